"""Stand-in for an OpenAI-compatible inference server (vLLM or SGLang), with the scripted model behind it.

Owns: the `/v1` layout (chat/completions, completions, responses unless `chat_only`, embeddings,
models), `GET /v1/models`
with `max_model_len`, each flavour's context checks and error body (vLLM nested, SGLang flat:
docs/token-budgets.md §1.1, §1.4, §2.1, §2.3), vLLM's `model_not_found`-style 404, and
OpenAI SSE as the agents accepted it (docs/agents.md §2.1): a role chunk, the text or the tool-call
arguments spread over several chunks, a finish chunk, a usage chunk with `choices: []` only when
`stream_options.include_usage` is set, then `[DONE]`. With the engines' token-id extensions asked for,
the prompt and completion ids (token_engine.py) where each flavour puts them (engine_ids.py), and
each engine's version route (vLLM `GET /version`, SGLang `GET /server_info`). Does not own: the
scripted reply (script.py) or logging and faults (server.py).

Unknown paths get FastAPI's `{"detail": "Not Found"}`, as both servers are FastAPI apps.

    with OpenAILikeStandIn(flavor="sglang", max_model_len=4096) as upstream:
        openai.OpenAI(base_url=upstream.v1_url, api_key="sk-test").chat.completions.create(...)
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from tests.standins import engine_ids, openai_wire, server
from tests.standins import token_engine as te
from tests.standins.script import (
    Conversation,
    Reply,
    Script,
    approx_tokens,
    chat_conversation,
    reply_tokens,
    responses_conversation,
    shell_arithmetic,
)
from tests.standins.server import SSE_HEADERS, BackendError, Dialect, FaultKind, StandIn
from tests.standins.wire import fastapi_route_error, hex_id, text_pieces

Flavor = Literal["vllm", "sglang"]
DEFAULT_MODEL = "standin-model"
DEFAULT_MAX_MODEL_LEN = 32768
MODEL_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"})
# Small and fixed: enough for a client to parse a vector, nothing to compute.
EMBEDDING_DIMENSIONS = 8
# The releases the stand-ins say they are: each with its token-id extensions (docs/engines.md §1.8, §2.8).
VERSIONS: dict[Flavor, str] = {"vllm": "0.11.0", "sglang": "0.5.23"}


@dataclass(frozen=True)
class OpenAILikeConfig:
    """What a test sets: the flavour, the served model, its window, and an optional API key."""

    flavor: Flavor = "vllm"
    model: str = DEFAULT_MODEL
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    api_key: str | None = None
    script: Script = shell_arithmetic
    # A deployment that serves chat but not the Responses API (many vLLM and SGLang ones do not).
    chat_only: bool = False


class OpenAIError(BackendError):
    """An error answered in the flavour's shape: vLLM nests it (docs/token-budgets.md §2.3), SGLang's
    body is flat (§1.4)."""

    def __init__(
        self,
        flavor: Flavor,
        status: int,
        message: str,
        error_type: str,
        param: str | None = None,
        code: Any = None,
    ) -> None:
        fields = {
            "message": message,
            "type": error_type,
            "param": param,
            "code": status if code is None else code,
        }
        super().__init__(status, {"error": fields} if flavor == "vllm" else {"object": "error", **fields})


# The API-key middleware of both servers answers a bare {"error": "Unauthorized"}; it is not in the
# docs/, but it is what their api_server sources return.
UNAUTHORIZED_BODY = {"error": "Unauthorized"}

CONFIG = web.AppKey("openai_like_config", OpenAILikeConfig)


# Each flavour's length refusals, word for word (docs/token-budgets.md §1.1 SGLang, §2.1 vLLM 0.33).
SGLANG_INPUT_TOO_LONG = (
    "The input ({prompt} tokens) is longer than the model's context length ({window} tokens)."
)
SGLANG_TOTAL_TOO_LONG = (
    "Requested token count exceeds the model's maximum context length of {window} tokens. "
    "You requested a total of {total} tokens: {prompt} tokens from the input messages and {output} tokens "
    "for the completion. Please reduce the number of tokens in the input messages or the completion to fit "
    "within the limit."
)
VLLM_OUTPUT_TOO_LONG = (
    "{param}={output} cannot be greater than max_model_len={window}. Please request fewer output tokens. "
    "(parameter={param}, value={output})"
)
VLLM_PROMPT_TOO_LONG = (
    "This model's maximum context length is {window} tokens. However, your prompt contains {prompt} "
    "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
    "the input prompt. (parameter=input_tokens, value={prompt})"
)
VLLM_PROMPT_FILLS_WINDOW = (
    "The decoder prompt (length {prompt}) plus the number of requested output tokens (at least 1) is "
    "longer than the maximum model length of {window}."
)


def _check_context(config: OpenAILikeConfig, prompt: int, output: int | None, param: str) -> None:
    """Refuse what the flavour refuses; vLLM 0.33 clamps a too-large prompt + output instead of refusing."""
    window = config.max_model_len
    if config.flavor == "sglang":
        if prompt >= window:
            raise OpenAIError(
                config.flavor,
                400,
                SGLANG_INPUT_TOO_LONG.format(prompt=prompt, window=window),
                "BadRequestError",
            )
        if output is not None and prompt + output > window:
            message = SGLANG_TOTAL_TOO_LONG.format(
                window=window, total=prompt + output, prompt=prompt, output=output
            )
            raise OpenAIError(config.flavor, 400, message, "BadRequestError")
    elif output is not None and output > window:
        message = VLLM_OUTPUT_TOO_LONG.format(param=param, output=output, window=window)
        raise OpenAIError(config.flavor, 400, message, "BadRequestError", param)
    elif prompt > window:
        message = VLLM_PROMPT_TOO_LONG.format(window=window, prompt=prompt)
        raise OpenAIError(config.flavor, 400, message, "BadRequestError", "input_tokens")
    elif prompt == window:
        message = VLLM_PROMPT_FILLS_WINDOW.format(prompt=prompt, window=window)
        raise OpenAIError(config.flavor, 400, message, "BadRequestError", "input_tokens")


def _check_request(request: web.Request, config: OpenAILikeConfig, required: str) -> dict[str, Any]:
    """Auth, JSON, the required field and the model name, in the order the servers check them."""
    if config.api_key is not None:
        authorization = request.headers.get("authorization", "")
        if authorization != f"Bearer {config.api_key}":
            raise BackendError(401, UNAUTHORIZED_BODY)
    body = server.request_body(request)
    if not isinstance(body, dict):
        raise OpenAIError(
            config.flavor, 400, "Expecting a JSON object as the request body", "BadRequestError"
        )
    if required not in body:
        raise OpenAIError(
            config.flavor,
            400,
            f"[{{'type': 'missing', 'loc': ('body', '{required}'), 'msg': 'Field required'}}]",
            "BadRequestError",
        )
    model = body.get("model")
    # vLLM checks the served name (404 NotFoundError, param "model"); SGLang serves whatever is asked.
    if config.flavor == "vllm" and model is not None and model != config.model:
        raise OpenAIError(
            config.flavor, 404, f"The model `{model}` does not exist.", "NotFoundError", "model"
        )
    return body


_route = server.with_state(CONFIG)


def _max_tokens(body: dict[str, Any]) -> tuple[int | None, str]:
    """`max_completion_tokens` wins over `max_tokens` in both servers (docs/token-budgets.md §1.1, §2.1)."""
    if body.get("max_completion_tokens") is not None:
        return int(body["max_completion_tokens"]), "max_completion_tokens"
    if body.get("max_tokens") is not None:
        return int(body["max_tokens"]), "max_tokens"
    return None, "max_tokens"


def _chat_chunks(completion: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """The chunks of docs/agents.md §2.1: role, text pieces or a tool-call header then its arguments in
    two pieces, finish, usage (only with include_usage); `[DONE]` follows them."""
    choice = completion["choices"][0]
    message = choice["message"]
    stamp = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            **stamp,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    for call in message["tool_calls"] or []:
        arguments = call["function"]["arguments"]
        header = {
            "index": 0,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [header]}))
        half = len(arguments) // 2
        for part in (arguments[:half], arguments[half:]):
            chunks.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}))
    if message["content"]:
        chunks += [chunk({"content": piece}) for piece in text_pieces(message["content"])]
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**stamp, "choices": [], "usage": completion["usage"]})
    return chunks


def _events(chunks: list[dict[str, Any]]) -> list[bytes]:
    return [*(openai_wire.sse_data(chunk) for chunk in chunks), openai_wire.SSE_DONE]


def _completion_ids(reply: Reply) -> list[int]:
    """What the model sampled for `reply`: its text, or its tool call, then the end-of-turn id."""
    call = reply.tool_call
    return te.completion(reply.text, [(call.name, dict(call.arguments))] if call else [])


async def _chat_completions(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    body = _check_request(request, config, "messages")
    ask = engine_ids.requested(config.flavor, "chat", body, request.headers)
    prompt_tokens = approx_tokens(body.get("messages"), body.get("tools"))
    _check_context(config, prompt_tokens, *_max_tokens(body))
    reply = config.script(chat_conversation(body))
    completion = openai_wire.chat_completion(
        reply,
        completion_id=hex_id("chatcmpl-", 32),
        tool_call_id=hex_id("chatcmpl-tool-", 32),
        tool_call_content=None,
        model=body.get("model") or config.model,
        prompt_tokens=prompt_tokens,
        completion_tokens=reply_tokens(reply),
    )
    ids = (te.render(body["messages"], body.get("tools")), _completion_ids(reply))
    if body.get("stream") is True:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = _chat_chunks(completion, include_usage)
        if ask is not None:
            chunks = engine_ids.add_to_chunks(ask, "chat", chunks, *ids)
        return await server.send_sse(request, _events(chunks), SSE_HEADERS)
    if ask is not None:
        engine_ids.add_to_body(ask, "chat", completion, *ids)
    return await server.send_json(request, completion)


async def _completions(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    body = _check_request(request, config, "prompt")
    ask = engine_ids.requested(config.flavor, "completions", body, request.headers)
    prompt_tokens = approx_tokens(body["prompt"])
    _check_context(config, prompt_tokens, *_max_tokens(body))
    reply = config.script(Conversation(last_user_text=str(body["prompt"])))
    reply = Reply(text=reply.text)
    completion = openai_wire.text_completion(
        reply,
        model=body.get("model") or config.model,
        prompt_tokens=prompt_tokens,
        completion_tokens=reply_tokens(reply),
    )
    ids = (te.encode(str(body["prompt"])), _completion_ids(reply))
    if body.get("stream") is True:
        stamp = {key: completion[key] for key in ("id", "object", "created", "model")}
        pieces = [
            {"index": 0, "text": piece, "logprobs": None, "finish_reason": None}
            for piece in text_pieces(reply.text)
        ]
        pieces[-1]["finish_reason"] = "stop"
        chunks = [{**stamp, "choices": [piece]} for piece in pieces]
        if ask is not None:
            chunks = engine_ids.add_to_chunks(ask, "completions", chunks, *ids)
        return await server.send_sse(request, _events(chunks), SSE_HEADERS)
    if ask is not None:
        engine_ids.add_to_body(ask, "completions", completion, *ids)
    return await server.send_json(request, completion)


async def _responses(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    body = _check_request(request, config, "input")
    prompt_tokens = approx_tokens(body.get("instructions"), body.get("input"), body.get("tools"))
    _check_context(config, prompt_tokens, body.get("max_output_tokens"), "max_output_tokens")
    reply = config.script(responses_conversation(body))
    response = openai_wire.response_object(
        reply,
        request=body,
        model=body.get("model") or config.model,
        prompt_tokens=prompt_tokens,
        completion_tokens=reply_tokens(reply),
    )
    if body.get("stream") is True:
        return await server.send_sse(request, openai_wire.response_events(response), SSE_HEADERS)
    return await server.send_json(request, response)


def _embedding(text: str) -> list[float]:
    """A deterministic vector for `text`, so a test can compare two answers."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round(byte / 255, 4) for byte in digest[:EMBEDDING_DIMENSIONS]]


