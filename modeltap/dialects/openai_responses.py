"""OpenAI Responses: `POST /v1/responses`, input items in, output items out (Codex speaks only this).

Owns: the route, `max_output_tokens` as its completion cap, the prompt (as AReaL renders it), the
typed event stream in both directions, the reply's text and function calls (a status stands for the
finish reason), what a turn added (all of it when chained by `previous_response_id`), and the
conversation as OpenAI chat for export.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from modeltap.dialects.base import (
    ChatPrompt,
    Conversation,
    Dialect,
    Prompt,
    Reading,
    as_dict,
    as_int,
    as_str,
    chat_function,
    chat_tool_call,
    dicts_in,
    part_texts,
    pruned,
    text_of,
    tool_call,
)
from modeltap.dialects.sse import Pieces, index_of, kind_of, list_of, named_event

# Final events: each carries the whole response.
_FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _ResponseEvents:
    """`response.completed` (or `.incomplete` / `.failed`) carries the whole final response. Until it
    arrives, output items are rebuilt from `output_item.*`, `content_part.*` and the text deltas, so a
    stream cut short still records what was said."""

    END: ClassVar[str] = "response.completed"
    # delta event -> (item field holding the parts, or None for a field of the item; field extended)
    _DELTAS: ClassVar[dict[str, tuple[str | None, str]]] = {
        "response.output_text.delta": ("content", "text"),
        "response.refusal.delta": ("content", "refusal"),
        "response.reasoning_text.delta": ("content", "text"),
        "response.reasoning_summary_text.delta": ("summary", "text"),
        "response.function_call_arguments.delta": (None, "arguments"),
        "response.custom_tool_call_input.delta": (None, "input"),
    }
    _ITEMS = frozenset({"response.output_item.added", "response.output_item.done"})
    _PARTS: ClassVar[dict[str, str]] = {
        "response.content_part.added": "content",
        "response.reasoning_summary_part.added": "summary",
    }

    def __init__(self) -> None:
        self._response: dict[str, Any] | None = None
        self._final = False
        self._items: dict[int, dict[str, Any]] = {}
        self._pieces = Pieces()

    def add(self, obj: dict[str, Any]) -> bool:
        kind = kind_of(obj)
        if isinstance(obj.get("response"), dict):
            self._response = obj["response"]
            self._final = kind in _FINAL
            return self._final
        output = index_of(obj.get("output_index"))
        if kind in self._ITEMS and isinstance(obj.get("item"), dict):
            self._items[output] = dict(obj["item"])
            if kind == "response.output_item.done":
                self._pieces.drop(lambda key: key[0] != output)
        elif kind in self._PARTS and isinstance(obj.get("part"), dict):
            number = index_of(obj.get("summary_index", obj.get("content_index")))
            _parts(self._items.setdefault(output, {}), self._PARTS[kind], number)[number] = dict(obj["part"])
        elif kind in self._DELTAS:
            container, field = self._DELTAS[kind]
            number = index_of(obj.get("summary_index", obj.get("content_index")))
            self._pieces.add((output, container, number, field), obj.get("delta"))
        return False

    def body(self) -> dict[str, Any] | None:
        if self._final or (self._response is None and not self._items and not self._pieces.keys()):
            return self._response
        response = dict(self._response or {"object": "response"})
        items = {index: dict(item) for index, item in self._items.items()}
        for key in self._pieces.keys():
            output, container, number, field = key
            target = items.setdefault(output, {})
            if container is not None:
                target = _parts(target, container, number)[number]
            target[field] = str(target.get(field) or "") + self._pieces.get(key)
        response["output"] = [items[index] for index in sorted(items)]
        return response


def _parts(item: dict[str, Any], container: str, number: int) -> list[dict[str, Any]]:
    """Give `item` its own copy of the part list `container`, with a dict at every index up to
    `number`, so parts can be filled in without touching what an earlier event stored."""
    parts = [dict(part) if isinstance(part, dict) else {} for part in list_of(item.get(container))]
    parts.extend({} for _ in range(number + 1 - len(parts)))
    item[container] = parts
    return parts


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """One output item as its added, part, delta and done events (each text and argument in one delta)."""
    at = {"output_index": index, "item_id": item.get("id")}
    kind = item.get("type")
    shell = (
        {**item, "content": []}
        if kind == "message"
        else {**item, "arguments": ""}
        if kind == "function_call"
        else item
    )
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": index, "item": shell}
    ]
    for part_index, part in enumerate(item.get("content") or [] if kind == "message" else []):
        where = {**at, "content_index": part_index}
        events.append({"type": "response.content_part.added", **where, "part": {**part, "text": ""}})
        if part.get("type") == "output_text":
            events.append({"type": "response.output_text.delta", **where, "delta": part.get("text", "")})
            events.append({"type": "response.output_text.done", **where, "text": part.get("text", "")})
        events.append({"type": "response.content_part.done", **where, "part": part})
    if kind == "function_call":
        arguments = item.get("arguments", "")
        events.append({"type": "response.function_call_arguments.delta", **at, "delta": arguments})
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": arguments})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


class Responses(Dialect):
    name = "responses"
    route = "responses"
    streams = True
    history_field = "input"
    context_fields = ("tools", "instructions")
    system_field = "instructions"
    # The conventions' inference span covers the Responses API too, as "chat" (docs/otel.md §2).
    operation = "chat"

    def completion_field(self, body: Any) -> str:
        return "max_output_tokens"

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        """`instructions` and `input` as chat messages, the way AReaL's ArealOpenAI converts them
        (areal/experimental/openai/client.py `_build_messages_list`, docs/areal.md §1.1.9): every text
        part of an input item becomes its own message, a function_call_output a tool message, other
        items pass as they are."""
        messages: list[Any] = []
        if body.get("instructions") is not None:
            messages.append({"role": "system", "content": body["instructions"]})
        items = body["input"]
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        for item in items:
            item = pruned(item, _not_none)
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, str):
                messages.append({"role": item["role"], "content": content})
            elif isinstance(content, list) and any(p.get("type") == "input_image" for p in content):
                messages.append({"role": item["role"], "content": content})
            elif isinstance(content, list):
                messages.extend({"role": item["role"], "content": p["text"]} for p in content if "text" in p)
            elif isinstance(item, dict) and item.get("type") == "function_call_output":
                tool = {"role": "tool", "content": item["output"]}
                messages.append({**tool, "tool_call_id": item["call_id"]} if "call_id" in item else tool)
            else:
                messages.append(item)
        tools = body.get("tools")
        kwargs = body.get("chat_template_kwargs")
        return ChatPrompt(
            messages, list(tools) if tools else None, kwargs if isinstance(kwargs, dict) else {}
        )

    def assembler(self) -> _ResponseEvents:
        return _ResponseEvents()

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """created, in_progress, each output item, then the final event its status calls for, carrying
        the whole response."""
        opening = {**body, "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opening},
            {"type": "response.in_progress", "response": opening},
        ]
        for index, item in enumerate(body.get("output") or []):
            events += _item_events(index, item)
        final = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
            body.get("status") or ""
        )
        events.append({"type": final or "response.completed", "response": body})
        return [named_event(e.pop("type"), {**e, "sequence_number": n}) for n, e in enumerate(events)]

    def read(self, reply: dict[str, Any]) -> Reading:
        # Responses has no finish reason: the status says it ("completed", "failed"), and an incomplete
        # response says why ("max_output_tokens", "content_filter").
        status = as_str(reply.get("status"))
        reason = as_str(as_dict(reply.get("incomplete_details")).get("reason"))
        texts: list[str] = []
        calls = []
        for item in dicts_in(reply.get("output")):
            kind = item.get("type")
            if kind == "message":
                texts += part_texts(item.get("content"), "output_text")
            elif kind == "function_call":
                calls.append(tool_call(item.get("call_id"), item.get("name"), item.get("arguments")))
            elif kind == "custom_tool_call":
                calls.append(tool_call(item.get("call_id"), item.get("name"), item.get("input")))
        finish = reason if status == "incomplete" and reason else status
        return finish, "".join(texts) if texts else None, calls

    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        usage = as_dict(reply.get("usage"))
        if "input_tokens" in usage or "output_tokens" in usage:
            return as_int(usage.get("input_tokens")), as_int(usage.get("output_tokens"))
        return super().usage(reply)

    def check(self, body: dict[str, Any]) -> None:
        """`input` is text or a list of items (objects, or text)."""
        items = body.get("input")
        if items is None or isinstance(items, str):
            return
        if not isinstance(items, list):
            raise ValueError(f"input must be text or a list of items, not {type(items).__name__}")
        for index, item in enumerate(items):
            if not isinstance(item, dict | str):
                raise ValueError(f"input[{index}] must be an object or text, not {type(item).__name__}")

    def continued_history(self, request: dict[str, Any], previous: dict[str, Any]) -> list[Any]:
        """A request chained by `previous_response_id` sends only new input: it repeats nothing."""
        return [] if request.get("previous_response_id") else self.history(previous)

    def history(self, request: dict[str, Any]) -> list[Any]:
        """A bare `input` string is one user message."""
        value = request.get("input")
        return [{"role": "user", "content": value}] if isinstance(value, str) else super().history(request)

    def conversation(
        self,
        request: dict[str, Any],
        response: dict[str, Any],
        session: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> Conversation:
        """Input and output items as chat messages; a request chained by `previous_response_id` gets
        its earlier turns from `session`."""
        items = [*_items(request.get("input")), *(response.get("output") or [])]
        by_id = {answer.get("id"): (before, answer) for before, answer in session}
        seen = {id(request)}
        previous = by_id.get(request.get("previous_response_id"))
        while previous is not None and id(previous[0]) not in seen:
            before, answer = previous
            seen.add(id(before))
            items = [*_items(before.get("input")), *(answer.get("output") or []), *items]
            previous = by_id.get(before.get("previous_response_id"))
        tools = [
            chat_function(t.get("name"), t.get("description"), t.get("parameters"))
            for t in request.get("tools") or []
            if isinstance(t, dict) and t.get("name") and "parameters" in t
        ]
        return Conversation(_chat_messages(request.get("instructions"), items), tools)


def _items(value: Any) -> list[Any]:
    return [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])


def _chat_messages(instructions: Any, items: Sequence[Any]) -> list[dict[str, Any]]:
    """Input and output items as OpenAI chat messages: message items by role, function calls gathered
    onto the assistant message they follow, their outputs as `role: tool`."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    for item in dicts_in(items):
        kind = item.get("type", "message")
        if kind == "function_call":
            call = chat_tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": text_of(item.get("output"))}
            )
        elif kind == "message" and item.get("role"):
            out.append({"role": item["role"], "content": text_of(item.get("content"), "")})
    return out


def _not_none(key: str, value: Any) -> bool:
    return value is not None


DIALECT = Responses()
