"""The trend of modeltap's goals across releases: each release's overhead run, as ratios to the floor
measured in that same run, in one table, so that a regression shows in review.

Owns: keeping a release's `overhead.json` under `benchmarks/results/history/<label>/` (`--record
LABEL`, done once per release from the run that release is judged on), and writing
`benchmarks/results/trend.md` from every kept run plus the latest one (`results/overhead.json`).
Not: measuring (bench_overhead.py). Ratios, not times: runs on a shared machine differ in speed,
while a ratio to a relay measured beside it in the same run holds (benchmarks/README.md).

    .venv-bench/bin/python -m benchmarks.trend                       # rewrite trend.md (make bench does)
    .venv-bench/bin/python -m benchmarks.trend --record 0.2.0-abc1234
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

from benchmarks.bench_overhead import added
from benchmarks.harness import RESULTS
from benchmarks.report import fmt, table

HISTORY = RESULTS / "history"
LATEST = RESULTS / "overhead.json"

# (header, what it is): each modeltap ÷ floor in the same run, the goal beside it.
COLUMNS = [
    ("added p50 c=1 (goal ≤ 1.3)", "c1", "p50_ms", "added"),
    ("added p50 c=8 (goal ≤ 2.0)", "c8", "p50_ms", "added"),
    ("req/s c=64 (goal ≥ 0.6)", "c64", "rps", "rate"),
    ("streamed req/s c=64 (goal ≥ 0.75)", "c64_stream", "rps", "rate"),
    ("CPU/request c=1", "c1", "cpu_ms_per_request", "rate"),
]


def _row(results: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((r for r in results["configs"] if r["name"] == name and r.get("status") == "ok"), None)


def ratios(results: dict[str, Any], name: str = "modeltap") -> list[float | None]:
    """`name` ÷ floor for each column, in one run."""
    ours, floor = _row(results, name), _row(results, "floor")
    out: list[float | None] = []
    for _, scenario, key, kind in COLUMNS:
        if kind == "added":
            mine, theirs = added(results, name, scenario, key), added(results, "floor", scenario, key)
        else:
            mine = None if ours is None else ours["scenarios"].get(scenario, {}).get(key)
            theirs = None if floor is None else floor["scenarios"].get(scenario, {}).get(key)
        out.append(None if mine is None or not theirs else round(mine / theirs, 2))
    return out


def _runs() -> list[tuple[str, dict[str, Any]]]:
    runs = [
        (folder.name, json.loads((folder / "overhead.json").read_text()))
        for folder in sorted(HISTORY.glob("*"))
    ]
    if LATEST.exists():
        runs.append(("latest run", json.loads(LATEST.read_text())))
    return runs


def render(runs: list[tuple[str, dict[str, Any]]]) -> str:
    header = ["release", "config", *[c[0] for c in COLUMNS], "peak RSS MB", "load before", "run"]
    rows = []
    for label, results in runs:
        for name in ("modeltap", "modeltap-record"):
            row = _row(results, name)
            if row is None:
                continue
            rss = row.get("serving_peak_rss_mb", row.get("peak_rss_mb"))
            load = results.get("load_before", {}).get("load_1m")
            rows.append(
                [
                    label,
                    name,
                    *[fmt(r) for r in ratios(results, name)],
                    fmt(rss, 1),
                    fmt(load),
                    results["generated"],
                ]
            )
    out = [
        "# modeltap against the floor, release by release",
        "",
        "Each row is one `make bench-overhead` run: modeltap ÷ the bare aiohttp relay (`floor`) measured",
        "in the same run on the same machine, so rows compare although the runs' speeds do not (a shared",
        "2-core machine: read the load beside each). `modeltap` counts with the budget on, `modeltap-record`",
        "without it. Peak RSS is the serving process's (the record writer's is in the run's own report).",
        "Written by `python -m benchmarks.trend` from `benchmarks/results/history/*/overhead.json` and the",
        "latest `benchmarks/results/overhead.json`.",
        "",
        *table(header, rows),
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", metavar="LABEL", help="keep results/overhead.json as this release's run")
    parser.add_argument(
        "--from", dest="source", type=Path, default=LATEST, help="the run to keep (default the latest)"
    )
    args = parser.parse_args()
    if args.record:
        folder = HISTORY / args.record
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.source, folder / "overhead.json")
        markdown = args.source.with_suffix(".md")
        if markdown.exists():
            shutil.copy(markdown, folder / "overhead.md")
    (RESULTS / "trend.md").write_text(render(_runs()))


if __name__ == "__main__":
    main()
