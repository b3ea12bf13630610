"""The Dialect protocol: what modeltap needs to know about one wire format, asked in one place, by role.

A dialect is one API format an agent speaks: OpenAI chat completions, legacy completions, Responses,
embeddings and models, Anthropic messages and count_tokens. Each lives in a module of its own in this
package, as one subclass of `Dialect`, and is listed once in the registry (`modeltap/dialects/__init__.py`).
The proxy, the records and the adapter look a format up by route or by name and ask it; none of them
branches on format names.

Every format plays two roles, and its class must provide each of their abstract methods:

- routing and errors (`Dialect`): its `name` and `route` (the path after `/v1`), `method`, whether
  AReaL serves it under `/v1` (`areal_v1`), which headers carry a key (`credential_headers`), the error
  JSON its clients parse (`error_body`) and the refusal they act on (`context_overflow`); and three
  hooks whose defaults do nothing: `local_answer`, `areal_body`, `check`. `OpenAIShaped` holds what the
  OpenAI formats share (errors, keys, usage); Anthropic's `AnthropicShaped` lives in
  modeltap/dialects/anthropic_messages.py;
- reading a body (`Dialect`): `completion_field` (the request field that caps the completion, None for a
  format that generates nothing), `prompt` (what the served template renders), `read` (finish reason,
  reply, tool calls), `usage` and `cache_usage`; from those, `summary`, and from `history_field`
  (the list a conversation grows in), `new_messages`. A format that generates nothing says so by
  `GeneratesNothing`.

and, of the optional roles, each one it plays, or else names it in `declines=` (a class that does
neither is refused when it is defined):

- `Streams`: `assembler` (rebuild the final body from events), `synthesise` (the events of a body),
  `event_bytes` (one event as SSE);
- `AsChat`: `conversation` (the exchange as OpenAI chat messages) and `tool_call_parse_failure`;
- `ThroughChat`: translation for an upstream that does not serve the format: `chat_request`,
  `chat_translator` (the format's stream written from a chat chunk stream as it arrives),
  `upstream_error`, and for a format whose requests chain to an earlier reply, `previous_id`,
  `reply_id`, `continued`;
- `ReturnsTokenIds`: `token_ids`, the prompt and completion ids an engine returned (dialects/token_ids.py);
- `TokenEndpoint`: an engine's endpoint of ids in and ids out, which `--tokens exact` sends prompts to:
  `generated`, what each choice of an answer or stream event generated;
- `CountsPrompt`: `count_answer`, for a format whose answer is the prompt's token count.

Callers ask `isinstance(dialect, Streams)` before asking a dialect to stream, and mypy narrows.

Adding a format: write `modeltap/dialects/<format>.py` with its class, `class MyFormat(OpenAIShaped,
Streams, AsChat, declines=(ThroughChat, ReturnsTokenIds, CountsPrompt))`, end it with `DIALECT = MyFormat()`,
and add that object to `DIALECTS` in `modeltap/dialects/__init__.py`.

    >>> from modeltap import dialects
    >>> chat = dialects.named("chat")
    >>> isinstance(chat, Streams), isinstance(chat, ThroughChat)
    (True, False)
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from modeltap.compat.layouts import ErrorInfo, is_context_overflow, overflow_tokens
from modeltap.dialects.base import (
    ApiError,
    Assembler,
    ChatTranslator,
    Conversation,
    Prompt,
    Reading,
    Summary,
    as_dict,
    as_int,
    as_str,
    same_message,
)

if TYPE_CHECKING:
    from modeltap.dialects.token_ids import Generated, TokenIds

# AReaL answers `"model": "None"` (docs/areal.md §1.1.6): that names no model, so the request's model is
# shown instead.
_NO_MODEL = frozenset({"", "None"})
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


class Dialect(ABC):
    """One wire format: its routing and errors, and reading its bodies. See the module's docstring for
    the optional roles a format plays or declines."""

    name: ClassVar[str]
    """The format's name in the records (`endpoint`): "chat", "messages", ..."""
    route: ClassVar[str]
    """The path after `/v1`: "chat/completions", "messages/count_tokens", ..."""
    method: ClassVar[str] = "POST"
    item_route: ClassVar[bool] = False
    """Whether `ROUTE/{id}` names one item (`GET /v1/models/{id}`)."""
    areal_v1: ClassVar[bool] = False
    """Whether AReaL serves it under `/v1` rather than at the bare path (docs/areal.md §1.1.1)."""
    request_headers: ClassVar[Mapping[str, str]] = {}
    """Headers a request of this format needs besides its body (a replay sends them)."""
    operation: ClassVar[str | None] = None
    """The call's `gen_ai.operation.name` in the GenAI conventions (docs/otel.md): "chat",
    "text_completion", "embeddings"; None for a format that calls no model."""
    provider: ClassVar[str] = "openai"
    """Whose API the format is, as `gen_ai.provider.name` names it (docs/otel.md)."""
    history_field: ClassVar[str | None] = None
    """The request field holding the conversation, a list that grows by turns (None: it has none)."""
    context_fields: ClassVar[tuple[str, ...]] = ()
    """Request fields repeated whole from turn to turn (tools, a system prompt)."""
    system_field: ClassVar[str | None] = None
    """The request field holding a system prompt kept outside the history."""
    declined: ClassVar[frozenset[type]] = frozenset()
    """The optional roles the format says it does not play."""

    def __init_subclass__(cls, declines: Sequence[type] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.declined = frozenset(declines) | cls.declined
        if inspect.isabstract(cls):
            return  # a role, or a partial format (OpenAIShaped): its subclasses are checked
        for role in ROLES:
            plays = issubclass(cls, role)
            if plays == (role in cls.declined):
                said = "both plays and declines" if plays else "neither plays nor declines"
                raise TypeError(f"dialect {cls.__name__} {said} the {role.__name__} role")

    def __repr__(self) -> str:
        return f"<dialect {self.name}>"

    # -- routing and errors ---------------------------------------------------------------------------

    @abstractmethod
    def credential_headers(self, key: str) -> dict[str, str]:
        """The headers that carry an upstream API key."""

    @abstractmethod
    def error_body(self, error: ApiError) -> dict[str, Any]:
        """The error JSON this format's clients parse."""

    @abstractmethod
    def context_overflow(
        self, prompt_tokens: int, completion_tokens: int, limit: int, max_prompt_tokens: int, note: str = ""
    ) -> ApiError:
        """The refusal of a prompt that does not fit, in the words this format's agents act on.
        `limit` is the most prompt + completion tokens, `completion_tokens` what the client asked for
        (0: none), `max_prompt_tokens` the most prompt tokens that leave room for the completion."""

    def local_answer(self, served_models: Sequence[str], started: float, item: str | None) -> Any:
        """A hook: what modeltap answers itself when the upstream does not serve this route, or None."""
        return None

    def areal_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """A hook: the body rewritten so that AReaL's proxy can render it, or None when it needs no change."""
        return None

    def check(self, body: dict[str, Any]) -> None:
        """A hook: refuse a body whose parts modeltap reads are of the wrong shape, with a ValueError
        that says which part and what it should be (the client gets it as a 400). Only the structure
        modeltap walks is checked; the upstream judges the rest in its own words. By default, the
        history must be a list of objects."""
        field = self.history_field
        if field is None or field not in body:
            return
        history = body[field]
        if not isinstance(history, list):
            raise ValueError(f"{field} must be a list of objects, not {type(history).__name__}")
        for index, item in enumerate(history):
            if not isinstance(item, dict):
                raise ValueError(f"{field}[{index}] must be an object, not {type(item).__name__}")

    # -- reading a body -------------------------------------------------------------------------------

    @abstractmethod
    def completion_field(self, body: Mapping[str, Any]) -> str | None:
        """The request field carrying the completion cap M (the one the client used, else the one to
        add), or None for a format that generates nothing and so has no budget."""

    @abstractmethod
    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        """The prompt the served model renders for `body`. `openai_typed`: the server validates chat
        bodies against the openai SDK's types first (AReaL, docs/areal.md §1.1.6). Raises TypeError,
        KeyError or ValueError for a body that holds no renderable prompt."""

    @abstractmethod
    def read(self, reply: dict[str, Any]) -> Reading:
        """(finish reason, reply text, tool calls) of a response body."""

    @abstractmethod
    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens a response body reports."""

    @abstractmethod
    def cache_usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """(read from, written to) the provider's prompt cache, as the response body reports them."""

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
        is new or changed. A format with no history adds no messages.
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


class OpenAIShaped(Dialect):
    """What the OpenAI formats share: keys as `Authorization: Bearer`, errors as `{"error": {...}}`,
    the `context_length_exceeded` refusal, and OpenAI-style usage."""

    def credential_headers(self, key: str) -> dict[str, str]:
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
        """OpenAI's `context_length_exceeded`, whose text agents compact on (docs/token-budgets.md §4),
        then `note`."""
        return ApiError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the messages, "
            f"{completion_tokens} in the completion). Please reduce the length of the messages or "
            f"completion. {note}".rstrip(),
            code="context_length_exceeded",
            param="messages",
        )

    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """(prompt, completion) tokens from the body's OpenAI-style usage."""
        usage = as_dict(reply.get("usage"))
        return as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens"))

    def cache_usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """OpenAI reports only what it read, as `prompt_tokens_details.cached_tokens` (Responses:
        `input_tokens_details`)."""
        usage = as_dict(reply.get("usage"))
        details = as_dict(usage.get("prompt_tokens_details") or usage.get("input_tokens_details"))
        return as_int(details.get("cached_tokens")), None


