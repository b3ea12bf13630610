"""The record channel's wire format: the frames a serving process sends the writer process, and the
acknowledgements it gets back.

Owns: turning an Exchange or a SessionEvent into one frame of bytes and back, reading frames and
acknowledgements out of a byte stream that arrives in pieces, and the flags a frame carries. Does not
own: the sockets (channel.py on the serving side, writer_process.py on the other) or what is written
(sql_writer.py).

A frame is `!IBBQ` (the length of what follows it, the kind, the flags, the sender's sequence number)
and a payload. An exchange's payload is a pickle of its fields as the relay holds them: the request's
bytes as received and the upstream's response bytes go as they are (pickle copies bytes verbatim),
and the request is parsed again in the writer process, not here. Pickle, not JSON: the writer
process is started by the same modeltap, from the same installation, and reached only through a
socket in a directory only its user can enter (channel.py), so nothing foreign is ever unpickled; and
pickling the few objects the relay built (an assembled stream's body) is the cheapest way to move them.

An acknowledgement is `!I` and a pickle of `Ack`: every frame up to `through` is settled (committed,
or its failure logged and its minimal record written).

    data = encode(7, exchange, WAIT)
    reader = FrameReader()
    [frame] = reader.feed(data)
    frame.item().id == exchange.id
"""

from __future__ import annotations

import dataclasses
import json
import operator
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from modeltap.records.exchange import Exchange, ExchangeDraft, SessionEvent

# Kinds of frame.
EXCHANGE = 1
SESSION = 2
# No payload: acknowledge everything before it now (a channel closing waits for that).
FLUSH = 3
# Flags.
WAIT = 1  # someone waits for this commit (`serve --sync`): acknowledge it as soon as it is committed
REPLAY = 2  # sent again after the writer process died: it may already be stored
MINIMAL = 4  # write only the minimal record: the full one could not be sent, or the writer died on it

_LENGTH = struct.Struct("!I")
_TAG = struct.Struct("!BBQ")
_PICKLE_PROTOCOL = 5
# The fields an exchange crosses with: all but the parsed request, which the writer parses again from
# the bytes (parsing is cheaper than pickling the objects, and the bytes must go anyway).
_FIELDS = tuple(f.name for f in dataclasses.fields(Exchange) if f.init and f.name != "request_json")
_VALUES = operator.attrgetter(*_FIELDS)  # all of them in one C call: this runs on the serving loop
# What a minimal record needs (sql_writer.SqlWriter writes these and the reason).
_MINIMAL_FIELDS = (
    "id",
    "session_id",
    "method",
    "endpoint",
    "path",
    "status",
    "streamed",
    "started",
    "first_byte",
    "ended",
    "error_class",
    "error_message",
    "client_disconnected",
)


class FrameError(ValueError):
    """Bytes that are not a frame of this format."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame as read: its kind, flags, sequence number and still-encoded payload."""

    kind: int
    flags: int
    seq: int
    payload: bytes

    def item(self) -> Exchange | SessionEvent:
        """The exchange or session event the frame carries (for a MINIMAL frame, an exchange holding
        only the fields of a minimal record)."""
        value = pickle.loads(self.payload)
        if self.kind == SESSION:
            if not isinstance(value, SessionEvent):
                raise FrameError("a session frame holds no session event")
            return value
        fields = value[0] if self.flags & MINIMAL else dict(zip(_FIELDS, value, strict=True))
        if not self.flags & MINIMAL:
            # Parsed once here for everything the writer process does with the exchange (the record,
            # the token ids, serve's line), as the relay's parse was before they left its process.
            fields["request_json"] = _object(fields["request"])
            if fields["response"] is None:
                fields["response"] = _object(fields["response_body"])
        if fields["ended"] is None:  # never from the relay, which seals with the end time
            return Exchange(**fields)
        return ExchangeDraft(**fields).seal()  # a draft takes its fields without the sealed checks

    def reason(self) -> str:
        """Why a MINIMAL frame carries only the minimal record."""
        _, why = pickle.loads(self.payload)
        return str(why)


