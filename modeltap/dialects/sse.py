"""Server-sent events: the incremental decoder, the stream assembler that drives a dialect's, and the
encoders a dialect's synthesiser writes with.

Owns: splitting SSE bytes into events by the WHATWG event-stream rules; `StreamAssembler`, which feeds
each event's JSON to the assembler of the stream's dialect (modeltap.dialects.*) and says what the
stream amounted to; spotting an error event in any format; writing events (`data_event`,
`named_event`) and splitting recorded bytes into events. Does not own: what a format's events mean
(each dialect's module), relaying (proxy/relay.py writes every chunk to the client exactly as it
arrived and feeds a copy here) or storing (records/).

Stdlib only, no I/O. Nothing here raises on stream content: a stream that is not valid SSE, not JSON,
cut short or carrying an error event is described in `Assembled.error`, never raised, so the relay
keeps going whatever the upstream sends (verifiers holds its parser failures back the same way).

    assembler = StreamAssembler(named("chat"))
    for chunk in upstream_chunks:          # each one after it was written to the client
        assembler.feed(chunk)
    assembled = assembler.result()         # Assembled(body={...}, events=7, complete=True, error=None)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from modeltap.dialects.base import Assembler
    from modeltap.dialects.roles import Streams

# OpenAI's end-of-stream sentinel (chat and legacy completions). Responses and Anthropic streams end
# with a typed event instead.
DONE = "[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
_BOM = "\ufeff"
# How much of an offending event an error message quotes: enough to recognise it in `modeltap show`,
# short enough to stay on one line.
_QUOTED_CHARS = 80
# How much of an upstream error message the record's error line keeps. AReaL's "Failed after N
# retries" detail carries the whole prompt's token ids (docs/areal.md §4.1);
# the start says what went wrong.
_ERROR_CHARS = 1000
# The largest choice, block, item or part index taken at face value. No real response has that many;
# a larger one is garbage, and filling a part list up to it would let one bad event allocate without
# bound. Garbage indices count as 0.
MAX_INDEX = 4096

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
    SSE events; `complete` says whether the stream ended properly (OpenAI's [DONE], or every choice's
    finish reason where a server sends no [DONE]; Anthropic's message_stop, a Responses stream's
    response.completed, .incomplete or .failed); `error` describes
    the first problem: invalid SSE, an error event, or a stream cut short.
    """

    body: dict[str, Any] | None
    events: int
    complete: bool
    error: str | None


class StreamAssembler:
    """Rebuilds one streamed exchange's final body from the bytes the client got. One per exchange.

    `dialect` is the stream's format; its `assembler()` reads the events. `feed` takes a copy of each
    chunk after it reached the client and never raises; `result` ends the stream and may be called any
    number of times. Each chunk costs one pass over its bytes plus one `json.loads` per event.
    `on_event`, when given, also gets each event's JSON object as it is read (None for `[DONE]`): a
    translation writes the client's stream from it (modeltap.proxy.translate).
    """

    def __init__(
        self, dialect: Streams, on_event: Callable[[dict[str, Any] | None], None] | None = None
    ) -> None:
        self._dialect: Assembler = dialect.assembler()
        self._on_event = on_event
        self._decoder = SSEDecoder()
        self._events = 0
        self._complete = False
        self._error: str | None = None
        self._result: Assembled | None = None

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the stream, as it was sent to the client."""
        if self._result is None:
            self._safely(lambda: self._take_all(self._decoder.feed(chunk), at_eof=False))

    @property
    def complete(self) -> bool:
        """Whether the stream's terminal event has arrived."""
        return self._complete

    def result(self) -> Assembled:
        """End the stream and say what it amounted to. Later `feed` calls are ignored."""
        if self._result is None:
            self._safely(lambda: self._take_all(self._decoder.flush(), at_eof=True))
            if not self._complete and self._error is None and self._safely(self._dialect.whole):
                self._complete = True
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
        if event.data == DONE:
            self._complete = self._dialect.END == DONE
            if self._on_event is not None:
                self._on_event(None)
            return
        try:
            obj = json.loads(event.data)
        except RecursionError:
            self._hold(f"event {self._events}: data nests deeper than JSON is read: {_quote(event.data)}")
            return
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
        if self._on_event is not None:
            self._on_event(obj)

    def _hold(self, error: str) -> None:
        if self._error is None:
            self._error = error


def _quote(data: str) -> str:
    return repr(data if len(data) <= _QUOTED_CHARS else data[:_QUOTED_CHARS] + "…")


def _upstream_error(obj: dict[str, Any]) -> str | None:
    """The message of an error event in any dialect, or None for an ordinary event.

    OpenAI-style servers send `data: {"error": {...}}` mid-stream (SGLang and vLLM nest it:
    docs/token-budgets.md §1.4); Anthropic sends `event: error` with
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


# -- what the dialects' assemblers share --------------------------------------------------------------


def index_of(value: Any) -> int:
    """A choice, block, item or part index taken at face value when it is sane, else 0 (MAX_INDEX)."""
    return value if isinstance(value, int) and 0 <= value <= MAX_INDEX else 0


def kind_of(obj: dict[str, Any]) -> str:
    """An event's or delta's `type`, as a string whatever the upstream put there."""
    kind = obj.get("type")
    return kind if isinstance(kind, str) else ""


def list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class Pieces:
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


# -- writing events -----------------------------------------------------------------------------------


def data_event(value: Any) -> bytes:
    """`data: JSON` and its blank line: an OpenAI chat or completions event. A lone surrogate (valid
    JSON as an escape, but not encodable as UTF-8) is written as its escape, so the event still is."""
    try:
        text = json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        text = json.dumps(value).encode()
    return b"data: " + text + b"\n\n"


def named_event(kind: str, value: dict[str, Any]) -> bytes:
    """`event: KIND` then `data: {"type": KIND, ...}`: an Anthropic or Responses event."""
    return f"event: {kind}\n".encode() + data_event({"type": kind, **value})


def typed_event(event: dict[str, Any]) -> bytes:
    """An event that carries its own `type` (first), as `named_event` writes it, without copying it:
    a translated stream writes one per event."""
    return b"event: " + str(event["type"]).encode() + b"\n" + data_event(event)


def split_events(raw: bytes) -> list[bytes]:
    """SSE bytes split after each blank line, so each piece is one event (WHATWG line ends)."""
    events, start, i = [], 0, 0
    while i < len(raw):
        for end in (b"\r\n\r\n", b"\n\n", b"\r\r"):
            if raw.startswith(end, i):
                i += len(end)
                events.append(raw[start:i])
                start = i
                break
        else:
            i += 1
    if start < len(raw):
        events.append(raw[start:])
    return events