async def _embeddings(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    body = _check_request(request, config, "input")
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    tokens = approx_tokens(inputs)
    data = [
        {"object": "embedding", "index": index, "embedding": _embedding(str(text))}
        for index, text in enumerate(inputs)
    ]
    answer = {
        "object": "list",
        "data": data,
        "model": body.get("model") or config.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return await server.send_json(request, answer)


async def _models(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    card = {
        "id": config.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": config.flavor,
        "root": config.model,
        "parent": None,
        "max_model_len": config.max_model_len,
    }
    return server.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    return web.Response()


async def _version(request: web.Request, config: OpenAILikeConfig) -> web.StreamResponse:
    """vLLM's `GET /version`; SGLang's `GET /server_info` (a few of its server-args keys)."""
    version = VERSIONS[config.flavor]
    if config.flavor == "vllm":
        return server.json_response({"version": version})
    return server.json_response({"model_path": config.model, "tp_size": 1, "version": version})


def _fault_error(flavor: Flavor) -> Callable[[FaultKind, Any], tuple[int, Any]]:
    """Injected errors with the messages the agents were measured against (docs/agents.md §3.6)."""

    def build(kind: FaultKind, body: Any) -> tuple[int, Any]:
        model = body.get("model") if isinstance(body, dict) else None
        errors = {
            "404": OpenAIError(
                flavor,
                404,
                f"The model `{model}` does not exist or you do not have access to it.",
                "invalid_request_error",
                None,
                "model_not_found",
            ),
            "400ctx": OpenAIError(
                flavor,
                400,
                "This model's maximum context length is 8192 tokens. However, your messages resulted in "
                "9000 tokens. Please reduce the length of the messages.",
                "invalid_request_error",
                "messages",
                "context_length_exceeded",
            ),
            "401": OpenAIError(
                flavor,
                401,
                "Incorrect API key provided: sk-test***.",
                "invalid_request_error",
                None,
                "invalid_api_key",
            ),
            "429": OpenAIError(
                flavor, 429, "Rate limit reached (stand-in)", "rate_limit_error", None, "rate_limit_exceeded"
            ),
            "500": OpenAIError(
                flavor,
                500,
                "The server had an error while processing your request.",
                "server_error",
                None,
                "server_error",
            ),
        }
        error = errors[kind]
        return error.status, error.body

    return build


def build_app(config: OpenAILikeConfig) -> web.Application:
    """The vLLM / SGLang stand-in app for `config`."""
    dialect = Dialect(
        name=config.flavor,
        model_paths=MODEL_PATHS - {"/v1/responses"} if config.chat_only else MODEL_PATHS,
        route_error=fastapi_route_error,
        fault_error=_fault_error(config.flavor),
        broken_sse=openai_wire.BROKEN_SSE,
    )
    routes = [
        web.post("/v1/chat/completions", _route(_chat_completions)),
        web.post("/v1/completions", _route(_completions)),
        web.post("/v1/embeddings", _route(_embeddings)),
        web.get("/v1/models", _route(_models)),
        web.get("/health", _route(_health)),
        web.get("/version" if config.flavor == "vllm" else "/server_info", _route(_version)),
    ]
    if not config.chat_only:
        routes.append(web.post("/v1/responses", _route(_responses)))
    app = server.build_app(dialect, routes)
    app[CONFIG] = config
    return app


class OpenAILikeStandIn(StandIn):
    """The vLLM / SGLang stand-in, served from its own thread; see the module docstring."""

    def __init__(
        self,
        *,
        flavor: Flavor = "vllm",
        model: str = DEFAULT_MODEL,
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        api_key: str | None = None,
        script: Script = shell_arithmetic,
        chat_only: bool = False,
    ) -> None:
        self.config = OpenAILikeConfig(flavor, model, max_model_len, api_key, script, chat_only)
        super().__init__(build_app(self.config))

    @property
    def v1_url(self) -> str:
        """The base URL the OpenAI SDK and opencode are given: `http://127.0.0.1:PORT/v1`."""
        return self.url + "/v1"
