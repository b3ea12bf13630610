"""The records database's schema: its migrations, in order, and the connections that open it.

Owns: the migrations (`PRAGMA user_version` counts those applied; each runs in its own transaction),
the connection settings every reader and writer shares (WAL, the busy timeout, read-only readers), and
where the write-ahead log lives. Does not own: writing (store.py), reading (reader.py), or the tables
of the running totals, blob references and token ids, which their own modules create (rollups.py,
references.py, token_store.py) and a migration step calls.

    conn = connect(".modeltap/records.db")
    migrate(conn)                     # a store of any earlier version, brought up to SCHEMA_VERSION
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path

from modeltap.records import references, rollups, token_store
from modeltap.records.sql import statements


def _rollups_and_references(conn: sqlite3.Connection) -> None:
    rollups.upgrade(conn)
    references.upgrade(conn)


Migration = str | Callable[[sqlite3.Connection], None]
MIGRATIONS: tuple[Migration, ...] = (
    # 1: sessions, exchanges, content-addressed blobs
    """
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
    """,
    # 2: translation: the format an exchange went upstream as, the upstream's own answer, and whether
    # the client's stream was made from a JSON answer
    """
    ALTER TABLE exchanges ADD COLUMN translated TEXT;
    ALTER TABLE exchanges ADD COLUMN received BLOB;
    ALTER TABLE exchanges ADD COLUMN synthesised INTEGER NOT NULL DEFAULT 0;
    """,
    # 3: running aggregates in the session rows and label groups, rollout outcomes, and which
    # sessions reference which blobs (so a prune deletes only blobs no other session holds)
    _rollups_and_references,
    # 4: token ids and token-history breaks (`serve --token-ids`)
    token_store.MIGRATION,
    # 5: the revision counter as a row of the store, shared by every writer (rollups.py)
    rollups.REVISION_MIGRATION,
    # 6: each completion's weight version and seed, and the mask of rendered ids (`serve --tokens`)
    token_store.SAMPLING_MIGRATION,
    # 7: the request's and the answer's headers, credentials redacted (JSON lists of [name, value])
    """
    ALTER TABLE exchanges ADD COLUMN request_headers TEXT;
    ALTER TABLE exchanges ADD COLUMN response_headers TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def connect(
    path: Path | str, *, readonly: bool = False, factory: type[sqlite3.Connection] = sqlite3.Connection
) -> sqlite3.Connection:
    """A connection with modeltap's settings; read-only connections cannot write by accident.
    `factory`: the connection's class (a reader's checks every statement)."""
    if readonly:
        uri = f"file:{Path(path)}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, factory=factory)
        conn.execute("PRAGMA query_only = ON")
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        # Pages a prune frees go back to the file system, a little at a time, with `modeltap vacuum`
        # while `serve` writes (a full VACUUM would hold the write lock for its whole run). It takes
        # effect in a database that has no table yet, or at its next full VACUUM (docs/sqlite.md §4).
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL survives a crash of the process (not of the OS) without losing commits.
        conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.row_factory = sqlite3.Row
    return conn


def migrate(conn: sqlite3.Connection) -> int:
    """Apply the pending migrations, each in its own transaction; return the schema version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise RuntimeError(
            f"records database has schema version {version}, newer than this modeltap ({SCHEMA_VERSION}): "
            "upgrade modeltap to read it"
        )
    for step in range(version, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            migration = MIGRATIONS[step]
            if callable(migration):
                migration(conn)
            else:
                for statement in statements(migration):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {step + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION


def objects(conn: sqlite3.Connection) -> frozenset[tuple[str, str]]:
    """The (type, name) of every table, index, view and trigger in the database but SQLite's own."""
    rows = conn.execute("SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'")
    return frozenset((row[0], row[1]) for row in rows)


@functools.cache
def made_objects() -> frozenset[tuple[str, str]]:
    """What the migrations make, at SCHEMA_VERSION: the objects a store of this release holds, and
    the only ones (a reader refuses a store with others: a view named `sessions` could run forever)."""
    conn = sqlite3.connect(":memory:")
    try:
        migrate(conn)
        return objects(conn)
    finally:
        conn.close()


def wal_path(path: Path) -> Path:
    """The write-ahead log beside the database at `path`."""
    return path.with_name(path.name + "-wal")
