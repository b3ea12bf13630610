"""What every wire format shares: the shapes a dialect returns (ApiError, ChatPrompt, TextPrompt,
Summary, Conversation, Reading, the Assembler and ChatTranslator protocols), routes with their session
and `/v1` prefixes, and readers of odd JSON.

Owns: those types and the helpers formats read bodies with. Does not own: the Dialect protocol and its
roles (roles.py) or any one format (its module).

Plain functions and classes over bytes and dicts: no I/O, no aiohttp. Stored bodies come from any
upstream, so every reader here takes odd JSON (a missing field, a field of the wrong type) as absent
and never raises on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

# The path prefix of a session URL, `/s/TOKEN/...` (modeltap.proxy.sessions issues the tokens).
SESSION_PREFIX = re.compile(r"^s/([A-Za-z0-9_-]{16,128})(?:/(.*))?$")


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

    def whole(self) -> bool:
        """Whether the events so far are a whole stream though END never came: a format whose streams
        may end without their terminal event says here when its own events finish it
        (docs/engines.md §8)."""
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
        reason (then `fail` ends it)."""
        ...

    def fail(self, message: str) -> list[dict[str, Any]]:
        """The events that end the stream when the chat stream ended without its finish reason (or
        was no chat stream): the format's own error, so the client's stream still ends in an event
        its SDK reads, not in silence."""
        ...


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


def as_float(value: Any) -> float | None:
    """A number as a float; None for what is not one, or an integer past a float's range (a JSON
    number of 400 digits)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


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
