"""`modeltap serve` with the budget's counting in a process of its own, to measure whether counting
belongs beside the serving process: it is on the request path, so the round trip (pickling the body,
two socket hops, unpickling) must cost less than the GIL contention and the thread hand-off it saves.

Owns: the counting process (the same TokenCounter, loaded from the same folder, answering counts over
a socket pair in order) and, in serve, the budget's `asyncio.to_thread(counter.count, ...)` sent
there instead. Everything else is modeltap's own. Not a modeltap mode: this is the measurement
(`make bench-overhead BENCH_ARGS="--only direct,floor,modeltap,modeltap-count-process"`), and what it
found is in docs/performance.md.

    python -m benchmarks.serve_counting_process serve --upstream URL --tokenizer DIR ...
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
import subprocess
import sys
import types
from collections import deque
from collections.abc import Callable
from typing import Any

_LENGTH = struct.Struct("!I")


def _frame(value: Any) -> bytes:
    data = pickle.dumps(value, 5)
    return _LENGTH.pack(len(data)) + data


def _read_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            raise EOFError
        data += piece
    return bytes(data)


def worker(fd: int, tokenizer: str) -> None:
    """The counting process: load the counter, then answer (dialect, body) with a count or an error."""
    from modeltap import dialects
    from modeltap.counting.counter import CountError, TokenCounter

    counter = TokenCounter.load(tokenizer, {})
    sock = socket.socket(fileno=fd)
    while True:
        try:
            (size,) = _LENGTH.unpack(_read_exact(sock, _LENGTH.size))
            name, body = pickle.loads(_read_exact(sock, size))
        except EOFError:
            return
        try:
            answer: Any = counter.count(dialects.named(name), body)
        except CountError as exc:
            answer = ("error", str(exc))
        sock.sendall(_frame(answer))


class _Counting:
    """serve's side: one connection to the counting process, answers taken in the order asked."""

    def __init__(self, tokenizer: str) -> None:
        mine, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.serve_counting_process",
                "--worker",
                str(theirs.fileno()),
                tokenizer,
            ],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self._sock = mine
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._listening: asyncio.Task[None] | None = None

    async def count(self, dialect: Any, body: Any) -> int:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(sock=self._sock)
            self._listening = asyncio.get_running_loop().create_task(self._listen())
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._writer.write(_frame((dialect.name, body)))
        answer = await future
        if isinstance(answer, tuple):
            from modeltap.counting.counter import CountError

            raise CountError(answer[1])
        return int(answer)

    async def _listen(self) -> None:
        assert self._reader is not None
        while True:
            (size,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
            self._waiting.popleft().set_result(pickle.loads(await self._reader.readexactly(size)))


def _shim(counting: _Counting) -> types.ModuleType:
    """asyncio as budget.py sees it, with its `to_thread(counter.count, dialect, body)` sent to the
    counting process."""
    from modeltap.counting.counter import TokenCounter

    shim = types.ModuleType("asyncio")
    shim.__dict__.update(asyncio.__dict__)

    def to_thread(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        if getattr(function, "__name__", "") == "count" and isinstance(
            getattr(function, "__self__", None), TokenCounter
        ):
            return counting.count(*args)
        return asyncio.to_thread(function, *args, **kwargs)

    shim.to_thread = to_thread  # type: ignore[attr-defined]
    return shim


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        worker(int(sys.argv[2]), sys.argv[3])
        return
    from modeltap import cli
    from modeltap.proxy import budget

    tokenizer = sys.argv[sys.argv.index("--tokenizer") + 1]
    budget.asyncio = _shim(_Counting(tokenizer))  # type: ignore[attr-defined]
    sys.exit(cli.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
