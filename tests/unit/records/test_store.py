"""modeltap/records/store.py: the writer thread, content-addressed bodies, readers, migrations."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from modeltap.records.exchange import Exchange, SessionEvent
from modeltap.records.reader import StoreReader, StoreUnreadable
from modeltap.records.schema import SCHEMA_VERSION, connect, migrate
from modeltap.records.sql_writer import SqlWriter
from modeltap.records.store import RECORD_ERROR, RecordStore, StoreClosed
from modeltap.testing import exchange

WORDS = "the proxy records every turn of an agent run with its tools tokens and timing".split()


def prose(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(words))


def chat_exchange(session: str, turn: int, *, big: str = "x" * 2000, words: int = 3) -> Exchange:
    messages = [{"role": "system", "content": big}]
    for i in range(turn):
        messages += [
            {"role": "user", "content": f"question {i} " + prose(2 * i, words)},
            {"role": "assistant", "content": f"answer {i} " + prose(2 * i + 1, words)},
        ]
    messages.append({"role": "user", "content": f"question {turn} " + prose(2 * turn, words)})
    body = {"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}]}
    response = {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"answer {turn}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10 * (turn + 1), "completion_tokens": 3},
    }
    return exchange(body, response, session_id=session, labels={"task_id": "t"}, ended=1.0)


async def test_round_trip_rebuilds_request_and_summary(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    ex = chat_exchange("s1", 2)
    await store.submit(ex, wait=True)
    await store.close()
    with StoreReader(tmp_path / "r.db") as reader:
        [row] = reader.exchanges("s1")
        assert row["request"] == ex.request_json
        assert row["response"] == ex.response
        assert (row["finish_reason"], row["prompt_tokens"], row["completion_tokens"]) == ("stop", 30, 3)
        assert row["labels"] == {"task_id": "t"}
        [session] = reader.sessions()
        assert (session["id"], session["exchanges"], session["labels"]) == ("s1", 1, {"task_id": "t"})


async def test_growing_session_costs_about_its_final_size(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    for turn in range(50):  # ~20k tokens by the end: 100 messages of ~100 words
        await store.submit(chat_exchange("long", turn, big=prose(-1, 1500), words=100))
    await store.close()
    with StoreReader(tmp_path / "r.db") as reader:
        sizes = reader.size_bytes()
        rows = reader.exchanges("long")
    assert len(rows) == 50 and rows[-1]["request"]["messages"][-1]["content"].startswith("question 49 ")
    naive = sum(len(json.dumps(r["request"]).encode()) for r in rows)
    final = len(json.dumps(rows[-1]["request"]).encode())
    # Shared messages are stored once and each turn references only its new ones: the session costs
    # about its final conversation (at most 1.5x of it), not the sum of its turns.
    assert sizes["total"] <= 1.5 * final < naive / 10


async def test_back_pressure_waits_instead_of_dropping(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db", queue_size=2)
    store.start()
    await asyncio.gather(*(store.submit(chat_exchange("bp", 0)) for _ in range(50)))
    await store.close()
    assert store.written == 50
    with StoreReader(tmp_path / "r.db") as reader:
        assert len(reader.exchanges("bp")) == 50


async def test_bad_json_request_is_kept_as_text(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    ex = exchange(None, None, request=b"{not json", status=400)
    await store.submit(ex)
    await store.close()
    with StoreReader(tmp_path / "r.db") as reader:
        [row] = reader.exchanges()
    assert row["request"] == "{not json" and row["session_id"] is None


async def test_closed_store_refuses(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreClosed):
        await store.submit(chat_exchange("x", 0))
    with pytest.raises(RuntimeError, match="starts once"):
        store.start()


async def test_sessions_are_listed_before_their_first_exchange(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    store.on_session(SessionEvent("opened", "s-new", {"agent": "solver"}, "http://up"))
    store.on_session(SessionEvent("closed", "s-new", {"agent": "solver"}, "http://up"))
    await store.close()
    with StoreReader(tmp_path / "r.db") as reader:
        [session] = reader.sessions()
    assert session["id"] == "s-new" and session["exchanges"] == 0 and session["closed"] is not None


def test_reader_is_read_only_and_checks_the_version(tmp_path: Path) -> None:
    conn = connect(tmp_path / "r.db")
    assert migrate(conn) == SCHEMA_VERSION
    conn.close()
    with StoreReader(tmp_path / "r.db") as reader, pytest.raises(StoreUnreadable, match="readonly"):
        reader._conn.execute("DELETE FROM exchanges")
    newer = connect(tmp_path / "r.db")
    newer.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    newer.close()
    with pytest.raises(RuntimeError, match="newer than this modeltap"):
        migrate(connect(tmp_path / "r.db"))
    with pytest.raises(FileNotFoundError, match="--store"):
        StoreReader(tmp_path / "missing.db")


async def test_a_bad_record_costs_only_itself(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    poison = dataclasses.replace(
        chat_exchange("p", 0), labels={"task": object()}
    )  # not JSON: its write fails
    await asyncio.gather(*(store.submit(e) for e in [chat_exchange("p", 0), poison, chat_exchange("p", 1)]))
    with pytest.raises(TypeError):
        await store.submit(poison, wait=True)
    await store.close()
    assert (store.written, store.failures) == (2, 2)
    assert "failed to write a record" in caplog.text
    with StoreReader(tmp_path / "r.db") as reader:
        rows = reader.exchanges("p")
    # The two good records in full; of the bad one, what can always be written (ids, times, why).
    by_id = {row["id"]: row for row in rows}
    assert len(rows) == 3 and by_id[poison.id]["error_class"] == RECORD_ERROR
    assert by_id[poison.id]["labels"] == {} and [r["error_class"] for r in rows].count(None) == 2


async def test_a_full_queue_makes_submit_wait_until_the_writer_frees_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    write_items = SqlWriter._write_items

    def held(self: SqlWriter, conn: Any, items: Any) -> Any:
        gate.wait(10)  # the disk is slow: nothing is written until the test opens the gate
        return write_items(self, conn, items)

    monkeypatch.setattr(SqlWriter, "_write_items", held)
    store = RecordStore(tmp_path / "r.db", queue_size=2)
    store.start()
    await store.submit(chat_exchange("bp", 0))
    await store.submit(chat_exchange("bp", 1))
    third = asyncio.ensure_future(store.submit(chat_exchange("bp", 2)))
    await asyncio.sleep(0.2)
    assert not third.done()  # back-pressure: the loop waits for room, it neither drops nor blocks
    gate.set()
    await asyncio.wait_for(third, 5)
    await store.close()
    assert store.written == 3
