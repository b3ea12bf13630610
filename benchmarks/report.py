"""Markdown pieces shared by the benchmark reports: tables, numbers, and the machine they ran on.

Owns: how results read on the page. Not: computing them (bench_*.py).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import machine


def fmt(value: float | None, digits: int = 2) -> str:
    """A number for a table cell; an em dash for one not measured."""
    return "—" if value is None else f"{value:.{digits}f}"


def verdict(met: bool) -> str:
    """A goal's cell: met or not."""
    return "met" if met else "NOT met"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table as lines."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def heading(title: str, command: str, quick: bool) -> list[str]:
    """Title, the command, and the machine and how loaded it was after the run: an in-process
    benchmark's opening lines (`preamble` is the proxies' one)."""
    facts, load = machine.facts(), machine.load()
    return [
        f"# {title}",
        "",
        f"Generated {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC by `{command}`"
        + (" (quick run: a smoke test, not numbers to quote)" if quick else "")
        + ".",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, {facts['memory_gib']} GiB, {facts['kernel']}, "
        f"{facts['python']}. Load (shared machine) after the run: {load['load_1m']} (1-min load average), "
        f"{load['busy_percent']}% CPU busy over {load['sample_s']} s.",
    ]


def preamble(results: dict[str, Any], title: str) -> list[str]:
    """Title, the command, the machine and how loaded it was, the configurations and their versions."""
    m, before, after = results["machine"], results["load_before"], results["load_after"]
    lines = [
        f"# {title}",
        "",
        f"Generated {results['generated']} by `{results['command']}`"
        + (" (quick run: a smoke test, not numbers to quote)" if results["quick"] else "")
        + ".",
        "All on loopback: the stand-in upstream, the proxy and the load generator share the machine, so the",
        "numbers are each proxy's CPU cost per request on it. Times in milliseconds unless marked.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['kernel']}, {m['python']}.",
        f"Load (shared machine): before the run {before['load_1m']} (1-min load average), "
        f"{before['busy_percent']}% CPU busy over {before['sample_s']} s; after it {after['load_1m']}, "
        f"{after['busy_percent']}% busy.",
        "",
        "## Configurations",
        "",
    ]
    lines += table(
        ["name", "what", "version", "status", "start s", "recorded"],
        [
            [
                row["name"],
                row["description"],
                row.get("version", "—"),
                row["status"].splitlines()[0][:200],
                fmt(row.get("startup_s"), 1),
                row.get("recorded") or "—",
            ]
            for row in results["configs"]
        ],
    )
    return lines


def save(out: Path, stem: str, results: dict[str, Any], markdown: str) -> None:
    """`out/STEM.json` (the results) and `out/STEM.md` (the report), and the report on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)
