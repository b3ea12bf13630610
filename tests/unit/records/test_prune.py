"""modeltap/records/prune.py: whole sessions go, with the blobs only they held and never another
session's; safely while the writer writes (it forgets what a prune removed); `vacuum` gives the space
back; and the writer warns once past --max-store-bytes."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.prune import needs_full_vacuum, prune, vacuum
from modeltap.records.reader import StoreReader
from modeltap.records.schema import connect
from modeltap.records.store import RecordStore
from modeltap.testing import exchange
from tests.factories import assistant, recorded, rollout
from tests.token_sessions import served_turn, tool_session
from tests.unit.records.test_store_migration import landed_store

SCORED = RolloutOutcome("scored", 1.0)


def hashes(path: Path, table: str) -> set[str]:
    conn = connect(path, readonly=True)
    try:
        return {h for (h,) in conn.execute(f"SELECT hash FROM {table}")}
    finally:
        conn.close()


def blobs(path: Path) -> set[str]:
    return hashes(path, "blobs")


def linked(path: Path, session: str) -> set[str]:
    conn = connect(path, readonly=True)
    try:
        return {h for (h,) in conn.execute("SELECT hash FROM session_blobs WHERE session_id = ?", (session,))}
    finally:
        conn.close()


async def test_prune_deletes_whole_sessions_and_only_their_unshared_blobs(tmp_path: Path) -> None:
    # Two samples of one task share its system prompt and task prompt; a third is another task.
    path = await recorded(
        tmp_path / "r.db",
        *rollout("s-old", "t1", [assistant("a"), assistant("b")], outcome=SCORED, started=1000.0),
        *rollout("s-kept", "t1", [assistant("c")], outcome=RolloutOutcome("failed"), started=2000.0),
        *rollout("s-new", "t2", [assistant("d")], started=3000.0),
    )
    with StoreReader(path) as reader:
        kept_before = reader.exchanges("s-kept")
    shared = linked(path, "s-old") & linked(path, "s-kept")
    only_old = linked(path, "s-old") - linked(path, "s-kept") - linked(path, "s-new")
    assert shared and only_old

    freed = prune(path, before=1500.0)
    assert (freed.sessions, freed.exchanges, freed.blobs) == (1, 2, len(only_old)) and freed.bytes > 0
    assert "pruned 1 session(s), 2 exchange(s)" in freed.text()
    left = blobs(path)
    assert shared <= left and not only_old & left
    with StoreReader(path) as reader:
        assert [s["id"] for s in reader.sessions()] == ["s-new", "s-kept"]
        assert reader.exchanges("s-old") == [] and reader.exchanges("s-kept") == kept_before
        [t1] = [g for g in reader.groups("task_id") if g["value"] == "t1"]
        assert (t1["sessions"], t1["exchanges"], t1["rewarded"], t1["outcomes"]) == (1, 1, 0, {"failed": 1})

    freed = prune(path, keep_last=1, labels=[("task_id", "t1")])
    assert freed.sessions == 0  # s-kept is the newest of t1
    freed = prune(path, keep_last=0)
    assert freed.sessions == 2 and blobs(path) == set()
    with StoreReader(path) as reader:
        assert reader.sessions() == [] and reader.groups("task_id") == []
    with pytest.raises(ValueError, match="either --before TIME or --keep-last N"):
        prune(path)


async def test_the_writer_rewrites_a_blob_a_prune_removed(tmp_path: Path) -> None:
    """The writer remembers which blobs are stored; after a prune took some, it must store them again
    rather than refer to what is gone."""
    path = tmp_path / "r.db"
    store = RecordStore(path)
    store.start()
    records = rollout("s-1", "t1", [assistant("a"), assistant("b")], started=1000.0)
    for record in records:
        await _write(store, record, wait=record is records[-1])  # committed before the prune looks
    freed = await asyncio.to_thread(prune, path, keep_last=0)  # another connection, as `modeltap prune`
    assert freed.sessions == 1 and blobs(path) == set()
    # The same task's prompt again, and a turn of a session the prune removed mid-run.
    for record in [*rollout("s-2", "t1", [assistant("a")]), *rollout("s-1", "t1", [assistant("a")] * 3)[3:]]:
        await _write(store, record)
    await store.close()
    with StoreReader(path) as reader:
        assert [m["role"] for m in reader.exchanges("s-2")[0]["request"]["messages"]] == ["system", "user"]
        [again] = reader.exchanges("s-1")
        assert len(again["request"]["messages"]) == 6
        assert {s["id"]: s["exchanges"] for s in reader.sessions()} == {"s-1": 1, "s-2": 1}


async def test_prune_beside_a_busy_writer_leaves_every_reader_a_whole_store(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = RecordStore(path)
    store.start()
    stop = threading.Event()
    problems: list[str] = []

    def pruning() -> None:
        while not stop.is_set():
            prune(path, keep_last=3)

    def reading() -> None:
        while not stop.is_set():
            with StoreReader(path) as reader:
                # One statement, one snapshot: each session's count is its exchanges', never half.
                counts = "SELECT COUNT(*) FROM exchanges e WHERE e.session_id = s.id"
                for sid, count, actual in reader._conn.execute(
                    f"SELECT id, exchanges, ({counts}) FROM sessions s"
                ):
                    if count != actual:
                        problems.append(f"{sid}: row says {count}, {actual} stored")
                for row in reader.sessions():
                    reader.exchanges(row["id"])  # rebuilds every body: a missing blob raises

    threads = [threading.Thread(target=pruning), threading.Thread(target=reading)]
    for thread in threads:
        thread.start()
    try:
        for n in range(40):
            for record in rollout(
                f"s-{n}", f"t{n % 3}", [assistant("x"), assistant(str(n))], started=1000.0 + n
            ):
                await _write(store, record)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        await store.close()
    assert problems == []
    prune(path, keep_last=3)
    with StoreReader(path) as reader:
        rows = reader.sessions()
        assert [s["id"] for s in rows] == ["s-39", "s-38", "s-37"]
        assert all(len(reader.exchanges(s["id"])) == s["exchanges"] == 2 for s in rows)
        assert sum(g["sessions"] for g in reader.groups("task_id")) == 3


async def test_vacuum_gives_pruned_space_back_in_small_steps(tmp_path: Path) -> None:
    rng = random.Random(3)
    records = []
    for n in range(30):
        replies = [assistant(rng.randbytes(2000).hex()) for _ in range(5)]
        records += rollout(f"s-{n}", f"t{n}", replies, started=1000.0 + n)
    path = await recorded(tmp_path / "r.db", *records)
    assert not needs_full_vacuum(path)
    prune(path, keep_last=2)
    done = vacuum(path)
    assert done.incremental and done.after_bytes < done.before_bytes / 3
    with StoreReader(path) as reader:
        assert [len(reader.exchanges(s["id"])) for s in reader.sessions()] == [5, 5]


async def test_vacuum_of_a_landed_store_upgrades_it_and_rewrites_it_once(tmp_path: Path) -> None:
    _, landed = await landed_store(tmp_path)
    assert needs_full_vacuum(landed)
    done = vacuum(landed)
    assert not done.incremental and not needs_full_vacuum(landed)
    with StoreReader(landed) as reader:  # upgraded on this first write
        assert len(reader.sessions()) == 3


async def test_the_writer_warns_once_past_max_store_bytes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = RecordStore(tmp_path / "r.db", max_bytes=64 * 1024)
    store.start()
    with caplog.at_level(logging.WARNING):
        for n in range(3):
            for record in rollout(f"s-{n}", "t", [assistant("words " * 4000)] * 3, started=1000.0 + n):
                await _write(store, record, wait=True)
        await store.close()
    warnings = [r.getMessage() for r in caplog.records if "max-store-bytes" in r.getMessage()]
    assert len(warnings) == 1 and "modeltap prune" in warnings[0]


async def _write(store: RecordStore, record: Exchange | SessionEvent, *, wait: bool = False) -> None:
    if isinstance(record, SessionEvent):
        store.on_session(record)
    else:
        await store.submit(record, wait=wait)


async def test_prune_drops_token_ids_only_no_remaining_session_reaches(tmp_path: Path) -> None:
    # Two samples open with the same prompt, so its ids are one node both sessions' chains start from.
    histories, replies = tool_session()
    path = await recorded(
        tmp_path / "r.db",
        *[
            served_turn(h, r, session_id="s-old", started=1000.0 + i)
            for i, (h, r) in enumerate(zip(histories, replies, strict=True))
        ],
        served_turn(histories[0], replies[0], session_id="s-kept", started=2000.0),
    )
    with StoreReader(path) as reader:
        kept_before = [reader.token_completion(t) for t in reader.token_turns("s-kept")]
        [first_kept] = reader.token_turns("s-kept")
    before = hashes(path, "token_nodes")

    freed = prune(path, before=1500.0)
    left = hashes(path, "token_nodes")
    assert freed.sessions == 1 and left < before and first_kept["prompt_node"] in left
    with StoreReader(path) as reader:
        assert [reader.token_completion(t) for t in reader.token_turns("s-kept")] == kept_before
        assert reader.token_turns("s-old") == []
    prune(path, keep_last=0)
    assert hashes(path, "token_nodes") == set()


@pytest.mark.parametrize(("before", "keep_last"), [(2500.0, None), (None, 0), (None, 1)])
async def test_a_dry_run_says_what_a_prune_would_free_and_deletes_nothing(
    tmp_path: Path, before: float | None, keep_last: int | None
) -> None:
    """Blobs shared by two doomed sessions (one task's prompts) are counted once and only when no kept
    session links them, exactly as the prune then frees them; the unsessioned exchanges stay."""
    path = await recorded(
        tmp_path / "r.db",
        *rollout("s-old", "t1", [assistant("a"), assistant("b")], outcome=SCORED, started=1000.0),
        *rollout("s-older", "t1", [assistant("e")], started=500.0),
        *rollout("s-kept", "t2", [assistant("c")], started=3000.0),
        exchange(None, None, request=b"not json", status=400, error_class="client_error", started=100.0),
    )
    before_blobs = blobs(path)
    would = prune(path, before=before, keep_last=keep_last, dry_run=True)
    assert would.dry_run and blobs(path) == before_blobs
    with StoreReader(path) as reader:
        assert len(reader.sessions()) == 3
    done = prune(path, before=before, keep_last=keep_last)
    assert (would.sessions, would.exchanges, would.blobs, would.bytes) == (
        done.sessions,
        done.exchanges,
        done.blobs,
        done.bytes,
    )
    assert len(would.session_ids) == would.sessions and "would prune" in would.text()
    with StoreReader(path) as reader:
        assert len(reader.exchanges("no-session")) == 1
