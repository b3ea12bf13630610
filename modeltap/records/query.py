"""Which sessions a reader lists, and in what order: the filters of `modeltap sessions` and of the
viewer, and the label groups of `modeltap groups`, as SQL over the running aggregates (rollups.py).

Owns: `SessionQuery` (labels, outcome, errors only, a time range, a search, the sort, a limit, and
"changed since revision N" for the viewer's live update) and its SQL, each shape of which an index
answers in the order asked for, so a listing costs what it prints rather than what is stored; the
groups' SQL and their means; parsing what people type (`task_id=t1`, `2h`, `2025-06-01T12:00`);
merging the answers of several stores into one. No I/O: StoreReader (reader.py) runs the SQL.

    query = SessionQuery(labels=(("task_id", "t1"),), outcome="failed", limit=50)
    reader.sessions(query)          # newest first
"""

from __future__ import annotations

import heapq
import itertools
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

# What `sessions` prints unless told otherwise: a screenful, the newest.
DEFAULT_LIMIT = 50
# The label `groups` groups by unless told otherwise: the adapter labels every rollout with its task.
DEFAULT_GROUP_LABEL = "task_id"

Sort = Literal["time", "reward"]
SORTS: tuple[Sort, ...] = get_args(Sort)

SESSION_COLUMNS = (
    "s.id, s.created, s.labels, s.upstream, s.closed, s.exchanges, s.first, s.last, s.prompt_tokens, "
    "s.completion_tokens, s.errors, s.model, s.reward, s.outcome, s.rollout, s.rev, "
    "s.token_drift"
)
GROUPS_SQL = """
    SELECT value, sessions, exchanges, prompt_tokens, completion_tokens, errors, rewarded, reward_sum
    FROM label_groups WHERE key = ? ORDER BY value"""
