"""Translation plumbing, and streams made for clients that asked for one.

Owns: one exchange translated through OpenAI chat (`Translation`: the chat request, the client's answer
from a chat answer, streamed or not, and a chat upstream's error in the client's shape); the stream
taps the relay writes through (`Untouched` for a stream relayed as it arrives, `TranslatedStream` for
one translated chunk by chunk: neither buffers); the stream a client that asked for one gets when the
upstream answered JSON (`synthesised`); and the conversations of translated Responses kept for a later
`previous_response_id` (`ResponseChains`), since a chat upstream keeps none. Does not own: what each
format's conversion is (its dialect, modeltap.dialects), which formats an upstream lacks
(upstream.py), or HTTP (relay.py).

No aiohttp here: plain classes over bytes and dicts.

    translation = Translation.start(anthropic_messages.DIALECT, body, chains, "s-1")
    translation.chat_body                   # what goes upstream, to its chat route
    stream = translation.stream()           # per upstream chunk: client_bytes = stream.relay(chunk)
"""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from modeltap.compat.layouts import ErrorInfo, parse_error
from modeltap.dialects.openai_chat import DIALECT as CHAT
from modeltap.dialects.openai_chat import chunks
from modeltap.dialects.roles import Streams, ThroughChat
from modeltap.dialects.sse import Assembled, StreamAssembler
from modeltap.proxy.errors import BadRequest
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, text_body

# Translated Responses whose conversation modeltap keeps for a later `previous_response_id`, newest
# kept, across sessions: at most this many, and at most CHAINS_MAX_BYTES of them. Each holds its chat
# messages (an agent's transcript, up to the request body limit, 64 MiB by default); Codex sends
# `store: false` and is never kept (docs/agents.md §6.4). By count alone, 24 requests of 16 MB held
# about 500 MB; the bytes bound keeps two conversations of the largest body accepted.
CHAINS_MAX = 1024
CHAINS_MAX_BYTES = 128 * 1024 * 1024
# What one JSON value beside its text is counted as (a dict's, a number's overhead), so a conversation
# of many small parts is not counted as nothing.
_VALUE_BYTES = 16
# What the client's stream ends in, and the record says, when the chat answer never finished.
_CUT_SHORT = "the upstream's chat answer ended before its finish reason"


class StreamTap(Protocol):
    """How the relay writes an upstream stream to the client: `end()` gives the bytes to write once the
    upstream stream has ended, `result()` what the client's stream amounted to. A tap either passes the
    upstream's chunks through as they are (`PassThrough`) or writes its own bytes for them
    (`Transforming`), which `transforms` tells apart."""

    def end(self) -> bytes: ...

    def result(self) -> Assembled: ...

    @property
    def complete(self) -> bool:
        """Whether the client has had the stream's terminal event."""
        ...

    @property
    def received(self) -> dict[str, Any] | None:
        """The upstream's answer, when it differs from what the client got."""
        ...


class PassThrough(StreamTap, Protocol):
    """A tap the upstream's chunks are written through as they are: it takes a copy of each once it
    was written (`keep`), so assembling it never delays the client."""

    transforms: Literal[False]

    def keep(self, chunk: bytes) -> None: ...


class Transforming(StreamTap, Protocol):
    """A tap that writes its own bytes for each upstream chunk (`relay`)."""

    transforms: Literal[True]

    def relay(self, chunk: bytes) -> bytes: ...


class Untouched:
    """A stream relayed exactly as it arrives; the copy of each chunk is assembled after it was written."""

    transforms: Literal[False] = False
    received = None

    def __init__(self, dialect: Streams) -> None:
        self._assembler = StreamAssembler(dialect)

    def keep(self, chunk: bytes) -> None:
        self._assembler.feed(chunk)

    def end(self) -> bytes:
        return b""

    def result(self) -> Assembled:
        return self._assembler.result()

    @property
    def complete(self) -> bool:
        return self._assembler.complete


