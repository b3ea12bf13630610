"""The record writer in a process of its own, so that serialising, hashing, compressing and SQLite
never take the serving process's event loop, GIL or core.

Owns: the writer process (`python -m modeltap.records.writer_process`): it listens on a Unix socket,
reads frames from every serving process connected to it (one for `serve`, one per worker for
`serve --workers N`), writes them in batches through SqlWriter and acknowledges them; and, in the
process that starts it, `WriterProcess`: starting it, restarting it when it dies, stopping it. Does
not own: the frames (frames.py), the serving side of a connection (channel.py), writing (sql_writer.py).

How it ends: it ignores SIGINT and SIGTERM (a Ctrl-C, or a `kill` of serve's process group, reaches
it too, and must not cut its queue short); it stops when its lifeline, the pipe on its standard input
that the starting process holds, is closed (that process stopping, or dying): it takes no new
connection, writes everything its connections still send until each one closes, and exits. A frame
sent again after a death (REPLAY) is written alone and acknowledged at once, so that when a record
kills the writer, the next death names it: the serving side then sends only its minimal record.

    writer = WriterProcess(WriterOptions(path=".modeltap/records.db"))
    await writer.start()            # raises RuntimeError when the store cannot be opened
    ...                             # channel.RecordChannel(writer.address) sends it records
    await writer.stop()
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modeltap.records import frames
from modeltap.records.exchange import Exchange, SessionEvent
from modeltap.records.sql_writer import SqlWriter

log = logging.getLogger(__name__)

# The writer commits up to this many records per transaction when they queue up (as the thread did).
BATCH_MAX = 256
# A connection's records are acknowledged once this many are settled, or once the oldest has waited
# this long: an acknowledgement is a wake-up of the serving loop, so one per record would cost the
# relay what the process saves it. A `--sync` waiter's record (WAIT) is acknowledged at once.
ACK_EVERY = 256
ACK_LINGER_S = 0.05
# Read per receive: large, so that a burst of records costs few system calls.
RECV_BYTES = 1024 * 1024
# Connections waiting to be accepted: one per serving process, and they connect together.
LISTEN_BACKLOG = 64
# Once its lifeline closes, the writer waits at most this long for its connections to finish.
DRAIN_TIMEOUT_S = 30.0
# A writer that dies is restarted after this pause, doubling up to the maximum, at most MAX_RESTARTS
# times within RESTART_WINDOW_S; past that, it keeps dying on start-up or on its records, and the
# serving processes write their records themselves (channel.py), saying so.
RESTART_PAUSE_S = 0.1
RESTART_PAUSE_MAX_S = 5.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0
# How long a writer may take to open its store and say it is ready (a first start migrates it).
READY_TIMEOUT_S = 120.0
# How long stop() waits for the process to exit once its lifeline is closed (it drains first).
STOP_TIMEOUT_S = DRAIN_TIMEOUT_S + 5.0
_READY = "ready"
_SOCKET_NAME = "writer.sock"


class RecordNotWritten(RuntimeError):
    """What a `--sync` waiter gets when its record could not be written in full (its minimal record
    was; the writer logged why)."""


@dataclass
class WriterOptions:
    """What the writer process needs: the store and how to write it, and where to listen.
    `decoder` names a factory `MODULE:ATTR` called with `decoder_arg` on the first token-history break,
    which gives the function that turns ids into text for the record (the serving side names it: the
    tokenizer is the proxy's business, not the records'); `turn_ends` are the served tokenizer's
    end-of-turn and stop ids (records/continuity.py `break_position`). `observers` name factories
    `MODULE:ATTR`, called without arguments in the writer process, whose `on_exchange` gets each
    exchange once it is written (serve's line per exchange: nothing of it is left in the serving
    process) and whose
    `close`, if any, is called as the writer stops. One object is shared by the WriterProcess and its
    RecordChannel, so what is set on it before the start reaches both."""

    path: str
    keep_raw_sse: bool = False
    max_bytes: int | None = None
    decoder: str | None = None
    decoder_arg: str | None = None
    turn_ends: list[int] = field(default_factory=list)
    address: str = ""
    observers: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WriterOptions:
        return cls(**json.loads(text))


# -- the serving side: starting, restarting and stopping the process --------------------------------


class WriterProcess:
    """The writer process, as the process that starts it sees it. Not started → running → stopped;
    a death while running is logged as an error and followed by a restart (within the limits above)."""

    def __init__(self, options: WriterOptions) -> None:
        # Made at start, mode 0700: only this user can connect (or send anything to unpickle).
        self._folder = Path(tempfile.gettempdir()) / f"modeltap-writer-{secrets.token_hex(8)}"
        self.address = options.address = str(self._folder / _SOCKET_NAME)
        self.options = options
        self.restarts = 0
        self.gave_up = False
        self._process: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task[None] | None = None
        self._stopping = False
        self._deaths: deque[float] = deque()

    @property
    def pid(self) -> int | None:
        """The running writer's process id (None when none runs)."""
        return None if self._process is None else self._process.pid

    async def start(self) -> None:
        """Start the process and wait until its store is open; RuntimeError saying why it is not."""
        if self._process is not None or self._stopping:
            raise RuntimeError("a WriterProcess starts once")
        self._folder.mkdir(mode=0o700)
        try:
            self._process = await self._spawn()
        except BaseException:
            self._remove_folder()
            raise
        self._watch = asyncio.get_running_loop().create_task(self._supervise(), name="modeltap:record-writer")

    async def stop(self) -> None:
        """Close the lifeline and wait for the process to drain its connections and exit. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        process = self._process
        if process is not None and process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.error("the record writer did not finish within %.0f s; killing it", STOP_TIMEOUT_S)
                process.kill()
                await process.wait()
        self._remove_folder()

    async def _spawn(self) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            __name__,
            "--options",
            self.options.to_json(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeError(
                f"the record writer did not open {self.options.path} within {READY_TIMEOUT_S:.0f} s"
            ) from None
        said = line.decode(errors="replace").strip()
        if said != _READY:
            await process.wait()
            raise RuntimeError(said or f"the record writer exited ({process.returncode}) before it was ready")
        return process

    async def _supervise(self) -> None:
        """Restart the writer whenever it dies, until stopped or past the limits."""
        pause = RESTART_PAUSE_S
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            now = time.monotonic()
            self._deaths.append(now)
            while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
                self._deaths.popleft()
            how = f"signal {-code}" if code < 0 else f"status {code}"
            if len(self._deaths) > MAX_RESTARTS:
                self.gave_up = True
                log.error(
                    "the record writer (pid %d) died with %s, its %d%s death within %.0f s: not restarting "
                    "it; each serving process writes its records itself from now on",
                    self._process.pid,
                    how,
                    len(self._deaths),
                    _ordinal(len(self._deaths)),
                    RESTART_WINDOW_S,
                )
                return
            log.error("the record writer (pid %d) died with %s; restarting it", self._process.pid, how)
            await asyncio.sleep(pause)
            pause = min(pause * 2, RESTART_PAUSE_MAX_S)
            try:
                self._process = await self._spawn()
            except RuntimeError as exc:
                log.error("the record writer could not be restarted: %s", exc)
                continue
            self.restarts += 1

    def _remove_folder(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


# -- the writer process ------------------------------------------------------------------------------


class _Connection:
    """One serving process's connection: the frames read from it, and what it has not been told."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = frames.FrameReader()
        self.settled = -1  # the last sequence number settled
        self.acked = -1  # the last one acknowledged
        self.written = 0
        self.failed: list[tuple[int, str]] = []
        self.oldest: float | None = None  # when the oldest settled, unacknowledged record settled
        self.now = False  # acknowledge at the next chance (a WAIT or FLUSH frame, or a replay)
        self.open = True

    def settle(self, frame: frames.Frame, error: BaseException | None, written: bool) -> None:
        self.settled = frame.seq
        self.written += written
        if error is not None:
            self.failed.append((frame.seq, f"{type(error).__name__}: {error}"))
        if self.oldest is None:
            self.oldest = time.monotonic()
        if frame.flags & (frames.WAIT | frames.REPLAY) or frame.kind == frames.FLUSH:
            self.now = True

    def due(self, now: float) -> float | None:
        """Seconds until this connection's acknowledgement is due (0: now), or None: nothing to say."""
        if self.settled == self.acked or self.oldest is None:
            return None
        if self.now or self.settled - self.acked >= ACK_EVERY:
            return 0.0
        return max(0.0, self.oldest + ACK_LINGER_S - now)

    def acknowledge(self) -> None:
        ack = frames.Ack(self.settled, self.written, tuple(self.failed))
        self.acked, self.written, self.failed, self.oldest, self.now = self.settled, 0, [], None, False
        try:
            self.sock.sendall(frames.encode_ack(ack))
        except OSError as exc:
            log.warning("record writer: a serving process's connection failed: %s", exc)
            self.open = False


