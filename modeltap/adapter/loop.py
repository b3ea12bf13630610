"""The process's background event loop: where the adapter's proxy, sandboxes and runs live.

Owns: one daemon thread running one asyncio loop per process, the resources shared on it (created
once per key, closed in reverse order at shutdown or interpreter exit), and the bridge that lets a
coroutine on another loop (AReaL's) await work here. Does not own: what the work is (workflow.py).

Why a loop of our own: AReaL awaits `run()` on its rollout loop and rebuilds the workflow object on
every submit (docs/areal.md §3.3), so nothing that must live across runs
(the proxy, the docker connection, prepared bundles) can belong to the workflow object or to AReaL's
loop; and docker, SQLite and scoring must never block AReaL's loop.

Cancellation: when the awaiting coroutine is cancelled, the work here is cancelled too, and the
CancelledError leaves `run()` only after that work has finished unwinding (its containers removed),
also when the cancel comes before the work's first step. When `stop()` cancels the work instead (at
shutdown), the caller gets a RuntimeError saying so.

    result = await background().run(play(task), name="run:t1")      # from any other loop
    proxy = await background().shared(("proxy", key), start_proxy, stop_proxy)   # on the loop
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, TypeVar, cast

from modeltap.proxy.tasks import Tasks, finish

log = logging.getLogger(__name__)

T = TypeVar("T")
# How long shutdown waits for running work and for shared resources to close (a proxy flushing its
# records, docker removing containers) before it gives up and lets the process exit.
SHUTDOWN_TIMEOUT_S = 30.0

Closer = Callable[[Any], Awaitable[None]]


class BackgroundLoop:
    """An asyncio loop on a daemon thread, started on first use. Not started → running → stopped;
    using it after `stop()` starts a fresh one (tests stop it between cases)."""

    def __init__(self, name: str = "modeltap-adapter") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: Tasks | None = None
        self._shared: dict[Hashable, asyncio.Future[Any]] = {}
        self._closers: list[tuple[Hashable, Closer]] = []

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The background loop, started if need be. Callers do not wait for its thread to be
        scheduled (that can take tens of milliseconds on a loaded machine, all of it on the caller's
        loop): work handed over with call_soon_threadsafe waits in the loop until it runs."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._tasks = Tasks(self._name)
                self._thread = threading.Thread(
                    target=self._serve, args=(loop,), name=self._name, daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def run(self, coro: Coroutine[Any, Any, T], name: str) -> T:
        """Run `coro` on the background loop and await its result from the caller's loop.

        If the caller is cancelled, `coro` is cancelled and awaited to its end before the
        CancelledError is re-raised here, however often the caller is cancelled meanwhile.
        """
        loop = self.loop
        if asyncio.get_running_loop() is loop:
            coro.close()
            raise RuntimeError(
                "BackgroundLoop.run() is for other loops; on the background loop, await directly"
            )
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks = cast(Tasks, self._tasks)
        spawned: list[asyncio.Task[None]] = []

        def start() -> None:
            task = tasks.spawn(_deliver(coro, done), name)
            task.add_done_callback(lambda _: _abandoned(coro, done))
            spawned.append(task)

        loop.call_soon_threadsafe(start)
        waiter = asyncio.wrap_future(done)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if done.done() and not done.cancelled():
                raise  # the work had finished: nothing left to unwind
            caller = asyncio.current_task()
            if done.cancelled() and (caller is None or not caller.cancelling()):
                # Nobody cancelled the caller: stop() cancelled the work, at shutdown.
                raise RuntimeError(
                    f"{name}: the adapter's background loop stopped while this ran (shutdown)"
                ) from None
        # call_soon_threadsafe runs callbacks in order, so the task exists when this one runs; a loop
        # that has closed meanwhile has ended all its tasks.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(lambda: spawned[0].cancel())
        with contextlib.suppress(
            asyncio.CancelledError, Exception
        ):  # the caller asked to cancel: it gets one
            await finish(waiter)
        raise asyncio.CancelledError

    async def shared(
        self,
        key: Hashable,
        factory: Callable[[], Awaitable[T]],
        close: Callable[[T], Awaitable[None]] | None = None,
    ) -> T:
        """The resource for `key`, made by `factory` the first time; `close` runs at `stop()`. Call it
        on the background loop. Concurrent first callers share one factory call, which runs as a task
        of its own so that one caller's cancellation does not cancel it for the others. A factory
        that fails is forgotten, so the next caller tries again."""
        future = self._shared.get(key)
        if future is None:
            future = self._shared[key] = asyncio.get_running_loop().create_future()
            cast(Tasks, self._tasks).spawn(self._make(key, future, factory, close), f"shared:{key!r}")
        return await asyncio.shield(future)

    async def _make(
        self,
        key: Hashable,
        future: asyncio.Future[T],
        factory: Callable[[], Awaitable[T]],
        close: Callable[[T], Awaitable[None]] | None,
    ) -> None:
        try:
            value = await factory()
        except asyncio.CancelledError:
            self._shared.pop(key, None)
            future.cancel()
            raise
        except Exception as exc:  # handed to every caller waiting for this resource
            self._shared.pop(key, None)
            future.set_exception(exc)
            return
        future.set_result(value)
        if close is not None:
            self._closers.append((key, close))

    def stop(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Cancel running work, close shared resources (newest first), stop the loop and its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            log.error("modeltap adapter shutdown did not finish cleanly: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)

    async def _close(self) -> None:
        if self._tasks is not None:
            await self._tasks.close()
        for key, close in reversed(self._closers):
            try:
                await close(self._shared[key].result())
            except Exception:  # one resource failing to close must not keep the others open
                log.exception("closing %r failed", key)
        self._closers.clear()
        self._shared.clear()


async def _deliver(coro: Coroutine[Any, Any, T], done: concurrent.futures.Future[T]) -> None:
    """Run `coro`, handing its outcome to `done`. Failures are the caller's to handle, so they are not
    re-raised into the task (whose owner would log them as crashes)."""
    try:
        result = await coro
    except asyncio.CancelledError:
        done.cancel()
        raise
    except BaseException as exc:  # every outcome goes to the awaiting caller, which re-raises it
        done.set_exception(exc)
        return
    done.set_result(result)


def _abandoned(coro: Coroutine[Any, Any, T], done: concurrent.futures.Future[T]) -> None:
    """After the task that ran `_deliver` ended: if it was cancelled before its first step, the body
    of `_deliver` never ran, so `coro` never started and `done` was never settled. Settle it here, or
    the caller waits for it forever (AReaL cancels a run it has just submitted on pause and stop)."""
    if not done.done():
        coro.close()  # it never started: nothing to unwind, and no "never awaited" warning
        done.cancel()


_BACKGROUND = BackgroundLoop()


def background() -> BackgroundLoop:
    """The process's background loop (one per process; AReaL re-creates workflows, not processes)."""
    return _BACKGROUND


def shutdown() -> None:
    """Stop the process's background loop: running runs are cancelled and torn down, the proxy
    flushes its records, and containers this process still owns are removed. Runs at interpreter
    exit; safe to call more than once."""
    _BACKGROUND.stop()


atexit.register(shutdown)
