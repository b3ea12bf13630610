"""Start, watch and stop the processes of a benchmark run: the stand-in upstream and each proxy.

Owns: process lifecycles (each in its own session, so that a proxy's workers stop with it), free
loopback ports, waiting for a port to listen, and the peak resident memory of a process tree. Not: what
to start (configs.py) or how to load it (load.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
# LiteLLM takes ~8 s to start here (docs/peers.md §3.1); modeltap reads its tokenizer's vocabulary for
# a few seconds. Room for both on a loaded 2-core machine.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.1


def free_port() -> int:
    """A loopback port nothing listens on right now (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _cpu_ns(pid: int) -> int:
    # schedstat counts each thread's time on a CPU in nanoseconds; /proc/PID/stat's clock ticks (10 ms)
    # are too coarse for a few dozen requests of a millisecond. A thread that exits takes its time along;
    # the proxies measured keep their threads.
    total = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return total


def _peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Service:
    """One started process (and whatever it forks), with its output in ``log_path``."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """The process id of the command itself."""
        return self.process.pid

    def tree(self) -> list[int]:
        """The process and all its live descendants."""
        pids, queue = [], [self.pid]
        while queue:
            pid = queue.pop()
            pids.append(pid)
            queue += _children(pid)
        return pids

    def peak_rss_bytes(self) -> int:
        """Sum of each live process's own peak RSS (VmHWM): exact for one process, an upper bound for a tree.

        Read it before ``stop()``: a process that has exited has no VmHWM left to read.
        """
        return 1024 * sum(_peak_rss_kib(pid) for pid in self.tree())

    def own_peak_rss_bytes(self) -> int:
        """The command's own peak RSS (VmHWM), its children left out: a proxy's serving process."""
        return 1024 * _peak_rss_kib(self.pid)

    def cpu_seconds(self) -> float:
        """CPU time the live threads of the process tree have used so far."""
        return sum(_cpu_ns(pid) for pid in self.tree()) / 1e9

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the process printed, to explain a failure."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, first_signal: signal.Signals = signal.SIGTERM) -> None:
        """Signal the process's own session (it and its workers), then SIGKILL what remains."""
        if self.process.poll() is None:
            os.killpg(self.pid, first_signal)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait()
        try:  # workers the leader left behind
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Service:
    """Start ``argv`` in a new session with stdout and stderr to ``log_dir/<name>.log``."""
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    return Service(name, process, log_path)


def wait_listening(service: Service, port: int, timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once ``port`` accepts connections; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise RuntimeError(f"{service.name} exited ({service.process.returncode}):\n{service.log_tail()}")
        with socket.socket() as sock:
            if sock.connect_ex((HOST, port)) == 0:
                return
        time.sleep(POLL_INTERVAL_S)
    raise RuntimeError(f"{service.name} did not listen on {port} in {timeout_s:.0f} s:\n{service.log_tail()}")
