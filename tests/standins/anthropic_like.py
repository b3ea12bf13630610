"""Stand-in for the Anthropic Messages API, with the scripted model behind it.

Owns: `/v1/messages` (with or without `?beta=true`), `/v1/messages/count_tokens`, `GET /v1/models`,
HEAD on any path (Claude Code's connectivity check), x-api-key or Bearer auth, typed error bodies,
the context refusal "prompt is too long: P tokens > L maximum", and the SSE event framing the agents
accepted (docs/agents.md §2.2: message_start, content_block_start, ping, deltas, content_block_stop,
message_delta, message_stop). Does not own: the scripted reply (script.py) or logging and faults
(server.py).

    with AnthropicLikeStandIn() as upstream:
        anthropic.Anthropic(base_url=upstream.url, api_key="sk-ant-test").messages.create(...)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.standins import anthropic_wire, server
from tests.standins.script import (
    Reply,
    Script,
    approx_tokens,
    messages_conversation,
    reply_tokens,
    shell_arithmetic,
)
from tests.standins.server import SSE_HEADERS, BackendError, Dialect, FaultKind, StandIn
from tests.standins.wire import hex_id, text_pieces

DEFAULT_MODEL = "claude-standin"
# Anthropic's models take 200k-token prompts; the refusal message of docs/agents.md §2.5 uses it.
DEFAULT_CONTEXT_WINDOW = 200_000
MODEL_PATHS = frozenset({"/v1/messages"})
REQUIRED_FIELDS = ("model", "max_tokens", "messages")


@dataclass(frozen=True)
class AnthropicLikeConfig:
    """What a test sets: the model listed by /v1/models, the context window, an optional API key."""

    model: str = DEFAULT_MODEL
    context_window: int = DEFAULT_CONTEXT_WINDOW
    api_key: str | None = None
    script: Script = shell_arithmetic


class AnthropicError(BackendError):
    """An error answered as `{"type": "error", "error": {"type", "message"}}`."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        super().__init__(status, anthropic_wire.error(error_type, message))


CONFIG = web.AppKey("anthropic_like_config", AnthropicLikeConfig)


def _check_key(request: web.Request, config: AnthropicLikeConfig) -> None:
    """x-api-key (Claude Code) or Bearer (anthropic-py 2.14 sends its key so: docs/agents.md §5)."""
    if config.api_key is None:
        return
    authorization = request.headers.get("authorization", "")
    bearer = authorization[len("Bearer ") :] if authorization.startswith("Bearer ") else None
    if config.api_key not in (request.headers.get("x-api-key"), bearer):
        raise AnthropicError(401, "authentication_error", "invalid x-api-key")


# Every handler runs after the key check.
_route = server.with_state(CONFIG, check=_check_key)


def _checked_body(
    request: web.Request, config: AnthropicLikeConfig, required: tuple[str, ...]
) -> tuple[dict[str, Any], int]:
    """The request body and its prompt tokens, or the API's 400 for a bad body or an over-long prompt."""
    body = server.request_body(request)
    if not isinstance(body, dict):
        raise AnthropicError(400, "invalid_request_error", "The request body is not valid JSON.")
    for name in required:
        if name not in body:
            raise AnthropicError(400, "invalid_request_error", f"{name}: Field required")
    prompt_tokens = approx_tokens(body.get("system"), body.get("messages"), body.get("tools"))
    if prompt_tokens > config.context_window:
        raise AnthropicError(
            400,
            "invalid_request_error",
            f"prompt is too long: {prompt_tokens} tokens > {config.context_window} maximum",
        )
    return body, prompt_tokens


