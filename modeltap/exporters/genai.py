"""The OpenTelemetry GenAI semantic conventions as modeltap applies them: what a span says of an exchange.

Owns: every name and shape the conventions fix (attribute keys, operation and finish-reason values, the
message JSON), the snapshot of an exchange that a span is made of (`Call`), and the cutting of exported
content to size. The conventions are still marked Development, so all of that is here and nowhere else;
docs/otel.md cites the version followed and lists the mapping. Plain functions over dicts with no
OpenTelemetry import: the SDK side (queue, exporter, span objects) is otlp.py. Does not own: reading a
format's bodies (its dialect's summary and conversion to chat).

    call = Call.of_exchange(exchange, content=False)
    span_name(dialects.of_record(call.endpoint), call), attributes(call, content=False)
    ('chat qwen', {'gen_ai.operation.name': 'chat', 'gen_ai.request.model': 'qwen', ...})
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from modeltap import dialects
from modeltap.dialects.base import Summary, as_dict, as_float, as_int, as_str, dicts_in, text_of
from modeltap.dialects.roles import AsChat, Dialect
from modeltap.exporters import openinference
from modeltap.records.exchange import BudgetRecord, Exchange
from modeltap.records.jsontext import dumps, safe_text

Value = str | bool | int | float | Sequence[str]
"""An attribute value as OpenTelemetry takes it (the kinds this mapping uses)."""

# Each text in the exported content (a message part, tool arguments, a tool result, a description) is
# cut here: agents paste whole files into tool results, and one of them is not worth 100 KB per span.
CONTENT_TEXT_MAX_CHARS = 8192
# Each content attribute's JSON stays under this, the oldest messages left out first: a long session's
# history would otherwise repeat in full on every span.
CONTENT_ATTRIBUTE_MAX_CHARS = 256 * 1024
# The name of the budget decision's span event.
BUDGET_EVENT = "modeltap.budget"
# The output-message schema's finish reasons, for the reasons the formats use.
_FINISH_REASONS = {
    "tool_calls": "tool_call",
    "function_call": "tool_call",
    "tool_use": "tool_call",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
}


@dataclass(frozen=True, slots=True)
class Knobs:
    """The request settings a span reports, read from the body the model got (after a clamp)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None

    @classmethod
    def of(cls, dialect: Dialect, body: Any) -> Knobs:
        if not isinstance(body, dict):
            return cls()
        cap = dialect.completion_field(body)
        stream = body.get("stream")
        return cls(
            as_str(body.get("model")),
            as_int(body.get(cap)) if cap else None,
            as_float(body.get("temperature")),
            as_float(body.get("top_p")),
            stream if isinstance(stream, bool) else None,
        )


# Fields a Call copies as they are from an exchange or a record.
_COPIED = (
    "id", "endpoint", "session_id", "labels", "started", "first_byte", "ended", "status", "streamed",
    "stream_complete", "budget", "error_class", "error_message", "upstream_url", "user_agent",
)  # fmt: skip


@dataclass(slots=True)
class Call:
    """What a span is made of: a live exchange or a recorded one, read once. `request` is the body as
    the client sent it, kept only when content is exported; `response` a dict, or the upstream's bytes
    (parsed on the worker thread). Nothing writes a Call once made; it is not frozen because a frozen
    dataclass's `__init__` costs the event loop about half as much again (measured: 12 against 8 µs)."""

    id: str
    endpoint: str | None
    session_id: str | None
    labels: Mapping[str, str]
    started: float
    first_byte: float | None
    ended: float | None
    status: int | None
    streamed: bool
    stream_complete: bool | None
    budget: BudgetRecord | None
    error_class: str | None
    error_message: str | None
    upstream_url: str | None
    user_agent: str | None
    knobs: Knobs = field(default_factory=Knobs)
    request: Any = None
    response: Any = None

    @classmethod
    def of_record(cls, row: Mapping[str, Any], *, content: bool) -> Call:
        """A recorded exchange (a StoreReader row with bodies)."""
        dialect = dialects.of_record(row["endpoint"])
        sent = row["sent"] if row["sent"] is not None else row["request"]
        copied = {name: row[name] for name in _COPIED} | {"budget": BudgetRecord.from_json(row["budget"])}
        return cls(
            **copied,
            knobs=Knobs.of(dialect, sent),
            request=row["request"] if content else None,
            response=row["response"],
        )

    @classmethod
    def of_exchange(cls, ex: Exchange, *, content: bool) -> Call:
        """A sealed exchange, as the relay hands it over (on the event loop: no parsing here)."""
        return cls(
            **{name: getattr(ex, name) for name in _COPIED},
            knobs=Knobs.of(
                dialects.of_record(ex.endpoint), ex.sent if ex.sent is not None else ex.request_json
            ),
            request=ex.request_json if content else None,
            response=ex.response if ex.response is not None else ex.response_body,
        )


