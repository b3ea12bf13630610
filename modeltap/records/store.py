"""RecordStore: the record writer on a thread of the serving process, fed through a bounded queue.

Owns: the writer thread, its bounded queue, back-pressure and the `wait`ers of a commit. Does not own:
what is written and how (sql_writer.py), the writer that runs in a process of its own
(writer_process.py, fed by channel.py, which is what `serve` uses), reading (reader.py).

The store is an observer (modeltap.proxy.observers): `on_exchange` queues an exchange at once and
returns, when the queue is over its size, an awaitable that waits for room (back-pressure, never a
blocking put and never a silent drop; a record queued is never lost to a client that hangs up while
waiting). The thread serialises, hashes, compresses and commits in batches. A failed write is
logged as an error and counted.

    store = RecordStore(".modeltap/records.db")
    store.start()
    await store.submit(exchange)          # on the event loop: waits only for room
    await store.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from modeltap.records.exchange import Exchange, SessionEvent
from modeltap.records.sql_writer import RECORD_ERROR, SqlWriter
from modeltap.records.token_store import TokenWriter

__all__ = ["BATCH_MAX", "QUEUE_SIZE", "RECORD_ERROR", "RecordStore", "StoreClosed"]

log = logging.getLogger(__name__)

# Exchanges waiting for the writer. At ~1 ms per write this is a few seconds of burst; beyond it the
# relay waits for a slot rather than grow memory without bound.
QUEUE_SIZE = 4096
# The writer commits up to this many exchanges per transaction when they queue up.
BATCH_MAX = 256
# How long close() waits for the writer to drain before saying so.
CLOSE_TIMEOUT_S = 30.0


class StoreClosed(RuntimeError):
    """Raised by `submit` after `close`."""


_Item = tuple[Exchange | SessionEvent, asyncio.AbstractEventLoop | None, "asyncio.Future[None] | None"]


class RecordStore:
    """The single writer of one records database, on a thread, and an observer of sessions and
    exchanges. Not started → running → closed. With `sync`, an exchange's wait lasts until it is
    committed."""

    def __init__(
        self,
        path: Path | str,
        *,
        keep_raw_sse: bool = False,
        sync: bool = False,
        queue_size: int = QUEUE_SIZE,
        max_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.sync = sync
        self._writer = SqlWriter(path, keep_raw_sse=keep_raw_sse, max_bytes=max_bytes)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._queue_size = queue_size
        # Back-pressure without a loop wake-up per record: the loop counts what it queued, the writer
        # what it finished, and the writer wakes the loop only when a submitter waits for room.
        self._submitted = 0
        self._finished = 0
        self._room: asyncio.Event | None = None
        self._room_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._on_exit: Callable[[], object] | None = None

    @property
    def written(self) -> int:
        """Exchanges written in full so far."""
        return self._writer.written

    @property
    def failures(self) -> int:
        """Records that could not be written in full (each logged as an error)."""
        return self._writer.failures

    @property
    def tokens(self) -> TokenWriter:
        """The token-id writer (its `decoder` may be set before `start`)."""
        return self._writer.tokens

    def start(self) -> None:
        """Open (creating and migrating) the database and start the writer thread."""
        if self._thread is not None or self._closed:
            raise RuntimeError("a RecordStore starts once")
        self._writer.open()
        self._thread = threading.Thread(target=self._run, name="modeltap-store", daemon=True)
        self._thread.start()

    def on_session(self, event: SessionEvent) -> None:
        """Record a session's opening (so it is listed even before its first exchange), closing or
        rollout outcome. Non-blocking: session events are rare, so they bypass the back-pressure slots."""
        if self._closed or self._thread is None:
            raise StoreClosed("the record store is not running")
        self._queue.put((event, None, None))

    def on_exchange(self, exchange: Exchange) -> Awaitable[None] | None:
        """Queue `exchange` at once; return what the relay waits for: room in the queue when it is
        over its size, or with `sync` the commit. None when there is nothing to wait for."""
        return self._enqueue(exchange, wait=self.sync)

    async def submit(self, exchange: Exchange, *, wait: bool = False) -> None:
        """Queue `exchange` and wait for room; with `wait`, also for the commit."""
        pending = self._enqueue(exchange, wait=wait)
        if pending is not None:
            await pending

    def _enqueue(self, exchange: Exchange, *, wait: bool) -> Awaitable[None] | None:
        if self._closed or self._thread is None:
            raise StoreClosed("the record store is not running")
        loop = asyncio.get_running_loop()
        future = loop.create_future() if wait else None
        self._submitted += 1
        self._queue.put((exchange, loop, future))
        if self._submitted - self._finished > self._queue_size:
            return self._room_for(loop, future)
        return future

    async def _room_for(self, loop: asyncio.AbstractEventLoop, commit: asyncio.Future[None] | None) -> None:
        """Wait until the queue is back within its size (and for `commit`, when given)."""
        while self._submitted - self._finished > self._queue_size:
            if self._room is None:
                self._room, self._room_loop = asyncio.Event(), loop
            room = self._room
            # Look again after publishing the event: the writer counts before it looks for a waiter,
            # so one of the two sees the other.
            if self._submitted - self._finished <= self._queue_size:
                break
            await room.wait()
        if commit is not None:
            await commit

    async def close(self) -> None:
        """Drain the queue, commit, and stop the writer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        # The writer says when it is done, rather than being joined in a worker thread: at interpreter
        # exit (an AReaL worker ending without modeltap.adapter.shutdown()) the default executor
        # already refuses new work.
        loop, finished = asyncio.get_running_loop(), asyncio.Event()
        self._on_exit = lambda: _call_soon(loop, finished.set)
        self._queue.put(None)
        try:
            await asyncio.wait_for(finished.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error(
                "record store writer did not finish within %.0f s; some records may be lost", CLOSE_TIMEOUT_S
            )

    # -- the writer thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                first = self._queue.get()
                batch = [first] if first is not None else []
                stop = first is None
                while not stop and len(batch) < BATCH_MAX:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                    else:
                        batch.append(nxt)
                if batch:
                    self._write_batch(batch)
                if stop:
                    return
        finally:
            self._writer.close()
            if self._on_exit is not None:
                self._on_exit()

    def _write_batch(self, batch: list[_Item]) -> None:
        """Write a batch, then free its room and tell its `wait`ers how it went."""
        errors = self._writer.write([item for item, _, _ in batch])
        self._finished += sum(isinstance(item, Exchange) for item, _, _ in batch)
        room, self._room = self._room, None
        if room is not None and self._room_loop is not None:
            _call_soon(self._room_loop, room.set)
        # Only `wait`ers are woken, with one hand-off per loop per batch: a burst of thousands of
        # wake-ups fills asyncio's self-pipe, and a signal's wake-up byte is then dropped.
        settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], Exception | None]]] = {}
        for (_, loop, future), item_error in zip(batch, errors, strict=True):
            if loop is not None and future is not None:
                settled.setdefault(loop, []).append((future, item_error))
        for loop, outcomes in settled.items():
            _call_soon(loop, functools.partial(_settle, outcomes))


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Hand `callback` to `loop` from the writer thread, unless the loop is already gone."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _settle(outcomes: list[tuple[asyncio.Future[None], Exception | None]]) -> None:
    """On the submitting loop: tell each `wait`er whether its record was committed."""
    for future, error in outcomes:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)
