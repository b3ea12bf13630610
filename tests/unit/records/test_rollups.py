"""modeltap/records/rollups.py: the totals the writer keeps in session rows and label groups are those
a recount of what was written gives, whatever the batching, relabelling and replaced outcomes."""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.query import SessionQuery
from modeltap.records.reader import StoreReader
from modeltap.records.store import RecordStore
from modeltap.testing import exchange
from tests.factories import assistant, chat_completion


def turn(session: str, labels: dict[str, str], rng: random.Random, at: float) -> Exchange:
    usage = {"prompt_tokens": rng.randrange(1, 500), "completion_tokens": rng.randrange(1, 50)}
    answer = chat_completion(assistant("ok"), usage=usage, model=f"m{rng.randrange(3)}")
    if rng.random() < 0.2:  # no usage reported
        answer.pop("usage")
    fields: dict[str, Any] = {
        "session_id": session,
        "labels": labels,
        "started": at,
        "ended": at + rng.random(),
    }
    if rng.random() < 0.15:
        fields |= {"error_class": "upstream_error", "error_message": "503", "status": 503}
    return exchange({"model": "m", "messages": [{"role": "user", "content": str(at)}]}, answer, **fields)


def expected(
    records: list[Exchange | SessionEvent],
) -> tuple[dict[str, dict[str, Any]], dict[Any, Any], Counter[Any]]:
    """Sessions' totals, groups' totals and outcome counts, recounted from the records in Python."""
    sessions: dict[str, dict[str, Any]] = {}
    labels: dict[str, dict[str, str]] = {}
    for record in records:
        if isinstance(record, SessionEvent):
            labels.setdefault(record.session_id, dict(record.labels))
            if record.kind == "opened":
                labels[record.session_id] = dict(record.labels)
            row = sessions.setdefault(record.session_id, _empty())
            if record.outcome is not None:
                row["reward"], row["outcome"] = record.outcome.reward, record.outcome.outcome
            continue
        labels.setdefault(record.session_id or "", dict(record.labels))
        row = sessions.setdefault(record.session_id or "", _empty())
        usage = (record.response or {}).get("usage") or {}
        row["exchanges"] += 1
        row["errors"] += record.error_class is not None
        row["prompt_tokens"] += usage.get("prompt_tokens", 0)
        row["completion_tokens"] += usage.get("completion_tokens", 0)
    groups: dict[Any, Any] = defaultdict(lambda: Counter())
    outcomes: Counter[Any] = Counter()
    for session, row in sessions.items():
        for pair in labels[session].items():
            group = groups[pair]
            group.update(
                sessions=1,
                exchanges=row["exchanges"],
                tokens=row["prompt_tokens"] + row["completion_tokens"],
                errors=row["errors"],
                rewarded=row["reward"] is not None,
            )
            group["reward_sum"] += row["reward"] or 0.0
            if row["outcome"] is not None:
                outcomes[(*pair, row["outcome"])] += 1
    return sessions, groups, outcomes


def _empty() -> dict[str, Any]:
    return {
        "exchanges": 0,
        "errors": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "reward": None,
        "outcome": None,
    }


