"""modeltap/adapter/loop.py: the background loop, its shared resources, and cancellation bridging."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from modeltap.adapter.loop import BackgroundLoop


@pytest.fixture
def bg() -> Iterator[BackgroundLoop]:
    loop = BackgroundLoop("test-background")
    yield loop
    loop.stop()


async def test_run_returns_the_result_computed_on_the_background_thread(bg: BackgroundLoop) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert await bg.run(where(), "where") == "test-background"


async def test_run_raises_the_work_s_own_exception(bg: BackgroundLoop) -> None:
    async def fail() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        await bg.run(fail(), "fail")


async def running_work(bg: BackgroundLoop) -> tuple[asyncio.Future[None], list[str]]:
    """Work started on `bg` that runs until cancelled, then takes a while to tear down (removing a
    container); returns its caller, once the work runs, and the events list it adds "torn down" to."""
    events: list[str] = []
    started = threading.Event()

    async def work() -> None:
        try:
            started.set()
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.3)
            events.append("torn down")

    caller = asyncio.ensure_future(bg.run(work(), "work"))
    await asyncio.to_thread(started.wait, 5)
    return caller, events


async def test_a_cancelled_caller_waits_until_the_work_has_unwound(bg: BackgroundLoop) -> None:
    caller, events = await running_work(bg)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    events.append("cancel reached the caller")
    assert events == ["torn down", "cancel reached the caller"]


async def test_cancelling_again_during_teardown_still_waits_for_it(bg: BackgroundLoop) -> None:
    caller, events = await running_work(bg)
    for _ in range(3):
        caller.cancel()
        await asyncio.sleep(0.05)
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert events == ["torn down"]


async def test_run_on_the_background_loop_itself_is_refused(bg: BackgroundLoop) -> None:
    async def nested() -> None:
        async def inner() -> None: ...

        await bg.run(inner(), "inner")

    with pytest.raises(RuntimeError, match="for other loops"):
        await bg.run(nested(), "nested")


async def test_a_shared_resource_is_made_once_for_concurrent_callers_and_closed_at_stop(
    bg: BackgroundLoop,
) -> None:
    made: list[int] = []
    closed: list[str] = []

    async def factory() -> str:
        made.append(1)
        await asyncio.sleep(0.1)
        return f"resource-{len(made)}"

    async def close(value: str) -> None:
        closed.append(value)

    async def get() -> str:
        return await bg.shared("key", factory, close)

    values = await asyncio.gather(*(bg.run(get(), f"get-{i}") for i in range(20)))
    assert set(values) == {"resource-1"} and len(made) == 1
    bg.stop()
    assert closed == ["resource-1"]


async def test_a_failed_factory_is_forgotten_so_the_next_caller_retries(bg: BackgroundLoop) -> None:
    attempts: list[int] = []

    async def factory() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("daemon not up yet")
        return len(attempts)

    async def get() -> int:
        return await bg.shared("flaky", factory)

    with pytest.raises(OSError, match="daemon not up yet"):
        await bg.run(get(), "first")
    assert await bg.run(get(), "second") == 2


async def test_resources_close_newest_first_and_the_loop_restarts_after_stop(bg: BackgroundLoop) -> None:
    order: list[str] = []

    async def make(name: str) -> None:
        async def factory() -> str:
            return name

        async def close(value: str) -> None:
            order.append(value)

        await bg.shared(name, factory, close)

    await bg.run(make("proxy"), "a")
    await bg.run(make("docker"), "b")
    first_thread = bg.loop
    bg.stop()
    assert order == ["docker", "proxy"]
    bg.stop()  # a second stop does nothing

    async def ping() -> str:
        return "pong"

    assert await bg.run(ping(), "ping") == "pong"
    assert bg.loop is not first_thread


async def test_a_caller_cancelled_before_its_work_started_returns_and_the_work_never_runs(
    bg: BackgroundLoop,
) -> None:
    """AReaL cancels a submitted run on pause and stop, often before the background loop ran it."""
    gate = threading.Event()
    bg.loop.call_soon_threadsafe(gate.wait)  # the background loop is busy: nothing handed over runs yet
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    try:
        caller = asyncio.ensure_future(bg.run(work(), "never-started"))
        await asyncio.sleep(0)  # run() handed the work over
        caller.cancel()
        await asyncio.sleep(0)  # run() handed the cancel over, behind the work
    finally:
        gate.set()  # the loop now spawns the work's task and cancels it before its first step
    done, _ = await asyncio.wait({caller}, timeout=5.0)  # a hang detector, not a speed limit
    assert done == {caller} and caller.cancelled()
    assert ran == []


async def test_a_caller_whose_work_is_stopped_by_shutdown_gets_an_error_saying_so(bg: BackgroundLoop) -> None:
    started = threading.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(60)

    caller = asyncio.ensure_future(bg.run(work(), "stopped"))
    await asyncio.to_thread(started.wait, 5)
    bg.stop()  # on the caller's thread: the caller wakes only once the background loop has closed
    with pytest.raises(RuntimeError, match=r"stopped: the adapter's background loop stopped while this ran"):
        await caller