@dataclass(frozen=True, slots=True)
class Ack:
    """The writer's answer: frames up to `through` are settled; `written` of them were exchanges
    written in full; `failed` holds (seq, reason) for each record that was not."""

    through: int
    written: int
    failed: tuple[tuple[int, str], ...] = ()


def _object(body: bytes | None) -> dict[str, Any] | None:
    """A JSON object body, parsed; None for anything else (the store keeps that as text)."""
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def encode(seq: int, item: Exchange | SessionEvent, flags: int = 0) -> bytes:
    """`item` as one frame. Raises what pickle raises for an exchange holding what cannot be sent
    (then send `encode_minimal`)."""
    if isinstance(item, SessionEvent):
        return _frame(SESSION, flags, seq, pickle.dumps(item, _PICKLE_PROTOCOL))
    return _frame(EXCHANGE, flags, seq, pickle.dumps(_VALUES(item), _PICKLE_PROTOCOL))


def encode_minimal(seq: int, exchange: Exchange, reason: str, flags: int = 0) -> bytes:
    """The frame of `exchange`'s minimal record, with the reason its full record is not sent."""
    fields = {name: getattr(exchange, name) for name in _MINIMAL_FIELDS}
    return _frame(EXCHANGE, flags | MINIMAL, seq, pickle.dumps((fields, reason), _PICKLE_PROTOCOL))


def with_flags(frame: bytes, flags: int) -> bytes:
    """`frame` with `flags` added to its own."""
    at = _LENGTH.size + 1  # the flags byte, after the length and the kind
    return frame[:at] + bytes([frame[at] | flags]) + frame[at + 1 :]


def encode_flush(seq: int) -> bytes:
    return _frame(FLUSH, 0, seq, b"")


def encode_ack(ack: Ack) -> bytes:
    payload = pickle.dumps(ack, _PICKLE_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


def _frame(kind: int, flags: int, seq: int, payload: bytes) -> bytes:
    return _LENGTH.pack(_TAG.size + len(payload)) + _TAG.pack(kind, flags, seq) + payload


class _Pieces:
    """Length-prefixed messages out of a stream that arrives in pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def messages(self, data: bytes, tag: struct.Struct | None = None) -> list[tuple[tuple[Any, ...], bytes]]:
        """Each whole message the bytes so far complete: its `tag` fields, then the rest (copied once)."""
        buffer = self._buffer
        buffer += data
        view = memoryview(buffer)
        out, at = [], 0
        try:
            while len(buffer) - at >= _LENGTH.size:
                (size,) = _LENGTH.unpack_from(buffer, at)
                start, end = at + _LENGTH.size, at + _LENGTH.size + size
                if end > len(buffer):
                    break
                if tag is None:
                    out.append(((), bytes(view[start:end])))
                elif size < tag.size:
                    raise FrameError(f"a frame of {size} bytes is shorter than its header")
                else:
                    out.append((tag.unpack_from(buffer, start), bytes(view[start + tag.size : end])))
                at = end
        finally:
            view.release()  # a bytearray with an export cannot be resized
        del buffer[:at]
        return out


class FrameReader:
    """Frames out of the bytes a writer process receives, fed as they arrive."""

    def __init__(self) -> None:
        self._pieces = _Pieces()

    def feed(self, data: bytes) -> list[Frame]:
        frames = []
        for (kind, flags, seq), payload in self._pieces.messages(data, _TAG):
            if kind not in (EXCHANGE, SESSION, FLUSH):
                raise FrameError(f"unknown frame kind {kind}")
            frames.append(Frame(kind, flags, seq, payload))
        return frames


class AckReader:
    """Acknowledgements out of the bytes a serving process receives, fed as they arrive."""

    def __init__(self) -> None:
        self._pieces = _Pieces()

    def feed(self, data: bytes) -> list[Ack]:
        acks: list[Any] = [pickle.loads(message) for _, message in self._pieces.messages(data)]
        if not all(isinstance(ack, Ack) for ack in acks):
            raise FrameError("the writer process sent something that is not an acknowledgement")
        return acks
