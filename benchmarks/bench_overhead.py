"""Overhead side by side: what each proxy adds to one chat completion, and what it sustains.

Owns: the overhead run of ``make bench``: every configuration of configs.py, and modeltap with recording on
and no budget (``modeltap-record``), in front of the stand-in upstream; added p50/p99 latency at concurrency
1 and 8, non-streamed and streamed (time to first byte and total); throughput at concurrency 8 and 64; peak
RSS; the table of ratios against direct and against each peer, and the goals, written to
``benchmarks/results/overhead.{md,json}``.
Not: the scale curves (bench_scale.py) or where modeltap spends its time (bench_profile.py).

    .venv-bench/bin/python -m benchmarks.bench_overhead [--only direct,floor,modeltap-record] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bodies import short_turn
from benchmarks.configs import (
    ModeltapAsyncio,
    ModeltapBaseline,
    ModeltapCountingProcess,
    ModeltapRecording,
    ModeltapThreadWriter,
    ModeltapTokenIds,
    ModeltapWorkers,
)
from benchmarks.harness import RESULTS, Running, interleaved, run_configs, select
from benchmarks.load import Run, first_answer
from benchmarks.report import fmt, preamble, save, table

# Per scenario: at most this long, so the slowest peer (LiteLLM, ~84 req/s at c=8 here) still stops.
TIME_CAP_S = 20.0
QUICK_DIVISOR = 10
# Each scenario's requests are split over this many rounds across the configurations, so that the load
# other work puts on the shared machine is spread over all of them.
ROUNDS = 3


@dataclass(frozen=True)
class Scenario:
    """One timed run: how many requests, how many in flight, streamed or not."""

    key: str
    concurrency: int
    stream: bool
    requests: int


SCENARIOS = [
    Scenario("c1", 1, False, 500),
    Scenario("c1_stream", 1, True, 500),
    Scenario("c8", 8, False, 2000),
    Scenario("c8_stream", 8, True, 2000),
    Scenario("c64", 64, False, 4000),
    Scenario("c64_stream", 64, True, 4000),
]


async def measure(running: list[Running], quick: bool) -> None:
    """Every scenario against every configuration, interleaved in rounds; streams where accepted."""
    body_for = short_turn()
    for r in running:
        problem = await first_answer(r.started.target, body_for(0, True), stream=True, timeout_s=5)
        r.row["streams"] = problem is None
        if problem is not None:
            r.row["stream_problem"] = problem
    rounds = 1 if quick else ROUNDS
    runs: dict[tuple[str, str], Run] = {}
    scenarios = interleaved(
        running,
        SCENARIOS,
        rounds,
        lambda scenario: scenario.requests // (QUICK_DIVISOR if quick else rounds),
        body_for,
        TIME_CAP_S,
    )
    async for r, scenario, run in scenarios:
        runs.setdefault((r.config.name, scenario.key), Run()).merge(run)
    for r in running:
        r.row["scenarios"] = {
            key: run.summary() for (name, key), run in runs.items() if name == r.config.name
        }


async def run_all(only: str | None, quick: bool) -> dict[str, Any]:
    """The whole overhead run, with the goals judged on it."""
    results = await run_configs(
        __spec__.name,
        # Named with --only: what uvloop, the writer process, counting in a process and a second
        # serving process each change.
        select(
            only,
            also=[ModeltapRecording(), ModeltapTokenIds()],
            optional=[
                ModeltapAsyncio(),
                ModeltapThreadWriter(),
                ModeltapCountingProcess(),
                ModeltapWorkers(),
                ModeltapBaseline(),
            ],
        ),
        quick,
        short_turn()(0),
        functools.partial(measure, quick=quick),
    )
    results["goals"] = goals(results)
    return results


def _row(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    rows: list[dict[str, Any]] = results["configs"]
    return next((row for row in rows if row["name"] == name and row.get("status") == "ok"), None)


def _metric(row: dict[str, Any] | None, scenario: str, key: str) -> float | None:
    if row is None:
        return None
    value = row["scenarios"].get(scenario, {}).get(key)
    return None if value is None else float(value)


def added(results: dict[str, Any], name: str, scenario: str, key: str) -> float | None:
    """Milliseconds ``name`` adds to ``key`` (p50_ms, ttfb_p99_ms...) of ``scenario`` over direct."""
    mine, direct = (
        _metric(_row(results, name), scenario, key),
        _metric(_row(results, "direct"), scenario, key),
    )
    return None if mine is None or direct is None else round(mine - direct, 3)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 2)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 3)


def _check(goal: str, value: float | None, limit: float | None, at_most: bool) -> dict[str, Any]:
    met = None if value is None or limit is None else (value <= limit if at_most else value >= limit)
    return {"goal": goal, "modeltap": value, "limit": limit, "met": met}


# The relay's own cost against the floor's (the goals set for it), judged for modeltap with and without the
# budget: added p50 at most this multiple of the floor's, and throughput at least this share of it.
FLOOR_ADDED_P50 = {"c1": 1.3, "c8": 2.0}
FLOOR_THROUGHPUT = {"c64": 0.6, "c64_stream": 0.75}


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """modeltap's goals, each with the numbers it was judged on (met None: not measured)."""
    checks = []
    for name in ("modeltap", "modeltap-record"):
        if name == "modeltap" or _row(results, name) is not None:
            checks += _floor_goals(results, name)
    for scenario in ("c1", "c8"):
        mine, litellms = (
            added(results, "modeltap", scenario, "p50_ms"),
            added(results, "litellm", scenario, "p50_ms"),
        )
        checks.append(
            _check(f"added p50 ({scenario}) at most 1/10 of LiteLLM's", mine, _scaled(litellms, 0.1), True)
        )
    ttfb = added(results, "modeltap", "c1_stream", "ttfb_p50_ms")
    checks.append(_check("streamed TTFB overhead (c1 p50) under 1 ms", ttfb, 1.0, True))
    ours = _row(results, "modeltap")
    rss = None if ours is None else ours.get("serving_peak_rss_mb")
    checks.append(_check("peak RSS of the serving process under 100 MB, budget on", rss, 100.0, True))
    return checks


