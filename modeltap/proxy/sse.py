"""Server-sent events: an incremental decoder, and assemblers that rebuild a stream's final body.

Owns: splitting SSE bytes into events by the WHATWG event-stream rules, and rebuilding, for the record,
the body an endpoint would have answered without `stream: true`: a `chat.completion` from OpenAI chat
chunks, a `text_completion` from legacy completions chunks, the final `response` from Responses events,
and a `message` from Anthropic Messages events. Does not own: relaying (relay.py writes every chunk to
the client exactly as it arrived and feeds a copy here), storing (records/), or classifying an error for
the exchange (relay.py reads `Assembled.error`).

Stdlib only, no I/O. Nothing here raises on stream content: a stream that is not valid SSE, not JSON,
cut short or carrying an error event is described in `Assembled.error`, never raised, so the relay
keeps going whatever the upstream sends (verifiers holds its parser failures back the same way).

    assembler = StreamAssembler("chat")
    for chunk in upstream_chunks:          # each one after it was written to the client
        assembler.feed(chunk)
    assembled = assembler.result()         # Assembled(body={...}, events=7, complete=True, error=None)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

# OpenAI's end-of-stream sentinel (chat and legacy completions). Responses and Anthropic streams end
# with a typed event instead.
_DONE = "[DONE]"
_BOM = "\ufeff"
# How much of an offending event an error message quotes: enough to recognise it in `modeltap show`,
# short enough to stay on one line.
_QUOTED_CHARS = 80
# How much of an upstream error message the record's error line keeps. AReaL's "Failed after N
# retries" detail carries the whole prompt's token ids (shared/reference/areal-proxy-protocol.md §4.1);
# the start says what went wrong.
_ERROR_CHARS = 1000
# The largest choice, block, item or part index taken at face value. No real response has that many;
# a larger one is garbage, and filling a part list up to it would let one bad event allocate without
# bound. Garbage indices count as 0.
_MAX_INDEX = 4096

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event: `event` is its type ("message" when the stream named none, as the spec
    says), `data` its `data:` lines joined by newlines, `id` the last event id seen so far."""

    event: str = "message"
    data: str = ""
    id: str | None = None


class SSEDecoder:
    """Incremental SSE decoder, shaped like httpx's decoders: `feed` returns the events complete so
    far, `flush` the rest once the stream has ended.

    Lines may end in \\n, \\r\\n or \\r, including a \\r at the end of one chunk whose \\n starts the
    next. Lines are split on bytes and decoded whole, so a UTF-8 character split across chunks comes
    out intact; invalid UTF-8 becomes U+FFFD rather than an exception. One leading BOM is ignored.
    `retry_ms` holds the reconnection time the stream asked for with `retry:`, if any.

    >>> decoder = SSEDecoder()
    >>> decoder.feed(b"event: ping\\ndata: {}\\n\\ndata: [DO")
    [SSEEvent(event='ping', data='{}', id=None)]
    >>> decoder.feed(b"NE]\\n\\n")
    [SSEEvent(event='message', data='[DONE]', id=None)]
    """

    def __init__(self) -> None:
        self._partial = bytearray()  # an unterminated line, waiting for its end in a later chunk
        self._skip_lf = False  # the last chunk ended in \r, so a \n opening the next one is the same line end
        self._first_line = True
        self._event = ""
        self._data: list[str] = []
        self._last_id: str | None = None
        self.retry_ms: int | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode one chunk; returns the events it completed, in order."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
        # bytes.splitlines breaks at \n, \r\n and \r only, which are exactly SSE's line ends.
        lines = chunk.splitlines(keepends=True)
        if not lines:
            return []
        tail = lines[-1]
        if tail[-1] in b"\r\n":
            self._skip_lf = tail[-1] == 0x0D
        else:
            lines.pop()
        events: list[SSEEvent] = []
        for line in lines:
            if self._partial:
                self._partial += line
                line = bytes(self._partial)
                self._partial.clear()
            cut = 2 if line.endswith(b"\r\n") else 1
            self._line(line[:-cut], events)
        if tail[-1] not in b"\r\n":
            self._partial += tail
        return events

    def flush(self) -> list[SSEEvent]:
        """End the stream: returns the event still being built, if it has data.

        The spec drops an event that the stream ends before its blank line; a recorder keeps what
        arrived, and treats what `flush` returns as possibly cut short.
        """
        events: list[SSEEvent] = []
        if self._partial:
            self._line(bytes(self._partial), events)
            self._partial.clear()
        self._line(b"", events)
        self._skip_lf = False
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        text = raw.decode("utf-8", "replace")
        if self._first_line:
            self._first_line = False
            if text.startswith(_BOM):
                text = text[1:]
        if not text:
            if self._data:
                events.append(SSEEvent(self._event or "message", "\n".join(self._data), self._last_id))
            self._event, self._data = "", []
            return
        if text[0] == ":":
            return
        name, colon, value = text.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)


