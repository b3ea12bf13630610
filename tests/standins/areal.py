"""Stand-in for AReaL 1.0.4's agent proxy (the proxy rollout server), with the scripted model behind it.

Owns: the routes, auth, statuses and bodies of the real server as measured in docs/areal.md
§10.5-§10.6 and read in its §1.1 (PRS below is AReaL's proxy_rollout_server.py, docs/areal.md §0):
bare `/chat/completions` and `/responses`, `/v1/messages`, no `/v1/chat/completions`, no models, no
count_tokens; FastAPI `{"detail": ...}` errors; session keys as Bearer or x-api-key; the control
routes grant_capacity, rl/start_session, rl/set_reward, rl/end_session, export_trajectories with the
admin key. Does not own: the scripted reply (script.py) or logging and faults (server.py).

Simplifications, each harmless for a client: prompt length is `script.approx_tokens` of the messages
and tools, not the chat template's token count; `export_trajectories` returns each interaction's
request, response and discounted reward as JSON instead of AReaL's serialized tensors; stale-session
garbage collection (and so the 410 answers) is left out.

    with ArealStandIn(engine_max_tokens=256) as areal:
        session = areal.open_session("t0")     # what grant_capacity + rl/start_session would do
        openai.OpenAI(base_url=areal.url, api_key=session.api_key).chat.completions.create(...)

`ArealStandIn(gateway=True)` plays AReaL 2.0's inference-service gateway instead (docs/areal.md §9):
chat at `/chat/completions` and `/v1/chat/completions`, models at `/models` and `/v1/models` (admin
key), the session and export routes, session keys as Bearer only, and no messages or responses.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.standins import anthropic_wire, openai_wire, server
from tests.standins.script import (
    Reply,
    Script,
    approx_tokens,
    chat_conversation,
    messages_conversation,
    reply_tokens,
    responses_conversation,
    shell_arithmetic,
)
from tests.standins.server import BackendError, Dialect, FaultKind, StandIn
from tests.standins.wire import fastapi_route_error, hex_id

DEFAULT_ADMIN_KEY = "standin-admin-key"
# AReaL's completions carry `model: "None"` whatever the request named (docs/areal.md §1.1.6, §10.5).
MODEL = "None"
# AReaL's StreamingResponse adds these two to the headers every backend sends.
SSE_HEADERS = {**server.SSE_HEADERS, "Connection": "keep-alive", "X-Accel-Buffering": "no"}
MODEL_PATHS = frozenset({"/chat/completions", "/responses", "/v1/messages"})
MISSING_TOKEN = (
    "Missing or malformed Authorization header. Expected 'Bearer <token>' or 'x-api-key: <token>'."
)
BAD_SESSION_KEY = "Invalid or expired session API key."
BAD_CONTENT_TYPE = [
    {
        "loc": ["header", "content-type"],
        "msg": "Unsupported Media Type: Only 'application/json' is allowed",
        "type": "value_error",
    }
]
# AReaL 1.0.4 passes tools=None into its Response model when a /responses request has no tools
# (docs/areal.md §1.1.9); pydantic's message, with its documentation link.
RESPONSES_WITHOUT_TOOLS = (
    "1 validation error for Response\ntools\n  Input should be a valid list "
    "[type=list_type, input_value=None, input_type=NoneType]\n"
    "    For further information visit https://errors.pydantic.dev/2.12/v/list_type"
)


class ArealError(BackendError):
    """An HTTPException of the real server: answered as `{"detail": detail}` with `status`."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(status, {"detail": detail})
        self.detail = detail

    def streamed(self) -> ArealError:
        """The same error raised while a stream is set up: a 500 embedding `str(exc)` (PRS:720-724)."""
        return ArealError(500, f"Streaming setup failed: {self.status}: {self.detail}")


@contextmanager
def _stream_setup(streamed: bool) -> Iterator[None]:
    """Checks made while a stream is set up: an ArealError raised in them becomes its `streamed()` form."""
    try:
        yield
    except ArealError as error:
        raise error.streamed() if streamed else error from None


@dataclass
class Interaction:
    """A model call of a session, recorded before generation as AReaL does (docs/areal.md §1.1.6)."""

    interaction_id: str
    endpoint: str
    request: Any
    response: Any = None
    reward: float | None = None