async def test_totals_match_a_recount_of_what_was_written(tmp_path: Path) -> None:
    rng = random.Random(7)
    records: list[Exchange | SessionEvent] = []
    names = [f"s-{n}" for n in range(12)]
    labels = {s: {"task_id": f"t{n % 3}", "agent": f"a{n % 2}"} for n, s in enumerate(names)}
    for n, session in enumerate(names):
        if n % 4:  # most open first; some are first seen through an exchange
            records.append(SessionEvent("opened", session, labels[session]))
    for step in range(300):
        session = rng.choice(names)
        records.append(turn(session, labels[session], rng, 1000.0 + step))
        if step == 150:  # a session reopened under other labels moves its totals to the new groups
            labels["s-5"] = {"task_id": "t9"}
            records.append(SessionEvent("opened", "s-5", labels["s-5"]))
    for n, session in enumerate(names[:8]):
        kind = ["scored", "failed", "model_fault", "timed_out"][n % 4]
        reward = None if kind in ("failed", "timed_out") else n / 10
        records.append(SessionEvent("outcome", session, outcome=RolloutOutcome(kind, reward)))
    # A replaced outcome counts once, as its last.
    records.append(SessionEvent("outcome", "s-0", outcome=RolloutOutcome("failed", None)))
    records.append(SessionEvent("closed", "s-1"))

    store = RecordStore(tmp_path / "r.db")
    store.start()
    for index, record in enumerate(records):
        if isinstance(record, SessionEvent):
            store.on_session(record)
        else:  # some commit alone, most in batches
            await store.submit(record, wait=index % 7 == 0)
    await store.close()

    sessions, groups, outcomes = expected(records)
    with StoreReader(tmp_path / "r.db") as reader:
        rows = {row["id"]: row for row in reader.sessions()}
        assert set(rows) == set(sessions)
        for session, want in sessions.items():
            row = rows[session]
            got = {
                key: row[key] or 0 for key in ("exchanges", "errors", "prompt_tokens", "completion_tokens")
            }
            assert got == {key: want[key] for key in got}, session
            assert (row["reward"], row["outcome"]) == (want["reward"], want["outcome"])
        assert rows["s-1"]["closed"] is not None and rows["s-5"]["labels"] == {"task_id": "t9"}
        for key in ("task_id", "agent"):
            for group in reader.groups(key):
                want = groups[(key, group["value"])]
                assert group["sessions"] == want["sessions"] and group["exchanges"] == want["exchanges"]
                assert group["tokens"] == want["tokens"] and group["errors"] == want["errors"]
                assert group["rewarded"] == want["rewarded"]
                assert abs(group["reward_sum"] - want["reward_sum"]) < 1e-9
                assert group["outcomes"] == {
                    o: n for (k, v, o), n in outcomes.items() if (k, v) == (key, group["value"])
                }
            assert {g["value"] for g in reader.groups(key)} == {v for k, v in groups if k == key}


async def test_first_and_last_times_and_the_latest_model(tmp_path: Path) -> None:
    rng = random.Random(1)
    store = RecordStore(tmp_path / "r.db")
    store.start()
    labels = {"task_id": "t"}
    # Out of order (concurrent requests end in any order): first is the earliest start, last the latest end.
    for at in (1005.0, 1001.0, 1009.0):
        await store.submit(turn("s", labels, rng, at))
    await store.close()
    with StoreReader(tmp_path / "r.db") as reader:
        [row] = reader.sessions()
        ends = [e["ended"] for e in reader.exchanges("s")]
        models = [e["model"] for e in reader.exchanges("s")]
    assert row["first"] == 1001.0 and row["last"] == max(ends) and row["model"] == models[-1]


async def test_a_session_s_revision_grows_with_each_change(tmp_path: Path) -> None:
    rng = random.Random(2)
    path = tmp_path / "r.db"
    store = RecordStore(path)
    store.start()
    store.on_session(SessionEvent("opened", "a", {"task_id": "t"}))
    store.on_session(SessionEvent("opened", "b", {"task_id": "t"}))
    await store.submit(turn("a", {"task_id": "t"}, rng, 1.0), wait=True)
    await asyncio.sleep(0)
    with StoreReader(path) as reader:
        seen = reader.revision()
    await store.submit(turn("b", {"task_id": "t"}, rng, 2.0), wait=True)
    await store.close()
    with StoreReader(path) as reader:
        assert [row["id"] for row in reader.sessions(SessionQuery(changed_after=seen))] == ["b"]
        assert reader.revision() > seen


async def test_two_writers_of_one_store_never_share_a_revision(tmp_path: Path) -> None:
    """A second writer (a second serve, replay, the demo) started on a store continues its revisions,
    and the first goes on from where the second stopped: a poll after each change sees it."""
    rng = random.Random(3)
    path = tmp_path / "r.db"
    first, second = RecordStore(path), RecordStore(path)
    first.start()
    second.start()  # both started before either wrote: each read the store's revision once, at 0
    seen = 0
    for n, writer in enumerate([first, second, first, second, first]):
        await writer.submit(turn(f"s{n}", {"task_id": "t"}, rng, float(n)), wait=True)
        with StoreReader(path) as reader:
            changed = [row["id"] for row in reader.sessions(SessionQuery(changed_after=seen))]
            assert changed == [f"s{n}"], (n, changed)
            seen = reader.revision()
    await first.close()
    await second.close()
    with StoreReader(path) as reader:
        revisions = [row["rev"] for row in reader.sessions()]
    assert len(set(revisions)) == len(revisions) == 5
