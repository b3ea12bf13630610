"""Reading a records database: read-only, safe beside a running writer.

Owns: `StoreReader` (sessions and groups as the running totals give them, a session's exchanges with
their bodies rebuilt from the content-addressed blobs, token turns, sizes) and refusing a database of
a newer schema. Does not own: the filters' SQL (query.py), several stores as one (stores.py), the
schema (schema.py), writing (store.py).

    with StoreReader(".modeltap/records.db") as reader:
        [s["id"] for s in reader.sessions()]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from modeltap import __version__
from modeltap.compat.clients import redacted_path
from modeltap.records import query, rollups, token_store
from modeltap.records.query import SESSION_COLUMNS, SessionQuery
from modeltap.records.schema import SCHEMA_VERSION, connect, made_objects, objects

# The session every exchange recorded without one is listed under (a body that is not JSON, a request
# refused before it was named): each reader lists it as a session, so `sessions --errors`, `show`,
# `grep` and the viewer reach those exchanges too. A pseudo-session, not a row of the store, as
# mitmproxy lists every flow: nothing is written for it, and a real session of that name wins.
NO_SESSION_ID = "no-session"
NO_SESSION_NOTE = "exchanges recorded without a session: bodies that are not JSON, refusals before naming"
# Blobs a reader keeps in memory, undecoded: turn k of a session repeats the messages of the turns
# before it, so `show` reads each once instead of once per later turn (a 30-turn session: ~60 blobs
# of ~1 kB, not ~1,400 lookups).
READER_BLOBS_MAX = 4096

# The longest any one statement of a reader may run: the slowest a reader runs on a store at a
# training run's scale takes well under a second (docs/performance.md), so one past this is a store
# built to hang its readers, or a disk gone bad. Checked every PROGRESS_STEPS of SQLite's VM.
QUERY_TIMEOUT_S = 30.0
PROGRESS_STEPS = 10_000


class StoreUnreadable(RuntimeError):
    """A records database a reader refuses or cannot go on reading: not a database, damaged, not one
    modeltap made (objects it did not make), or a statement past QUERY_TIMEOUT_S. Its message names
    the file, in one line."""


class _Cursor(sqlite3.Cursor):
    """A cursor whose every failure, while executing or fetching, is a StoreUnreadable naming the file."""

    connection: _Connection

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        self.connection.deadline = time.monotonic() + self.connection.timeout_s
        with self.connection.guarded():
            super().execute(sql, parameters)
        return self

    def fetchone(self) -> Any:
        with self.connection.guarded():
            return super().fetchone()

    def fetchall(self) -> list[Any]:
        with self.connection.guarded():
            return super().fetchall()

    def __next__(self) -> Any:
        with self.connection.guarded():
            return super().__next__()


class _Connection(sqlite3.Connection):
    """A reader's connection: each statement runs on a `_Cursor` and stops past its deadline, or at
    once after `interrupt` (a viewer stopping on SIGTERM)."""

    path = Path()
    deadline = 0.0
    timeout_s = QUERY_TIMEOUT_S

    def execute(self, sql: str, parameters: Any = (), /) -> _Cursor:
        return self.cursor(_Cursor).execute(sql, parameters)

    def watch(self, path: Path) -> None:
        self.path = path
        self.set_progress_handler(self._past_deadline, PROGRESS_STEPS)

    def _past_deadline(self) -> int:
        return int(time.monotonic() > self.deadline)

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "interrupted" not in str(exc):
                raise StoreUnreadable(f"records database {self.path} cannot be read: {exc}") from None
            raise StoreUnreadable(
                f"records database {self.path}: a query was stopped (past {self.timeout_s:.0f} s, or "
                "the reader is stopping)"
            ) from None
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(f"records database {self.path} cannot be read: {exc}") from None


_SUMMARY_COLUMNS = (
    "seq, id, session_id, labels, method, endpoint, path, upstream_url, status, streamed, stream_complete, "
    "started, first_byte, ended, model, finish_reason, prompt_tokens, completion_tokens, tool_calls, "
    "counted_prompt_tokens, budget, error_class, error_message, user_agent, retry_count, "
    "client_disconnected, translated, synthesised"
)

# What an exchange holds besides its summary, read only with its bodies.
_BODY_COLUMNS = "request, sent, response, received, request_headers, response_headers"
_BODY_FIELDS = frozenset(_BODY_COLUMNS.split(", "))


class StoreReader:
    """Read-only access to a records database, safe beside a running writer.

    >>> reader = StoreReader(".modeltap/records.db")    # doctest: +SKIP
    >>> [s["id"] for s in reader.sessions()]            # doctest: +SKIP
    """

    def __init__(self, path: Path | str) -> None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(
                f"no records database at {path} (give --store PATH or set MODELTAP_STORE)"
            )
        self.path = path
        try:
            conn = connect(path, readonly=True, factory=_Connection)
        except sqlite3.DatabaseError as exc:
            raise StoreUnreadable(f"records database {path} cannot be opened: {exc}") from None
        assert isinstance(conn, _Connection)
        conn.watch(path)
        self._conn = conn
        self._texts: dict[str, bytes] = {}
        try:
            self._check()
        except BaseException:
            conn.close()
            raise

    def _check(self) -> None:
        """Refuse a database this release does not read: not modeltap's schema version, or holding
        objects modeltap does not make (a view named `sessions` whose recursive query never ends)."""
        path = self.path
        try:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        except StoreUnreadable:
            raise StoreUnreadable(f"{path} is not a records database (not SQLite, or damaged)") from None
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"records database {path} has schema version {version}, newer than this modeltap "
                f"({__version__}, schema {SCHEMA_VERSION}) reads: upgrade modeltap to read it"
            )
        if version < SCHEMA_VERSION:
            raise RuntimeError(
                f"records database {path} has schema version {version}, older than this modeltap's "
                f"{SCHEMA_VERSION}; it is upgraded in place on its next write: run `modeltap vacuum --store "
                f"{path}` once (or `modeltap serve --store {path}`)"
            )
        found, made = objects(self._conn), made_objects()
        if found != made:
            odd = sorted(f"{kind} {name}" for kind, name in found ^ made)
            raise StoreUnreadable(
                f"{path} is not a records database modeltap made: its schema differs ({', '.join(odd[:5])})"
            )

    def interrupt(self) -> None:
        """Stop the statement running on this reader, from any thread: it raises StoreUnreadable."""
        self._conn.interrupt()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sessions(self, query: SessionQuery | None = None) -> list[dict[str, Any]]:
        """The sessions `query` selects (default: all), newest first, each with its exchange count,
        time span, token totals, error count, model, and rollout reward and outcome (None for a
        session that is not a rollout). Read from the session rows, through an index."""
        query = query or SessionQuery()
        sql, args = query.sql()
        rows = [_session(row) for row in self._conn.execute(sql, args)]
        unsessioned = self._unsessioned(query)
        return rows if unsessioned is None else query.merge([rows, [unsessioned]])

    def _unsessioned(self, query: SessionQuery) -> dict[str, Any] | None:
        """The pseudo-session of the exchanges recorded without a session (NO_SESSION_ID), as a session
        row, when there are some and `query` asks for it and selects it (it has no labels, outcome or
        revision)."""
        if not query.unsessioned or query.labels or query.outcome or query.changed_after is not None:
            return None
        if query.search and not NO_SESSION_ID.startswith(query.search):
            return None
        row = self._conn.execute(_UNSESSIONED_SQL).fetchone()
        if not row["exchanges"] or self._has_session(NO_SESSION_ID):
            return None
        created = row["first"]
        if (query.errors and not row["errors"]) or (query.since is not None and created < query.since):
            return None
        if query.until is not None and created >= query.until:
            return None
        columns = [name.strip().removeprefix("s.") for name in SESSION_COLUMNS.split(",")]
        out: dict[str, Any] = dict.fromkeys(columns) | dict(row)
        return out | {
            "id": NO_SESSION_ID,
            "created": created,
            "labels": {},
            "rev": 0,
            "note": NO_SESSION_NOTE,
        }

    def _has_session(self, session_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is not None

    def count(self, query: SessionQuery | None = None) -> int:
        """How many sessions `query` selects, its limit aside (through the same index as `sessions`)."""
        query = dataclasses.replace(query or SessionQuery(), limit=None)
        sql, args = query.sql()
        counted = int(self._conn.execute(f"SELECT COUNT(*) FROM ({sql})", args).fetchone()[0])
        return counted + (self._unsessioned(query) is not None)

    def session(self, session_id: str) -> dict[str, Any] | None:
        """One session's row, as `sessions` gives it; None when there is none."""
        row = self._conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions s WHERE id = ?", (session_id,))
        found = row.fetchone()
        if found is None and session_id == NO_SESSION_ID:
            return self._unsessioned(SessionQuery(unsessioned=True))
        return None if found is None else _session(found)

    def groups(self, label: str) -> list[dict[str, Any]]:
        """The sessions that carry `label`, grouped by its value, as sums (query.merge_groups adds up
        several stores' and takes the means)."""
        return query.groups(
            label,
            self._conn.execute(query.GROUPS_SQL, (label,)),
            self._conn.execute(query.GROUP_OUTCOMES_SQL, (label,)),
        )

    def revision(self) -> int:
        """The store's latest revision: `SessionQuery(changed_after=…)` lists what changed after it."""
        return rollups.revision(self._conn)

    def session_ids(self, prefix: str, limit: int | None = None) -> list[str]:
        """Session ids starting with `prefix` (at most `limit`), so a person can type the first few
        characters."""
        low, high = query.id_range(prefix)
        sql = "SELECT id FROM sessions WHERE id >= ? AND id < ? ORDER BY id LIMIT ?"
        ids = [row[0] for row in self._conn.execute(sql, (low, high, -1 if limit is None else limit))]
        if NO_SESSION_ID.startswith(prefix) and NO_SESSION_ID not in ids:
            if self._unsessioned(SessionQuery(unsessioned=True)) is not None:
                ids = sorted([*ids, NO_SESSION_ID])[: limit if limit is not None else None]
        return ids

    def exchanges(
        self,
        session_id: str | None = None,
        *,
        after_seq: int = 0,
        bodies: bool = True,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Exchanges in recording order, optionally of one session and after a sequence number.
        With `bodies`, each has its `request`, `sent` and `response` rebuilt as dicts."""
        columns = _SUMMARY_COLUMNS + (f", {_BODY_COLUMNS}" if bodies else "")
        sql = f"SELECT {columns} FROM exchanges WHERE seq > ?"
        args: list[Any] = [after_seq]
        if session_id is not None:
            clause, more = self._of_session(session_id)
            sql += f" AND {clause}"
            args += more
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._snapshot():
            return [self._row(row, bodies) for row in self._conn.execute(sql, args)]

    def recent(self, session_id: str | None, count: int) -> list[dict[str, Any]]:
        """The last `count` exchanges (of one session, or of all), with their bodies, oldest first."""
        sql = f"SELECT {_SUMMARY_COLUMNS}, {_BODY_COLUMNS} FROM exchanges"
        args: list[Any] = []
        if session_id is not None:
            clause, more = self._of_session(session_id)
            sql += f" WHERE {clause}"
            args += more
        with self._snapshot():
            rows = self._conn.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, count)).fetchall()
            return [self._row(row, True) for row in reversed(rows)]

    def turn_number(self, session_id: str, seq: int) -> int:
        """The number (from 1) of exchange `seq` among its session's turns."""
        clause, args = self._of_session(session_id)
        sql = f"SELECT COUNT(*) FROM exchanges WHERE {clause} AND seq <= ?"
        return int(self._conn.execute(sql, (*args, seq)).fetchone()[0])

    def _of_session(self, session_id: str) -> tuple[str, list[Any]]:
        """The WHERE clause of a session's exchanges: the pseudo-session's are those with none."""
        if session_id == NO_SESSION_ID and not self._has_session(NO_SESSION_ID):
            return "session_id IS NULL", []
        return "session_id = ?", [session_id]

    def exchange(self, exchange_id: str) -> dict[str, Any] | None:
        with self._snapshot():
            row = self._conn.execute(
                f"SELECT {_SUMMARY_COLUMNS}, {_BODY_COLUMNS} FROM exchanges WHERE id = ?",
                (exchange_id,),
            ).fetchone()
            return None if row is None else self._row(row, True)

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[None]:
        """One read transaction: rows and the blobs they reference are read as of one moment, so a
        prune that commits meanwhile is seen whole or not at all (docs/sqlite.md §1)."""
        if self._conn.in_transaction:
            yield
            return
        self._conn.execute("BEGIN")
        try:
            yield
        finally:
            self._conn.execute("COMMIT")

    def raw_sse(self, exchange_id: str) -> bytes | None:
        row = self._conn.execute("SELECT raw_sse FROM exchanges WHERE id = ?", (exchange_id,)).fetchone()
        return zlib.decompress(row[0]) if row is not None and row[0] is not None else None

    def size_bytes(self) -> dict[str, int]:
        """Stored bytes of request skeletons, responses, blobs and token ids (compressed), for storage
        reports."""
        req, resp = self._conn.execute(
            "SELECT COALESCE(SUM(LENGTH(request)), 0), COALESCE(SUM(LENGTH(response)), 0) FROM exchanges"
        ).fetchone()
        blobs = self._conn.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM blobs").fetchone()[0]
        tokens = token_store.token_bytes(self._conn)
        total = req + resp + blobs + tokens
        return {"requests": req, "responses": resp, "blobs": blobs, "token_ids": tokens, "total": total}

    def token_turns(self, session_id: str) -> list[dict[str, Any]]:
        """The session's exchanges that hold token ids or were asked for them, in recording order:
        `turn`, `source`, lengths, nodes, `continues`, `shared` and `drift` (records/token_store.py)."""
        return token_store.session_tokens(self._conn, session_id)

    def token_sequence(self, node: str) -> list[int]:
        """The ids a token node stands for (a turn's `prompt_node` or `sequence_node`)."""
        return token_store.load_sequence(self._conn, node).tolist()

    def token_completion(self, turn: dict[str, Any]) -> list[int]:
        """The completion ids of a token turn (one of `token_turns`)."""
        return token_store.node_ids(self._conn, turn["sequence_node"]).tolist()

    def token_logprobs(self, turn: dict[str, Any]) -> list[float | None] | None:
        """The completion's logprobs of a token turn, when they were recorded."""
        return token_store.unpack_logprobs(turn["logprobs"])

    def _row(self, row: sqlite3.Row, bodies: bool) -> dict[str, Any]:
        out = {key: row[key] for key in row.keys() if key not in _BODY_FIELDS}
        # A key in a query (`?key=`) that a record from before modeltap redacted them still holds is
        # redacted as it is read, so that no reader shows it and no replay sends it on.
        for name in ("path", "upstream_url"):
            if out.get(name):
                out[name] = redacted_path(out[name])
        out["labels"] = json.loads(out["labels"])
        out["budget"] = json.loads(out["budget"]) if out["budget"] else None
        out["streamed"] = bool(out["streamed"])
        out["client_disconnected"] = bool(out["client_disconnected"])
        out["synthesised"] = bool(out["synthesised"])
        if bodies:
            out["request"] = self._unpack_request(row["request"])
            out["sent"] = self._unpack_request(row["sent"])
            out["response"] = json.loads(zlib.decompress(row["response"])) if row["response"] else None
            out["received"] = json.loads(zlib.decompress(row["received"])) if row["received"] else None
            for name in ("request_headers", "response_headers"):
                out[name] = [tuple(pair) for pair in json.loads(row[name])] if row[name] else []
        return out

    def _unpack_request(self, packed: bytes | None) -> Any:
        if packed is None:
            return None
        doc = json.loads(zlib.decompress(packed))
        if "raw" in doc:
            return doc["raw"]
        body, refs = doc["body"], doc["refs"]
        out: dict[str, Any] = {}
        for key in doc["order"]:
            if key not in refs:
                out[key] = body[key]
            elif isinstance(refs[key], dict):
                out[key] = [self._blob(h) for h in self._list_hashes(refs[key]["list"])]
            else:
                out[key] = self._blob(refs[key])
        return out

    def _list_hashes(self, node: str) -> list[str]:
        chunks: list[list[str]] = []
        while node is not None:
            doc = self._blob(node)
            chunks.append(doc["add"])
            node = doc["prev"]
        return [h for chunk in reversed(chunks) for h in chunk]

    def _blob(self, digest: str) -> Any:
        """The blob's value, decoded afresh (callers may change it); its text comes from the cache when
        an earlier turn read it: a blob never changes."""
        text = self._texts.get(digest)
        if text is None:
            row = self._conn.execute("SELECT data FROM blobs WHERE hash = ?", (digest,)).fetchone()
            if row is None:
                raise RuntimeError(f"records database {self.path} is missing blob {digest}")
            text = self._texts[digest] = zlib.decompress(row[0])
            if len(self._texts) > READER_BLOBS_MAX:
                self._texts.pop(next(iter(self._texts)))
        return json.loads(text)


# The pseudo-session's totals, through the index of exchanges by session (NULL session ids included).
_UNSESSIONED_SQL = """
    SELECT COUNT(*) AS exchanges, MIN(started) AS first, MAX(COALESCE(ended, started)) AS last,
           SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens,
           COALESCE(SUM(error_class IS NOT NULL), 0) AS errors,
           (SELECT model FROM exchanges WHERE session_id IS NULL AND model IS NOT NULL
            ORDER BY seq DESC LIMIT 1) AS model
    FROM exchanges WHERE session_id IS NULL"""


def _session(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out["labels"] = json.loads(out["labels"])
    out["rollout"] = json.loads(out["rollout"]) if out["rollout"] else None
    out["token_drift"] = json.loads(out["token_drift"]) if out["token_drift"] else None
    return out