@dataclass
class ArealSession:
    """A session: its id, its key, and the interactions recorded so far."""

    session_id: str
    api_key: str
    interactions: list[Interaction] = field(default_factory=list)
    ended: bool = False
    # Set by end_session; export_trajectories waits on it, without a timeout, as the real one does.
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, endpoint: str, request: Any, interaction_id: str) -> Interaction:
        """Insert an interaction for a call about to be generated."""
        interaction = Interaction(interaction_id, endpoint, request)
        self.interactions.append(interaction)
        return interaction


class ArealState:
    """Capacity, sessions and keys, guarded by one lock (tests call `open_session` from their thread)."""

    def __init__(
        self,
        admin_key: str = DEFAULT_ADMIN_KEY,
        engine_max_tokens: int | None = None,
        script: Script = shell_arithmetic,
    ) -> None:
        self.admin_key = admin_key
        self.engine_max_tokens = engine_max_tokens
        self.script = script
        self.capacity = 0
        self.sessions: dict[str, ArealSession] = {}
        self._session_by_key: dict[str, str] = {}
        self._lock = threading.Lock()

    def grant_capacity(self) -> int:
        """One more session may start; returns the new capacity."""
        with self._lock:
            self.capacity += 1
            return self.capacity

    def start_session(self, task_id: str, api_key: str | None = None) -> ArealSession:
        """Start a session as `/rl/start_session` does (PRS:440-504): consumes one unit of capacity."""
        with self._lock:
            if self.capacity <= 0:
                raise ArealError(429, "No available capacity to start a new session")
            if api_key is not None and api_key == self.admin_key:
                raise ArealError(400, "Cannot use the admin API key as a session key.")
            bound = self._session_by_key.get(api_key or "")
            if bound is not None and not self.sessions[bound].ended:
                raise ArealError(409, f"API key is already bound to active session {bound}.")
            index = 0
            while f"{task_id}-{index}" in self.sessions:
                index += 1
            session = ArealSession(f"{task_id}-{index}", api_key or secrets.token_urlsafe(32))
            self.capacity -= 1
            self.sessions[session.session_id] = session
            self._session_by_key[session.api_key] = session.session_id
            return session

    def session_for_key(self, token: str) -> ArealSession:
        """The session a session key belongs to; 401 for any other token, the admin key included."""
        with self._lock:
            session_id = self._session_by_key.get(token)
            if session_id is None:
                raise ArealError(401, BAD_SESSION_KEY)
            return self.sessions[session_id]

    def check_admin(self, token: str) -> None:
        """403 unless `token` is the admin key (compared in constant time, as PRS does)."""
        if not hmac.compare_digest(token.encode(), self.admin_key.encode()):
            raise ArealError(403, "Invalid admin API key.")

    def check_prompt(self, prompt_tokens: int, cap_name: str) -> None:
        """AReaL 1.0.4's one length gate: `cap - prompt <= 0` fails, so a prompt equal to the cap fails."""
        cap = self.engine_max_tokens
        if cap is not None and cap - prompt_tokens <= 0:
            raise ArealError(500, f"len of prompt tokens {prompt_tokens} exceeds {cap_name} {cap}")

    def pop_session(self, session_id: str) -> ArealSession:
        """Remove a session and its key (export does this; the key then answers 401)."""
        with self._lock:
            session = self.sessions.pop(session_id)
            self._session_by_key.pop(session.api_key, None)
            return session


AREAL = web.AppKey("areal_state", ArealState)


def _token(request: web.Request) -> str:
    """Bearer token (prefix matched case-insensitively), else x-api-key, else 401 (PRS:172-212)."""
    authorization = request.headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[len("bearer ") :].strip()
    api_key = request.headers.get("x-api-key", "")
    if api_key:
        return api_key
    raise ArealError(401, MISSING_TOKEN)


