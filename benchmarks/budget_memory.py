"""The memory of `modeltap serve` with the budget on, side by side with one without it.

Owns: starting both in front of the stand-in upstream, growing the same agent conversations through
each (one request per turn, as an agent sends them, alternating between the two so that load falls
on both alike), and reading each process's peak and current RSS after start-up and after each
conversation. Not: the conversations' content (bench_counting.py passes them in), the counting cost.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.configs import CHAT_PATH, REPO, Modeltap
from benchmarks.harness import stand_in_upstream
from benchmarks.processes import HOST, Service, free_port, start, wait_listening
from benchmarks.stand_in import MODEL

# A reply of a few tokens: the upstream's cost is not what is measured.
MAX_TOKENS = 16
# Long enough for a 350 kB request through a loaded 2-core machine.
REQUEST_TIMEOUT_S = 60.0
# The flags that turn the budget on (configs.Modeltap.argv), left out of the relay-only process.
BUDGET_FLAGS = ("--tokenizer", "--context-length")


@dataclass(frozen=True)
class Memory:
    """One process's resident memory, in MB: its peak so far (VmHWM) and now (VmRSS)."""

    peak_mb: float
    current_mb: float


@dataclass(frozen=True)
class Served:
    """What one `modeltap serve` process held: after start-up, then after each conversation."""

    name: str
    startup_s: float
    stages: dict[str, Memory]


def measure(conversations: Sequence[tuple[str, Iterable[list[dict[str, Any]]]]], tools: Any) -> list[Served]:
    """Serve each conversation (a label and its requests' message lists) through a budgeted and an
    unbudgeted `modeltap serve`, turn by turn, alternating between them."""
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp, stand_in_upstream(Path(tmp)) as upstream:
        services = [_serve(name, upstream, Path(tmp), budget) for name, budget in _KINDS]
        try:
            stages: list[dict[str, Memory]] = [{"started": _memory(s)} for s, _, _ in services]
            for label, requests in conversations:
                for messages in requests:
                    body = json.dumps(
                        {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages, "tools": tools}
                    )
                    for _, port, _ in services:
                        _send(port, body.encode())
                for index, (service, _, _) in enumerate(services):
                    stages[index][label] = _memory(service)
            return [
                Served(service.name, startup, stage)
                for (service, _, startup), stage in zip(services, stages, strict=True)
            ]
        finally:
            for service, _, _ in services:
                service.stop()


# (name, budget on): `modeltap serve` as bench_overhead runs it, and the same without a tokenizer.
_KINDS = (("modeltap, budget on", True), ("modeltap, no budget", False))


def _serve(name: str, upstream: str, workdir: Path, budget: bool) -> tuple[Service, int, float]:
    port = free_port()
    folder = workdir / name.replace(" ", "").replace(",", "-")
    folder.mkdir()
    argv = Modeltap().argv(upstream, port, folder)
    if not budget:
        argv = [a for i, a in enumerate(argv) if a not in BUDGET_FLAGS and argv[i - 1] not in BUDGET_FLAGS]
    began = time.perf_counter()
    # The console script imports modeltap from wherever the venv installed it (editable: one
    # checkout); the checkout running the benchmark is the one to measure.
    service = start(name, argv, folder, env={"PYTHONPATH": str(REPO)})
    wait_listening(service, port)
    return service, port, time.perf_counter() - began


def _send(port: int, body: bytes) -> None:
    request = urllib.request.Request(
        f"http://{HOST}:{port}{CHAT_PATH}", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
        reply.read()


def _memory(service: Service) -> Memory:
    fields = {}
    for line in Path(f"/proc/{service.pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) / 1024
    return Memory(round(fields["VmHWM"], 1), round(fields["VmRSS"], 1))
