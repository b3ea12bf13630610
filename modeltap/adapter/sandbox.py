"""Where an agent's commands run: the Sandbox a run gets and the provider that makes them, one kind
per module (docker_sandbox.py: a container per run; local_sandbox.py: a process group on the host).

Owns: the Sandbox and SandboxProvider protocols, what they return (ExecResult) and raise
(SandboxError), choosing a provider for `runner=`, and the daemon-thread call both kinds make blocking
calls through. Does not own: what runs in a sandbox or how it is scored (runner.py).

    provider = provider_for("docker")                 # or "local"
    await provider.prepare(["modeltap-agent:local"])  # once per process: images exist, strays reaped
    async with await provider.open(spec) as sandbox:
        result = await sandbox.exec(["sh", "-c", "echo hi"], env={}, timeout_s=10)
    await provider.close()                            # removes every sandbox this process still owns

Blocking calls run each in its own daemon thread and hand their result back through the loop's
thread-safe call: a command can block its call for the whole run, so a shared thread pool would let
long commands starve the short calls (container removal) that tear runs down, and non-daemon pool
threads would hold interpreter exit until they return.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from modeltap.adapter.bundle import Mount
from modeltap.proxy.tasks import finish

T = TypeVar("T")

# What `runner: docker` needs beyond the base package (pyproject.toml's extras).
DOCKER_INSTALL_HINT = "runner: docker needs the docker SDK: pip install 'modeltap[adapter]'"
# Answers and files read back from a sandbox are text the checks compare; anything larger is not an
# answer but a runaway log.
MAX_FILE_BYTES = 8 * 1024 * 1024
# What a command's output keeps of each stream: its head (what the command said it was doing) and its
# tail (where the answer and the errors are). What falls between is counted and said, not kept: an
# agent printing 40 MB must cost neither 40 MB of memory nor the work of joining it.
OUTPUT_HEAD_BYTES = 64 * 1024
OUTPUT_TAIL_BYTES = MAX_FILE_BYTES
# What one command's output keeps in the run's log (its tail: the end is where errors are).
MAX_LOG_CHARS_PER_STREAM = 4000


class SandboxError(Exception):
    """The sandbox itself failed: no such image, the daemon refused, a container vanished."""


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What a run's sandbox needs: its run id (the container label), image, working directory, mounts."""

    run_id: str
    image: str | None
    workdir: str
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecResult:
    """One command's outcome. `exit_code` is None when the command was stopped at its timeout."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    def log_entry(self) -> str:
        """A readable log paragraph: the command, how it ended, and the tail of each stream."""
        ended = "timed out" if self.timed_out else f"exit {self.exit_code}"
        lines = [f"$ {' '.join(self.argv)[:400]}  ({ended}, {self.duration_s:.1f} s)"]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                lines.append(f"--- {name} ---\n{text[-MAX_LOG_CHARS_PER_STREAM:].rstrip()}")
        return "\n".join(lines)


class Sandbox(Protocol):
    """One run's isolated place to execute commands; closing it removes everything it created.

    `endpoint_kind` says which base URL of the proxy its processes can reach ("container" or "host");
    `home` is a directory of the run's own, for agents' HOME (never the real one).
    """

    endpoint_kind: Literal["container", "host"]
    workdir: str
    home: str
    logs: list[str]

    def mount_path(self, mount: Mount) -> str: ...

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes | None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxProvider(Protocol):
    """Makes sandboxes of one kind; one per process, shared by every run."""

    async def prepare(self, images: Iterable[str]) -> None: ...

    async def open(self, spec: SandboxSpec) -> Sandbox: ...

    async def close(self) -> None: ...


class Closing:
    """`async with` support: close on exit, whatever happened inside."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def in_thread(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Run `fn` in a new daemon thread; the returned future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting side timed out or was cancelled
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(*args, **kwargs), None)
        except BaseException as exc:  # delivered to the awaiting coroutine, which decides
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the call ran: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"modeltap-{name}", daemon=True).start()
    return future


class BoundedOutput:
    """One stream of a command's output, written as it arrives and kept within a bound: its first
    `head` bytes, its last `tail` bytes, and the count of those between. Each byte written is copied a
    bounded number of times, so n bytes cost O(n) work, and at most `head + tail` bytes plus the
    latest chunk are held at any time.

        out = BoundedOutput()
        for chunk in frames:
            out.write(chunk)
        out.text()  # the head, "[… N bytes of output dropped …]", the tail
    """

    def __init__(self, head: int = OUTPUT_HEAD_BYTES, tail: int = OUTPUT_TAIL_BYTES) -> None:
        self._head_limit, self._tail_limit = head, tail
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self.total = 0
        """Bytes written so far."""

    def write(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or not self._tail_limit:
            return
        self._tail.append(chunk)
        self._tail_size += len(chunk)
        while self._tail_size - len(self._tail[0]) >= self._tail_limit:
            self._tail_size -= len(self._tail.popleft())

    def skip(self, count: int) -> None:
        """Count `count` bytes that follow the head and are never read (the middle of a file, which
        is then read from where its tail starts). Only before anything past the head was written."""
        if self._tail or len(self._head) < self._head_limit:
            raise ValueError("skip() is for the bytes right after a full head")
        self.total += count

    @property
    def held(self) -> int:
        """Bytes held now: the head, and the chunks the tail is cut from."""
        return len(self._head) + self._tail_size

    @property
    def dropped(self) -> int:
        """Bytes written but not kept."""
        return self.total - len(self._head) - min(self._tail_size, self._tail_limit)

    def text(self) -> str:
        """What was kept, as text; a line between head and tail says how much fell between them."""
        tail = b"".join(self._tail)[-self._tail_limit :] if self._tail_limit else b""
        if not self.dropped:
            return decoded(bytes(self._head) + tail)
        gap = f"\n[… {self.dropped} bytes of output dropped …]\n"
        return decoded(bytes(self._head)) + gap + decoded(tail)


async def unwinding(teardown: Coroutine[Any, Any, T]) -> T:
    """Run `teardown` to its end even if the caller is cancelled meanwhile, then re-raise the cancel.

    For a teardown of several steps: `finish()` around each step would let a cancel that arrives
    during one skip the next (the container removal after its logs). The task running it is held by
    this call, which does not return before the task ends.
    """
    return await finish(asyncio.ensure_future(teardown))


def decoded(data: bytes | None) -> str:
    """Command output as text: invalid UTF-8 replaced, never an error."""
    return (data or b"").decode("utf-8", errors="replace")


def provider_for(runner: str) -> SandboxProvider:
    """The provider for AgentWorkflow's `runner=` argument: "docker" or "local". The docker SDK is
    imported only for "docker" (the `[adapter]` extra)."""
    if runner == "docker":
        try:
            from modeltap.adapter.docker_sandbox import DockerProvider
        except ImportError as exc:
            raise SandboxError(f"{DOCKER_INSTALL_HINT} ({exc})") from exc
        return DockerProvider()
    if runner == "local":
        from modeltap.adapter.local_sandbox import LocalProvider

        return LocalProvider()
    raise ValueError(f'runner={runner!r} is not a sandbox kind; use runner="docker" or runner="local"')