def _fastapi_body(request: web.Request) -> Any:
    """The body as FastAPI reads a typed body before any dependency runs: JSON unless the content type
    is something else, and 422 `json_invalid` when it does not parse."""
    media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    raw = server.request_raw(request)
    if not (media_type == "application/json" or media_type.endswith("+json")) or not raw:
        return server.request_body(request)
    try:
        return json.loads(raw)
    except ValueError as error:
        position = getattr(error, "pos", 0)
        message = getattr(error, "msg", str(error))
        raise ArealError(
            422,
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", position],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": message},
                }
            ],
        ) from None


def _require_json(request: web.Request) -> None:
    """`validate_json_request` (PRS:151-164): a route-level dependency, so it runs before the auth one."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise ArealError(422, BAD_CONTENT_TYPE)


def _missing(body: Any, location: list[str], fields: list[str]) -> list[dict[str, Any]]:
    present = body if isinstance(body, dict) else {}
    return [
        {"type": "missing", "loc": ["body", *location, name], "msg": "Field required", "input": body}
        for name in fields
        if name not in present
    ]


def _require_fields(body: Any, fields: list[str]) -> dict[str, Any]:
    """FastAPI's body validation of a plain pydantic model: 422 listing what is wrong."""
    if not isinstance(body, dict):
        not_an_object = {
            "type": "model_attributes_type",
            "loc": ["body"],
            "msg": "Input should be a valid dictionary",
        }
        raise ArealError(422, [{**not_an_object, "input": body}])
    errors = _missing(body, [], fields)
    if errors:
        raise ArealError(422, errors)
    return body


def _require_chat_params(body: Any) -> dict[str, Any]:
    """CompletionCreateParams is a union of the non-streaming and streaming TypedDicts; a body missing
    a field gets one error per member, plus the streaming member's `stream` (docs/areal.md §1.1.4)."""
    missing = [name for name in ("messages", "model") if not (isinstance(body, dict) and name in body)]
    if not missing and isinstance(body, dict):
        return body
    errors = _missing(body, ["CompletionCreateParamsNonStreaming"], missing)
    errors += _missing(body, ["CompletionCreateParamsStreaming"], missing)
    if not (isinstance(body, dict) and body.get("stream") is True):
        stream = ["body", "CompletionCreateParamsStreaming", "stream"]
        errors.append({"type": "missing", "loc": stream, "msg": "Field required", "input": body})
    raise ArealError(422, errors)


def _check_chat_arguments(body: dict[str, Any]) -> None:
    """ArealOpenAI's own refusals, each a 500 (docs/areal.md §1.1.6)."""
    if body.get("n", 1) != 1:
        raise ArealError(500, "NotImplementedError: n != 1 is not supported yet")
    if not body.get("messages"):
        raise ArealError(500, "messages cannot be empty")
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:
        raise ArealError(
            500,
            "max_tokens and max_completion_tokens cannot be set at the same time. "
            "max_tokens has been deprecated. Please use max_completion_tokens instead.",
        )


_route = server.with_state(AREAL)


async def _health(request: web.Request, state: ArealState) -> web.StreamResponse:
    return server.json_response({"status": "ok", "initialized": True})


async def _gateway_health(request: web.Request, state: ArealState) -> web.StreamResponse:
    # GatewayHealthResponse (areal/v2/inference_service/gateway/app.py): the router's address.
    return server.json_response({"status": "ok", "router_addr": "http://127.0.0.1:9"})


async def _grant_capacity(request: web.Request, state: ArealState) -> web.StreamResponse:
    state.check_admin(_token(request))
    return server.json_response({"capacity": state.grant_capacity()})


async def _start_session(request: web.Request, state: ArealState) -> web.StreamResponse:
    body = _fastapi_body(request)
    state.check_admin(_token(request))
    body = _require_fields(body, ["task_id"])
    session = state.start_session(str(body["task_id"]), body.get("api_key"))
    return server.json_response({"session_id": session.session_id, "api_key": session.api_key})


async def _end_session(request: web.Request, state: ArealState) -> web.StreamResponse:
    session = state.session_for_key(_token(request))
    session.ended = True
    session.finished.set()
    return server.json_response({"message": "success", "interaction_count": len(session.interactions)})


