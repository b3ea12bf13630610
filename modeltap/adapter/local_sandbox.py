"""Local sandboxes: host processes in a temporary directory, for machines without Docker.

Owns: a run's directory and the process groups its commands run in. Does not own the Sandbox
protocol (sandbox.py). There is no isolation: an agent can read and write anything the training
process can.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from modeltap.adapter.bundle import Mount, path_inside
from modeltap.adapter.sandbox import (
    MAX_FILE_BYTES,
    OUTPUT_HEAD_BYTES,
    OUTPUT_TAIL_BYTES,
    BoundedOutput,
    Closing,
    ExecResult,
    SandboxError,
    SandboxSpec,
    in_thread,
)
from modeltap.proxy.tasks import finish

log = logging.getLogger(__name__)

# How long teardown waits for SIGKILLed processes to die before it removes the run's directory anyway.
GROUP_EXIT_TIMEOUT_S = 5.0
# Every process a run starts carries this variable, its value the run's directory, and their children
# inherit it: at close it finds what left the run's process groups (setsid, a daemon whose parent exited,
# now PID 1's child). A process that clears its own environment is not found: nothing here isolates.
RUN_MARK = "MODELTAP_LOCAL_SANDBOX"


class LocalProvider(Closing):
    """Sandboxes that are host processes in a temporary directory, for machines without Docker.

    There is no isolation: an agent can read and write anything the training process can. Mounts are
    used in place (`${mount_NAME}` is the source path) and images are ignored.
    """

    async def prepare(self, images: Iterable[str]) -> None:
        """Nothing to prepare on the host."""

    async def open(self, spec: SandboxSpec) -> LocalSandbox:
        """Make the run's directory: `work/` (the workdir) and `home/` (its HOME)."""
        making = in_thread("local-mkdir", _make_root, spec.run_id)
        try:
            return LocalSandbox(await finish(making), spec)
        except asyncio.CancelledError:
            if making.exception() is None:  # made before the cancel could propagate: nobody owns it
                await finish(in_thread("local-rmtree", shutil.rmtree, making.result(), True))
            raise

    async def close(self) -> None:
        """Local sandboxes own their processes; nothing is left at provider level."""


class LocalSandbox(Closing):
    """A run's temporary directory on the host; each command is its own process group, and each process
    of the run carries RUN_MARK."""

    endpoint_kind: Literal["container", "host"] = "host"

    def __init__(self, root: Path, spec: SandboxSpec) -> None:
        self._root = root
        self.workdir = str(root / "work")
        self.home = str(root / "home")
        self.run_id = spec.run_id
        self.logs: list[str] = []
        self._groups: set[int] = set()
        self._commands = 0

    def mount_path(self, mount: Mount) -> str:
        return str(mount.source)

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult:
        """Run `argv` in its own session (so its whole process group can be killed) under the workdir.

        Its output goes to files of the run's directory, not pipes: a process that leaves the group
        (setsid, a daemon) and keeps a pipe open would hold the command past its exit, and its
        cancellation past the run's limit. The command ends when its process does; the files are
        read back within OUTPUT_HEAD_BYTES + OUTPUT_TAIL_BYTES per stream.
        """
        started = time.monotonic()
        self._commands += 1
        outputs = (self._root / f"out-{self._commands}.stdout", self._root / f"out-{self._commands}.stderr")
        process = self._spawn(argv, env, outputs)
        # Popen made the group with no await in between, so a cancellation finds it registered here.
        self._groups.add(process.pid)
        exited = in_thread("local-wait", process.wait)
        exit_code: int | None
        try:
            async with asyncio.timeout(timeout_s):
                exit_code = await asyncio.shield(exited)
        except TimeoutError:
            exit_code = None
        finally:
            if not exited.done():  # timed out or cancelled: end the group, then reap its leader
                _kill_group(process.pid)
                await finish(exited)
        stdout, stderr = await finish(in_thread("local-output", _read_outputs, outputs))
        result = ExecResult(tuple(argv), exit_code, stdout, stderr, time.monotonic() - started)
        self.logs.append(result.log_entry())
        return result

    def _spawn(
        self, argv: Sequence[str], env: Mapping[str, str], outputs: tuple[Path, Path]
    ) -> subprocess.Popen[bytes]:
        """Start `argv`: fork and exec on the loop, as asyncio's own subprocesses do (no wait here)."""
        base = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": self.home,
            "LANG": "C.UTF-8",
        }
        try:
            with outputs[0].open("wb") as stdout, outputs[1].open("wb") as stderr:
                return subprocess.Popen(
                    list(argv),
                    cwd=self.workdir,
                    env={**base, **env, RUN_MARK: str(self._root)},
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,
                )
        except OSError as exc:
            raise SandboxError(
                f"cannot start {argv[0]!r}: {exc.strerror}; check the agent's command"
            ) from exc

    async def read_file(self, path: str) -> bytes | None:
        """The regular file at `path` inside the workdir, or None if there is none. A path that
        leaves the workdir, a link on the way, or a file that is not regular (a FIFO, a device) is a
        SandboxError; nothing here can block."""
        return await in_thread("local-read", _read_inside, Path(self.workdir), path)

    async def close(self) -> None:
        """Kill every process group the run started and every process carrying its RUN_MARK (stray
        background children, those that left their group too), then delete the directory."""
        groups, self._groups = self._groups, set()
        for group in groups:
            _kill_group(group)
        # A killed process dies when the kernel next schedules it; until then it may still write into
        # the directory, and removing it would race that write (and leave what it wrote).
        await finish(in_thread("local-teardown", _remove_when_gone, groups, self._root))


