"""AReaL's servers as both AReaL tiers start them: a subprocess on a free loopback port, polled on
`/health` until it answers, stopped with SIGINT as AReaL's scheduler stops it. Failures quote the end of
the server's log. Used by areal_server.py (the v1 proxy) and tests/areal2/v2_services.py (the v2 router,
data proxy and gateway)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

HEALTH_POLL_INTERVAL_S = 0.25
# Each server exits within a second of SIGINT; one that hangs past this is killed.
SHUTDOWN_TIMEOUT_S = 15.0
LOG_TAIL_CHARS = 4000


def free_loopback_port() -> int:
    """A port nothing listens on right now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(log: Path) -> str:
    """The end of a server's log, for failure messages."""
    return log.read_text(errors="replace")[-LOG_TAIL_CHARS:]


def wait_healthy(process: subprocess.Popen[bytes], url: str, what: str, log: Path, timeout_s: float) -> None:
    """Return once `url`/health answers 200; raise, naming `what` and quoting its log, if the process
    exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log_tail(log)}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(HEALTH_POLL_INTERVAL_S)
    raise TimeoutError(f"{what} not healthy after {timeout_s} s:\n{log_tail(log)}")


def stop_servers(processes: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGINT each running process, then wait for each, killing what hangs. Idempotent."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGINT)
    for process in running:
        try:
            process.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