async def _set_reward(request: web.Request, state: ArealState) -> web.StreamResponse:
    body = _fastapi_body(request)
    session = state.session_for_key(_token(request))
    body = _require_fields(body, ["reward"])
    interaction_id = body.get("interaction_id")
    if interaction_id is None:
        if not session.interactions:
            raise ArealError(400, "No interactions in session")
        target = session.interactions[-1]
    else:
        matches = [i for i in session.interactions if i.interaction_id == interaction_id]
        if not matches:
            raise ArealError(400, f"Interaction {interaction_id} not found")
        target = matches[0]
    target.reward = float(body["reward"])
    return server.json_response({"message": "success"})


async def _export_trajectories(request: web.Request, state: ArealState) -> web.StreamResponse:
    body = _fastapi_body(request)
    state.check_admin(_token(request))
    body = _require_fields(body, ["session_id"])
    session = state.sessions.get(body["session_id"])
    if session is None:
        raise ArealError(404, f"Session {body['session_id']} not found")
    await session.finished.wait()
    state.pop_session(session.session_id)
    # Backward turn discount r[i] += discount * r[i+1] over every interaction; those without output are
    # then left out, yet their reward has already flowed back (docs/areal.md §10.5, the quirk).
    discount = float(body.get("discount", 1.0))
    rewards = [i.reward or 0.0 for i in session.interactions]
    for index in range(len(rewards) - 2, -1, -1):
        rewards[index] += discount * rewards[index + 1]
    exported = {
        i.interaction_id: {
            "interaction_id": i.interaction_id,
            "reward": reward,
            "endpoint": i.endpoint,
            "request": i.request,
            "response": i.response,
        }
        for i, reward in zip(session.interactions, rewards, strict=True)
        if i.response is not None
    }
    return server.json_response({"interactions": exported})


def _chat_chunk(
    completion_id: str,
    created: int,
    delta: dict[str, Any],
    finish_reason: str | None = None,
    usage: Any = None,
) -> bytes:
    """A chunk as `ChatCompletionChunk.model_dump_json()` writes it: every field present, unset ones null."""
    full_delta = {
        "content": None,
        "function_call": None,
        "refusal": None,
        "role": None,
        "tool_calls": None,
        **delta,
    }
    return openai_wire.sse_data(
        {
            "id": completion_id,
            "choices": [{"delta": full_delta, "finish_reason": finish_reason, "index": 0, "logprobs": None}],
            "created": created,
            "model": MODEL,
            "object": "chat.completion.chunk",
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
        }
    )


def _chat_chunks(completion: dict[str, Any]) -> list[bytes]:
    """AReaL's replay of a finished generation (PRS:691-724): role chunk, the whole text in one chunk,
    one chunk per tool call with id, name and full arguments (1.0.4, docs/areal.md §10.6), then a last chunk
    with finish_reason and usage whether or not `stream_options` asked for it; then [DONE]."""
    choice = completion["choices"][0]
    message = choice["message"]
    stamp = (completion["id"], completion["created"])
    chunks = [_chat_chunk(*stamp, {"role": "assistant", "content": ""})]
    if message["content"]:
        chunks.append(_chat_chunk(*stamp, {"content": message["content"]}))
    for index, call in enumerate(message["tool_calls"] or []):
        chunks.append(_chat_chunk(*stamp, {"tool_calls": [{"index": index, **call}]}))
    chunks.append(_chat_chunk(*stamp, {}, choice["finish_reason"], completion["usage"]))
    return [*chunks, openai_wire.SSE_DONE]


async def _chat_completions(request: web.Request, state: ArealState) -> web.StreamResponse:
    body = _fastapi_body(request)
    _require_json(request)
    session = state.session_for_key(_token(request))
    body = _require_chat_params(body)
    streamed = body.get("stream") is True
    prompt_tokens = approx_tokens(body.get("messages"), body.get("tools"))
    with _stream_setup(streamed):
        _check_chat_arguments(body)
        state.check_prompt(prompt_tokens, "max_total_tokens")
    reply = state.script(chat_conversation(body))
    completion = openai_wire.chat_completion(
        reply,
        completion_id=hex_id("chatcmpl-", 29),
        tool_call_id=hex_id("call_", 24),
        tool_call_content="",
        model=MODEL,
        prompt_tokens=prompt_tokens,
        completion_tokens=reply_tokens(reply),
    )
    session.record("chat", body, completion["id"]).response = completion
    if streamed:
        return await server.send_sse(request, _chat_chunks(completion), SSE_HEADERS)
    return await server.send_json(request, completion)


