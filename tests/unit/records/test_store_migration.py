"""modeltap/records/store.py, migrations: a store written by the landed version (schema 1, built here
with its own DDL) is upgraded in place on its first write and reads as if written today; a reader
refuses a store of another schema with a message that says what to do."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.query import SessionQuery
from modeltap.records.reader import StoreReader
from modeltap.records.schema import SCHEMA_VERSION, connect, migrate
from modeltap.records.store import RecordStore
from tests.factories import assistant, recorded, rollout, tool_call

# The landed version's schema, as it created every records database (PRAGMA user_version = 1).
SCHEMA_1 = """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    upstream TEXT,
    closed REAL
);
CREATE TABLE exchanges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    session_id TEXT,
    labels TEXT NOT NULL DEFAULT '{}',
    method TEXT NOT NULL,
    endpoint TEXT,
    path TEXT NOT NULL,
    upstream_url TEXT,
    status INTEGER,
    streamed INTEGER NOT NULL DEFAULT 0,
    stream_complete INTEGER,
    started REAL NOT NULL,
    first_byte REAL,
    ended REAL,
    model TEXT,
    request BLOB,
    sent BLOB,
    response BLOB,
    raw_sse BLOB,
    finish_reason TEXT,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    tool_calls INTEGER,
    counted_prompt_tokens INTEGER,
    budget TEXT,
    error_class TEXT,
    error_message TEXT,
    user_agent TEXT,
    retry_count INTEGER,
    client_disconnected INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX exchanges_session ON exchanges (session_id, seq);
CREATE TABLE blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
PRAGMA user_version = 1;
"""
V1_SESSION_COLUMNS = "id, created, labels, upstream, closed"


async def landed_store(tmp_path: Path) -> tuple[Path, Path]:
    """(a store written today, the same records in a schema-1 file as the landed version kept them:
    its tables, its body encoding, no totals, no outcome)."""
    call = tool_call("call_1", "bash", '{"command": "ls"}')
    today = await recorded(
        tmp_path / "today.db",
        *rollout("s-a", "t1", [assistant(None, call), assistant("done")]),
        *rollout(
            "s-b", "t1", [assistant("done"), assistant("again"), assistant("bye")]
        ),  # shares s-a's prompt
        *rollout("s-c", "t2", [assistant("other")], labels={"agent": "x"}),
    )
    landed = tmp_path / "landed.db"
    conn = sqlite3.connect(landed)
    conn.executescript(SCHEMA_1)
    conn.execute("ATTACH DATABASE ? AS today", (str(today),))
    columns = [row[1] for row in conn.execute("PRAGMA main.table_info(exchanges)")]
    conn.execute(f"INSERT INTO main.sessions SELECT {V1_SESSION_COLUMNS} FROM today.sessions")
    conn.execute(
        f"INSERT INTO main.exchanges ({', '.join(columns)}) SELECT {', '.join(columns)} FROM today.exchanges"
    )
    conn.execute("INSERT INTO main.blobs SELECT hash, data FROM today.blobs")
    conn.commit()
    conn.close()
    return today, landed


def links(path: Path) -> tuple[set[tuple[str, str]], set[tuple[str, int]]]:
    """Which session references which blob, and each blob's count of sessions."""
    conn = connect(path, readonly=True)
    try:
        return set(conn.execute("SELECT session_id, hash FROM session_blobs")), set(
            conn.execute("SELECT hash, refs FROM blobs")
        )
    finally:
        conn.close()


async def test_a_landed_store_is_upgraded_on_first_write_and_reads_as_today(tmp_path: Path) -> None:
    today, landed = await landed_store(tmp_path)
    with pytest.raises(RuntimeError, match=r"older than this modeltap's .*modeltap vacuum --store"):
        StoreReader(landed)

    conn = connect(landed)
    assert migrate(conn) == SCHEMA_VERSION
    conn.close()
    with StoreReader(today) as want, StoreReader(landed) as got:
        drop = ("rev", "rollout", "reward", "outcome")
        assert [{k: v for k, v in s.items() if k not in drop} for s in got.sessions()] == [
            {k: v for k, v in s.items() if k not in drop} for s in want.sessions()
        ]
        assert got.groups("task_id") == want.groups("task_id") and got.groups("agent") == want.groups("agent")
        assert got.exchanges() == want.exchanges()
        assert got.sessions(SessionQuery(labels=(("task_id", "t1"),)))[0]["id"] == "s-b"
    # Which session holds which blob is worked out from the stored bodies as the writer notes it.
    assert links(landed) == links(today)

    # The upgraded store takes new records: the next turn of a session, and an outcome.
    store = RecordStore(landed)
    store.start()
    turn, outcome = rollout("s-b", "t1", [assistant("done")] * 4, outcome=RolloutOutcome("scored", 1.0))[4:]
    assert isinstance(turn, Exchange) and isinstance(outcome, SessionEvent)
    await store.submit(turn)
    store.on_session(outcome)
    await store.close()
    with StoreReader(landed) as reader:
        row = reader.session("s-b")
        assert row is not None and (row["exchanges"], row["outcome"], row["reward"]) == (4, "scored", 1.0)
        assert len(reader.exchanges("s-b")) == 4


def test_a_reader_refuses_a_newer_store_saying_to_upgrade(tmp_path: Path) -> None:
    conn = connect(tmp_path / "r.db")
    migrate(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match=r"newer than this modeltap .* upgrade modeltap to read it"):
        StoreReader(tmp_path / "r.db")
    with pytest.raises(RuntimeError, match="newer than this modeltap"):
        migrate(connect(tmp_path / "r.db"))
