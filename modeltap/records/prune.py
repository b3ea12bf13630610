"""Keeping a records database in bounds: deleting whole sessions (`modeltap prune`) and giving the
space back to the file system (`modeltap vacuum`), safely while `serve` writes to it.

Owns: choosing what to delete (the sessions last active before a time, or all but the newest N, either
among those with given labels), deleting them a few per transaction (their exchanges, label rows and
share of the group totals, their token ids, and the blobs and token nodes that no other session
references), reporting what that freed, and vacuuming. Does not own: the schema (schema.py, rollups.py)
or the filters (query.py).

Beside a running `serve`: each transaction is short, so the writer waits for the lock (its busy
timeout) and never fails for it; a reader (WAL) sees a session whole or not at all; the writer
forgets the blobs and sessions it remembered once another connection has written (store.py), so it
never refers to a blob a prune removed. A database made by this modeltap gives pages back in small
steps (`auto_vacuum = INCREMENTAL`); an older one needs one full VACUUM, which holds the write lock
for its whole run, so `vacuum` then asks for `serve` to be stopped first.

    freed = prune("records.db", keep_last=1000, labels=(("experiment", "grpo-7"),))
    print(freed.text()); print(vacuum("records.db").text())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modeltap.records import rollups, token_store
from modeltap.records.query import SessionQuery
from modeltap.records.reader import StoreReader
from modeltap.records.schema import connect, migrate, wal_path

if TYPE_CHECKING:
    from sqlite3 import Connection

# Sessions deleted per transaction: a ~30-turn session takes about a millisecond, so the writer waits
# well under a second for the lock, far below its busy timeout (5 s: docs/sqlite.md §2).
PRUNE_BATCH_SESSIONS = 50
# Pages given back per vacuum step (4 MiB at SQLite's default 4 KiB page): a short hold of the lock.
VACUUM_STEP_PAGES = 1024
# SQLite's auto_vacuum mode that frees pages on request (PRAGMA auto_vacuum).
_INCREMENTAL = 2


@dataclass(frozen=True, slots=True)
class Freed:
    """What a prune deleted: sessions, exchanges, blobs, and the stored (compressed) bytes they held,
    now free pages inside the file."""

    sessions: int = 0
    exchanges: int = 0
    blobs: int = 0
    bytes: int = 0
    free_bytes: int = 0
    # A dry run's: the sessions it would delete, newest first; nothing was deleted.
    dry_run: bool = False
    session_ids: tuple[str, ...] = ()

    def __add__(self, other: Freed) -> Freed:
        return Freed(
            self.sessions + other.sessions,
            self.exchanges + other.exchanges,
            self.blobs + other.blobs,
            self.bytes + other.bytes,
            other.free_bytes,
        )

    def text(self) -> str:
        if self.dry_run:
            return (
                f"would prune {self.sessions} session(s), {self.exchanges} exchange(s) and {self.blobs} "
                f"unshared blob(s): {_size(self.bytes)} of records (a dry run: nothing was deleted)"
            )
        return (
            f"pruned {self.sessions} session(s), {self.exchanges} exchange(s) and {self.blobs} unshared "
            f"blob(s): {_size(self.bytes)} of records; the file now holds {_size(self.free_bytes)} of free "
            "pages, which new records reuse (`modeltap vacuum` gives them back to the file system)"
        )


@dataclass(frozen=True, slots=True)
class Vacuumed:
    """The file's size before and after a vacuum, and whether it was done in small steps."""

    before_bytes: int
    after_bytes: int
    incremental: bool

    def text(self) -> str:
        how = "in small steps" if self.incremental else "in one pass"
        return f"vacuumed {how}: {_size(self.before_bytes)} -> {_size(self.after_bytes)}"


def prune(
    path: Path | str,
    *,
    before: float | None = None,
    keep_last: int | None = None,
    labels: Sequence[tuple[str, str]] = (),
    dry_run: bool = False,
) -> Freed:
    """Delete the sessions (among those carrying all of `labels`) last active before `before`, or all
    but the `keep_last` newest; exactly one of the two. Returns what it freed. With `dry_run`, delete
    nothing and return what it would free: the sessions (by id), their exchanges, the blobs no other
    session shares and their bytes, read without taking the write lock (the token ids' nodes that a
    prune also frees are not counted: finding them walks every live row)."""
    if (before is None) == (keep_last is None):
        raise ValueError("give either --before TIME or --keep-last N")
    if keep_last is not None and keep_last < 0:
        raise ValueError(f"--keep-last must be 0 or more, not {keep_last}")
    path = _existing(path)
    conn = connect(path)
    try:
        migrate(conn)
        doomed = _chosen(path, before, keep_last, tuple(labels))
        if dry_run:
            return _would_free(conn, doomed)
        freed = Freed()
        for start in range(0, len(doomed), PRUNE_BATCH_SESSIONS):
            freed += _delete(conn, doomed[start : start + PRUNE_BATCH_SESSIONS])
        if doomed:
            freed += Freed(bytes=token_store.drop_unreachable(conn))
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        free_pages = conn.execute("PRAGMA freelist_count").fetchone()[0]
        return freed + Freed(free_bytes=page_size * free_pages)
    finally:
        conn.close()


def vacuum(path: Path | str) -> Vacuumed:
    """Give the free pages of the database back to the file system (upgrading an older schema first)."""
    path = _existing(path)
    before = _file_bytes(path)
    conn = connect(path)
    try:
        migrate(conn)
        incremental = conn.execute("PRAGMA auto_vacuum").fetchone()[0] == _INCREMENTAL
        if incremental:
            while conn.execute("PRAGMA freelist_count").fetchone()[0]:
                # executescript steps the pragma to its end; execute frees one page (docs/sqlite.md §4).
                conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_STEP_PAGES});")
        else:
            conn.execute("VACUUM")  # and from now on incremental: connect() asked for it
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return Vacuumed(before, _file_bytes(path), incremental)