async def _responses(request: web.Request, state: ArealState) -> web.StreamResponse:
    body = _fastapi_body(request)
    _require_json(request)
    session = state.session_for_key(_token(request))
    body = _require_fields(body, ["input", "model"])
    prompt_tokens = approx_tokens(body.get("instructions"), body.get("input"), body.get("tools"))
    if body.get("include"):  # before the interaction is recorded, as in ArealOpenAI (docs/areal.md §1.1.9)
        raise ArealError(500, "NotImplementedError: include is not supported yet")
    state.check_prompt(prompt_tokens, "engine_max_tokens")
    interaction = session.record("responses", body, hex_id("resp-", 32))
    if body.get("tools") is None:
        raise ArealError(500, RESPONSES_WITHOUT_TOOLS)
    reply = state.script(responses_conversation(body))
    response = openai_wire.response_object(
        reply, request=body, model=MODEL, prompt_tokens=prompt_tokens, completion_tokens=reply_tokens(reply)
    )
    interaction.response = {**response, "id": interaction.interaction_id}
    # PRS:733-750 has no streaming branch: `stream` is answered with the whole object.
    return await server.send_json(request, interaction.response)


def _message_events(reply: Reply, message: dict[str, Any], request_model: str) -> list[bytes]:
    """What LiteLLM's adapter streams for AReaL (docs/areal.md §1.1.7, §10.6): message_start with the
    request's model and zero usage, an empty text block that a tool_use block follows, each block's whole
    content in one delta, then message_delta with the usage and message_stop."""
    start = {**message, "id": hex_id("msg_", 32), "model": request_model, "content": [], "stop_reason": None}
    events = [
        {"type": "message_start", "message": {**start, "usage": {"input_tokens": 0, "output_tokens": 0}}}
    ]
    for index, block in enumerate(message["content"]):
        opened = {**block, "text": ""} if block["type"] == "text" else {**block, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        if block["type"] == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif block["text"]:
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "text_delta", "text": block["text"]},
                }
            )
        events.append({"type": "content_block_stop", "index": index})
    stop = {"stop_reason": anthropic_wire.stop_reason(reply), "stop_sequence": None}
    events += [{"type": "message_delta", "delta": stop, "usage": message["usage"]}, {"type": "message_stop"}]
    return [anthropic_wire.sse_event(event) for event in events]


async def _messages(request: web.Request, state: ArealState) -> web.StreamResponse:
    _require_json(request)
    session = state.session_for_key(_token(request))
    body = server.request_body(request)
    if not isinstance(body, dict):
        # The raw `await request.json()` (PRS:838) raises outside any handler: Starlette's plain 500.
        return web.Response(status=500, text="Internal Server Error")
    if "messages" not in body:
        raise ArealError(400, "Invalid Anthropic request format: 'messages'")
    streamed = body.get("stream") is True
    prompt_tokens = approx_tokens(body.get("system"), body.get("messages"), body.get("tools"))
    with _stream_setup(streamed):
        state.check_prompt(prompt_tokens, "max_total_tokens")
    reply = state.script(messages_conversation(body))
    message = anthropic_wire.message(
        reply,
        message_id=hex_id("chatcmpl-", 29),
        tool_use_id=hex_id("call_", 24),
        model=MODEL,
        input_tokens=prompt_tokens,
        output_tokens=reply_tokens(reply),
        text_before_tool=True,
    )
    session.record("messages", body, message["id"]).response = message
    if streamed:
        return await server.send_sse(
            request, _message_events(reply, message, str(body.get("model", "default"))), SSE_HEADERS
        )
    return await server.send_json(request, message)