# -- the mapping ----------------------------------------------------------------------------------------


def span_name(dialect: Dialect, call: Call) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}`; a call of no model is named by its format."""
    if dialect.operation is None:
        return call.endpoint or "unrouted"
    name = f"{dialect.operation} {call.knobs.model}" if call.knobs.model else dialect.operation
    return safe_text(name) or ""


def attributes(call: Call, *, content: bool) -> dict[str, Value]:
    """The span's attributes (docs/otel.md §2): what the conventions name, the session as both
    `gen_ai.conversation.id` and Phoenix's `session.id`, its labels, and modeltap's own."""
    dialect = dialects.of_record(call.endpoint)
    reply = _reply(call.response)
    summary = dialect.summary({"model": call.knobs.model}, reply)
    attrs: dict[str, Value | None] = {}
    if dialect.operation is not None:
        attrs |= _model_call(dialect, call, reply, summary)
        model = call.knobs.model or summary.model
        attrs |= openinference.attributes_of_call(model, summary.prompt_tokens, summary.completion_tokens)
    attrs |= {
        "gen_ai.conversation.id": call.session_id,
        "session.id": call.session_id,
        "http.response.status_code": call.status,
        "error.type": call.error_class,
        "user_agent.original": call.user_agent,
        "modeltap.exchange.id": call.id,
        "modeltap.endpoint": call.endpoint,
        "modeltap.stream.complete": call.stream_complete if call.streamed else None,
    }
    attrs |= _server(call.upstream_url)
    attrs |= {f"modeltap.label.{key}": str(value) for key, value in call.labels.items()}
    if content and isinstance(call.request, dict):
        attrs |= _content(dialect, call.request, reply, summary.finish_reason)
    return exportable(attrs)


def exportable(attrs: Mapping[str, Value | None]) -> dict[str, Value]:
    """The attributes OTLP can carry, each as it can: text with a lone surrogate as its escape (UTF-8
    cannot encode it), and an integer past OTLP's signed 64 bits left out, like a None. One such value
    would otherwise cost its attribute, or (in a span's name) the whole batch of spans sent with it."""
    out: dict[str, Value] = {}
    for key, value in attrs.items():
        if isinstance(value, str):
            out[safe_text(key) or ""] = safe_text(value) or ""
        elif isinstance(value, int) and not isinstance(value, bool):
            if -(2**63) <= value < 2**63:
                out[safe_text(key) or ""] = value
        elif isinstance(value, list | tuple):
            out[safe_text(key) or ""] = [safe_text(item) or "" for item in value]
        elif value is not None:
            out[safe_text(key) or ""] = value
    return out


def _model_call(
    dialect: Dialect, call: Call, reply: dict[str, Any], summary: Summary
) -> dict[str, Value | None]:
    knobs = call.knobs
    answered = call.error_class is None and bool(reply)
    first_chunk = call.first_byte - call.started if call.streamed and call.first_byte else None
    return {
        "gen_ai.operation.name": dialect.operation,
        "gen_ai.provider.name": dialect.provider,
        "gen_ai.request.model": knobs.model,
        "gen_ai.request.max_tokens": knobs.max_tokens,
        "gen_ai.request.temperature": knobs.temperature,
        "gen_ai.request.top_p": knobs.top_p,
        "gen_ai.request.stream": bool(knobs.stream),
        "gen_ai.response.model": summary.model if answered else None,
        "gen_ai.response.id": as_str(reply.get("id")) if answered else None,
        "gen_ai.response.finish_reasons": [summary.finish_reason] if summary.finish_reason else None,
        "gen_ai.usage.input_tokens": summary.prompt_tokens,
        "gen_ai.usage.output_tokens": summary.completion_tokens,
        "gen_ai.usage.cache_read.input_tokens": summary.cache_read_tokens,
        "gen_ai.usage.cache_creation.input_tokens": summary.cache_write_tokens,
        "gen_ai.response.time_to_first_chunk": round(first_chunk, 6) if first_chunk is not None else None,
    }


def _server(upstream_url: str | None) -> dict[str, Value | None]:
    """`server.address` and `server.port` of the upstream; never its path or query, which may carry a key."""
    if not upstream_url:
        return {}
    address, port = _host_and_port(upstream_url)
    return {"server.address": address, "server.port": port}


# A proxy talks to a handful of upstreams: parsing each URL once saves the worker a tenth of a span's mapping.
@functools.lru_cache(maxsize=64)
def _host_and_port(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    try:
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return parts.hostname, None


def budget_event(call: Call) -> dict[str, Value] | None:
    """The attributes of the budget decision's event (BUDGET_EVENT: the counted prompt tokens, and
    pass, clamp or reject), or None when the exchange had no budget."""
    if not call.budget:
        return None
    values = {f"modeltap.budget.{key}": value for key, value in dataclasses.asdict(call.budget).items()}
    return exportable(
        {key: value for key, value in values.items() if isinstance(value, str | bool | int | float)}
    )


def error_description(call: Call, *, content: bool) -> str | None:
    """The error status's description, or None for an answered call: the error class, and with content
    its message (which may quote the prompt)."""
    if call.error_class is None:
        return None
    message = call.error_message if content and call.error_message else None
    return safe_text(f"{call.error_class}: {_cut(message)}" if message else call.error_class)


# -- content: messages in the conventions' JSON shapes -----------------------------------------------------


def _content(
    dialect: Dialect, request: dict[str, Any], reply: dict[str, Any], finish_reason: str | None
) -> dict[str, Value]:
    """`gen_ai.input.messages`, `gen_ai.output.messages`, `gen_ai.system_instructions` and
    `gen_ai.tool.definitions`, from the exchange as OpenAI chat (its dialect's conversion, whatever the
    format): the reply is what the conversation gained over the request's alone; and the same as
    OpenInference's `input.value`, `output.value` and flattened messages (openinference.py)."""
    if not isinstance(dialect, AsChat):
        return {}
    try:
        whole, asked = dialect.conversation(request, reply), dialect.conversation(request, {})
    except (TypeError, ValueError, AttributeError):  # a body the conversion cannot read: no content
        return {"modeltap.content.unreadable": True}
    same = 0
    while (
        same < min(len(whole.messages), len(asked.messages)) and whole.messages[same] == asked.messages[same]
    ):
        same += 1
    asked_chat = list(whole.messages[:same])
    history = [_message(m) for m in asked_chat]
    if history and history[-1]["role"] == "assistant" and not history[-1]["parts"]:
        history.pop()  # the empty reply a failed exchange's conversion ends with
        asked_chat.pop()
    system: list[dict[str, Any]] = []
    while dialect.system_field is not None and history and history[0]["role"] == "system":
        system += history.pop(0)["parts"]
    finish = _FINISH_REASONS.get(finish_reason or "stop", finish_reason or "stop")
    answer = [m | {"finish_reason": finish} for m in map(_message, whole.messages[same:]) if m["parts"]]
    out: dict[str, Value] = {}
    left_out = 0
    for key, items in (
        ("gen_ai.system_instructions", system),
        ("gen_ai.input.messages", history),
        ("gen_ai.output.messages", answer),
        ("gen_ai.tool.definitions", [_tool(t) for t in whole.tools]),
    ):
        if items:
            out[key], dropped = _fit(items)
            left_out += dropped
    if left_out:
        out["modeltap.content.left_out"] = left_out
    # The same conversation as OpenInference readers (Phoenix's Sessions tab) read it.
    answered = [m for m in whole.messages[same:] if _message(m)["parts"]]
    out |= openinference.content_attributes(asked_chat, answered, cut=_cut, limit=CONTENT_ATTRIBUTE_MAX_CHARS)
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as a GenAI message: reasoning, text, tool calls and tool results as parts;
    images and other media named by their type, not exported."""
    role = as_str(message.get("role")) or "user"
    parts: list[dict[str, Any]] = []
    reasoning = as_str(message.get("reasoning_content")) or as_str(message.get("reasoning"))
    if reasoning:
        parts.append({"type": "reasoning", "content": _cut(reasoning)})
    if role == "tool":
        result = _cut(text_of(message.get("content")))
        parts.append({"type": "tool_call_response", "id": message.get("tool_call_id"), "response": result})
    else:
        parts += _parts(message.get("content"))
    for call in dicts_in(message.get("tool_calls")):
        function = as_dict(call.get("function"))
        arguments = _arguments(function.get("arguments"))
        parts.append(
            {"type": "tool_call", "id": call.get("id"), "name": function.get("name"), "arguments": arguments}
        )
    out = {"role": "system" if role == "developer" else role, "parts": parts}
    return out | ({"name": message["name"]} if isinstance(message.get("name"), str) else {})


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": _cut(content)}] if content else []
    return [
        {"type": "text", "content": _cut(as_str(part.get("text")) or "")}
        if part.get("type") == "text"
        else {"type": as_str(part.get("type")) or "unknown"}
        for part in dicts_in(content)
    ]


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool by type, name and description; its parameters schema is left out, as the
    conventions recommend for what is not required."""
    function = as_dict(tool.get("function"))
    description = as_str(function.get("description"))
    out = {"type": "function", "name": function.get("name")}
    return out | ({"description": _cut(description)} if description else {})


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as the object they encode when they fit, else their text, cut."""
    if not isinstance(arguments, str):
        return arguments
    if len(arguments) <= CONTENT_TEXT_MAX_CHARS:
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):  # not JSON, or nested past what Python's parser reads
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    return _cut(arguments)


def _cut(text: str) -> str:
    if len(text) <= CONTENT_TEXT_MAX_CHARS:
        return text
    return f"{text[:CONTENT_TEXT_MAX_CHARS]}… [{len(text) - CONTENT_TEXT_MAX_CHARS} more characters]"


def _fit(items: list[dict[str, Any]]) -> tuple[str, int]:
    """`items` as a JSON array under CONTENT_ATTRIBUTE_MAX_CHARS, leaving out the first ones as needed,
    and how many were left out (always valid JSON, which a cut would not be)."""
    texts = [dumps(item, compact=False) for item in items]
    size, start = sum(len(text) + 1 for text in texts) + 1, 0
    while size > CONTENT_ATTRIBUTE_MAX_CHARS and start < len(texts):
        size -= len(texts[start]) + 1
        start += 1
    return "[" + ",".join(texts[start:]) + "]", start


# -- small readers ------------------------------------------------------------------------------------------


def _reply(response: Any) -> dict[str, Any]:
    """The response as a JSON object: a dict as it is, an upstream's bytes parsed, anything else empty."""
    if isinstance(response, bytes | bytearray):
        try:
            response = json.loads(response)
        except (ValueError, RecursionError):
            return {}
    return as_dict(response)
