"""The Dialect protocol: what modeltap needs to know about one wire format, asked in one place.

A dialect is one API format an agent speaks: OpenAI chat completions, legacy completions, Responses,
embeddings and models, Anthropic messages and count_tokens. Each lives in a module of its own in this
package, as one `Dialect` subclass, and is listed once in the registry (`modeltap/dialects/__init__.py`).
The proxy, the records and the adapter look a format up by route or by name and ask it; none of them
branches on format names.

A dialect answers, for its format:

- routing: its route (`route`, the path after `/v1`), `method`, whether AReaL serves it under `/v1`
  (`areal_v1`), whether it streams (`streams`) and which headers carry a key (`credential_headers`);
- errors: `error_body`, the JSON its clients parse, and `context_overflow`, the refusal they act on;
- budgets: `completion_field`, the request field that caps the completion, and `prompt`, what the
  served model's chat template renders;
- streams: `assembler` (rebuild the final body from events) and `synthesise` (the events of a body);
- records: `summary` (finish reason, reply, tool calls, usage), `new_messages` (what a turn added),
  `conversation` (the exchange as OpenAI chat messages), `tool_call_parse_failure`, and `token_ids`
  (the prompt and completion ids an engine returned: dialects/token_ids.py);
- translation, for an upstream that does not serve the format (`translates`): `chat_request` (the
  request as OpenAI chat), `chat_translator` (the format's stream written from a chat chunk stream as
  it arrives; a non-streamed reply is converted through it too), `upstream_error` (a chat upstream's
  error as the format's clients parse it) and, for a format whose requests chain to an earlier reply,
  `previous_id`, `reply_id` and `continued`.
- traces: `operation` and `provider`, the format's names in the OpenTelemetry GenAI conventions
  (docs/otel.md).

Adding a format: write `modeltap/dialects/<format>.py` with a `Dialect` subclass overriding what the
format has (the defaults say "nothing of that kind"), end it with `DIALECT = MyFormat()`, and add that
object to `DIALECTS` in `modeltap/dialects/__init__.py`.

Plain functions and classes over bytes and dicts: no I/O, no aiohttp. Stored bodies come from any
upstream, so every reader here takes odd JSON (a missing field, a field of the wrong type) as absent
and never raises on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    from modeltap.dialects.token_ids import TokenIds

from modeltap.compat.layouts import ErrorInfo, is_context_overflow, overflow_tokens
from modeltap.dialects.sse import typed_event

# The path prefix of a session URL, `/s/TOKEN/...` (modeltap.proxy.sessions issues the tokens).
SESSION_PREFIX = re.compile(r"^s/([A-Za-z0-9_-]{16,128})(?:/(.*))?$")
# AReaL answers `"model": "None"` (docs/areal.md §1.1.6): that names no model, so the request's model is
# shown instead.
_NO_MODEL = frozenset({"", "None"})


@dataclass(frozen=True, slots=True)
class ApiError:
    """An error as modeltap states it, before a dialect shapes it: the message and the type and code
    each error shape uses (OpenAI's `type` and `code`, Anthropic's `type`)."""

    message: str
    openai_type: str = "invalid_request_error"
    anthropic_type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A request's prompt as a chat template renders it: messages, tools and the request's own
    `chat_template_kwargs`."""

    messages: list[Any]
    tools: list[Any] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TextPrompt:
    """A legacy completions prompt: text, token ids, or a batch of either, rendered by no template."""

    prompt: Any


Prompt = ChatPrompt | TextPrompt


