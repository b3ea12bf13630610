"""modeltap/records/query.py: filters that combine, newest first, answered through an index in the
order asked for (so a listing's cost follows what it prints), the times people type, and merging."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.query import SessionQuery, merge_groups, parse_label, parse_when
from modeltap.records.reader import StoreReader
from tests.factories import assistant, recorded, rollout

DAY_S = 86400.0
NOW = 1_800_000_000.0


def samples() -> list[Exchange | SessionEvent]:
    """Eight rollouts of two tasks, a day apart, with rewards, outcomes and one failed exchange."""
    records: list[Exchange | SessionEvent] = []
    kinds = ["scored", "failed", "scored", "model_fault", "scored", "timed_out", "scored", "cancelled"]
    for n, kind in enumerate(kinds):
        reward = n / 10 if kind == "scored" else (0.0 if kind == "model_fault" else None)
        replies = [assistant(f"reply {n}")] * (1 + n % 3)
        records += rollout(
            f"s-{n}",
            f"task-{n % 2}",
            replies,
            outcome=RolloutOutcome(kind, reward),
            started=NOW - (8 - n) * DAY_S,
            labels={"step": str(n // 4)},
        )
    failed = rollout("s-err", "task-0", [assistant("x")], started=NOW - 0.5 * DAY_S)
    failed[1] = _failed(failed[1])
    return records + failed


def _failed(record: Exchange | SessionEvent) -> Exchange:
    assert isinstance(record, Exchange)
    fields = {f: getattr(record, f) for f in Exchange.__dataclass_fields__ if not f.startswith("_")}
    return Exchange(
        **fields | {"status": 502, "error_class": "upstream_unreachable", "error_message": "down"}
    )


@pytest.fixture
async def reader(tmp_path: Path) -> StoreReader:
    return StoreReader(await recorded(tmp_path / "r.db", *samples()))


def ids(reader: StoreReader, **query: object) -> list[str]:
    return [row["id"] for row in reader.sessions(SessionQuery(**query))]  # type: ignore[arg-type]


def test_filters_combine_newest_first(reader: StoreReader) -> None:
    assert ids(reader) == ["s-err", "s-7", "s-6", "s-5", "s-4", "s-3", "s-2", "s-1", "s-0"]
    assert ids(reader, limit=3) == ["s-err", "s-7", "s-6"]
    assert ids(reader, labels=(("task_id", "task-0"),)) == ["s-err", "s-6", "s-4", "s-2", "s-0"]
    assert ids(reader, labels=(("task_id", "task-0"), ("step", "1"))) == ["s-6", "s-4"]
    assert ids(reader, labels=(("task_id", "task-0"),), outcome="scored", limit=2) == ["s-6", "s-4"]
    assert ids(reader, outcome="failed") == ["s-1"]
    assert ids(reader, errors=True) == ["s-err"]
    assert ids(reader, since=NOW - 3 * DAY_S, until=NOW - 1 * DAY_S) == ["s-6", "s-5"]  # until: before
    assert ids(reader, labels=(("task_id", "task-1"),), since=NOW - 4 * DAY_S) == ["s-7", "s-5"]
    assert ids(reader, labels=(("task_id", "nope"),)) == []


def test_search_finds_an_id_prefix_or_a_label_value_and_sort_by_reward(reader: StoreReader) -> None:
    assert ids(reader, search="s-e") == ["s-err"]
    assert ids(reader, search="task-1") == ["s-7", "s-5", "s-3", "s-1"]
    # Best reward first; sessions without a reward last, newest first among equals.
    assert ids(reader, sort="reward", limit=5) == ["s-6", "s-4", "s-2", "s-3", "s-0"]
    assert ids(reader, sort="reward", labels=(("task_id", "task-1"),)) == ["s-3", "s-7", "s-5", "s-1"]


def test_rows_carry_reward_outcome_and_totals(reader: StoreReader) -> None:
    rows = {row["id"]: row for row in reader.sessions()}
    assert (rows["s-6"]["reward"], rows["s-6"]["outcome"], rows["s-6"]["exchanges"]) == (0.6, "scored", 1)
    assert (
        rows["s-err"]["reward"] is None and rows["s-err"]["outcome"] is None and rows["s-err"]["errors"] == 1
    )
    assert rows["s-5"]["rollout"] == {"scores": [], "duration_s": None, "exit_status": None, "log_tail": ""}


# Each shape of query, and the index that must answer it (SQLite's own words in EXPLAIN QUERY PLAN).
PLANS = [
    (SessionQuery(limit=50), "USING INDEX sessions_created"),
    (SessionQuery(labels=(("task_id", "t"),), limit=50), "USING COVERING INDEX session_labels_pair"),
    (
        SessionQuery(labels=(("task_id", "t"), ("step", "1")), outcome="failed", limit=50),
        "session_labels_pair",
    ),
    (SessionQuery(outcome="failed", errors=True, limit=50), "USING INDEX sessions_outcome"),
    (SessionQuery(errors=True, limit=50), "USING INDEX sessions_errors"),
    (SessionQuery(since=1.0, until=2.0, limit=50), "USING INDEX sessions_created (created>? AND created<?)"),
    (SessionQuery(sort="reward", limit=50), "USING INDEX sessions_reward"),
    (SessionQuery(changed_after=7, limit=50), "USING INDEX sessions_rev (rev>?)"),
    (SessionQuery(labels=(("task_id", "t"),), changed_after=7, limit=50), "USING INDEX sessions_rev (rev>?)"),
]


@pytest.mark.parametrize(("query", "index"), PLANS)
def test_every_listing_is_answered_through_an_index_in_its_order(
    reader: StoreReader, query: SessionQuery, index: str
) -> None:
    sql, args = query.sql()
    plan = [row[3] for row in reader._conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
    assert any(index in step for step in plan), plan
    # Never a pass over every session: each table is searched through an index...
    assert not [step for step in plan if step.startswith("SCAN") and "INDEX" not in step], plan
    # ...that already gives the order asked for, so LIMIT stops the walk (changes come few).
    if query.changed_after is None and query.sort == "time":
        assert not [step for step in plan if "TEMP B-TREE" in step], plan


def test_search_uses_the_id_and_label_value_indexes(reader: StoreReader) -> None:
    sql, args = SessionQuery(search="task-1", limit=50).sql()
    plan = " ".join(row[3] for row in reader._conn.execute("EXPLAIN QUERY PLAN " + sql, args))
    assert "sqlite_autoindex_sessions_1 (id>? AND id<?)" in plan and "session_labels_value (value=?)" in plan


def test_parse_when_reads_durations_and_iso_times() -> None:
    assert parse_when("2h", now=NOW) == NOW - 7200
    assert parse_when("30m", now=NOW) == NOW - 1800
    assert parse_when("1.5d", now=NOW) == NOW - 1.5 * DAY_S
    assert (
        parse_when("2025-06-01T12:00:00+00:00")
        == datetime.fromisoformat("2025-06-01T12:00:00+00:00").timestamp()
    )
    assert parse_when("2025-06-01") == datetime(2025, 6, 1).timestamp()  # local midnight
    with pytest.raises(ValueError, match="duration ago"):
        parse_when("yesterday")
    assert parse_label("task_id=a=b") == ("task_id", "a=b")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_label("task_id")


def test_merge_takes_each_store_s_rows_in_order_and_adds_up_groups() -> None:
    query = SessionQuery(limit=3)
    a = [{"id": "a2", "created": 5.0}, {"id": "a1", "created": 1.0}]
    b = [{"id": "b2", "created": 4.0}, {"id": "b1", "created": 3.0}]
    assert [row["id"] for row in query.merge([a, b])] == ["a2", "b2", "b1"]
    group = {"label": "task_id", "value": "t", "sessions": 2, "exchanges": 10, "tokens": 100, "errors": 1}
    one = [group | {"rewarded": 2, "reward_sum": 1.0, "outcomes": {"scored": 2}}]
    two = [group | {"rewarded": 1, "reward_sum": 0.0, "outcomes": {"failed": 1, "scored": 1}}]
    [merged] = merge_groups([one, two])
    assert merged["sessions"] == 4 and merged["mean_reward"] == pytest.approx(1 / 3)
    assert merged["outcomes"] == {"failed": 1, "scored": 3} and merged["shares"] == {
        "failed": 0.25,
        "scored": 0.75,
    }
    assert (merged["mean_turns"], merged["mean_tokens"]) == (5.0, 50.0)
