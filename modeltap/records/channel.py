"""RecordChannel: the record store as a serving process sees it when the writer runs in a process of
its own (writer_process.py): an observer that sends each exchange down a Unix socket as a frame.

Owns: the serving side of the channel: sending, the bounded count of records sent and not yet
acknowledged (back-pressure: past it the relay waits for room, it never drops and never blocks the
loop), `--sync` waiters (settled when the writer acknowledges the commit), keeping every record until
it is acknowledged, sending them again to a writer restarted after a death, and, when the writer is
gone for good, writing them itself from a thread (store.RecordStore), saying so loudly. Does not own:
the frames (frames.py), the writer process and its restarts (writer_process.py).

What the event loop pays per exchange: a pickle of the fields the relay already holds (frames.py)
and a share of one socket write per loop iteration (the frames of one iteration go together). What
it no longer pays: parsing, hashing, compressing, SQLite, and the GIL those held.

A record is lost only if the machine is: one queued is kept until acknowledged, whether its client
hangs up (the relay hands it over before anything is awaited) or serve is told to stop (close() waits
for every acknowledgement); one sent to a writer that dies is sent again to the next; one that the
writer dies on twice is sent again as its minimal record (ids, times, status, why).

    channel = RecordChannel(writer.address, writer.options, sync=False)
    await channel.start()
    await channel.submit(exchange)      # waits only for room (with wait=True: for the commit)
    await channel.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

from modeltap.records import frames
from modeltap.records.exchange import Exchange, SessionEvent
from modeltap.records.store import QUEUE_SIZE, RecordStore, StoreClosed
from modeltap.records.writer_process import (
    MAX_RESTARTS,
    RESTART_WINDOW_S,
    RecordNotWritten,
    WriterOptions,
    writer_decoder,
)

log = logging.getLogger(__name__)

# How often a lost connection is tried again while the writer restarts (it takes a few tenths of a
# second to start), and for how long before this process writes its records itself.
RECONNECT_PAUSE_S = 0.05
WRITER_GONE_S = 15.0
# How long start() waits for the writer to greet the connection (it is running: it said it was ready).
GREETING_TIMEOUT_S = 30.0
# How long close() waits for the writer to acknowledge everything before saying what may be lost.
CLOSE_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Sent:
    """A frame sent and not yet acknowledged, with what it carries and who waits for its commit.
    `suspect`: it was the first unacknowledged record when a writer replaying alone died."""

    seq: int
    item: Exchange | SessionEvent | None  # None: a FLUSH
    frame: bytes
    future: asyncio.Future[None] | None
    replayed: bool = False
    suspect: bool = False


class _Protocol(asyncio.Protocol):
    """One connection to the writer. The writer greets each connection it accepts with an empty
    acknowledgement: a connection lost before that never reached a writer (a dying one's listener
    took it), so it says nothing of what the writer died on."""

    def __init__(self, channel: RecordChannel, loop: asyncio.AbstractEventLoop) -> None:
        self._channel = channel
        self._acks = frames.AckReader()
        self.greeted = False
        self.greeting: asyncio.Future[None] = loop.create_future()

    def data_received(self, data: bytes) -> None:
        try:
            acks = self._acks.feed(data)
        except (frames.FrameError, ValueError, EOFError) as exc:
            log.error("record channel: the writer sent what is not an acknowledgement: %s", exc)
            return
        self.greeted = True
        if not self.greeting.done():
            self.greeting.set_result(None)
        for ack in acks:
            self._channel._acknowledged(ack)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.greeting.done():
            self.greeting.set_exception(ConnectionError("the record writer closed the connection"))
            self.greeting.exception()  # retrieved: nobody may be waiting for it
        self._channel._lost(self.greeted)


class RecordChannel:
    """The serving side of the writer process, and an observer of sessions and exchanges. Not started
    → running → closed. With `sync`, an exchange's wait lasts until it is committed."""

    def __init__(
        self, address: str, options: WriterOptions, *, sync: bool = False, queue_size: int = QUEUE_SIZE
    ) -> None:
        self.address = address
        self.options = options
        self.sync = sync
        self._queue_size = queue_size
        self._written = 0
        self._failures = 0
        self._seq = 0
        self._unacked: deque[_Sent] = deque()
        self._outbox: list[bytes] = []
        self._flushing = False
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._room: asyncio.Event | None = None
        self._drained: asyncio.Event | None = None
        self._losses: deque[float] = deque()
        self._reconnect: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._fallback: RecordStore | None = None
        self._started = False
        self._closed = False

    @property
    def written(self) -> int:
        """Exchanges the writer acknowledged as written in full."""
        return self._written + (self._fallback.written if self._fallback else 0)

    @property
    def failures(self) -> int:
        """Records not written in full (each logged as an error where it failed)."""
        return self._failures + (self._fallback.failures if self._fallback else 0)

    @property
    def in_process(self) -> bool:
        """Whether this process writes its records itself now (the writer process is gone for good)."""
        return self._fallback is not None

    async def start(self) -> None:
        """Connect to the writer; RuntimeError when it cannot be reached."""
        if self._started or self._closed:
            raise RuntimeError("a RecordChannel starts once")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        try:
            protocol = await self._connect()
            await asyncio.wait_for(asyncio.shield(protocol.greeting), GREETING_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            self._closed = True
            if self._transport is not None:
                self._transport.close()
            raise RuntimeError(f"cannot reach the record writer at {self.address}: {exc!r}") from exc

    def on_session(self, event: SessionEvent) -> None:
        """Send a session's opening, closing or outcome. Non-blocking: session events are rare, so
        they take no part in back-pressure."""
        self._check_open()
        if self._fallback is not None:
            self._fallback.on_session(event)
            return
        self._queue(event, None)

    def on_exchange(self, exchange: Exchange) -> Awaitable[None] | None:
        """Send `exchange` at once; return what the relay waits for: room when too many records are
        unacknowledged, or with `sync` the commit. None when there is nothing to wait for."""
        return self._enqueue(exchange, wait=self.sync)

    async def submit(self, exchange: Exchange, *, wait: bool = False) -> None:
        """Send `exchange` and wait for room; with `wait`, also for the commit."""
        pending = self._enqueue(exchange, wait=wait)
        if pending is not None:
            await pending

    async def close(self) -> None:
        """Wait until the writer has acknowledged every record, then close the connection. Idempotent."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        assert self._drained is not None
        if self._fallback is None:
            self._queue(None, None)  # a FLUSH: the writer acknowledges everything at once
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), CLOSE_TIMEOUT_S)
            except TimeoutError:
                log.error(
                    "the record writer did not acknowledge %d record(s) within %.0f s; they may be lost",
                    len(self._unacked),
                    CLOSE_TIMEOUT_S,
                )
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._fallback is not None:
            await self._fallback.close()

    # -- sending ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise StoreClosed("the record store is not running")

    def _enqueue(self, exchange: Exchange, *, wait: bool) -> Awaitable[None] | None:
        self._check_open()
        here = self._fallback
        if here is not None:
            return here.submit(exchange, wait=True) if wait else here.on_exchange(exchange)
        assert self._loop is not None
        future = self._loop.create_future() if wait else None
        self._queue(exchange, future)
        if len(self._unacked) > self._queue_size:
            return self._room_for(future)
        return future

    def _queue(self, item: Exchange | SessionEvent | None, future: asyncio.Future[None] | None) -> None:
        self._seq += 1
        seq, flags = self._seq, frames.WAIT if future is not None else 0
        if item is None:
            frame = frames.encode_flush(seq)
        else:
            try:
                frame = frames.encode(seq, item, flags)
            except Exception as exc:  # boundary: what cannot be pickled still gets its minimal record
                if not isinstance(item, Exchange):
                    raise
                why = f"it could not be sent to the record writer: {exc}"
                frame = frames.encode_minimal(seq, item, why, flags)
        self._unacked.append(_Sent(seq, item, frame, future))
        self._send(frame)

    def _send(self, frame: bytes) -> None:
        """Send with the other frames of this loop iteration, in one write."""
        if self._transport is None:
            return  # kept in _unacked: sent again once connected
        self._outbox.append(frame)
        if not self._flushing:
            self._flushing = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        outbox, self._outbox = self._outbox, []
        if self._transport is not None and outbox:
            self._transport.write(b"".join(outbox))

    async def _room_for(self, commit: asyncio.Future[None] | None) -> None:
        """Wait until the unacknowledged records are back within the bound (and for `commit`)."""
        while len(self._unacked) > self._queue_size and self._fallback is None:
            if self._room is None:
                self._room = asyncio.Event()
            await self._room.wait()
        if commit is not None:
            await commit

    # -- acknowledgements, losses and reconnection ---------------------------------------------

    def _acknowledged(self, ack: frames.Ack) -> None:
        failed = dict(ack.failed)
        self._written += ack.written
        self._failures += len(ack.failed)
        while self._unacked and self._unacked[0].seq <= ack.through:
            sent = self._unacked.popleft()
            if sent.future is not None and not sent.future.done():
                if sent.seq in failed:
                    sent.future.set_exception(RecordNotWritten(failed[sent.seq]))
                else:
                    sent.future.set_result(None)
        self._wake()

    def _wake(self) -> None:
        if self._room is not None and (len(self._unacked) <= self._queue_size or self._fallback is not None):
            self._room.set()
            self._room = None
        if not self._unacked and self._drained is not None:
            self._drained.set()

    def _lost(self, greeted: bool) -> None:
        """The connection closed: the writer died (or is restarting). When it had greeted us, blame
        the record it was writing alone, if any; connect again."""
        self._transport = None
        self._outbox.clear()
        if self._fallback is not None or (self._closed and not self._unacked):
            return
        if greeted:
            now = time.monotonic()
            self._losses.append(now)
            while self._losses and now - self._losses[0] > RESTART_WINDOW_S:
                self._losses.popleft()
            if self._unacked and self._unacked[0].replayed:
                self._unacked[0].suspect = True
        if len(self._losses) > MAX_RESTARTS:
            self._write_here(f"it was lost {len(self._losses)} times within {RESTART_WINDOW_S:.0f} s")
            return
        if greeted:
            waiting = sum(sent.item is not None for sent in self._unacked)
            log.warning("record channel: lost the record writer; %d record(s) to send again", waiting)
        assert self._loop is not None
        self._reconnect = self._loop.create_task(self._connect_again(), name="modeltap:record-reconnect")

    async def _connect_again(self) -> None:
        deadline = time.monotonic() + WRITER_GONE_S
        while True:
            try:
                await self._connect()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self._write_here(f"it could not be reached for {WRITER_GONE_S:.0f} s")
                    return
                await asyncio.sleep(RECONNECT_PAUSE_S)

    async def _connect(self) -> _Protocol:
        loop = self._loop
        assert loop is not None
        transport, protocol = await loop.create_unix_connection(lambda: _Protocol(self, loop), self.address)
        # asyncio's or uvloop's stream transport (uvloop's is no asyncio.Transport subclass: no isinstance).
        self._transport = transport
        # Everything not acknowledged goes again, marked so the writer skips what it had committed,
        # and writes each alone; a record the writer died on while writing it alone, as its minimal one.
        for sent in self._unacked:
            if sent.suspect and isinstance(sent.item, Exchange):
                why = "the record writer died twice while writing it"
                sent.frame = frames.encode_minimal(sent.seq, sent.item, why, frames.REPLAY)
            elif not sent.replayed:
                sent.frame = frames.with_flags(sent.frame, frames.REPLAY)
            sent.replayed = True
            self._send(sent.frame)
        return protocol

    def _write_here(self, why: str) -> None:
        """The writer is gone for good: write from a thread of this process from now on, starting
        with every record not acknowledged."""
        log.error(
            "the record writer process is gone (%s): this serving process writes its records itself "
            "from now on, on a thread",
            why,
        )
        store = RecordStore(
            self.options.path,
            keep_raw_sse=self.options.keep_raw_sse,
            sync=self.sync,
            max_bytes=self.options.max_bytes,
            queue_size=self._queue_size,
        )
        store.tokens.decoder = writer_decoder(self.options)
        store.tokens.turn_ends = frozenset(self.options.turn_ends)
        store.start()
        self._fallback = store
        unacked, self._unacked = self._unacked, deque()
        for sent in unacked:
            if isinstance(sent.item, SessionEvent):
                store.on_session(sent.item)
            if sent.future is not None and not sent.future.done():
                if isinstance(sent.item, Exchange):
                    self._spawn(_settle_from(store.submit(sent.item, wait=True), sent.future))
                else:
                    sent.future.set_result(None)
            elif isinstance(sent.item, Exchange):
                self._spawn(store.submit(sent.item))
        self._wake()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro, name="modeltap:record-handover")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _settle_from(commit: Awaitable[None], future: asyncio.Future[None]) -> None:
    """Settle `future` as `commit` ends (a waiter whose record moved to this process's writer)."""
    try:
        await commit
    except Exception as exc:  # handed on to the waiter, who logs it as the store's failure
        if not future.done():
            future.set_exception(exc)
        return
    if not future.done():
        future.set_result(None)