def _make_root(run_id: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"modeltap-{run_id}-"))
    (root / "work").mkdir()
    (root / "home").mkdir()
    return root


def _remove_when_gone(groups: set[int], root: Path) -> None:
    """Kill the processes marked as `root`'s, and wait (up to GROUP_EXIT_TIMEOUT_S) until none of them
    and no process of `groups` runs, then remove `root`. The marked are sought again each time: one may
    have forked while its parent was being killed."""
    mark = f"{RUN_MARK}={root}".encode()
    deadline = time.monotonic() + GROUP_EXIT_TIMEOUT_S
    while _kill_marked(mark) or any(_group_running(group) for group in groups):
        if time.monotonic() > deadline:
            log.warning("processes of run %s outlived SIGKILL for %g s", root, GROUP_EXIT_TIMEOUT_S)
            break
        time.sleep(0.005)
    shutil.rmtree(root, ignore_errors=True)


def _kill_marked(mark: bytes) -> bool:
    """SIGKILL every process whose environment holds `mark` (as `NAME=value`); whether there was one.
    A zombie's environment reads empty: it runs nothing, and is not sought."""
    found = False
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark not in environ.read_bytes().split(b"\0"):
                continue
            os.kill(int(environ.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue  # gone meanwhile, or another user's
        found = True
    return found


def _group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. Zombies do not count: they run nothing, and the
    orphans among them are for PID 1 to reap, which may never happen in a container."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or its id now names another user's group
        return False
    for process in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = process.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if group == str(pgid) and state != "Z":
            return True
    return False


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has already exited


def _read_outputs(outputs: tuple[Path, Path]) -> tuple[str, str]:
    """A command's stdout and stderr from their files, bounded, the files then deleted."""
    texts = []
    for path in outputs:
        kept = BoundedOutput()
        with path.open("rb") as handle:
            # Only the head and the tail are read: the work is bounded whatever the command printed.
            middle = os.fstat(handle.fileno()).st_size - OUTPUT_HEAD_BYTES - OUTPUT_TAIL_BYTES
            if middle > 0:
                kept.write(handle.read(OUTPUT_HEAD_BYTES))
                kept.skip(middle)
                handle.seek(middle, os.SEEK_CUR)
            while chunk := handle.read(1 << 20):
                kept.write(chunk)
        path.unlink()
        texts.append(kept.text())
    return texts[0], texts[1]


def _read_inside(workdir: Path, path: str) -> bytes | None:
    """Open each component of `path` relative to the one before, from `workdir`, never following a
    link (so neither ".." nor a link the agent made leads out), the file itself non-blocking (opening
    or reading a FIFO would wait for a writer for good); read it only if it is a regular file, and at
    most MAX_FILE_BYTES of it."""
    parts = path_inside(path)
    if parts is None:
        raise SandboxError(f"answer file {path!r} is not a path inside the workdir")
    walk = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    directory = os.open(workdir, walk | os.O_DIRECTORY)
    part = ""
    try:
        for part in parts[:-1]:
            inner = os.open(part, walk | os.O_DIRECTORY, dir_fd=directory)
            os.close(directory)
            directory = inner
        part = parts[-1]
        fd = os.open(part, walk | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=directory)
    except OSError as exc:
        # Linux says ELOOP for a link opened with O_NOFOLLOW, and ENOTDIR when O_DIRECTORY is set too.
        if exc.errno == errno.ELOOP or _is_link(part, directory):
            raise SandboxError(f"answer file {path!r}: {part!r} on its way is a symlink") from exc
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            return None  # no such file (or a file where the path needs a directory)
        raise SandboxError(f"answer file {path!r} cannot be read: {exc.strerror}") from exc
    finally:
        os.close(directory)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SandboxError(f"answer file {path!r} is not a regular file ({_file_kind(mode)})")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise SandboxError(f"answer file {path!r} is over the {MAX_FILE_BYTES}-byte limit for answers")
    return data


def _is_link(name: str, directory: int) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=directory).st_mode)
    except OSError:
        return False


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISDIR: "a directory", stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "a device")