def _fault_error(kind: FaultKind, body: Any) -> tuple[int, Any]:
    """Injected errors in AReaL's shape; a context overflow is its 500 "exceeds max_total_tokens"."""
    if kind == "400ctx":
        prompt = approx_tokens(body.get("messages") if isinstance(body, dict) else body)
        error = ArealError(
            500, f"len of prompt tokens {prompt} exceeds max_total_tokens {max(prompt - 1, 1)}"
        )
        streamed = isinstance(body, dict) and body.get("stream") is True
        return 500, {"detail": (error.streamed() if streamed else error).detail}
    details = {
        "404": (404, "Not Found"),
        "401": (401, BAD_SESSION_KEY),
        "429": (429, "Rate limited (stand-in)"),
        "500": (500, "Internal server error (stand-in)"),
    }
    status, detail = details[kind]
    return status, {"detail": detail}


DIALECT = Dialect(
    name="areal",
    model_paths=MODEL_PATHS,
    route_error=fastapi_route_error,
    fault_error=_fault_error,
    broken_sse=openai_wire.BROKEN_SSE,
)


def build_app(state: ArealState) -> web.Application:
    """The AReaL stand-in app over `state`."""
    app = server.build_app(DIALECT, ROUTES)
    app[AREAL] = state
    return app


ROUTES = [
    web.get("/health", _route(_health)),
    web.post("/grant_capacity", _route(_grant_capacity)),
    web.post("/rl/start_session", _route(_start_session)),
    web.post("/rl/end_session", _route(_end_session)),
    web.post("/rl/set_reward", _route(_set_reward)),
    web.post("/export_trajectories", _route(_export_trajectories)),
    web.post("/chat/completions", _route(_chat_completions)),
    web.post("/responses", _route(_responses)),
    web.post("/v1/messages", _route(_messages)),
]


def _bearer_only(handler: Any) -> Any:
    """The gateway reads only `Authorization: Bearer` and answers anything else with a plain 401
    (docs/areal.md §1.2, the same forwarder)."""

    async def run(request: web.Request, state: ArealState) -> web.StreamResponse:
        if not request.headers.get("authorization", "").lower().startswith("bearer "):
            return web.Response(status=401, text="Invalid session key")
        return await handler(request, state)

    return run


async def _models(request: web.Request, state: ArealState) -> web.StreamResponse:
    state.check_admin(_token(request))
    card = {"id": "default", "object": "model", "created": 0, "owned_by": "areal"}
    return server.json_response({"object": "list", "data": [card]})


GATEWAY_MODEL_PATHS = frozenset({"/chat/completions", "/v1/chat/completions"})
GATEWAY_DIALECT = Dialect(
    name="areal-gateway",
    model_paths=GATEWAY_MODEL_PATHS,
    route_error=fastapi_route_error,
    fault_error=_fault_error,
    broken_sse=openai_wire.BROKEN_SSE,
)
GATEWAY_ROUTES = [
    web.get("/health", _route(_gateway_health)),
    web.post("/rl/start_session", _route(_start_session)),
    web.post("/rl/set_reward", _route(_set_reward)),
    web.post("/export_trajectories", _route(_export_trajectories)),
    web.post("/chat/completions", _route(_bearer_only(_chat_completions))),
    web.post("/v1/chat/completions", _route(_bearer_only(_chat_completions))),
    web.get("/models", _route(_models)),
    web.get("/v1/models", _route(_models)),
]


class ArealStandIn(StandIn):
    """The AReaL stand-in, served from its own thread; see the module docstring."""

    def __init__(
        self,
        *,
        admin_key: str = DEFAULT_ADMIN_KEY,
        engine_max_tokens: int | None = None,
        script: Script = shell_arithmetic,
        gateway: bool = False,
    ) -> None:
        self.state = ArealState(admin_key, engine_max_tokens, script)
        if gateway:
            app = server.build_app(GATEWAY_DIALECT, GATEWAY_ROUTES)
            app[AREAL] = self.state
        else:
            app = build_app(self.state)
        super().__init__(app)

    @property
    def admin_key(self) -> str:
        """The admin key the control routes want."""
        return self.state.admin_key

    def open_session(self, task_id: str = "task") -> ArealSession:
        """Grant capacity and start a session, as AReaL's workflow does before it runs an agent."""
        self.state.grant_capacity()
        return self.state.start_session(task_id)

    def session(self, session_id: str) -> ArealSession:
        """A live session (not yet exported) by id."""
        return self.state.sessions[session_id]