def _floor_goals(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    ours, floor = _row(results, name), _row(results, "floor")
    checks = []
    for scenario, factor in FLOOR_ADDED_P50.items():
        mine, floors = added(results, name, scenario, "p50_ms"), added(results, "floor", scenario, "p50_ms")
        checks.append(
            _check(
                f"{name}: added p50 ({scenario}) within {factor}x the floor's",
                mine,
                _scaled(floors, factor),
                True,
            )
        )
    for scenario, share in FLOOR_THROUGHPUT.items():
        mine, floors = _metric(ours, scenario, "rps"), _metric(floor, scenario, "rps")
        checks.append(
            _check(
                f"{name}: throughput {scenario} at least {share}x the floor's",
                mine,
                _scaled(floors, share),
                False,
            )
        )
    return checks


LATENCY_COLUMNS = [  # (header, scenario, key)
    ("c1 p50", "c1", "p50_ms"),
    ("c1 p99", "c1", "p99_ms"),
    ("c1 TTFB p50", "c1_stream", "ttfb_p50_ms"),
    ("c1 TTFB p99", "c1_stream", "ttfb_p99_ms"),
    ("c1 stream p50", "c1_stream", "p50_ms"),
    ("c1 stream p99", "c1_stream", "p99_ms"),
    ("c8 p50", "c8", "p50_ms"),
    ("c8 p99", "c8", "p99_ms"),
    ("c8 TTFB p50", "c8_stream", "ttfb_p50_ms"),
    ("c8 TTFB p99", "c8_stream", "ttfb_p99_ms"),
    ("c8 stream p50", "c8_stream", "p50_ms"),
    ("c8 stream p99", "c8_stream", "p99_ms"),
]
# c=8 streams are paced by the stand-in's chunk gap, not by the proxy: no throughput column for them.
THROUGHPUT_SCENARIOS = ["c8", "c64", "c64_stream"]
# The proxy's own CPU per request: unlike latency, hardly moved by other work on a shared machine.
CPU_SCENARIOS = ["c1", "c1_stream", "c64"]


# The p50s that the ratio tables compare: (header, scenario, key).
RATIO_COLUMNS = [
    ("c1 p50", "c1", "p50_ms"),
    ("c1 TTFB p50", "c1_stream", "ttfb_p50_ms"),
    ("c8 p50", "c8", "p50_ms"),
    ("c8 stream p50", "c8_stream", "p50_ms"),
]
MET = {True: "yes", False: "**no**", None: "not measured"}


def _latency_sections(results: dict[str, Any], ok: list[dict[str, Any]]) -> list[str]:
    header = ["config", *[h for h, _, _ in LATENCY_COLUMNS]]
    out = ["", "## Latency, absolute (ms)", ""]
    out += table(header, [[r["name"], *[fmt(_metric(r, s, k)) for _, s, k in LATENCY_COLUMNS]] for r in ok])
    out += ["", "## Added latency over direct (ms)", ""]
    proxies = [r for r in ok if r["name"] != "direct"]
    return out + table(
        header,
        [
            [r["name"], *[fmt(added(results, r["name"], s, k)) for _, s, k in LATENCY_COLUMNS]]
            for r in proxies
        ],
    )


def _throughput_section(ok: list[dict[str, Any]]) -> list[str]:
    out = [
        "",
        "## Throughput (req/s), errors, the proxy's CPU per request (ms, all its processes), peak RSS",
        "",
    ]
    rows = [
        [
            r["name"],
            *[fmt(_metric(r, s, "rps"), 0) for s in THROUGHPUT_SCENARIOS],
            str(sum(v["errors"] for v in r["scenarios"].values())),
            *[fmt(_metric(r, s, "cpu_ms_per_request"), 3) for s in CPU_SCENARIOS],
            fmt(r.get("serving_peak_rss_mb"), 1),
            fmt(r.get("peak_rss_mb"), 1),
        ]
        for r in ok
    ]
    header = [
        "config",
        *[f"{s} req/s" for s in THROUGHPUT_SCENARIOS],
        "errors",
        *[f"CPU {s}" for s in CPU_SCENARIOS],
        "peak RSS MB, serving process",
        "peak RSS MB, all its processes",
    ]
    return out + table(header, rows)


def _direct_ratio_section(results: dict[str, Any], ok: list[dict[str, Any]]) -> list[str]:
    direct = _row(results, "direct")
    out = [
        "",
        "## Ratios against direct (config ÷ direct)",
        "",
        "Latency: of absolute p50s (1.00 = free).",
        "",
    ]
    rows = [
        [
            r["name"],
            *[fmt(_ratio(_metric(r, s, k), _metric(direct, s, k))) for _, s, k in RATIO_COLUMNS],
            *[fmt(_ratio(_metric(r, s, "rps"), _metric(direct, s, "rps"))) for s in THROUGHPUT_SCENARIOS],
        ]
        for r in ok
        if r["name"] != "direct"
    ]
    header = ["config", *[h for h, _, _ in RATIO_COLUMNS], *[f"{s} req/s" for s in THROUGHPUT_SCENARIOS]]
    return out + table(header, rows)


def _peer_ratio_section(results: dict[str, Any], ok: list[dict[str, Any]]) -> list[str]:
    ours = _row(results, "modeltap")
    if ours is None:
        return []
    out = [
        "",
        "## modeltap against each other configuration (modeltap ÷ other)",
        "",
        "Added latency: below 1 means modeltap adds less. Throughput: above 1 means modeltap serves more.",
        "CPU per request and RSS: below 1 means modeltap uses less.",
        "",
    ]
    rows = [
        [
            r["name"],
            *[
                fmt(_ratio(added(results, "modeltap", s, k), added(results, r["name"], s, k)))
                for _, s, k in RATIO_COLUMNS
            ],
            *[fmt(_ratio(_metric(ours, s, "rps"), _metric(r, s, "rps"))) for s in THROUGHPUT_SCENARIOS],
            *[
                fmt(_ratio(_metric(ours, s, "cpu_ms_per_request"), _metric(r, s, "cpu_ms_per_request")))
                for s in CPU_SCENARIOS
            ],
            fmt(_ratio(ours.get("peak_rss_mb"), r.get("peak_rss_mb"))),
        ]
        for r in ok
        if r["name"] not in ("modeltap", "direct")
    ]
    header = [
        "vs",
        *[f"added {h}" for h, _, _ in RATIO_COLUMNS],
        *[f"{s} req/s" for s in THROUGHPUT_SCENARIOS],
        *[f"CPU/req {s}" for s in CPU_SCENARIOS],
        "peak RSS",
    ]
    return out + table(header, rows)


def _goals_and_notes(results: dict[str, Any], ok: list[dict[str, Any]]) -> list[str]:
    out = ["", "## Goals (against the peers, and against the floor)", ""]
    out += table(
        ["goal", "modeltap", "limit", "met"],
        [[g["goal"], fmt(g["modeltap"]), fmt(g["limit"]), MET[g["met"]]] for g in results["goals"]],
    )
    notes = [f"- {r['name']}: streams not measured: {r['stream_problem']}" for r in ok if not r["streams"]]
    notes += [
        f"- {r['name']} {key}: {v['errors']} errors, first: {v['first_error']}"
        for r in ok
        for key, v in r["scenarios"].items()
        if v["errors"]
    ]
    return out + (["", "## Notes", "", *notes] if notes else [])


def render(results: dict[str, Any]) -> str:
    """The markdown report: machine, versions, absolute and added latency, throughput, ratios, goals."""
    ok = [row for row in results["configs"] if row.get("status") == "ok"]
    out = preamble(results, "Overhead: modeltap side by side with its peers")
    out += _latency_sections(results, ok) + _throughput_section(ok)
    out += _direct_ratio_section(results, ok) + _peer_ratio_section(results, ok)
    return "\n".join(out + _goals_and_notes(results, ok)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated configuration names (default: all)")
    parser.add_argument(
        "--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the requests (a smoke run)"
    )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help="directory for overhead.md and overhead.json"
    )
    args = parser.parse_args()
    results = asyncio.run(run_all(args.only, args.quick))
    save(args.out, "overhead", results, render(results))


if __name__ == "__main__":
    main()
