"""Named, owned background tasks, and waiting through a cancellation.

The event loop keeps only weak references to tasks, so a task nobody holds can vanish mid-run; and an
unnamed task is anonymous in every traceback. `TaskGroup`-like owners here hold their tasks, name
them, and cancel and await them on close. Lint bans bare `asyncio.create_task`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Tasks:
    """An owner of background tasks: `spawn` names and keeps them, `close` cancels and awaits them.

    >>> async def main():
    ...     tasks = Tasks("demo")
    ...     tasks.spawn(asyncio.sleep(0), "nap")
    ...     await tasks.close()
    """

    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self._owner}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s failed", task.get_name(), exc_info=exc)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def __len__(self) -> int:
        return len(self._tasks)


async def finish(future: asyncio.Future[T]) -> T:
    """Await `future` to its end even if the caller is cancelled meanwhile, then re-raise the cancel.

    For work that must not be abandoned half way: a container removal left half done is the stray
    that cancellation must not leave, and a run torn down must be waited for before its caller moves
    on. `future` must have an owner that completes it (a thread, a task held by `Tasks`).
    """
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        # The cancel wins over the future's own failure, which would otherwise swallow it (and a
        # caller that handles that failure would carry on as if never cancelled).
        if not future.cancelled():
            future.exception()  # retrieved: its failure is not logged as unhandled
        raise asyncio.CancelledError
    return future.result()