class GeneratesNothing(Dialect):
    """What a format that calls no generation says when asked to read a body (models, embeddings, a
    token count): no completion cap, no prompt, no reply."""

    def completion_field(self, body: Mapping[str, Any]) -> None:
        return None

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        raise ValueError(f"{self.name} requests have no prompt a chat template renders")

    def read(self, reply: dict[str, Any]) -> Reading:
        return None, None, []


class Streams(Dialect):
    """The role of a format that answers `stream: true` with server-sent events."""

    @abstractmethod
    def assembler(self) -> Assembler:
        """A fresh stream assembler for one exchange."""

    @abstractmethod
    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """A final body as the SSE events that stream it, each ending in its blank line."""

    @abstractmethod
    def event_bytes(self, event: dict[str, Any]) -> bytes:
        """One event of this format's stream as SSE, ending in its blank line."""


class AsChat(Dialect):
    """The role of a format whose exchanges hold a conversation, read as OpenAI chat."""

    @abstractmethod
    def conversation(
        self,
        request: dict[str, Any],
        response: dict[str, Any],
        session: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> Conversation:
        """The exchange as OpenAI chat messages and function tools. `session` holds the (request,
        response) pairs of the session's earlier successful exchanges of this format, for a format
        whose requests refer back to them."""

    @abstractmethod
    def tool_call_parse_failure(self, response: Any) -> bool:
        """Whether the reply says "tool call" but carries none: AReaL's sign that the model's tool-call
        output failed to parse (docs/areal.md §4.2). A model fault, not a broken run."""


class ThroughChat(Streams):
    """The role of a format modeltap translates through OpenAI chat for an upstream that does not serve
    it: the request as chat, and the chat answer (a stream as it arrives) back in this format."""

    @abstractmethod
    def chat_request(
        self, body: dict[str, Any], earlier: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The request as an OpenAI chat request. `earlier`: the chat messages of the conversation a
        chained request continues (`previous_id`). Raises ValueError for a body it cannot convert."""

    @abstractmethod
    def chat_translator(self, request: dict[str, Any]) -> ChatTranslator:
        """A fresh translator of one exchange's chat stream into this format's events."""

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
        conversation modeltap keeps when it translates (the chat upstream keeps none); None for a
        format whose requests do not chain."""
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


class ReturnsTokenIds(Dialect):
    """The role of a format an engine returns token ids for (vLLM's and SGLang's extensions to OpenAI
    chat and completions: docs/engines.md)."""

    @abstractmethod
    def token_ids(self, request: Any, response: Any) -> TokenIds | None:
        """The prompt and completion ids the engine returned with `response`, or None."""


class TokenEndpoint(ReturnsTokenIds, Streams):
    """The role of an engine's own endpoint that takes a prompt of token ids and answers generated ids
    (vLLM's `/v1/completions`, SGLang's `/generate`), which `serve --tokens exact` sends prompts to."""

    @abstractmethod
    def generated(self, body: Any, *, streamed: bool) -> list[Generated]:
        """What each choice of an answer (`streamed`: one stream event) generated."""


class CountsPrompt(Dialect):
    """The role of a format whose answer is the prompt's token count, which modeltap gives itself."""

    @abstractmethod
    def count_answer(self, prompt_tokens: int) -> dict[str, Any]:
        """The answer for a prompt of `prompt_tokens` tokens."""


ROLES: tuple[type[Dialect], ...] = (
    Streams,
    AsChat,
    ThroughChat,
    ReturnsTokenIds,
    TokenEndpoint,
    CountsPrompt,
)
"""The optional roles: a format plays each or declines it."""
