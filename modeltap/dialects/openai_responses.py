"""OpenAI Responses: `POST /v1/responses`, input items in, output items out (Codex speaks only this).

Owns: the route, `max_output_tokens` as its completion cap, the prompt (as AReaL renders it), the
typed event stream in both directions, the reply's text and function calls (a status stands for the
finish reason), what a turn added (all of it when chained by `previous_response_id`), and the
conversation as OpenAI chat for export.

Translation (an upstream that serves chat but not Responses): `instructions` and input items become
chat messages (developer messages as system ones, the leading ones joined, since most chat templates
take one system message; function calls and their outputs as tool calls and tool messages; reasoning
items as the next assistant message's `reasoning_content`), function tools become chat functions (other
tools need OpenAI's servers), and the reply comes back as the Responses event stream, written from the
chat chunks as they arrive. A chat server keeps no responses, so modeltap keeps each translated
reply's conversation for a later `previous_response_id` (proxy/translate.py).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from modeltap.compat.areal import responses_body_for_areal
from modeltap.dialects.base import (
    ChatPrompt,
    Conversation,
    Prompt,
    Reading,
    as_dict,
    as_int,
    as_str,
    chat_function,
    chat_tool_call,
    dicts_in,
    first_choice,
    part_texts,
    pruned,
    text_of,
    tool_call,
)
from modeltap.dialects.openai_chat import ChatDeltas, request_options
from modeltap.dialects.roles import (
    AsChat,
    CountsPrompt,
    OpenAIShaped,
    ReturnsTokenIds,
    ThroughChat,
    TokenEndpoint,
)
from modeltap.dialects.sse import Pieces, index_of, kind_of, list_of, named_event, typed_event

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

    def whole(self) -> bool:
        """A Responses stream is whole only at its terminal response event."""
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
    for part_index, part in enumerate(dicts_in(item.get("content")) if kind == "message" else []):
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


class Responses(OpenAIShaped, ThroughChat, AsChat, declines=(ReturnsTokenIds, CountsPrompt, TokenEndpoint)):
    """No engine returns token ids for Responses; modeltap asks for them on the chat it translates to."""

    name = "responses"
    route = "responses"
    history_field = "input"
    context_fields = ("tools", "instructions")
    system_field = "instructions"
    # The conventions' inference span covers the Responses API too, as "chat" (docs/otel.md §2).
    operation = "chat"

    def completion_field(self, body: Any) -> str:
        return "max_output_tokens"

    def areal_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body AReaL can take, or None when it needs no change (compat.areal)."""
        return responses_body_for_areal(body)

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

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        """`event: TYPE` and its data, as the Responses API streams."""
        return typed_event(event)

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """created, in_progress, each output item, then the final event its status calls for, carrying
        the whole response."""
        opening = {**body, "status": "in_progress", "output": []}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": opening},
            {"type": "response.in_progress", "response": opening},
        ]
        for index, item in enumerate(dicts_in(body.get("output"))):
            events += _item_events(index, item)
        final = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
            as_str(body.get("status")) or ""
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

    def tool_call_parse_failure(self, response: Any) -> bool:
        """False: no Responses server signals a tool call that did not parse (AReaL's sign is chat's
        `finish_reason: tool_calls` with no call, docs/areal.md §4.2)."""
        return False

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

    def chat_request(
        self, body: dict[str, Any], earlier: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The body as a chat request for a chat server (see the module docstring); `earlier` is the
        conversation of the response `previous_response_id` names."""
        conversation = [*(earlier or []), *_chat_messages(None, _items(body.get("input")), for_server=True)]
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            conversation.insert(0, {"role": "system", "content": instructions})
        chat: dict[str, Any] = {"model": body.get("model"), "messages": _leading_systems_joined(conversation)}
        tools = [
            chat_function(t.get("name"), t.get("description"), t.get("parameters"))
            for t in dicts_in(body.get("tools"))
            if t.get("type") == "function" and isinstance(t.get("name"), str)
        ]
        if tools:
            chat["tools"] = tools
            choice = body.get("tool_choice")
            if choice in ("auto", "none", "required"):
                chat["tool_choice"] = choice
            elif isinstance(choice, dict) and choice.get("type") == "function":
                chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            if isinstance(body.get("parallel_tool_calls"), bool):
                chat["parallel_tool_calls"] = body["parallel_tool_calls"]
        return chat | request_options(body, "max_output_tokens", ("temperature", "top_p"))

    def chat_translator(self, request: dict[str, Any]) -> _ResponseFromChat:
        return _ResponseFromChat(request)

    def previous_id(self, body: dict[str, Any]) -> str | None:
        return as_str(body.get("previous_response_id"))

    def reply_id(self, request: dict[str, Any], reply: dict[str, Any]) -> str | None:
        """The response's id, unless the request said `store: false` (a response OpenAI keeps no
        more than modeltap does; Codex says it: docs/agents.md §6.4)."""
        return None if request.get("store") is False else as_str(reply.get("id"))

    def continued(
        self, request: dict[str, Any], sent: dict[str, Any], reply: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """What went upstream less the instructions (a chained request states its own), and the reply."""
        messages = dicts_in(sent.get("messages"))
        if isinstance(request.get("instructions"), str) and request["instructions"] and messages:
            messages = messages[1:]
        message = as_dict(first_choice(reply.get("choices")).get("message"))
        answer = {k: v for k, v in message.items() if v is not None}
        return [*messages, {**answer, "role": "assistant"}]


def _leading_systems_joined(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The system messages that open the conversation, joined into one (blank line between) when each is
    text."""
    lead = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
    texts = [m.get("content") for m in messages[:lead]]
    if lead < 2 or not all(isinstance(text, str) for text in texts):
        return messages
    return [{"role": "system", "content": "\n\n".join(str(text) for text in texts)}, *messages[lead:]]


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """Chat usage as a Response counts it (the fields Codex reads: docs/agents.md §6.5)."""
    if not isinstance(usage, dict):
        return None
    prompt = as_int(usage.get("prompt_tokens")) or 0
    completion = as_int(usage.get("completion_tokens")) or 0
    cached = as_int(as_dict(usage.get("prompt_tokens_details")).get("cached_tokens")) or 0
    reasoning = as_int(as_dict(usage.get("completion_tokens_details")).get("reasoning_tokens")) or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


