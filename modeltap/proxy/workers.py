"""`serve --workers N`: N serving processes on one port (SO_REUSEPORT), one record writer, and the
sessions shared so that any worker serves any session.

Owns: starting the N-1 other workers from the first one (the primary, the process `serve` runs in),
telling them the configuration and the admin key over a private socket pair (never in argv, which
any local user can read), keeping every worker's sessions the same, and stopping them first when
serve stops. Does not own: what a worker serves (server.py, relay.py), the record writer (the
primary starts it; every worker sends it its records: records/writer_process.py).

Sessions: the primary holds the registry every other registry copies. A session opened or closed
anywhere (the admin API on any worker, serve's own default session, an idle one expiring) is
opened or closed in the primary's registry, which sends the change to every worker and answers only
once each has applied it: when `POST /_modeltap/sessions` returns, every worker accepts the token;
when `DELETE` returns, none does. Workers report which sessions they served now and then, so that
the primary expires only sessions idle everywhere. What stays per worker: the token counter's cache
(a conversation that moves to another worker is counted there from its start once), the names of
anonymous conversations and the chains of translated Responses (a client's connection stays with one
worker, and with it its conversation, but a reconnecting anonymous client may be named anew).

Messages are JSON lines; a message with a `rid` is a request whose answer carries the same `rid`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.sessions import Session, SessionRegistry

if TYPE_CHECKING:
    from modeltap.proxy.server import Proxy

log = logging.getLogger(__name__)

# How long the primary waits for a new worker to say it is ready (it loads its own tokenizer).
WORKER_READY_TIMEOUT_S = 120.0
# How long a worker may take to apply a session change before the change is answered without it.
SYNC_TIMEOUT_S = 10.0
# How long a stopping worker has to finish its exchanges and flush its records.
WORKER_STOP_TIMEOUT_S = 45.0
# A line of the control channel: a session with its labels fits many times over.
LINE_LIMIT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class WorkerSetup:
    """What makes a worker's app one of many: where its records go (`writer_address`: the primary's
    writer process), the admin key they share, and the port they all listen on."""

    writer_address: str
    admin_key: str
    port: int
    index: int = 0  # 0 is the first worker, the one serve runs in


def _session_message(session: Session) -> dict[str, Any]:
    fields = dataclasses.asdict(session)
    fields.pop("last_used")
    return fields


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def _read(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    line = await reader.readline()
    if not line:
        return None
    message: dict[str, Any] = json.loads(line)
    return message


# -- in the primary -----------------------------------------------------------------------------------


class _Worker:
    """One other worker as the primary sees it: its process and its end of the control channel."""

    def __init__(self, index: int, process: asyncio.subprocess.Process, reader: Any, writer: Any) -> None:
        self.index = index
        self.process = process
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer
        self.applied = 0  # the last session change it applied
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()


class Workers:
    """The other N-1 workers, started by the primary after its own app is serving. Not started →
    running → stopped. Keeps their sessions the primary's (module docstring).

        async with Workers(config, setup, registry, n=4) as workers:
            ...                                  # every worker serves until the block ends
    """

    def __init__(self, config: ProxyConfig, setup: WorkerSetup, registry: SessionRegistry, n: int) -> None:
        self._config = config
        self._setup = setup
        self._registry = registry
        self._n = n
        self._workers: list[_Worker] = []
        self._version = 0
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        registry.add_listener(self._broadcast)

    async def __aenter__(self) -> Workers:
        try:
            for index in range(1, self._n):
                self._workers.append(await self._spawn(index))
            for worker in self._workers:
                await asyncio.wait_for(asyncio.shield(worker.ready), WORKER_READY_TIMEOUT_S)
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers]

    async def _spawn(self, index: int) -> _Worker:
        mine, theirs = socket.socketpair()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                __name__,
                "--control-fd",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_connection(sock=mine, limit=LINE_LIMIT_BYTES)
        worker = _Worker(index, process, reader, writer)
        hello = {
            "op": "hello",
            "index": index,
            "config": dataclasses.asdict(self._config),
            "setup": dataclasses.asdict(dataclasses.replace(self._setup, index=index)),
            "sessions": [_session_message(s) for s in self._registry],
            "closed": self._registry.closed_tokens(),
            "version": self._version,
        }
        worker.applied = self._version
        await _send(writer, hello)
        self._spawn_task(self._listen(worker), f"worker-{index}")
        return worker

    def _spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"modeltap:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _broadcast(self, session: Session, closed: bool) -> None:
        """Tell every worker of a change in the primary's registry (a listener: it runs in `open` and
        `close`, synchronously)."""
        self._version += 1
        message = (
            {"op": "closed", "id": session.id, "token": session.token, "version": self._version}
            if closed
            else {"op": "opened", "session": _session_message(session), "version": self._version}
        )
        line = json.dumps(message).encode() + b"\n"
        for worker in self._workers:
            if not worker.writer.is_closing():
                worker.writer.write(line)

    async def synced(self) -> None:
        """Wait until every worker has applied the changes made so far (at most SYNC_TIMEOUT_S)."""
        version = self._version
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                while any(w.applied < version and w.process.returncode is None for w in self._workers):
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            log.error("a worker did not apply a session change within %.0f s", SYNC_TIMEOUT_S)

    async def _listen(self, worker: _Worker) -> None:
        """What one worker asks and says: applied versions, opening and closing requests, touches."""
        while (message := await _read(worker.reader)) is not None:
            op = message["op"]
            if op == "ready":
                worker.ready.set_result(message)
            elif op == "applied":
                worker.applied = max(worker.applied, message["version"])
                self._changed.set()
            elif op == "touch":
                now = time.monotonic()
                for session_id in message["ids"]:
                    if (session := self._registry.get(session_id)) is not None:
                        session.last_used = now
            elif op == "open":
                session = self._registry.open(
                    upstream=message["upstream"],
                    upstream_key=message["upstream_key"],
                    labels=message["labels"],
                )
                await self.synced()
                await _send(worker.writer, {"op": "answer", "rid": message["rid"], "id": session.id})
            elif op == "close":
                closed = self._registry.close(message["id"])
                await self.synced()
                await _send(worker.writer, {"op": "answer", "rid": message["rid"], "closed": closed})
        if not worker.ready.done():
            worker.ready.set_exception(RuntimeError(f"worker {worker.index} exited before it was ready"))
        if not self._stopping:
            code = await worker.process.wait()
            log.error(
                "serve worker %d (pid %d) exited (%s): its port share goes to the others",
                worker.index,
                worker.process.pid,
                code,
            )
        self._changed.set()

    async def stop(self) -> None:
        """Ask every other worker to stop and wait for each (each flushes its records). Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        for worker in self._workers:
            if not worker.writer.is_closing():
                with contextlib.suppress(ConnectionError):
                    await _send(worker.writer, {"op": "stop"})
        for worker in self._workers:
            try:
                await asyncio.wait_for(worker.process.wait(), WORKER_STOP_TIMEOUT_S)
            except TimeoutError:
                log.error(
                    "serve worker %d did not stop within %.0f s; killing it",
                    worker.index,
                    WORKER_STOP_TIMEOUT_S,
                )
                worker.process.kill()
                await worker.process.wait()
            worker.writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class LocalSharing:
    """How the admin API opens and closes sessions: in this process's registry (one worker), or, in
    the primary of several, there and answered once every worker has applied the change."""

    def __init__(self, registry: SessionRegistry) -> None:
        self._registry = registry
        self.workers: Workers | None = None

    async def open(self, upstream: str | None, upstream_key: str | None, labels: dict[str, str]) -> Session:
        session = self._registry.open(upstream=upstream, upstream_key=upstream_key, labels=labels)
        if self.workers is not None:
            await self.workers.synced()
        return session

    async def close(self, session_id: str) -> bool:
        closed = self._registry.close(session_id)
        if self.workers is not None:
            await self.workers.synced()
        return closed


