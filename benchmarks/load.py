"""The load generator: a bounded run of chat completions at a fixed concurrency, timed per request.

Owns: sending requests and timing them (total, and time to first body byte), checking each answer,
and the percentile arithmetic. Not: which endpoints exist or what is started (configs.py).

Every run is bounded twice: at most ``requests`` requests and at most ``time_cap_s`` seconds; workers
stop taking new requests at the cap and the run reports what completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, hdrs

from benchmarks.stand_in import CONTENT_MARKER

# Warm-up requests before each timed run: connections opened, caches and JITs (LiteLLM's first request
# took 660 ms here: docs/peers.md §3.1) paid outside the numbers.
WARMUP_REQUESTS = 20
# A request slower than this is a failure, not a latency: no configuration is anywhere near it.
REQUEST_TIMEOUT_S = 60.0
STREAM_END = b"data: [DONE]"
ERROR_SNIPPET_CHARS = 300
PROBE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Target:
    """Where a configuration answers chat completions (or another format's endpoint), the headers it
    wants, and what a complete stream from it contains."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    stream_end: bytes = STREAM_END


@dataclass
class Run:
    """What one bounded run measured. Times are seconds; lists hold successful requests only."""

    latencies_s: list[float] = field(default_factory=list)
    ttfbs_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None
    wall_s: float = 0.0
    warmups: int = 0
    # CPU time the proxy used over the run, warm-up included (set by the caller, who knows the process).
    proxy_cpu_s: float | None = None

    def merge(self, other: Run) -> None:
        """Add ``other``'s requests to this run, as if they had been one run."""
        self.latencies_s += other.latencies_s
        self.ttfbs_s += other.ttfbs_s
        self.errors += other.errors
        self.first_error = self.first_error or other.first_error
        self.wall_s += other.wall_s
        self.warmups += other.warmups
        if other.proxy_cpu_s is not None:
            self.proxy_cpu_s = (self.proxy_cpu_s or 0.0) + other.proxy_cpu_s

    @property
    def completed(self) -> int:
        """Successful requests."""
        return len(self.latencies_s)

    def summary(self) -> dict[str, float | int | str | None]:
        """The run as plain numbers (milliseconds, requests a second) for JSON and tables."""
        return {
            "requests": self.completed,
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": round(self.wall_s, 3),
            "rps": round(self.completed / self.wall_s, 1) if self.wall_s else 0.0,
            "p50_ms": percentile_ms(self.latencies_s, 50),
            "p99_ms": percentile_ms(self.latencies_s, 99),
            "ttfb_p50_ms": percentile_ms(self.ttfbs_s, 50),
            "ttfb_p99_ms": percentile_ms(self.ttfbs_s, 99),
            "cpu_ms_per_request": self.cpu_ms_per_request(),
        }

    def cpu_ms_per_request(self) -> float | None:
        """The proxy's CPU milliseconds per request sent (warm-ups and failures included)."""
        sent = self.completed + self.errors + self.warmups
        return None if self.proxy_cpu_s is None or not sent else round(1000 * self.proxy_cpu_s / sent, 3)


def percentile_ms(values_s: list[float], pct: float) -> float | None:
    """The ``pct`` percentile of ``values_s`` in milliseconds (linear between ranks); None when empty."""
    if not values_s:
        return None
    ordered = sorted(values_s)
    rank = (len(ordered) - 1) * pct / 100
    low, high = math.floor(rank), math.ceil(rank)
    value = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return round(value * 1000, 3)


class AnswerError(Exception):
    """The configuration answered, but not with the stand-in's completion."""


FAILURES = (ClientError, TimeoutError, AnswerError)


def _client() -> ClientSession:
    # No pool cap: the callers set the concurrency. Bodies are compared as sent, so nothing is decoded.
    return ClientSession(
        connector=TCPConnector(limit=0),
        headers={hdrs.CONTENT_TYPE: "application/json"},
        auto_decompress=False,
        timeout=ClientTimeout(total=REQUEST_TIMEOUT_S),
    )


async def _one(client: ClientSession, target: Target, body: bytes, stream: bool) -> tuple[float, float]:
    started = time.perf_counter()
    async with client.post(target.url, data=body, headers=target.headers) as response:
        first = await response.content.readany()
        ttfb = time.perf_counter() - started
        whole = first + await response.content.read()
        total = time.perf_counter() - started
        complete = CONTENT_MARKER.encode() in whole and (not stream or target.stream_end in whole)
        if response.status != 200 or not complete:
            raise AnswerError(f"{response.status}: {whole[:ERROR_SNIPPET_CHARS]!r}")
    return total, ttfb


async def _timed(run: Run, client: ClientSession, target: Target, body: bytes, stream: bool) -> None:
    try:
        total, ttfb = await _one(client, target, body, stream)
    except FAILURES as exc:
        run.errors += 1
        run.first_error = run.first_error or f"{type(exc).__name__}: {exc}"[:ERROR_SNIPPET_CHARS]
        return
    run.latencies_s.append(total)
    run.ttfbs_s.append(ttfb)


async def _warm_up(
    client: ClientSession, target: Target, body_for: Callable[[int], bytes], stream: bool, requests: int
) -> None:
    for i in range(requests):
        with contextlib.suppress(*FAILURES):  # a configuration that keeps failing fails the timed run too
            await _one(client, target, body_for(-1 - i), stream)


async def run_load(
    target: Target,
    body_for: Callable[[int], bytes],
    requests: int,
    concurrency: int,
    stream: bool,
    time_cap_s: float,
    warmup: int = WARMUP_REQUESTS,
) -> Run:
    """Send ``requests`` bodies (``body_for(i)``) from ``concurrency`` workers, within ``time_cap_s``.

    ``warmup`` requests go first, untimed (bodies ``body_for(-1)``, ``body_for(-2)``...).
    """
    run = Run(warmups=warmup)
    async with _client() as client:
        await _warm_up(client, target, body_for, stream, warmup)
        next_index = 0
        started = time.perf_counter()
        deadline = started + time_cap_s

        async def worker() -> None:
            nonlocal next_index
            while next_index < requests and time.perf_counter() < deadline:
                index, next_index = next_index, next_index + 1
                await _timed(run, client, target, body_for(index), stream)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.wall_s = time.perf_counter() - started
    return run


async def run_sessions(
    target: Target,
    concurrent: int,
    sessions: int,
    turns: int,
    body_for_turn: Callable[[int, int], bytes],
    time_cap_s: float,
    stagger_s: float,
) -> Run:
    """``sessions`` conversations, ``concurrent`` at a time, each sending its ``turns`` requests in order.

    A body is ``body_for_turn(session, turn)``. The ``concurrent`` workers start ``stagger_s`` apart, as
    agents do not all connect in one instant; each runs one session after another until none is left.
    """
    run = Run(warmups=WARMUP_REQUESTS)
    async with _client() as client:
        await _warm_up(client, target, lambda i: body_for_turn(i, 0), False, WARMUP_REQUESTS)
        next_session = 0
        started = time.perf_counter()
        deadline = started + time_cap_s

        async def worker(index: int) -> None:
            nonlocal next_session
            await asyncio.sleep(index * stagger_s)
            while next_session < sessions:
                session, next_session = next_session, next_session + 1
                for turn in range(turns):
                    if time.perf_counter() >= deadline:
                        return
                    await _timed(run, client, target, body_for_turn(session, turn), stream=False)

        await asyncio.gather(*(worker(w) for w in range(concurrent)))
        run.wall_s = time.perf_counter() - started
    return run


async def first_answer(target: Target, body: bytes, stream: bool, timeout_s: float) -> str | None:
    """Retry one request until it succeeds or ``timeout_s`` passes; None on success, else the last error."""
    deadline = time.monotonic() + timeout_s
    problem = "no attempt"
    async with _client() as client:
        while time.monotonic() < deadline:
            try:
                await _one(client, target, body, stream)
                return None
            except FAILURES as exc:
                problem = f"{type(exc).__name__}: {exc}"[:ERROR_SNIPPET_CHARS]
            await asyncio.sleep(PROBE_INTERVAL_S)
    return problem