class _Writer:
    """The writer process's loop: accept, read, write in batches, acknowledge, and drain at the end."""

    def __init__(
        self, writer: SqlWriter, listener: socket.socket, lifeline: int, observers: list[Any]
    ) -> None:
        self._writer = writer
        self._observers = observers
        self._listener = listener
        self._lifeline = lifeline
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(lifeline, selectors.EVENT_READ, None)
        self._connections: dict[socket.socket, _Connection] = {}
        self._pending: deque[tuple[_Connection, frames.Frame]] = deque()
        self._drain_by: float | None = None

    def run(self) -> None:
        while self._drain_by is None or self._connections or self._pending:
            now = time.monotonic()
            if self._drain_by is not None and now > self._drain_by:
                log.error(
                    "record writer: %d serving connection(s) still open %.0f s after serve stopped; exiting",
                    len(self._connections),
                    DRAIN_TIMEOUT_S,
                )
                break
            for key, _ in self._selector.select(self._timeout(now)):
                self._ready(key.fileobj)
            if self._pending:
                self._write_some()
            now = time.monotonic()
            for connection in list(self._connections.values()):
                if connection.due(now) == 0.0:
                    connection.acknowledge()
                if not connection.open:
                    self._drop(connection)

    def _timeout(self, now: float) -> float | None:
        if self._pending:
            return 0.0
        dues = [d for c in self._connections.values() if (d := c.due(now)) is not None]
        timeout = min(dues) if dues else None
        if self._drain_by is not None:
            timeout = min(timeout if timeout is not None else DRAIN_TIMEOUT_S, max(0.0, self._drain_by - now))
        return timeout

    def _ready(self, source: Any) -> None:
        if source is self._listener:
            sock, _ = self._listener.accept()
            connection = self._connections[sock] = _Connection(sock)
            self._selector.register(sock, selectors.EVENT_READ, None)
            connection.acknowledge()  # the greeting: an acknowledgement of nothing (channel.py)
        elif source == self._lifeline:
            if not os.read(self._lifeline, 4096):  # closed: serve is stopping (or gone)
                self._selector.unregister(self._lifeline)
                self._selector.unregister(self._listener)
                self._listener.close()
                self._drain_by = time.monotonic() + DRAIN_TIMEOUT_S
        else:
            connection = self._connections[source]
            try:
                data = source.recv(RECV_BYTES)
            except OSError:
                data = b""
            if not data:
                connection.open = False
                self._drop(connection)
                return
            try:
                self._pending.extend((connection, frame) for frame in connection.reader.feed(data))
            except frames.FrameError as exc:
                log.error("record writer: dropping a connection that sent %s", exc)
                connection.open = False
                self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        """Forget a closed connection; what it sent before closing is still written."""
        if self._connections.pop(connection.sock, None) is not None:
            self._selector.unregister(connection.sock)
            connection.sock.close()

    def _write_some(self) -> None:
        """Write the next batch: a replayed record alone (so that a record that kills the writer is
        known by the next death), others up to BATCH_MAX in one transaction."""
        batch: list[tuple[_Connection, frames.Frame]] = [self._pending.popleft()]
        if not batch[0][1].flags & frames.REPLAY:
            while self._pending and len(batch) < BATCH_MAX and not self._pending[0][1].flags & frames.REPLAY:
                batch.append(self._pending.popleft())
        items: list[tuple[_Connection, frames.Frame, Exchange | SessionEvent | None]] = []
        for connection, frame in batch:
            if frame.kind == frames.FLUSH:
                items.append((connection, frame, None))
                continue
            try:
                item = frame.item()
            except Exception as exc:  # boundary: a frame that cannot be read costs only itself
                self._writer.failures += 1
                log.error("record writer: a record could not be read (frame %d)", frame.seq, exc_info=exc)
                connection.settle(frame, exc, written=False)
                continue
            items.append((connection, frame, item))
        self._write(items)

    def _write(self, items: list[tuple[_Connection, frames.Frame, Exchange | SessionEvent | None]]) -> None:
        replayed = [i.id for _, f, i in items if f.flags & frames.REPLAY and isinstance(i, Exchange)]
        stored = self._writer.stored(replayed) if replayed else set()
        to_write = []
        for _, frame, item in items:
            if item is None:  # FLUSH
                continue
            if isinstance(item, Exchange) and item.id in stored:
                continue  # committed before the writer that took it died
            if frame.flags & frames.MINIMAL:
                self._writer.failed(item, RecordNotWritten(frame.reason()))
                continue
            to_write.append(item)
        errors = iter(self._writer.write(to_write) if to_write else [])
        self._observe(to_write)
        for connection, frame, item in items:
            if item is None:
                connection.settle(frame, None, written=False)
            elif isinstance(item, Exchange) and item.id in stored:
                connection.settle(frame, None, written=True)
            elif frame.flags & frames.MINIMAL:
                connection.settle(frame, RecordNotWritten(frame.reason()), written=False)
            else:
                error = next(errors)
                connection.settle(frame, error, written=error is None and isinstance(item, Exchange))

    def _observe(self, items: list[Exchange | SessionEvent]) -> None:
        for observer in self._observers:
            for item in items:
                if isinstance(item, Exchange):
                    try:
                        observer.on_exchange(item)
                    except Exception:  # boundary: an observer's bug must not stop the writer
                        log.exception("record writer: observer %s failed on exchange %s", observer, item.id)


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def writer_decoder(options: WriterOptions) -> Callable[[list[int]], list[str]] | None:
    """The ids' decoder the options name, built on its first use (only a token-history break needs it,
    and building it loads a tokenizer)."""
    if options.decoder is None:
        return None
    built: list[Callable[[list[int]], list[str]]] = []

    def decode(ids: list[int]) -> list[str]:
        if not built:
            built.append(_load(options.decoder or "")(options.decoder_arg))
        return built[0](ids)

    return decode