def _events(reply: Reply, message: dict[str, Any]) -> list[bytes]:
    """message_start (input usage, 1 output token), each block opened, a ping after the first opening,
    text word by word or tool input JSON in two pieces, each block closed, message_delta, message_stop."""
    usage = {
        **message["usage"],
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    start = {**message, "content": [], "stop_reason": None, "usage": usage}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            opened = {**block, "input": {}}
            arguments = json.dumps(block["input"])
            half = len(arguments) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in (arguments[:half], arguments[half:])
            ]
        else:
            opened = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in text_pieces(block["text"])]
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        if index == 0:
            events.append({"type": "ping"})
        events += [{"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas]
        events.append({"type": "content_block_stop", "index": index})
    stop = {"stop_reason": anthropic_wire.stop_reason(reply), "stop_sequence": None}
    events += [
        {
            "type": "message_delta",
            "delta": stop,
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return [anthropic_wire.sse_event(event) for event in events]


async def _messages(request: web.Request, config: AnthropicLikeConfig) -> web.StreamResponse:
    body, prompt_tokens = _checked_body(request, config, REQUIRED_FIELDS)
    reply = config.script(messages_conversation(body))
    message = anthropic_wire.message(
        reply,
        message_id=hex_id("msg_", 24),
        tool_use_id=hex_id("toolu_", 24),
        model=str(body["model"]),
        input_tokens=prompt_tokens,
        output_tokens=reply_tokens(reply),
        text_before_tool=False,
    )
    if body.get("stream") is True:
        return await server.send_sse(request, _events(reply, message), SSE_HEADERS)
    return await server.send_json(request, message)


async def _count_tokens(request: web.Request, config: AnthropicLikeConfig) -> web.StreamResponse:
    _, prompt_tokens = _checked_body(request, config, ("model", "messages"))
    return server.json_response({"input_tokens": prompt_tokens})


async def _models(request: web.Request, config: AnthropicLikeConfig) -> web.StreamResponse:
    card = {
        "type": "model",
        "id": config.model,
        "display_name": "Stand-in",
        "created_at": "2026-01-01T00:00:00Z",
    }
    return server.json_response(
        {"data": [card], "has_more": False, "first_id": config.model, "last_id": config.model}
    )


async def _any_other(request: web.Request) -> web.StreamResponse:
    """HEAD answers 200 on any path (Claude Code's `HEAD /api/hello` check); anything else is a 404."""
    if request.method == "HEAD":
        return web.Response()
    raise web.HTTPNotFound


def _fault_error(kind: FaultKind, body: Any) -> tuple[int, Any]:
    """Injected errors with the types and messages the agents were measured against (docs/agents.md §4.4)."""
    model = body.get("model") if isinstance(body, dict) else None
    errors = {
        "404": (404, "not_found_error", f"model: {model}"),
        "400ctx": (400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
        "401": (401, "authentication_error", "invalid x-api-key"),
        "429": (429, "rate_limit_error", "Rate limited (stand-in)"),
        "500": (500, "api_error", "Internal server error"),
    }
    status, error_type, message = errors[kind]
    return status, anthropic_wire.error(error_type, message)


DIALECT = Dialect(
    name="anthropic",
    model_paths=MODEL_PATHS,
    route_error=lambda status: anthropic_wire.error(
        "not_found_error" if status == 404 else "invalid_request_error",
        "Not Found" if status == 404 else "Method Not Allowed",
    ),
    fault_error=_fault_error,
    broken_sse=b"event: message_start\ndata: {not json\n\n",
)


def build_app(config: AnthropicLikeConfig) -> web.Application:
    """The Anthropic stand-in app for `config`."""
    app = server.build_app(
        DIALECT,
        [
            web.post("/v1/messages", _route(_messages)),
            web.post("/v1/messages/count_tokens", _route(_count_tokens)),
            web.get("/v1/models", _route(_models), allow_head=False),
            web.route("*", "/{tail:.*}", _any_other),
        ],
    )
    app[CONFIG] = config
    return app


class AnthropicLikeStandIn(StandIn):
    """The Anthropic stand-in, served from its own thread; see the module docstring."""

    def __init__(
        self,
        *,
        model: str = DEFAULT_MODEL,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        api_key: str | None = None,
        script: Script = shell_arithmetic,
    ) -> None:
        self.config = AnthropicLikeConfig(model, context_window, api_key, script)
        super().__init__(build_app(self.config))
