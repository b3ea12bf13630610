"""`modeltap stats`: how a run's exchanges ended and how large they were, per value of a label.

Owns: tallying exchanges by group (one group for all, or one per value of a label such as `task_id`
or `agent`): sessions, exchanges, finish reasons and error classes with their counts, and the
50th/90th/99th percentiles of prompt and completion tokens per exchange; its table and JSON. Reads
each session's summary columns only (`StoreReader.exchanges(…, bodies=False)`), never a body, so a
million exchanges cost a scan of small rows, not a decompression of their messages. Does not own:
which sessions (records/query.py, records/stores.py), printing columns (text.py).

    with Stores.open(["records.db"]) as stores:
        print(stats_table(stats(stores.selected(SessionQuery()), "task_id")))
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from modeltap.readers.text import columns
from modeltap.records.reader import StoreReader

PERCENTILES = (50, 90, 99)
# The group of sessions that do not carry the label asked for.
UNLABELLED = "-"


@dataclass
class _Tally:
    sessions: int = 0
    exchanges: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    prompt: list[int] = field(default_factory=list)
    completion: list[int] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        self.exchanges += 1
        self.finish_reasons[row["finish_reason"] or "none"] += 1
        if row["error_class"]:
            self.errors[row["error_class"]] += 1
        if row["prompt_tokens"] is not None:
            self.prompt.append(row["prompt_tokens"])
        if row["completion_tokens"] is not None:
            self.completion.append(row["completion_tokens"])


def covered(chosen: int, selected: int) -> str:
    """What a tally of `chosen` sessions, the newest of `selected` the filters select, covers, in words:
    `all 37 sessions`, `the newest 50 of 1276 sessions`."""
    if chosen >= selected:
        return f"all {selected} session{'s' if selected != 1 else ''}"
    return f"the newest {chosen} of {selected} sessions"


def stats(
    sessions: Iterable[tuple[StoreReader, dict[str, Any]]], label: str | None = None, covers: str = "all"
) -> list[dict[str, Any]]:
    """The exchanges of `sessions` (`Stores.selected`) tallied per value of `label` (None: one group of
    all, whose value is `covers`, what the sessions are: see `covered`), sorted by value, sessions
    without the label last as `-`. Each group has `label`, `value`, `covers`, `sessions`, `exchanges`,
    `finish_reasons` and `errors` (counts, most first, then by name; an exchange with no finish reason
    counts as `none`), and `prompt_tokens` / `completion_tokens`: `p50`, `p90`, `p99` and `count` (the
    exchanges that reported them)."""
    tallies: dict[str, _Tally] = {}
    for reader, session in sessions:
        value = session["labels"].get(label, UNLABELLED) if label else covers
        tally = tallies.setdefault(value, _Tally())
        tally.sessions += 1
        for row in reader.exchanges(session["id"], bodies=False):
            tally.add(row)
    ordered = sorted(tallies.items(), key=lambda item: (item[0] == UNLABELLED, item[0]))
    return [_group(label, value, tally) | {"covers": covers} for value, tally in ordered]


def percentile(values: Sequence[int], p: float) -> int | None:
    """The nearest-rank `p`th percentile of sorted `values`: the smallest value with at least p% of
    them at or below it (None for none)."""
    if not values:
        return None
    return values[max(math.ceil(p / 100 * len(values)) - 1, 0)]


def stats_table(groups: Sequence[dict[str, Any]]) -> str:
    """One line per group: sessions, exchanges, token percentiles, finish reasons, error classes."""
    if not groups:
        return "no exchanges recorded in the sessions chosen"
    head = (
        (groups[0]["label"] or "over").upper(),
        "SESSIONS",
        "EXCHANGES",
        "PROMPT p50/p90/p99",
        "COMPLETION p50/p90/p99",
        "FINISH REASONS",
        "ERRORS",
    )
    rows = [head]
    for group in groups:
        rows.append(
            (
                group["value"],
                str(group["sessions"]),
                str(group["exchanges"]),
                _spread(group["prompt_tokens"]),
                _spread(group["completion_tokens"]),
                _counts(group["finish_reasons"]),
                _counts(group["errors"]),
            )
        )
    return columns(rows)


def _group(label: str | None, value: str, tally: _Tally) -> dict[str, Any]:
    return {
        "label": label,
        "value": value,
        "sessions": tally.sessions,
        "exchanges": tally.exchanges,
        "finish_reasons": _most_first(tally.finish_reasons),
        "errors": _most_first(tally.errors),
        "prompt_tokens": _percentiles(tally.prompt),
        "completion_tokens": _percentiles(tally.completion),
    }


def _most_first(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def _percentiles(values: list[int]) -> dict[str, int | None]:
    values.sort()
    return {f"p{p}": percentile(values, p) for p in PERCENTILES} | {"count": len(values)}


def _spread(tokens: dict[str, int | None]) -> str:
    if not tokens["count"]:
        return "-"
    return "/".join(str(tokens[f"p{p}"]) for p in PERCENTILES)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "-"
