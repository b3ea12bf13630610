"""Export on against export off: what `serve --otlp-endpoint` adds to modeltap's latency, throughput and CPU.

Owns: the run of ``make bench`` (and ``make bench-otlp``) that compares ``modeltap serve`` exporting a span
per exchange to a local OTLP sink (otlp_sink.py) with the same modeltap not exporting, both recording and
counting as in bench_overhead.py. They run side by side in ROUNDS interleaved rounds (the order rotating);
each difference, export on minus off of the medians over the rounds, is set beside the range of export
off's own rounds: the run-to-run noise the difference should stay within. Writes
``benchmarks/results/otlp.{md,json}``. Not: the comparison with the peers (bench_overhead.py).

    .venv-bench/bin/python -m benchmarks.bench_otlp [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_overhead import Scenario
from benchmarks.bodies import short_turn
from benchmarks.configs import Modeltap
from benchmarks.harness import RESULTS, Running, interleaved, local_server, run_configs
from benchmarks.report import fmt, preamble, save, table

# Rounds per scenario: enough to see how much the same configuration moves from one round to the next.
ROUNDS = 6
QUICK_ROUNDS = 2
QUICK_DIVISOR = 10
# Per scenario and configuration, at most this long in all (split over the rounds).
TIME_CAP_S = 30.0


@dataclass(frozen=True)
class Judged(Scenario):
    """A scenario of the overhead benchmark, and the number of its summary it is judged on."""

    metric: str = "p50_ms"


SCENARIOS = [
    Judged("c1", 1, False, 1200, "p50_ms"),
    Judged("c1_stream", 1, True, 1200, "ttfb_p50_ms"),
    Judged("c64", 64, False, 6000, "rps"),
]
METRIC_NAMES = {
    "p50_ms": "latency p50 (ms)",
    "ttfb_p50_ms": "time to first byte p50 (ms)",
    "rps": "req/s",
    "cpu_ms_per_request": "proxy CPU per request in the scenario's window (ms)",
    "cpu_ms_per_exchange": "proxy CPU per exchange over whole rounds (ms)",
}


class ModeltapOtlp(Modeltap):
    """modeltap as the overhead benchmark runs it, exporting to the sink at ``sink``."""

    name = "modeltap-otlp"
    description = "the same, exporting a span per exchange (--otlp-endpoint) to a local OTLP sink"

    def __init__(self, sink: str) -> None:
        self.sink = sink

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--otlp-endpoint", self.sink]

    def recorded(self, workdir: Path) -> str:
        with urllib.request.urlopen(self.sink + "/stats", timeout=10) as reply:
            stats = json.load(reply)
        lost = [
            line for line in (workdir / f"{self.name}.log").read_text().splitlines() if "spans lost" in line
        ]
        spans = f"{stats['requests']} export requests, {stats['bytes'] / 2**20:.1f} MiB of spans"
        return f"{super().recorded(workdir)}; {spans}; {lost[-1] if lost else 'no span lost'}"


async def measure(running: list[Running], rounds: int, divisor: int) -> None:
    """Every scenario against both configurations, a round at a time; each round's summary kept."""
    scenarios = interleaved(
        running, SCENARIOS, rounds, lambda s: s.requests // divisor // rounds, short_turn(), TIME_CAP_S
    )
    async for r, scenario, run in scenarios:
        summaries = r.row.setdefault("rounds", {}).setdefault(scenario.key, [])
        summaries.append(run.summary())
        # The proxy's CPU over whole rounds too: the worker sends a span up to 5 s after its exchange,
        # so a scenario's own window misses some of its export and catches some of the one before.
        spent = r.row.setdefault("round_cpu", [])
        if len(spent) < len(summaries):
            spent.append({"cpu_s": 0.0, "requests": 0})
        spent[len(summaries) - 1]["cpu_s"] += run.proxy_cpu_s or 0.0
        spent[len(summaries) - 1]["requests"] += run.completed + run.errors + run.warmups


def compare(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per scenario, its metric and the proxy's CPU per request: off and on (median and range over the
    rounds), the difference of the medians, and whether it is within off's range."""
    rows = {row["name"]: row for row in results["configs"] if row.get("status") == "ok"}
    if {"modeltap", "modeltap-otlp"} - rows.keys():
        return []
    series = {}
    for scenario in SCENARIOS:
        for metric in (scenario.metric, "cpu_ms_per_request"):
            series[scenario.key, metric] = [
                [r[metric] for r in rows[name]["rounds"][scenario.key] if r[metric] is not None]
                for name in ("modeltap", "modeltap-otlp")
            ]
    series["all", "cpu_ms_per_exchange"] = [
        [1000 * r["cpu_s"] / r["requests"] for r in rows[name]["round_cpu"] if r["requests"]]
        for name in ("modeltap", "modeltap-otlp")
    ]
    out = []
    for (scenario_key, metric), (off, on) in series.items():
        difference, noise = statistics.median(on) - statistics.median(off), max(off) - min(off)
        out.append(
            {
                "scenario": scenario_key,
                "metric": metric,
                "off": off,
                "on": on,
                "difference": round(difference, 3),
                "noise": round(noise, 3),
                "within_noise": abs(difference) <= noise,
            }
        )
    return out


async def run_all(quick: bool) -> dict[str, Any]:
    rounds, divisor = (QUICK_ROUNDS, QUICK_DIVISOR) if quick else (ROUNDS, 1)
    with (
        tempfile.TemporaryDirectory(prefix="modeltap-bench-otlp-") as tmp,
        local_server("otlp_sink", Path(tmp)) as sink,
    ):
        results = await run_configs(
            __spec__.name,
            [Modeltap(), ModeltapOtlp(sink)],
            quick,
            short_turn()(0),
            functools.partial(measure, rounds=rounds, divisor=divisor),
        )
    results["comparison"] = compare(results)
    return results


def _range(values: list[float]) -> str:
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def render(results: dict[str, Any]) -> str:
    out = preamble(results, "OTLP export on against off")
    out += [
        "",
        "## Export on against off",
        "",
        "Medians over the rounds, with each configuration's lowest and highest round; the noise is export",
        "off's own range from round to round, which the difference should stay within.",
        "",
    ]
    out += table(
        ["scenario", "measure", "export off", "export on", "on − off", "noise", "within noise"],
        [
            [
                c["scenario"],
                METRIC_NAMES[c["metric"]],
                _range(c["off"]),
                _range(c["on"]),
                fmt(c["difference"], 3),
                fmt(c["noise"], 3),
                "yes" if c["within_noise"] else "**no**",
            ]
            for c in results["comparison"]
        ],
    )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_ROUNDS} rounds of 1/{QUICK_DIVISOR} the requests"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for otlp.md and otlp.json")
    args = parser.parse_args()
    results = asyncio.run(run_all(args.quick))
    save(args.out, "otlp", results, render(results))


if __name__ == "__main__":
    main()