def main(argv: Iterable[str] | None = None) -> int:
    """The writer process: open the store, say "ready" on standard output, serve until the lifeline
    (standard input) closes."""
    parser = argparse.ArgumentParser(description="modeltap's record writer process (started by serve)")
    parser.add_argument("--options", required=True, help="WriterOptions as JSON")
    args = parser.parse_args(None if argv is None else list(argv))
    # serve is told of a Ctrl-C or a kill of its process group and stops; this process stops when serve
    # closes its lifeline, after writing everything it was sent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = WriterOptions.from_json(args.options)
    writer = SqlWriter(options.path, keep_raw_sse=options.keep_raw_sse, max_bytes=options.max_bytes)
    writer.tokens.decoder = writer_decoder(options)
    writer.tokens.turn_ends = frozenset(options.turn_ends)
    try:
        observers = [_load(spec)() for spec in options.observers]
        writer.open()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(options.address)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(options.address)
        listener.listen(LISTEN_BACKLOG)
    except (RuntimeError, OSError, ImportError, AttributeError) as exc:
        print(exc, flush=True)
        return 1
    print(_READY, flush=True)
    try:
        _Writer(writer, listener, sys.stdin.fileno(), observers).run()
    finally:
        writer.close()
        for observer in observers:
            if callable(getattr(observer, "close", None)):
                observer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