@dataclass(frozen=True, slots=True)
class Summary:
    """One exchange at a glance, whatever its format. `tool_calls` holds `{"id", "name", "arguments"}`
    dicts, arguments as JSON text in every format; token counts are None when the body has no usage."""

    finish_reason: str | None = None
    text: str | None = None
    tool_calls: list[dict[str, str | None]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None
    cache_read_tokens: int | None = None
    """Prompt tokens served from the provider's cache (part of `prompt_tokens`)."""
    cache_write_tokens: int | None = None
    """Prompt tokens written to the provider's cache (part of `prompt_tokens`)."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """An exchange as OpenAI chat: its request's history followed by the reply, and its function tools
    (the shape of one line of an SFT set)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


Reading = tuple[str | None, str | None, list[dict[str, str | None]]]
"""(finish reason, reply text, tool calls) of one response body."""


class Assembler(Protocol):
    """Rebuilds one stream's final body from its events' JSON (see modeltap.dialects.sse)."""

    END: ClassVar[str]
    """What a properly ended stream ends with, for the message when it does not."""

    def add(self, obj: dict[str, Any]) -> bool:
        """Take one event's JSON; True when it is the stream's terminal event."""
        ...

    def body(self) -> dict[str, Any] | None:
        """The non-streamed body rebuilt from the events so far."""
        ...


class ChatTranslator(Protocol):
    """Writes one exchange's stream in a format from the OpenAI chat chunk stream an upstream sends,
    chunk by chunk as the chunks arrive (modeltap.dialects.openai_chat.ChatDeltas reads them). Events
    are dicts carrying their `type`, written with `Dialect.event_bytes`."""

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat chunk makes."""
        ...

    def end(self) -> list[dict[str, Any]]:
        """The closing events, once the chat stream has ended; none when it ended before its finish
        reason (the client then sees a stream cut short, as it was)."""
        ...


# Error types by HTTP status, for an upstream error that names none the client's format knows
# (OpenAI's documented error types; Anthropic's: docs/agents.md §2.5).
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class Dialect:
    """One wire format. The defaults describe a format that has none of the optional parts: no budget,
    no stream, no conversation, OpenAI-shaped errors."""

    name: ClassVar[str]
    """The format's name in the records (`endpoint`): "chat", "messages", ..."""
    route: ClassVar[str]
    """The path after `/v1`: "chat/completions", "messages/count_tokens", ..."""
    method: ClassVar[str] = "POST"
    item_route: ClassVar[bool] = False
    """Whether `ROUTE/{id}` names one item (`GET /v1/models/{id}`)."""
    areal_v1: ClassVar[bool] = False
    """Whether AReaL <= 2.1.0 serves it under `/v1` rather than at the bare path (docs/areal.md §1.1.1)."""
    streams: ClassVar[bool] = False
    """Whether it answers `stream: true` with server-sent events."""
    history_field: ClassVar[str | None] = None
    """The request field holding the conversation, a list that grows by turns."""
    context_fields: ClassVar[tuple[str, ...]] = ()
    """Request fields repeated whole from turn to turn (tools, a system prompt)."""
    system_field: ClassVar[str | None] = None
    """The request field holding a system prompt kept outside the history."""
    counts_prompt: ClassVar[bool] = False
    """Whether its answer is the prompt's token count, which modeltap can give itself."""
    request_headers: ClassVar[Mapping[str, str]] = {}
    """Headers a request of this format needs besides its body (a replay sends them)."""
    translates: ClassVar[bool] = False
    """Whether modeltap can send its requests to an upstream as OpenAI chat, and answer back in this
    format, when the upstream does not serve it."""
    operation: ClassVar[str | None] = None
    """The call's `gen_ai.operation.name` in the GenAI conventions (docs/otel.md): "chat",
    "text_completion", "embeddings"; None for a format that calls no model."""
    provider: ClassVar[str] = "openai"
    """Whose API the format is, as `gen_ai.provider.name` names it (docs/otel.md)."""

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    # -- routing and errors ---------------------------------------------------------------------------

    def credential_headers(self, key: str) -> dict[str, str]:
        """The headers that carry an upstream API key."""
        return {"Authorization": f"Bearer {key}"}

    def error_body(self, error: ApiError) -> dict[str, Any]:
        """`{"error": {"message", "type", "param", "code"}}`, as the openai SDK and opencode parse it."""
        return {
            "error": {
                "message": error.message,
                "type": error.openai_type,
                "param": error.param,
                "code": error.code,
            }
        }

    def context_overflow(
        self, prompt_tokens: int, completion_tokens: int, limit: int, max_prompt_tokens: int, note: str = ""
    ) -> ApiError:
        """The refusal of a prompt that does not fit: OpenAI's `context_length_exceeded`, whose text
        agents compact on (docs/token-budgets.md §4), then `note`. `limit` is the most prompt +
        completion tokens, `completion_tokens` what the client asked for (0: none), `max_prompt_tokens`
        the most prompt tokens that leave room for the completion."""
        return ApiError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
            f"{completion_tokens} in the completion). Please reduce the length of the messages or "
            f"completion. {note}".rstrip(),
            code="context_length_exceeded",
            param="messages",
        )

    def local_answer(self, served_models: Sequence[str], started: float, item: str | None) -> Any:
        """What modeltap answers itself when the upstream does not serve this route, or None."""
        return None

    def areal_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body rewritten so that AReaL's proxy can render it, or None when it needs no change."""
        return None

    def count_answer(self, prompt_tokens: int) -> dict[str, Any]:
        """The answer of a `counts_prompt` format."""
        raise NotImplementedError(f"{self.name} does not answer with a token count")

    # -- budgets --------------------------------------------------------------------------------------

    def check(self, body: dict[str, Any]) -> None:
        """Refuse a body whose parts modeltap reads are of the wrong shape, with a ValueError that says
        which part and what it should be (the client gets it as a 400). Only the structure modeltap
        walks is checked; the upstream judges the rest in its own words."""
        field = self.history_field
        if field is None or field not in body:
            return
        history = body[field]
        if not isinstance(history, list):
            raise ValueError(f"{field} must be a list of objects, not {type(history).__name__}")
        for index, item in enumerate(history):
            if not isinstance(item, dict):
                raise ValueError(f"{field}[{index}] must be an object, not {type(item).__name__}")

    def completion_field(self, body: Mapping[str, Any]) -> str | None:
        """The request field carrying the completion cap M (the one the client used, else the one to
        add), or None for a format that generates nothing and so has no budget."""
        return None

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        """The prompt the served model renders for `body`. `openai_typed`: the server validates chat
        bodies against the openai SDK's types first (AReaL, docs/areal.md §1.1.6). Raises TypeError,
        KeyError or ValueError for a body that holds no renderable prompt."""
        raise ValueError(f"{self.name} requests have no prompt to count")

    # -- streams --------------------------------------------------------------------------------------

    def assembler(self) -> Assembler:
        """A fresh stream assembler for one exchange."""
        raise ValueError(f"{self.name} does not stream")

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """A final body as the SSE events that stream it, each ending in its blank line."""
        raise ValueError(f"{self.name} does not stream")

    # -- records --------------------------------------------------------------------------------------

    def read(self, reply: dict[str, Any]) -> Reading:
        """(finish reason, reply text, tool calls) of a response body."""
        return None, None, []

    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens from the body's OpenAI-style usage."""
        usage = as_dict(reply.get("usage"))
        return as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens"))

    def cache_usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """(read from, written to) the provider's prompt cache: OpenAI reports only what it read, as
        `prompt_tokens_details.cached_tokens` (Responses: `input_tokens_details`)."""
        usage = as_dict(reply.get("usage"))
        details = as_dict(usage.get("prompt_tokens_details") or usage.get("input_tokens_details"))
        return as_int(details.get("cached_tokens")), None

    def summary(self, request: Any, response: Any) -> Summary:
        """The exchange at a glance.

        >>> from modeltap.dialects import named
        >>> reply = {"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}],
        ...          "model": "None", "usage": {"prompt_tokens": 9}}
        >>> summary = named("chat").summary({"model": "m"}, reply)
        >>> summary.text, summary.finish_reason, summary.prompt_tokens, summary.model
        ('42', 'stop', 9, 'm')
        """
        reply = as_dict(response)
        finish_reason, text, tool_calls = self.read(reply)
        prompt_tokens, completion_tokens = self.usage(reply)
        model = as_str(reply.get("model"))
        if model is None or model in _NO_MODEL:
            model = as_str(as_dict(request).get("model"))
        cache_read, cache_write = self.cache_usage(reply)
        return Summary(
            finish_reason, text, tool_calls, prompt_tokens, completion_tokens, model, cache_read, cache_write
        )

    def new_messages(self, request: Any, previous: Any) -> list[Any]:
        """The messages `request` added against `previous`, the request of the turn it continues.

        Everything after the longest common prefix of the two histories, so a turn shows the previous
        reply as the agent echoed it back plus the tool results or user message that follow; a
        history the agent rewrote (compaction, a side request) shows from the first changed message.
        A system prompt kept outside the history comes first as a `{"role": "system"}` message when it
        is new or changed.
        """
        if self.history_field is None:
            return []
        current, earlier_request = as_dict(request), as_dict(previous)
        history = self.history(current)
        earlier = self.continued_history(current, earlier_request) if previous is not None else []
        start = 0
        while start < min(len(history), len(earlier)) and same_message(history[start], earlier[start]):
            start += 1
        added = history[start:]
        if self.system_field is not None:
            system = current.get(self.system_field)
            if system and (
                previous is None or not same_message(system, earlier_request.get(self.system_field))
            ):
                added.insert(0, {"role": "system", "content": system})
        return added

    def continued_history(self, request: dict[str, Any], previous: dict[str, Any]) -> list[Any]:
        """The history of `previous` that `request` repeats before what it adds."""
        return self.history(previous)

    def history(self, request: dict[str, Any]) -> list[Any]:
        """The request's conversation as a list."""
        value = request.get(self.history_field) if self.history_field else None
        return list(value) if isinstance(value, list) else []

    def conversation(
        self,
        request: dict[str, Any],
        response: dict[str, Any],
        session: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> Conversation | None:
        """The exchange as OpenAI chat messages and function tools, or None for a format that holds no
        conversation. `session` holds the (request, response) pairs of the session's earlier
        successful exchanges of this format, for a format whose requests refer back to them."""
        return None

    def tool_call_parse_failure(self, response: Any) -> bool:
        """Whether the reply says "tool call" but carries none: AReaL's sign that the model's tool-call
        output failed to parse (docs/areal.md §4.2). A model fault, not a broken run."""
        return False

    def token_ids(self, request: Any, response: Any) -> TokenIds | None:
        """The prompt and completion ids the engine returned with `response` (vLLM's and SGLang's
        extensions, docs/engines.md), or None: a format no engine returns ids for."""
        return None

    # -- translation through OpenAI chat -----------------------------------------------------------------

    def chat_request(
        self, body: dict[str, Any], earlier: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The request as an OpenAI chat request. `earlier`: the chat messages of the conversation a
        chained request continues (`previous_id`). Raises ValueError for a body it cannot convert."""
        raise ValueError(f"{self.name} requests cannot be translated to chat")

    def chat_translator(self, request: dict[str, Any]) -> ChatTranslator:
        """A fresh translator of one exchange's chat stream into this format's events."""
        raise ValueError(f"{self.name} replies cannot be translated from chat")

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        """One event of this format's stream as SSE: `event: TYPE` and its data, as Anthropic and
        Responses stream (the formats that translate)."""
        return typed_event(event)

    def upstream_error(self, status: int, error: ErrorInfo) -> tuple[int, ApiError]:
        """A chat upstream's error as this format's clients parse it, and the status to answer with.
        A context overflow becomes this format's own refusal, a 400 whatever the upstream said (AReaL
        says 500, which agents retry instead of compacting: docs/areal.md §4.1)."""
        if is_context_overflow(error):
            prompt, limit = overflow_tokens(error.message) or (None, None)
            if prompt is not None and limit is not None:
                return 400, self.context_overflow(
                    prompt, 0, limit, limit, f"The upstream said: {error.message}"
                )
            return 400, ApiError(error.message, code="context_length_exceeded", param="messages")
        fallback = "invalid_request_error" if status < 500 else "api_error"
        return status, ApiError(
            error.message or f"the upstream answered {status}",
            openai_type=_OPENAI_TYPES.get(
                status, "invalid_request_error" if status < 500 else "server_error"
            ),
            anthropic_type=_ANTHROPIC_TYPES.get(status, fallback),
            code=error.code if isinstance(error.code, str) else None,
        )

    def previous_id(self, body: dict[str, Any]) -> str | None:
        """The id of the earlier reply a request continues (Responses' `previous_response_id`), whose
        conversation modeltap keeps when it translates (the chat upstream keeps none)."""
        return None

    def reply_id(self, request: dict[str, Any], reply: dict[str, Any]) -> str | None:
        """The id a later request names to continue this reply, when the format chains and the request
        asked for the reply to be kept."""
        return None

    def continued(
        self, request: dict[str, Any], sent: dict[str, Any], reply: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """The chat messages a request continuing this exchange starts from: what went upstream (`sent`,
        a chat request) and the chat `reply`, less what each request states anew."""
        return []


# -- routes -------------------------------------------------------------------------------------------


def route_suffix(path: str) -> tuple[str | None, str]:
    """(session token, route) of a path without its query: `/s/TOKEN` and any number of leading `v1`
    segments taken off (Claude Code and the anthropic SDK append `/v1` to a base URL that already ends
    in it: docs/agents.md §4.3).

    >>> route_suffix("/s/" + "A" * 22 + "/v1/v1/messages")
    ('AAAAAAAAAAAAAAAAAAAAAA', 'messages')
    """
    rest = path.strip("/")
    token = None
    match = SESSION_PREFIX.match(rest)
    if match:
        token, rest = match.group(1), match.group(2) or ""
    while rest == "v1" or rest.startswith("v1/"):
        rest = rest[3:]
    return token, rest


# -- reading odd JSON ---------------------------------------------------------------------------------


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def dicts_in(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def first_choice(choices: Any) -> dict[str, Any]:
    """The choice with index 0, else the first one listed (OpenAI chat and completions)."""
    listed = dicts_in(choices)
    return next((choice for choice in listed if choice.get("index", 0) == 0), listed[0] if listed else {})


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, str | None]:
    """One tool call as a Summary holds it; arguments that arrived as an object (Anthropic `input`)
    become JSON text."""
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": as_str(call_id), "name": as_str(name), "arguments": arguments}


def chat_tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """One tool call as an OpenAI chat message carries it (arguments as JSON text)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_function(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    """One OpenAI chat function tool, without the fields that are None."""
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def text_of(content: Any, joiner: str = "\n") -> str:
    """Content as text: a string as it is, the text parts of a list joined."""
    if isinstance(content, str):
        return content
    return joiner.join(part["text"] for part in dicts_in(content) if isinstance(part.get("text"), str))


def part_texts(parts: Any, kind: str) -> list[str]:
    """The texts of the parts of type `kind`."""
    return [as_str(part.get("text")) or "" for part in dicts_in(parts) if part.get("type") == kind]


def same_message(a: Any, b: Any) -> bool:
    """Whether two messages are the same message. Claude Code moves its `cache_control` marker to the
    newest message each turn (docs/agents.md §4.3), so an old message that lost it is still the same."""
    return bool(a == b or pruned(a, _not_cache_control) == pruned(b, _not_cache_control))


def _not_cache_control(key: str, value: Any) -> bool:
    return key != "cache_control"


def pruned(value: Any, keep: Callable[[str, Any], bool]) -> Any:
    """A copy of `value` keeping only the object members `keep(key, value)` accepts, however deep,
    without recursion (a body nested thousands deep must not exhaust the stack). Object members come
    out in their order."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, slot = stack.pop()
        if isinstance(item, dict):
            members = [(k, v) for k, v in item.items() if keep(k, v)]
            copy: dict[str, Any] = dict.fromkeys(k for k, _ in members)
            parent[slot] = copy
            stack.extend((v, copy, k) for k, v in members)
        elif isinstance(item, list):
            items: list[Any] = [None] * len(item)
            parent[slot] = items
            stack.extend((v, items, i) for i, v in enumerate(item))
        else:
            parent[slot] = item
    return root[0]