GROUP_OUTCOMES_SQL = "SELECT value, outcome, sessions FROM label_outcomes WHERE key = ? AND sessions > 0"
# The highest code point: an id prefix P names the ids in [P, P + this).
_TOP = "\U0010ffff"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass(frozen=True, slots=True)
class SessionQuery:
    """A filter of sessions, newest first (or by reward, best first). Filters combine with AND.

    - `labels`: (key, value) pairs a session must all carry;
    - `outcome`: its rollout outcome; `errors`: only sessions with an exchange that failed;
    - `since` / `until`: when it started, as a Unix time (`parse_when` reads what people type);
    - `search`: an id prefix, or a label value (the viewer's search box);
    - `changed_after`: only sessions whose row changed after this revision (the viewer's live poll);
    - `limit`: at most this many (None: all);
    - `unsessioned`: also the pseudo-session of the exchanges recorded without a session
      (reader.NO_SESSION_ID), as the readers a person runs list it.
    """

    labels: tuple[tuple[str, str], ...] = ()
    outcome: str | None = None
    errors: bool = False
    since: float | None = None
    until: float | None = None
    search: str | None = None
    sort: Sort = "time"
    limit: int | None = None
    changed_after: int | None = None
    unsessioned: bool = False

    def __post_init__(self) -> None:
        if self.sort not in SORTS:
            raise ValueError(f"sort must be one of {', '.join(SORTS)}, not {self.sort!r}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be at least 1, not {self.limit}")

    def sql(self) -> tuple[str, list[Any]]:
        """The SELECT and its arguments. Changes since a revision come from the revision index, in
        revision order (few, and the viewer sorts them itself); else a label filter drives the query
        from its index, in time order; else the index of the outcome, of failed sessions, of rewards
        or of start times does."""
        args: list[Any] = []
        where: list[str] = []
        if self.labels and self.changed_after is None:
            # CROSS JOIN keeps SQLite from reordering: the label's index gives the sessions in order
            # (docs/sqlite.md §5).
            source, created = "session_labels l CROSS JOIN sessions s", "l.created"
            (key, value), rest = self.labels[0], self.labels[1:]
            where += ["l.key = ?", "l.value = ?", "s.id = l.session_id"]
            args += [key, value]
        else:
            source, created, rest = "sessions s", "s.created", self.labels
        for key, value in rest:
            where.append(
                "EXISTS (SELECT 1 FROM session_labels x"
                " WHERE x.session_id = s.id AND x.key = ? AND x.value = ?)"
            )
            args += [key, value]
        for clause, arg in (
            ("s.outcome = ?", self.outcome),
            (f"{created} >= ?", self.since),
            (f"{created} < ?", self.until),
            ("s.rev > ?", self.changed_after),
        ):
            if arg is not None:
                where.append(clause)
                args.append(arg)
        if self.errors:
            where.append("s.errors > 0")
        if self.search:
            where.append(
                "(s.id IN (SELECT id FROM sessions WHERE id >= ? AND id < ?)"
                " OR s.id IN (SELECT session_id FROM session_labels WHERE value = ?))"
            )
            args += [*id_range(self.search), self.search]
        if self.changed_after is not None:
            order = "s.rev"
        elif self.sort == "time":
            order = f"{created} DESC"
        else:
            order = "s.reward DESC, s.created DESC"
        sql = f"SELECT {SESSION_COLUMNS} FROM {source}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order}"
        if self.limit is not None:
            sql += " LIMIT ?"
            args.append(self.limit)
        return sql, args

    def merge(self, answers: Iterable[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
        """One answer from the answers of several stores, each already in this query's order (changes
        since a revision come in each store's own order, one store after the other)."""
        if self.changed_after is not None:
            merged: Iterator[dict[str, Any]] = itertools.chain.from_iterable(answers)
        else:
            merged = heapq.merge(*answers, key=self._key, reverse=True)
        return list(merged if self.limit is None else itertools.islice(merged, self.limit))

    def _key(self, row: dict[str, Any]) -> tuple[Any, ...]:
        if self.sort == "time":
            return (row["created"],)
        return (row["reward"] is not None, row["reward"] or 0.0, row["created"])


def id_range(prefix: str) -> tuple[str, str]:
    """The ids that start with `prefix`, as a range an index answers: [low, high)."""
    return prefix, prefix + _TOP


def parse_label(text: str) -> tuple[str, str]:
    """`KEY=VALUE` as a pair."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ValueError(f"--label {text!r}: give KEY=VALUE, e.g. task_id=fix-bug")
    return key, value


def parse_when(text: str, now: float | None = None) -> float:
    """A time as people type it: a duration ago (`90s`, `30m`, `2h`, `7d`, `1w`) or an ISO 8601 date
    or time (`2025-06-01`, `2025-06-01T14:30`, with or without a zone; without one it is local)."""
    match = _DURATION.match(text)
    if match is not None:
        return (time.time() if now is None else now) - float(match[1]) * _UNIT_S[match[2]]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give a duration ago (30m, 2h, 7d) or an ISO time (2025-06-01T14:30)"
        ) from None


def groups(
    label: str, rows: Iterable[Sequence[Any]], outcomes: Iterable[Sequence[Any]]
) -> list[dict[str, Any]]:
    """One store's groups (rows of GROUPS_SQL, GROUP_OUTCOMES_SQL) as sums, for `merge_groups`."""
    out: dict[str, dict[str, Any]] = {}
    for value, sessions, exchanges, prompt, completion, errors, rewarded, reward_sum in rows:
        out[value] = {
            "label": label,
            "value": value,
            "sessions": sessions,
            "exchanges": exchanges,
            "tokens": prompt + completion,
            "errors": errors,
            "rewarded": rewarded,
            "reward_sum": reward_sum,
            "outcomes": {},
        }
    for value, outcome, sessions in outcomes:
        if value in out:
            out[value]["outcomes"][outcome] = sessions
    return list(out.values())


def merge_groups(answers: Iterable[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The groups of several stores added up, with their means: reward (over the sessions that have
    one), turns and tokens per session, and each outcome's share of the sessions."""
    totals: dict[str, dict[str, Any]] = {}
    for answer in answers:
        for group in answer:
            total = totals.setdefault(group["value"], {**group, "outcomes": {}} | dict.fromkeys(_SUMS, 0))
            for key in _SUMS:
                total[key] += group[key]
            for outcome, n in group["outcomes"].items():
                total["outcomes"][outcome] = total["outcomes"].get(outcome, 0) + n
    return [_means(total) for _, total in sorted(totals.items())]


_SUMS = ("sessions", "exchanges", "tokens", "errors", "rewarded", "reward_sum")


def _means(group: dict[str, Any]) -> dict[str, Any]:
    n = group["sessions"] or 1
    return {
        "label": group["label"],
        "value": group["value"],
        "sessions": group["sessions"],
        "mean_reward": group["reward_sum"] / group["rewarded"] if group["rewarded"] else None,
        "outcomes": dict(sorted(group["outcomes"].items())),
        "shares": {o: c / n for o, c in sorted(group["outcomes"].items())},
        "mean_turns": group["exchanges"] / n,
        "mean_tokens": group["tokens"] / n,
        "errors": group["errors"],
    }