class TranslatedStream:
    """A chat upstream stream written to the client in its own format, each chunk's events as soon as
    the chunk arrives. The chat stream is assembled for the record (`received`); what the client got
    is rebuilt from it once, at the end (`result`), through the same translator, rather than assembled
    event by event. A stream that ends without its finish reason (cut short, or no chat stream at all)
    ends in the client's format's error (`ChatTranslator.fail`); one that held no chat chunk is
    recorded as the start of its bytes."""

    transforms: Literal[True] = True

    def __init__(self, client: ThroughChat, request: dict[str, Any]) -> None:
        self._client = client
        self._request = request
        self._translator = client.chat_translator(request)
        self._upstream = StreamAssembler(CHAT, on_event=self._take)
        self._out: list[bytes] = []
        self._events = 0
        self._ended = False
        self._complete = False
        self._head = bytearray()  # the stream's first bytes, the record of one that held no chunk

    def relay(self, chunk: bytes) -> bytes:
        if len(self._head) < RESPONSE_TEXT_MAX_CHARS:
            self._head += chunk[: RESPONSE_TEXT_MAX_CHARS - len(self._head)]
        self._upstream.feed(chunk)
        return self._flush()

    def end(self) -> bytes:
        """The closing events, when the chat stream ended without `[DONE]` but after its finish."""
        self._finish()
        return self._flush()

    def result(self) -> Assembled:
        upstream = self._upstream.result()
        error = upstream.error if upstream.error is not None or self._complete else _CUT_SHORT
        body = answer_from_chat(self._client, self._request, upstream.body) if upstream.body else None
        return Assembled(body, self._events, self._complete, error)

    @property
    def complete(self) -> bool:
        return self._complete

    @property
    def received(self) -> dict[str, Any] | None:
        """The chat stream as it arrived, assembled (ends the upstream's side: ask once it has ended);
        the start of its bytes when they held no chat chunk."""
        body = self._upstream.result().body
        return body if body is not None or not self._head else text_body(bytes(self._head))

    def _take(self, chunk: dict[str, Any] | None) -> None:
        if chunk is None:
            self._finish()
        else:
            self._write(self._translator.feed(chunk))

    def _finish(self) -> None:
        if not self._ended:
            self._ended = True
            closing = self._translator.end()
            self._complete = bool(closing)
            self._write(closing or self._translator.fail(_CUT_SHORT))

    def _write(self, events: list[dict[str, Any]]) -> None:
        self._out.extend(self._client.event_bytes(event) for event in events)
        self._events += len(events)

    def _flush(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out


class Chained:
    """Two transforming taps in a row: the engine's stream written as chat (`--tokens exact`), then chat
    written in the client's format. The record's `received` is the first's: the engine's answer."""

    transforms: Literal[True] = True

    def __init__(self, first: Transforming, second: Transforming) -> None:
        self._first, self._second = first, second

    def relay(self, chunk: bytes) -> bytes:
        return self._second.relay(self._first.relay(chunk))

    def end(self) -> bytes:
        return self._second.relay(self._first.end()) + self._second.end()

    def result(self) -> Assembled:
        return self._second.result()

    @property
    def complete(self) -> bool:
        return self._second.complete

    @property
    def received(self) -> dict[str, Any] | None:
        return self._first.received


def answer_from_chat(
    client: ThroughChat, request: dict[str, Any], chat: dict[str, Any]
) -> dict[str, Any] | None:
    """The client's answer to a chat completion (whole, or as much of one as a cut stream carried):
    written through the client's translator, then assembled, so a whole answer and a streamed one say
    the same."""
    assembler = client.assembler()
    for event in _chat_events(client, request, chat):
        assembler.add(event)
    return assembler.body()


def _chat_events(client: ThroughChat, request: dict[str, Any], chat: dict[str, Any]) -> list[dict[str, Any]]:
    """The client's events for a chat completion (or what a cut stream carried of one, which ends in
    the format's error, as the client's stream did)."""
    translator = client.chat_translator(request)
    events = [event for chunk in chunks(chat, include_usage=True) for event in translator.feed(chunk)]
    return events + (translator.end() or translator.fail(_CUT_SHORT))


def _finished(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion answered whole: it has ended, so a choice naming no finish reason stopped."""
    choices = chat.get("choices")
    if not isinstance(choices, list):
        return chat
    return {
        **chat,
        "choices": [
            {**choice, "finish_reason": "stop"}
            if isinstance(choice, dict) and not isinstance(choice.get("finish_reason"), str)
            else choice
            for choice in choices
        ],
    }


class Translation:
    """One exchange of a format the upstream does not serve, sent to it as OpenAI chat.

    Build it with `start`; `chat_body` is what goes upstream (the budget may lower its completion cap:
    assign the clamped body back). Then, by what the upstream answered: `error` for an error status,
    `stream()` for a chat stream, `reply` or `events` for a chat JSON body (`events` when the client
    asked for a stream), and `remember` once it succeeded.
    """

    def __init__(
        self, client: ThroughChat, request: dict[str, Any], earlier: list[dict[str, Any]] | None
    ) -> None:
        self.client = client
        self.request = request
        try:
            self.chat_body: dict[str, Any] = client.chat_request(request, earlier)
        except (TypeError, KeyError, ValueError, AttributeError) as exc:  # a part of the wrong shape
            raise BadRequest(f"this {client.name} request cannot be translated to chat: {exc}") from None

    @classmethod
    def start(
        cls, client: ThroughChat, request: dict[str, Any], chains: ResponseChains, session: str | None
    ) -> Translation:
        """The translation of `request`; a request continuing a response modeltap does not keep is
        refused (400), in the client's shape."""
        previous = client.previous_id(request)
        earlier = chains.get(session, previous) if previous is not None else None
        if previous is not None and earlier is None:
            raise BadRequest(
                f"previous_response_id {previous!r} names no response modeltap keeps for this session: the "
                "upstream serves no Responses API, and modeltap keeps only translated responses stored "
                f"(`store` not false), the last {chains.limit} up to {chains.max_bytes} bytes of them",
            )
        return cls(client, request, earlier)

    @property
    def streamed(self) -> bool:
        """Whether the client asked for a stream."""
        return self.request.get("stream") is True

    def error(self, status: int, raw: bytes) -> tuple[int, bytes, ErrorInfo]:
        """(status, body, what the upstream said) of a chat upstream's error, in the client's shape."""
        info = parse_error(status, raw)
        answered, api = self.client.upstream_error(status, info)
        return answered, json.dumps(self.client.error_body(api)).encode(), info

    def reply(self, chat: dict[str, Any]) -> dict[str, Any] | None:
        """The client's non-streamed answer to a chat completion (`answer_from_chat`); `chat` must be
        one (`openai_chat.is_completion`)."""
        return answer_from_chat(self.client, self.request, _finished(chat))

    def events(self, chat: dict[str, Any]) -> tuple[list[bytes], dict[str, Any] | None]:
        """The client's stream of a chat completion the upstream answered whole, and its final body;
        `chat` must be one (`openai_chat.is_completion`)."""
        assembler = self.client.assembler()
        out = []
        for event in _chat_events(self.client, self.request, _finished(chat)):
            assembler.add(event)
            out.append(self.client.event_bytes(event))
        return out, assembler.body()

    def stream(self) -> TranslatedStream:
        return TranslatedStream(self.client, self.request)

    def remember(
        self,
        chains: ResponseChains,
        session: str | None,
        chat_reply: dict[str, Any] | None,
        reply: dict[str, Any] | None,
    ) -> None:
        """Keep the conversation a later request may continue by naming this reply."""
        if chat_reply is None or reply is None:
            return
        reply_id = self.client.reply_id(self.request, reply)
        if reply_id is not None:
            chains.keep(session, reply_id, self.client.continued(self.request, self.chat_body, chat_reply))


class ResponseChains:
    """The chat conversations of translated replies, by (session, reply id), for the requests that
    continue them (`previous_response_id`): the newest `limit`, within `max_bytes` as `value_size`
    counts them, the least recently used going first; a conversation larger than `max_bytes` alone is
    not kept. `bytes` is what those kept count. Owned by the proxy."""

    def __init__(self, limit: int = CHAINS_MAX, max_bytes: int = CHAINS_MAX_BYTES) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: collections.OrderedDict[tuple[str | None, str], tuple[list[dict[str, Any]], int]] = (
            collections.OrderedDict()
        )

    def get(self, session: str | None, reply_id: str) -> list[dict[str, Any]] | None:
        kept = self._kept.get((session, reply_id))
        if kept is None:
            return None
        self._kept.move_to_end((session, reply_id))
        return kept[0]

    def keep(self, session: str | None, reply_id: str, messages: Sequence[dict[str, Any]]) -> None:
        key = (session, reply_id)
        old = self._kept.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        counted = value_size(messages)
        if counted > self.max_bytes:
            return
        self._kept[key] = (list(messages), counted)
        self.bytes += counted
        while len(self._kept) > self.limit or self.bytes > self.max_bytes:
            _, (_, dropped) = self._kept.popitem(last=False)
            self.bytes -= dropped


def value_size(value: Any) -> int:
    """What a JSON value holds, counted as its text's characters plus _VALUE_BYTES per value: about the
    memory it takes, never less than its text. Iterative, so a value nested thousands deep costs no
    stack; a conversation of a few thousand parts takes well under a millisecond."""
    total, pending = 0, [value]
    while pending:
        item = pending.pop()
        total += _VALUE_BYTES
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(key) for key in item if isinstance(key, str))
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return total


def synthesised(
    dialect: Streams, request: dict[str, Any], raw: bytes
) -> tuple[list[bytes], dict[str, Any]] | None:
    """The stream `dialect` defines for a JSON answer `raw` to a request that asked for a stream (AReaL
    1.0.4's /responses answers JSON to `stream: true`: docs/areal.md §1.1.7), and the answer parsed; None
    when the answer is not a JSON object."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    options = request.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    return dialect.synthesise(body, include_usage), body