# The delta event of each kind of piece (ChatDeltas) an output item grows by.
_DELTA_EVENTS = {
    "reasoning": "response.reasoning_text.delta",
    "text": "response.output_text.delta",
    "arguments": "response.function_call_arguments.delta",
}
# chat finish_reason -> why a Response is incomplete; any other finish completes it.
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


class _ResponseFromChat:
    """The Responses event stream written from a chat chunk stream as it arrives: created and
    in_progress at the first chunk, an output item per run of reasoning, text or one function call
    (each done when the next starts), then response.completed (or .incomplete) with the whole response
    once the chat stream has ended. Events are numbered by `sequence_number`."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._deltas = ChatDeltas()
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # the output so far, the open item last
        self._open: tuple[str, int] | None = None  # (item type, call number) of the open item
        self._texts: dict[int, list[str]] = {}  # output index -> text or argument pieces
        self._call_items: dict[int, int] = {}
        self._response: dict[str, Any] = {
            "id": None,
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": request.get("model"),
            "instructions": request.get("instructions"),
            "output": [],
            "tools": request.get("tools") or [],
            "tool_choice": request.get("tool_choice", "auto"),
            "parallel_tool_calls": request.get("parallel_tool_calls", True),
            "previous_response_id": request.get("previous_response_id"),
            "error": None,
            "incomplete_details": None,
            "usage": None,
            "metadata": {},
        }
        self._started = False

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._start(chunk)
        for kind, number, value in self._deltas.read(chunk):
            if kind == "call":
                call = {
                    "type": "function_call",
                    "call_id": value["id"],
                    "name": value["name"],
                    "arguments": "",
                }
                events += self._item("function_call", call, number)
                self._call_items[number] = len(self._items) - 1
                continue
            if kind == "error":
                events.append(self._event("error", code="upstream_error", message=value, param=None))
                continue
            if kind == "reasoning":
                events += self._item("reasoning", {"type": "reasoning", "summary": [], "content": []})
            elif kind == "text":
                events += self._item("message", {"type": "message", "role": "assistant", "content": []})
            elif number not in self._call_items:
                continue
            index = self._call_items[number] if kind == "arguments" else len(self._items) - 1
            self._texts.setdefault(index, []).append(value)
            at = {**self._where(index), **({} if kind == "arguments" else {"content_index": 0})}
            events.append(self._event(_DELTA_EVENTS[kind], **at, delta=value))
        return events

    def end(self) -> list[dict[str, Any]]:
        reason = self._deltas.finish_reason
        if reason is None:
            return []
        events = [*self._start({}), *self._done()]
        response = self._response
        response["output"] = self._items
        response["usage"] = responses_usage(self._deltas.usage)
        if reason in _INCOMPLETE:
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": _INCOMPLETE[reason]}
            return [*events, self._event("response.incomplete", response=response)]
        response["status"] = "completed"
        return [*events, self._event("response.completed", response=response)]

    def fail(self, message: str) -> list[dict[str, Any]]:
        """`response.failed` carrying the output so far and the error, the terminal event Codex and the
        openai SDK read a failed response from."""
        events = [*self._start({}), *self._done()]
        response = self._response
        response["output"], response["status"] = self._items, "failed"
        response["error"] = {"code": "server_error", "message": message}
        return [*events, self._event("response.failed", response=response)]

    def _start(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """created and in_progress, once. The response's id comes from the chat completion's, so the
        same chat answer always makes the same response (a record rebuilt from it matches the stream)."""
        if self._started:
            return []
        self._started = True
        chat_id = chunk.get("id")
        self._response["id"] = f"resp_{chat_id}" if isinstance(chat_id, str) else f"resp_{uuid.uuid4().hex}"
        opening = {**self._response}
        return [
            self._event("response.created", response=opening),
            self._event("response.in_progress", response=opening),
        ]

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._sequence += 1
        return {"type": kind, **fields, "sequence_number": self._sequence - 1}

    def _where(self, index: int) -> dict[str, Any]:
        return {"item_id": self._items[index]["id"], "output_index": index}

    def _item(self, kind: str, item: dict[str, Any], number: int = 0) -> list[dict[str, Any]]:
        """Open an output item of `kind` unless it is the one open (each call is an item of its own)."""
        if self._open == (kind, number) and kind != "function_call":
            return []
        events = self._done()
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item_id = f"{prefix}_{self._response['id'].removeprefix('resp_')}_{len(self._items)}"
        self._items.append({"id": item_id, **item, "status": "in_progress"})
        self._open = (kind, number)
        index = len(self._items) - 1
        events.append(
            self._event("response.output_item.added", output_index=index, item=dict(self._items[index]))
        )
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(
                self._event("response.content_part.added", **self._where(index), content_index=0, part=part)
            )
        return events

    def _done(self) -> list[dict[str, Any]]:
        """Close the open item: its text in full, then output_item.done."""
        if self._open is None:
            return []
        kind, _ = self._open
        self._open = None
        index = len(self._items) - 1
        item, text = self._items[index], "".join(self._texts.get(index, ()))
        item["status"] = "completed"
        where = self._where(index)
        events = []
        if kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item["content"] = [part]
            events.append(self._event("response.output_text.done", **where, content_index=0, text=text))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=part))
        elif kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            events.append(self._event("response.reasoning_text.done", **where, content_index=0, text=text))
        else:
            item["arguments"] = text
            events.append(self._event("response.function_call_arguments.done", **where, arguments=text))
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events


def _items(value: Any) -> list[Any]:
    return [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])


def _chat_messages(
    instructions: Any, items: Sequence[Any], *, for_server: bool = False
) -> list[dict[str, Any]]:
    """Input and output items as OpenAI chat messages: message items by role, function calls gathered
    onto the assistant message they follow, their outputs as `role: tool`. `for_server`: as a chat
    server takes them (translation): developer messages as system ones, images kept beside the text,
    a reasoning item as the `reasoning_content` of the assistant message that follows it."""
    out: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning: list[str] = []
    for item in (i if isinstance(i, dict) else {"role": "user", "content": i} for i in items):
        kind = item.get("type", "message")
        if kind == "function_call":
            call = chat_tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
            if out and out[-1]["role"] == "assistant" and not reasoning:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append(_assistant(None, reasoning, [call]))
        elif kind == "function_call_output":
            out.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": text_of(item.get("output"))}
            )
        elif kind == "reasoning" and for_server:
            texts = [
                *part_texts(item.get("summary"), "summary_text"),
                *part_texts(item.get("content"), "reasoning_text"),
            ]
            reasoning += [text for text in texts if text]
        elif kind == "message" and item.get("role"):
            role, content = item["role"], item.get("content")
            if for_server and role == "developer":
                role = "system"
            text = _server_content(content) if for_server else text_of(content, "")
            out.append(
                _assistant(text, reasoning, None) if role == "assistant" else {"role": role, "content": text}
            )
    return out


def _assistant(content: Any, reasoning: list[str], calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """An assistant message, taking the reasoning gathered before it (and emptying that list)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
        reasoning.clear()
    if calls:
        message["tool_calls"] = calls
    return message


def _server_content(content: Any) -> Any:
    """Message content for a chat server: text as one string, or text and image parts when it holds
    an image."""
    parts = dicts_in(content)
    images = [p for p in parts if p.get("type") == "input_image" and isinstance(p.get("image_url"), str)]
    if not images:
        return text_of(content, "")
    return [
        {"type": "text", "text": p.get("text", "")}
        if p.get("type") != "input_image"
        else {"type": "image_url", "image_url": {"url": p["image_url"]}}
        for p in parts
        if p.get("type") != "input_image" or isinstance(p.get("image_url"), str)
    ]


def _not_none(key: str, value: Any) -> bool:
    return value is not None


DIALECT = Responses()
