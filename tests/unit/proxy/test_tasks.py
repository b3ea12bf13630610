"""modeltap/proxy/tasks.py: owned tasks, and finish(), which waits through a cancellation."""

from __future__ import annotations

import asyncio

import pytest

from modeltap.proxy.tasks import finish


async def test_finish_waits_for_the_future_then_re_raises_the_cancel_even_when_the_future_failed() -> None:
    loop = asyncio.get_running_loop()
    for outcome in ("result", "failure"):
        future: asyncio.Future[int] = loop.create_future()
        waiter = asyncio.ensure_future(finish(future))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.sleep(0)
        assert not waiter.done()  # the cancel waits for the future's end
        if outcome == "result":
            future.set_result(1)
        else:
            future.set_exception(OSError("the work failed after the cancel"))
        with pytest.raises(asyncio.CancelledError):  # the failure must not swallow the cancel
            await waiter


async def test_finish_returns_the_result_or_raises_the_failure_when_not_cancelled() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    loop.call_soon(future.set_result, 7)
    assert await finish(future) == 7
    failing: asyncio.Future[int] = loop.create_future()
    loop.call_soon(failing.set_exception, OSError("no"))
    with pytest.raises(OSError, match="no"):
        await finish(failing)