def start_workers(proxy: Proxy) -> Workers:
    """The other workers of `proxy`, the first (`async with start_workers(proxy):`), each given its
    records' writer, its admin key and its port; the admin API then opens and closes sessions in all."""
    ctx = proxy.context
    if ctx.writer is None or proxy.port is None:
        raise RuntimeError("workers share the first worker's record writer process and port")
    setup = WorkerSetup(ctx.writer.address, proxy.admin_key, proxy.port)
    workers = Workers(proxy.config, setup, ctx.sessions, proxy.config.workers)
    if isinstance(ctx.sharing, LocalSharing):
        ctx.sharing.workers = workers
    return workers


# -- in another worker ----------------------------------------------------------------------------------


class ReplicaSharing:
    """A worker's copy of the primary's sessions, and its way to ask the primary to open or close one."""

    def __init__(self, registry: SessionRegistry) -> None:
        self._registry = registry
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._rid = 0
        self.stop = asyncio.Event()

    def bind(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """The control channel to the primary."""
        self._reader, self._writer = reader, writer

    def apply(self, message: dict[str, Any]) -> None:
        """A session change from the primary, or the primary's snapshot (`hello`)."""
        if message["op"] == "opened":
            self._registry.adopt(Session(**message["session"]))
        elif message["op"] == "closed":
            self._registry.close(message["id"])

    async def open(self, upstream: str | None, upstream_key: str | None, labels: dict[str, str]) -> Session:
        answer = await self._ask(
            {"op": "open", "upstream": upstream, "upstream_key": upstream_key, "labels": labels}
        )
        session = self._registry.get(answer["id"])
        if session is None:  # applied before the answer came: the channel keeps the primary's order
            raise RuntimeError(f"session {answer['id']} was opened but never reached this worker")
        return session

    async def close(self, session_id: str) -> bool:
        answer = await self._ask({"op": "close", "id": session_id})
        return bool(answer["closed"])

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        self._rid += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._answers[self._rid] = future
        assert self._writer is not None
        await _send(self._writer, {**message, "rid": self._rid})
        return await future

    async def listen(self) -> None:
        """Apply the primary's changes and take its answers until it says stop or goes away."""
        assert self._reader is not None and self._writer is not None
        while (message := await _read(self._reader)) is not None:
            if message["op"] == "answer":
                self._answers.pop(message["rid"]).set_result(message)
            elif message["op"] == "stop":
                break
            else:
                self.apply(message)
                await _send(self._writer, {"op": "applied", "version": message["version"]})
        self.stop.set()

    async def touch_now_and_then(self, every_s: float) -> None:
        """Tell the primary which sessions this worker served since it last said, so that only those
        idle on every worker expire."""
        since = time.monotonic()
        while True:
            await asyncio.sleep(every_s)
            used = [s.id for s in self._registry if s.last_used >= since]
            since = time.monotonic()
            if used and self._writer is not None:
                await _send(self._writer, {"op": "touch", "ids": used})


async def _replica(control_fd: int) -> None:
    """One other worker: its configuration from the primary, its app on the shared port, its sessions
    kept the primary's, until the primary says stop (or is gone)."""
    from modeltap.proxy.server import Proxy

    reader, writer = await asyncio.open_connection(
        sock=socket.socket(fileno=control_fd), limit=LINE_LIMIT_BYTES
    )
    hello = await _read(reader)
    if hello is None or hello["op"] != "hello":
        raise SystemExit("modeltap worker: the primary said nothing")
    config = ProxyConfig(**hello["config"])
    setup = WorkerSetup(**hello["setup"])
    proxy = Proxy(dataclasses.replace(config, port=setup.port), setup=setup)
    await proxy.start()
    try:
        sharing = proxy.context.sharing
        assert isinstance(sharing, ReplicaSharing)
        sharing.bind(reader, writer)
        sessions = proxy.context.sessions
        sessions.remember_closed(hello["closed"])
        for fields in hello["sessions"]:
            sessions.adopt(Session(**fields))
        ctx = proxy.context
        await _send(writer, {"op": "ready", "budget": ctx.budget_report, "token_ids": ctx.token_ids_report})
        ttl = config.session_ttl_s
        toucher = asyncio.get_running_loop().create_task(
            sharing.touch_now_and_then(max(min(ttl / 8, 30.0), 0.5))
        )
        await sharing.listen()
        toucher.cancel()
    finally:
        await proxy.stop()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description="one worker of `modeltap serve --workers N` (started by serve)"
    )
    parser.add_argument("--control-fd", type=int, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The primary stops this worker (after a Ctrl-C or a kill of serve's process group reaches it too).
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asyncio.run(_replica(args.control_fd))


if __name__ == "__main__":
    # Run as `python -m`, this file is `__main__`; the app imports it as modeltap.proxy.workers, whose
    # classes are the ones it checks against.
    from modeltap.proxy import workers

    workers.main()