@dataclass(frozen=True, slots=True)
class Assembled:
    """What a stream amounted to.

    `body` is the non-streamed body it rebuilds (None if nothing usable arrived); `events` counts the
    SSE events; `complete` says whether the stream ended properly (OpenAI's [DONE], Anthropic's
    message_stop, a Responses stream's response.completed, .incomplete or .failed); `error` describes
    the first problem: invalid SSE, an error event, or a stream cut short.
    """

    body: dict[str, Any] | None
    events: int
    complete: bool
    error: str | None


class StreamAssembler:
    """Rebuilds one streamed exchange's final body from the bytes the client got. One per exchange.

    `endpoint` is "chat", "completions", "responses" or "messages" (an `Endpoint.value`). `feed` takes
    a copy of each chunk after it reached the client and never raises; `result` ends the stream and
    may be called any number of times. Each chunk costs one pass over its bytes plus one `json.loads`
    per event: text pieces are kept in lists and joined only in `result`.
    """

    def __init__(self, endpoint: str) -> None:
        dialect = _DIALECTS.get(endpoint)
        if dialect is None:
            raise ValueError(f"no stream assembler for {endpoint!r}; expected one of {sorted(_DIALECTS)}")
        self._dialect = dialect()
        self._decoder = SSEDecoder()
        self._events = 0
        self._complete = False
        self._error: str | None = None
        self._result: Assembled | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the stream, as it was sent to the client."""
        if self._result is None:
            self._safely(lambda: self._take_all(self._decoder.feed(chunk), at_eof=False))

    def result(self) -> Assembled:
        """End the stream and say what it amounted to. Later `feed` calls are ignored."""
        if self._result is None:
            self._safely(lambda: self._take_all(self._decoder.flush(), at_eof=True))
            if not self._complete:
                self._hold(f"stream ended before {self._dialect.END} after {self._events} events")
            body = self._safely(self._dialect.body)
            self._result = Assembled(body, self._events, self._complete, self._error)
        return self._result

    def _safely(self, action: Callable[[], _T]) -> _T | None:
        # The boundary between the relay and its record: a bug in an assembler must cost the record,
        # never the client's stream, so anything it raises is held as the exchange's error.
        try:
            return action()
        except Exception as exc:
            self._hold(f"event {self._events}: assembler failed: {type(exc).__name__}: {exc}")
            return None

    def _take_all(self, events: list[SSEEvent], *, at_eof: bool) -> None:
        for event in events:
            self._take(event, at_eof=at_eof)

    def _take(self, event: SSEEvent, *, at_eof: bool) -> None:
        self._events += 1
        if self._complete:
            return
        if event.data == _DONE:
            self._complete = self._dialect.END == _DONE
            return
        try:
            obj = json.loads(event.data)
        except ValueError:
            problem = "stream ended mid-event" if at_eof else "data is not JSON"
            self._hold(f"event {self._events}: {problem}: {_quote(event.data)}")
            return
        if not isinstance(obj, dict):
            self._hold(f"event {self._events}: data is not a JSON object: {_quote(event.data)}")
            return
        message = _upstream_error(obj)
        if message is not None:
            self._hold(f"event {self._events}: upstream error: {message}")
        if self._dialect.add(obj):
            self._complete = True

    def _hold(self, error: str) -> None:
        if self._error is None:
            self._error = error


def _quote(data: str) -> str:
    return repr(data if len(data) <= _QUOTED_CHARS else data[:_QUOTED_CHARS] + "…")


def _upstream_error(obj: dict[str, Any]) -> str | None:
    """The message of an error event in any dialect, or None for an ordinary event.

    OpenAI-style servers send `data: {"error": {...}}` mid-stream (SGLang and vLLM nest it:
    shared/reference/token-budgets.md §1.4); Anthropic sends `event: error` with
    `{"type": "error", "error": {...}}`; Responses sends `{"type": "error", "message", "code"}` or ends
    with `response.failed`.
    """
    kind = obj.get("type")
    if kind == "response.failed":
        response = obj.get("response")
        error = response.get("error") if isinstance(response, dict) else None
        return _describe(error) if error else "response.failed"
    error = obj.get("error")
    if error is not None:
        return _describe(error)
    if kind == "error" or obj.get("object") == "error":
        return _describe(obj)
    return None


def _describe(error: Any) -> str:
    if not isinstance(error, dict):
        error = {"message": error}
    message = error.get("message")
    kind = error.get("type")
    if kind in (None, "error"):
        kind = error.get("code")
    text = str(message) if message is not None else json.dumps(error)
    text = f"{kind}: {text}" if kind else text
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS] + "…"


class _Dialect(Protocol):
    END: ClassVar[str]
    """What a properly ended stream ends with, for the truncation message."""

    def add(self, obj: dict[str, Any]) -> bool:
        """Take one event's JSON; True when it is the stream's terminal event."""
        ...

    def body(self) -> dict[str, Any] | None:
        """The non-streamed body rebuilt from the events so far."""
        ...


def _index(value: Any) -> int:
    return value if isinstance(value, int) and 0 <= value <= _MAX_INDEX else 0


def _kind(obj: dict[str, Any]) -> str:
    """An event's or delta's `type`, as a string whatever the upstream put there."""
    kind = obj.get("type")
    return kind if isinstance(kind, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class _Pieces:
    """Text fields that arrive in pieces, kept as lists and joined once, so a long reply streamed
    token by token costs linear time, not quadratic."""

    __slots__ = ("_pieces",)

    def __init__(self) -> None:
        self._pieces: dict[Any, list[str]] = {}

    def add(self, key: Any, piece: Any) -> None:
        if isinstance(piece, str):
            self._pieces.setdefault(key, []).append(piece)

    def has(self, key: Any) -> bool:
        return key in self._pieces

    def get(self, key: Any) -> str:
        return "".join(self._pieces.get(key, ()))

    def keys(self) -> list[Any]:
        return list(self._pieces)

    def drop(self, keep: Callable[[Any], bool]) -> None:
        self._pieces = {key: value for key, value in self._pieces.items() if keep(key)}


class _Chunks:
    """Shared by OpenAI chat and legacy completions: the chunk header, choices by index, usage."""

    END: ClassVar[str] = _DONE
    OBJECT: ClassVar[str]
    _HEAD = ("id", "created", "model", "system_fingerprint")

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._usage: Any = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._pieces = _Pieces()

    def add(self, obj: dict[str, Any]) -> bool:
        for key in self._HEAD:
            if key not in self._head and obj.get(key) is not None:
                self._head[key] = obj[key]
        if obj.get("usage"):
            self._usage = obj["usage"]
        for choice in _list(obj.get("choices")):
            if isinstance(choice, dict):
                index = _index(choice.get("index"))
                state = self._choices.setdefault(index, {"finish_reason": None})
                if choice.get("finish_reason") is not None:
                    state["finish_reason"] = choice["finish_reason"]
                self._merge(index, state, choice)
        return False

    def body(self) -> dict[str, Any] | None:
        if not self._head and not self._choices and self._usage is None:
            return None
        body = {
            "id": self._head.get("id"),
            "object": self.OBJECT,
            "created": self._head.get("created"),
            "model": self._head.get("model"),
            "choices": [self._choice(index, self._choices[index]) for index in sorted(self._choices)],
            "usage": self._usage,
        }
        if "system_fingerprint" in self._head:
            body["system_fingerprint"] = self._head["system_fingerprint"]
        return body

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        raise NotImplementedError

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _merge_logprobs(self, state: dict[str, Any], logprobs: Any) -> None:
        """Logprobs come as lists per chunk (`content` in chat, `tokens`... in completions): extend."""
        if not isinstance(logprobs, dict):
            return
        merged = state.setdefault("logprobs", {})
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)


class _ChatChunks(_Chunks):
    OBJECT = "chat.completion"
    # Delta fields that arrive as text pieces. vLLM and SGLang stream their parsed reasoning as
    # `reasoning_content` (newer vLLM as `reasoning`); AReaL leaves it inline in `content`
    # (shared/reference/areal-proxy-protocol.md §1.1).
    _TEXT = ("content", "reasoning_content", "reasoning", "refusal")

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        self._merge_logprobs(state, choice.get("logprobs"))
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("role"):
            state["role"] = delta["role"]
        for key in self._TEXT:
            if key in delta:
                self._pieces.add((index, key), delta[key])
        for position, call in enumerate(_list(delta.get("tool_calls"))):
            if isinstance(call, dict):
                self._merge_call(index, state, call, position)

    def _merge_call(self, index: int, state: dict[str, Any], call: dict[str, Any], position: int) -> None:
        # A call's first chunk carries its id and name; later ones only add to the arguments. AReaL
        # 1.0.4 sends each call whole in one chunk (shared/reference/areal-tier.md §6), later AReaL
        # in two (areal-proxy-protocol.md §1.1): both land here. Servers that repeat the id or name
        # on later chunks repeat the same value, so the first one wins.
        number = _index(call.get("index", position))  # OpenAI requires `index`; else its position
        entry = state.setdefault("calls", {}).setdefault(number, {"id": None, "type": None, "name": None})
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        for key, source in (("id", call), ("type", call), ("name", function)):
            if source.get(key) and entry[key] is None:
                entry[key] = source[key]
        self._pieces.add((index, "call", number), function.get("arguments"))

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": state.get("role", "assistant"), "content": None}
        for key in self._TEXT:
            if self._pieces.has((index, key)):
                message[key] = self._pieces.get((index, key))
        calls = state.get("calls")
        if calls:
            message["tool_calls"] = [
                {
                    "id": entry["id"],
                    "type": entry["type"] or "function",
                    "function": {"name": entry["name"], "arguments": self._pieces.get((index, "call", call))},
                }
                for call, entry in sorted(calls.items())
            ]
        return {
            "index": index,
            "message": message,
            "logprobs": state.get("logprobs"),
            "finish_reason": state["finish_reason"],
        }


class _CompletionChunks(_Chunks):
    OBJECT = "text_completion"

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        self._pieces.add(index, choice.get("text"))
        self._merge_logprobs(state, choice.get("logprobs"))

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": index,
            "text": self._pieces.get(index),
            "logprobs": state.get("logprobs"),
            "finish_reason": state["finish_reason"],
        }


class _MessageEvents:
    """Anthropic Messages: message_start, content blocks by index, message_delta, message_stop."""

    END: ClassVar[str] = "message_stop"
    # delta type -> (block field it extends, delta field holding the piece)
    _DELTAS: ClassVar[dict[str, tuple[str, str]]] = {
        "text_delta": ("text", "text"),
        "thinking_delta": ("thinking", "thinking"),
        "input_json_delta": ("input", "partial_json"),
    }

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._pieces = _Pieces()

    def add(self, obj: dict[str, Any]) -> bool:
        kind = _kind(obj)
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            self._message = dict(obj["message"])
        elif kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            self._blocks[_index(obj.get("index"))] = dict(obj["content_block"])
        elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            self._delta(_index(obj.get("index")), obj["delta"])
        elif kind == "message_delta":
            self._message_delta(obj)
        return kind == "message_stop"

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        kind = _kind(delta)
        if kind in self._DELTAS:
            field, source = self._DELTAS[kind]
            self._pieces.add((index, field), delta.get(source))
            return
        block = self._blocks.setdefault(index, {})
        if kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block["citations"] = [*_list(block.get("citations")), delta.get("citation")]

    def _message_delta(self, obj: dict[str, Any]) -> None:
        message = self._message_or_new()
        if isinstance(obj.get("delta"), dict):
            message.update(obj["delta"])
        # Usage on message_delta is cumulative, so it overwrites; a count it leaves out keeps its
        # message_start value (the anthropic SDK's accumulate_event merges the same way).
        if isinstance(obj.get("usage"), dict):
            counts = {key: value for key, value in obj["usage"].items() if value is not None}
            usage = message.get("usage")
            message["usage"] = {**(usage if isinstance(usage, dict) else {}), **counts}

    def _message_or_new(self) -> dict[str, Any]:
        if self._message is None:
            self._message = {"type": "message", "role": "assistant", "content": [], "usage": {}}
        return self._message

    def body(self) -> dict[str, Any] | None:
        if self._message is None and not self._blocks and not self._pieces.keys():
            return None
        message = dict(self._message_or_new())
        indices = sorted(set(self._blocks) | {index for index, _ in self._pieces.keys()})
        if indices:
            message["content"] = [self._block(index) for index in indices]
        return message

    def _block(self, index: int) -> dict[str, Any]:
        block = dict(self._blocks.get(index, {}))
        for field in ("text", "thinking"):
            if self._pieces.has((index, field)):
                block[field] = str(block.get(field) or "") + self._pieces.get((index, field))
        arguments = self._pieces.get((index, "input"))
        if arguments:
            # The concatenated partial_json is the tool input. If it does not parse (a stream cut
            # short), the raw text is kept as the evidence.
            try:
                block["input"] = json.loads(arguments)
            except ValueError:
                block["input"] = arguments
        return block


class _ResponseEvents:
    """OpenAI Responses: `response.completed` (or `.incomplete` / `.failed`) carries the whole final
    response. Until it arrives, output items are rebuilt from `output_item.*`, `content_part.*` and
    the text deltas, so a stream cut short still records what was said."""

    END: ClassVar[str] = "response.completed"
    _FINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
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
        self._pieces = _Pieces()

    def add(self, obj: dict[str, Any]) -> bool:
        kind = _kind(obj)
        if isinstance(obj.get("response"), dict):
            self._response = obj["response"]
            self._final = kind in self._FINAL
            return self._final
        output = _index(obj.get("output_index"))
        if kind in self._ITEMS and isinstance(obj.get("item"), dict):
            self._items[output] = dict(obj["item"])
            if kind == "response.output_item.done":
                self._pieces.drop(lambda key: key[0] != output)
        elif kind in self._PARTS and isinstance(obj.get("part"), dict):
            number = _index(obj.get("summary_index", obj.get("content_index")))
            _parts(self._items.setdefault(output, {}), self._PARTS[kind], number)[number] = dict(obj["part"])
        elif kind in self._DELTAS:
            container, field = self._DELTAS[kind]
            number = _index(obj.get("summary_index", obj.get("content_index")))
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
    parts = [dict(part) if isinstance(part, dict) else {} for part in _list(item.get(container))]
    parts.extend({} for _ in range(number + 1 - len(parts)))
    item[container] = parts
    return parts


_DIALECTS: dict[str, Callable[[], _Dialect]] = {
    "chat": _ChatChunks,
    "completions": _CompletionChunks,
    "responses": _ResponseEvents,
    "messages": _MessageEvents,
}
