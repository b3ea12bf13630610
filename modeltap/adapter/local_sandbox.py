"""Local sandboxes: host processes in a temporary directory, for machines without Docker.

Owns: a run's directory and the process groups its commands run in. Does not own the Sandbox
protocol (sandbox.py). There is no isolation: an agent can read and write anything the training
process can.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from modeltap.adapter.bundle import Mount
from modeltap.adapter.sandbox import (
    MAX_FILE_BYTES,
    Closing,
    ExecResult,
    SandboxError,
    SandboxSpec,
    decoded,
    in_thread,
)
from modeltap.proxy.tasks import finish


class LocalProvider(Closing):
    """Sandboxes that are host processes in a temporary directory, for machines without Docker.

    There is no isolation: an agent can read and write anything the training process can. Mounts are
    used in place (`${mount_NAME}` is the source path) and images are ignored.
    """

    async def prepare(self, images: Iterable[str]) -> None:
        """Nothing to prepare on the host."""

    async def open(self, spec: SandboxSpec) -> LocalSandbox:
        """Make the run's directory: `work/` (the workdir) and `home/` (its HOME)."""
        root = await in_thread("local-mkdir", _make_root, spec.run_id)
        return LocalSandbox(root, spec)

    async def close(self) -> None:
        """Local sandboxes own their processes; nothing is left at provider level."""


class LocalSandbox(Closing):
    """A run's temporary directory on the host; each command is its own process group."""

    endpoint_kind: Literal["container", "host"] = "host"

    def __init__(self, root: Path, spec: SandboxSpec) -> None:
        self._root = root
        self.workdir = str(root / "work")
        self.home = str(root / "home")
        self.run_id = spec.run_id
        self.logs: list[str] = []
        self._groups: set[int] = set()

    def mount_path(self, mount: Mount) -> str:
        return str(mount.source)

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult:
        """Run `argv` in its own session (so its whole process group can be killed) under the workdir."""
        started = time.monotonic()
        base = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": self.home,
            "LANG": "C.UTF-8",
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.workdir,
                env={**base, **env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(
                f"cannot start {argv[0]!r}: {exc.strerror}; check the agent's command"
            ) from exc
        self._groups.add(process.pid)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
            exit_code: int | None = process.returncode
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            exit_code, stdout, stderr = None, b"", b""
        except BaseException:
            _kill_group(process.pid)
            await process.wait()
            raise
        result = ExecResult(
            tuple(argv), exit_code, decoded(stdout), decoded(stderr), time.monotonic() - started
        )
        self.logs.append(result.log_entry())
        return result

    async def read_file(self, path: str) -> bytes | None:
        """The file at `path` (relative to the workdir), or None if it does not exist."""
        return await in_thread("local-read", _read_host_file, Path(self.workdir, path))

    async def close(self) -> None:
        """Kill every process group the run started (stray background children too), then delete the
        directory."""
        for group in self._groups:
            _kill_group(group)
        self._groups.clear()
        await finish(in_thread("local-rmtree", shutil.rmtree, self._root, True))


def _make_root(run_id: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"modeltap-{run_id}-"))
    (root / "work").mkdir()
    (root / "home").mkdir()
    return root


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has already exited


def _read_host_file(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(data) > MAX_FILE_BYTES:
        raise SandboxError(f"{path} is over the {MAX_FILE_BYTES}-byte limit for answers")
    return data