def needs_full_vacuum(path: Path | str) -> bool:
    """Whether `vacuum` would rewrite the whole file in one pass (a database made before modeltap
    asked SQLite for incremental vacuuming), holding the write lock throughout."""
    conn = connect(path, readonly=True)
    try:
        return bool(conn.execute("PRAGMA auto_vacuum").fetchone()[0] != _INCREMENTAL)
    finally:
        conn.close()


def _chosen(
    path: Path, before: float | None, keep_last: int | None, labels: tuple[tuple[str, str], ...]
) -> list[str]:
    """The ids of the sessions to delete, read before any is deleted."""
    with StoreReader(path) as reader:
        sessions = reader.sessions(SessionQuery(labels=labels))  # newest first
    if keep_last is not None:
        return [s["id"] for s in sessions[keep_last:]]
    return [s["id"] for s in sessions if (s["last"] or s["created"]) < (before or 0.0)]


def _would_free(conn: Connection, session_ids: Sequence[str]) -> Freed:
    """What deleting `session_ids` would free, counted in a temporary table of them: the main database
    is only read. A blob is freed when every session that links it is among them (`refs` counts links)."""
    conn.execute("CREATE TEMP TABLE doomed (id TEXT PRIMARY KEY)")
    try:
        conn.executemany("INSERT OR IGNORE INTO doomed (id) VALUES (?)", [(sid,) for sid in session_ids])
        sessions = conn.execute(
            "SELECT COUNT(*) FROM sessions WHERE id IN (SELECT id FROM doomed)"
        ).fetchone()[0]
        exchanges, stored = conn.execute(
            """SELECT COUNT(*), COALESCE(SUM(COALESCE(LENGTH(request), 0) + COALESCE(LENGTH(sent), 0)
                      + COALESCE(LENGTH(response), 0) + COALESCE(LENGTH(raw_sse), 0)), 0)
               FROM exchanges WHERE session_id IN (SELECT id FROM doomed)"""
        ).fetchone()
        logprobs = conn.execute(
            """SELECT COALESCE(SUM(LENGTH(logprobs)), 0) FROM exchange_tokens
               WHERE session_id IN (SELECT id FROM doomed)"""
        ).fetchone()[0]
        blobs, blob_bytes = conn.execute(
            """SELECT COUNT(*), COALESCE(SUM(LENGTH(b.data)), 0)
               FROM (SELECT hash, COUNT(*) AS links FROM session_blobs
                     WHERE session_id IN (SELECT id FROM doomed) GROUP BY hash) l
               JOIN blobs b ON b.hash = l.hash WHERE b.refs - l.links <= 0"""
        ).fetchone()
    finally:
        conn.execute("DROP TABLE temp.doomed")
    return Freed(
        sessions,
        exchanges,
        blobs,
        stored + logprobs + blob_bytes,
        dry_run=True,
        session_ids=tuple(session_ids),
    )


def _delete(conn: Connection, session_ids: Sequence[str]) -> Freed:
    """Delete whole sessions and their unshared blobs (those no session references any more) in one
    transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        sessions = exchanges = stored = 0
        candidates: set[str] = set()
        for session_id in session_ids:
            totals = rollups.session_totals(conn, session_id)
            if totals is None:
                continue  # gone already
            rollups.add_to_groups(conn, rollups.stored_labels(conn, session_id), totals, sign=-1)
            count, size = conn.execute(
                """SELECT COUNT(*), COALESCE(SUM(COALESCE(LENGTH(request), 0) + COALESCE(LENGTH(sent), 0)
                          + COALESCE(LENGTH(response), 0) + COALESCE(LENGTH(raw_sse), 0)), 0)
                   FROM exchanges WHERE session_id = ?""",
                (session_id,),
            ).fetchone()
            logprobs = conn.execute(
                "SELECT COALESCE(SUM(LENGTH(logprobs)), 0) FROM exchange_tokens WHERE session_id = ?",
                (session_id,),
            ).fetchone()[0]
            linked = conn.execute("SELECT hash FROM session_blobs WHERE session_id = ?", (session_id,))
            candidates.update(digest for (digest,) in linked)
            for sql in (
                "DELETE FROM exchanges WHERE session_id = ?",
                "DELETE FROM exchange_tokens WHERE session_id = ?",
                "DELETE FROM session_labels WHERE session_id = ?",
                "DELETE FROM session_blobs WHERE session_id = ?",
                "DELETE FROM sessions WHERE id = ?",
            ):
                conn.execute(sql, (session_id,))
            sessions, exchanges, stored = sessions + 1, exchanges + count, stored + size + logprobs
        blobs = 0
        for digest in candidates:  # the links just deleted counted themselves out of `refs`
            sql = "DELETE FROM blobs WHERE hash = ? AND refs <= 0 RETURNING LENGTH(data)"
            row = conn.execute(sql, (digest,)).fetchone()
            if row is not None:
                blobs, stored = blobs + 1, stored + row[0]
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return Freed(sessions, exchanges, blobs, stored)


def _existing(path: Path | str) -> Path:
    """`path`, which must exist: pruning or vacuuming must not create a database."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no records database at {path} (give --store PATH or set MODELTAP_STORE)")
    return Path(path)


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, wal_path(path)) if p.exists())


def _size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"
