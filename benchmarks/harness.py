"""The skeleton every side-by-side benchmark shares: stand-in up, each configuration in turn, facts kept.

Owns: one run over the configurations of configs.py in front of a fresh stand-in upstream, with the
machine's facts and load before and after, each configuration's version, start-up time, status and
peak RSS. What is measured while a configuration runs is the caller's ``measure`` coroutine.
"""

from __future__ import annotations

import functools
import shlex
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from benchmarks import machine
from benchmarks.configs import Configuration, Started, all_configurations, started
from benchmarks.load import Run, run_load
from benchmarks.processes import HOST, free_port, start, wait_listening

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


@dataclass
class Running:
    """A configuration started for the run, and the result row it fills in."""

    config: Configuration
    started: Started
    row: dict[str, Any]


Measure = Callable[[list[Running]], Awaitable[None]]


def select(
    only: str | None, also: Sequence[Configuration] = (), optional: Sequence[Configuration] = ()
) -> list[Configuration]:
    """The configurations named in ``only`` (comma-separated), or all of them; ``also`` adds the
    benchmark's own (placed after modeltap), ``optional`` more that run only when named."""
    configs = all_configurations()
    at = next((i + 1 for i, c in enumerate(configs) if c.name == "modeltap"), len(configs))
    configs[at:at] = [*also, *optional]
    if only is None:
        return [c for c in configs if c not in optional]
    names = only.split(",")
    unknown = set(names) - {c.name for c in configs}
    if unknown:
        raise SystemExit(f"unknown configuration(s) {sorted(unknown)}; known: {[c.name for c in configs]}")
    return [c for c in configs if c.name in names]


@contextmanager
def stand_in_upstream(workdir: Path) -> Iterator[str]:
    """The stand-in upstream (benchmarks/stand_in.py) running for the block; yields its base URL."""
    with local_server("stand_in", workdir) as url:
        yield url


@contextmanager
def local_server(module: str, workdir: Path) -> Iterator[str]:
    """`python -m benchmarks.MODULE --port N` running for the block; yields its base URL."""
    port = free_port()
    service = start(
        module, [sys.executable, "-m", f"benchmarks.{module}", "--port", str(port)], workdir, cwd=REPO
    )
    try:
        wait_listening(service, port)
        yield f"http://{HOST}:{port}"
    finally:
        service.stop()


async def run_configs(
    module: str, configs: list[Configuration], quick: bool, probe: bytes, measure: Measure
) -> dict[str, Any]:
    """Start the stand-in and every configuration at once, ``measure`` them, read their peak RSS, stop all.

    All configurations run side by side so that ``measure`` can interleave them: on a machine shared
    with other work, load that comes and goes then falls on every configuration alike.
    """
    results: dict[str, Any] = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join(["python", "-m", module, *sys.argv[1:]]),
        "quick": quick,
        "machine": machine.facts(),
        "load_before": machine.load(),
        "configs": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="modeltap-bench-") as tmp,
        stand_in_upstream(Path(tmp)) as upstream,
    ):
        workdir = Path(tmp)
        async with AsyncExitStack() as stack:
            running = [r for c in configs if (r := await _start(stack, c, upstream, workdir, probe, results))]
            await measure(running)
            for r in running:
                r.row["peak_rss_mb"] = peak_rss_mb(r.started)
                r.row["serving_peak_rss_mb"] = serving_peak_rss_mb(r.started)
                r.row["status"] = "ok"
        for r in running:  # stopped now, so every record is flushed
            r.row["recorded"] = r.config.recorded(workdir / r.config.name)
    results["load_after"] = machine.load()
    return results


async def _start(
    stack: AsyncExitStack,
    config: Configuration,
    upstream: str,
    workdir: Path,
    probe: bytes,
    results: dict[str, Any],
) -> Running | None:
    row: dict[str, Any] = {"name": config.name, "description": config.description}
    results["configs"].append(row)
    problem = config.missing()
    if problem is not None:
        row["status"] = f"not run: {problem}"
        log(f"{config.name}: {row['status']}")
        return None
    row["version"] = config.version()
    log(f"{config.name} ({row['version']}): starting")
    config_dir = workdir / config.name
    config_dir.mkdir()
    try:
        running = await stack.enter_async_context(started(config, upstream, config_dir, probe))
    except RuntimeError as exc:
        row["status"] = f"failed to start: {exc}"
        log(f"{config.name}: {row['status']}")
        return None
    row["startup_s"] = round(running.startup_s, 2)
    return Running(config, running, row)


class Scenario(Protocol):
    """A timed load: its name, how many requests in flight, streamed or not."""

    @property
    def key(self) -> str: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def stream(self) -> bool: ...


S = TypeVar("S", bound=Scenario)


async def interleaved(
    running: list[Running],
    scenarios: Sequence[S],
    rounds: int,
    requests: Callable[[S], int],
    body_for: Callable[..., bytes],
    time_cap_s: float,
) -> AsyncIterator[tuple[Running, S, Run]]:
    """Each scenario against each configuration that accepts it (streams where `row["streams"]` is not
    False), `rounds` times, `requests(scenario)` requests each time: yields each configuration's run.

    The order rotates each round, so that no configuration always runs right after the same one, and
    load that other work puts on the shared machine is spread over all of them.
    """
    for round_index in range(rounds):
        shift = round_index % len(running)
        for scenario in scenarios:
            count = requests(scenario)
            for r in running[shift:] + running[:shift]:
                if scenario.stream and r.row.get("streams") is False:
                    continue
                log(f"  round {round_index + 1}/{rounds} {scenario.key} {r.config.name}: {count} requests")
                body = functools.partial(body_for, stream=scenario.stream)
                load = run_load(
                    r.started.target, body, count, scenario.concurrency, scenario.stream, time_cap_s / rounds
                )
                yield r, scenario, await with_proxy_cpu(r.started, load)


async def with_proxy_cpu(running: Started, load: Awaitable[Run]) -> Run:
    """Await ``load`` and note on its run the CPU time the proxy used meanwhile (none for direct)."""
    service = running.service
    before = None if service is None else service.cpu_seconds()
    run = await load
    if service is not None and before is not None:
        run.proxy_cpu_s = service.cpu_seconds() - before
    return run


def peak_rss_mb(running: Started) -> float | None:
    """The proxy's peak RSS so far in MiB (None for direct, which has no proxy)."""
    return None if running.service is None else round(running.service.peak_rss_bytes() / 2**20, 1)


def serving_peak_rss_mb(running: Started) -> float | None:
    """The peak RSS in MiB of the process that serves (the command itself, without the processes it
    started: modeltap's record writer, LiteLLM's workers)."""
    return None if running.service is None else round(running.service.own_peak_rss_bytes() / 2**20, 1)


def log(message: str) -> None:
    """Progress on stderr, so a long run shows where it is."""
    print(message, file=sys.stderr, flush=True)
