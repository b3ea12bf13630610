"""The record store: SQLite in WAL mode, one writer thread, read-only readers.

Owns: the schema and its migrations (`PRAGMA user_version`), the writer thread and its bounded queue,
content-addressed compressed bodies, and the reader API. `sqlite3` is imported here and nowhere else.

The store is the proxy's first observer (modeltap.proxy.observers): `on_exchange` queues an exchange
at once and returns, when the queue is over its size, an awaitable that waits for room (back-pressure,
never a blocking put and never a silent drop; a record queued is never lost to a client that hangs up
while waiting). The thread serialises, hashes, compresses and commits in batches. A failed write is
logged as an error and counted.

Bodies are stored so that a long session costs about its final size, not the sum of its turns: each
element of a request's history (the dialect's `history_field`: `messages`, `input`) and its context
fields (`tools`, `system`, `instructions`) is a blob keyed by a 128-bit BLAKE2b digest of its JSON.
A list that extends the session's previous list is stored as a node `{"prev": <previous node>, "add":
[<hashes of the new elements>]}`, so a turn costs its new messages plus a few references, not
references to its whole history. Token ids are stored the same way, by records/token_store.py, which
the writer runs after each exchange.

    store = RecordStore(".modeltap/records.db")
    store.start()
    await store.submit(exchange)          # on the event loop: waits only for room
    await store.close()
    StoreReader(".modeltap/records.db").sessions()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import queue
import sqlite3
import threading
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from modeltap import __version__, dialects
from modeltap.dialects.token_ids import without_ids
from modeltap.records import query, references, rollups, token_store
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, Exchange, SessionEvent
from modeltap.records.jsontext import dumps as _dumps
from modeltap.records.jsontext import safe_text as _safe_text
from modeltap.records.query import SESSION_COLUMNS, SessionQuery
from modeltap.records.references import NO_SESSION

log = logging.getLogger(__name__)

# Exchanges waiting for the writer. At ~1 ms per write this is a few seconds of burst; beyond it the
# relay waits for a slot rather than grow memory without bound.
QUEUE_SIZE = 4096
# The writer commits up to this many exchanges per transaction when they queue up.
BATCH_MAX = 256
# Hashes of blobs known to be stored, kept in memory so an unchanged message is neither compressed
# nor re-sent to SQLite on every turn. 64k hashes is ~6 MB.
KNOWN_BLOBS_MAX = 65536
# Sessions whose latest message list the writer remembers, to store the next turn as an extension.
LAST_LISTS_MAX = 4096
# Blobs a reader keeps in memory, undecoded: turn k of a session repeats the messages of the turns
# before it, so `show` reads each once instead of once per later turn (a 30-turn session: ~60 blobs
# of ~1 kB, not ~1,400 lookups).
READER_BLOBS_MAX = 4096
# How long close() waits for the writer to drain before saying so.
CLOSE_TIMEOUT_S = 30.0
# The error class of an exchange whose full record could not be written (its minimal record says why).
RECORD_ERROR = "record_error"


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
)
SCHEMA_VERSION = len(MIGRATIONS)


class StoreClosed(RuntimeError):
    """Raised by `submit` after `close`."""


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection with modeltap's settings; read-only connections cannot write by accident."""
    if readonly:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, check_same_thread=False)
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
                for statement in _statements(migration):
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {step + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return SCHEMA_VERSION


def _statements(script: str) -> Iterator[str]:
    # executescript() would commit the open transaction first; split so a step stays atomic.
    for statement in script.split(";"):
        if statement.strip():
            yield statement


_EXCHANGE_COLUMNS = (
    "id, session_id, labels, method, endpoint, path, upstream_url, status, streamed, stream_complete, "
    "started, first_byte, ended, model, request, sent, response, raw_sse, finish_reason, prompt_tokens, "
    "completion_tokens, tool_calls, counted_prompt_tokens, budget, error_class, error_message, user_agent, "
    "retry_count, client_disconnected, translated, received, synthesised"
)
_PLACEHOLDERS = ", ".join(["?"] * (_EXCHANGE_COLUMNS.count(",") + 1))
_INSERT_EXCHANGE = f"INSERT INTO exchanges ({_EXCHANGE_COLUMNS}) VALUES ({_PLACEHOLDERS})"
_Item = tuple[Exchange | SessionEvent, asyncio.AbstractEventLoop | None, "asyncio.Future[None] | None"]


class RecordStore:
    """The single writer of one records database, and an observer of sessions and exchanges. Not
    started → running → closed. With `sync`, an exchange's wait lasts until it is committed."""

    def __init__(
        self,
        path: Path | str,
        *,
        keep_raw_sse: bool = False,
        sync: bool = False,
        queue_size: int = QUEUE_SIZE,
        max_bytes: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.keep_raw_sse = keep_raw_sse
        self.sync = sync
        self.max_bytes = max_bytes
        self.written = 0
        self.failures = 0
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._queue_size = queue_size
        # Back-pressure without a loop wake-up per record: the loop counts what it queued, the writer
        # what it finished, and the writer wakes the loop only when a submitter waits for room.
        self._submitted = 0
        self._finished = 0
        self._room: asyncio.Event | None = None
        self._room_loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._known: OrderedDict[str, None] = OrderedDict()
        self._on_exit: Callable[[], object] | None = None
        self._last_lists: OrderedDict[tuple[str | None, str], tuple[str, list[str]]] = OrderedDict()
        # (session, blob) pairs known to be in `session_blobs`, like `_known` for the blobs.
        self._linked: OrderedDict[tuple[str, str], None] = OrderedDict()
        # The blobs the exchange being written references that its session may not have linked yet: a
        # list's node and new elements (what the node extends was linked with it), the context blobs.
        self._refs: list[str] = []
        self._rollups = rollups.Rollups()
        self._data_version: int | None = None
        self._size_warned = False
        self.tokens = token_store.TokenWriter()

    def start(self) -> None:
        """Open (creating and migrating) the database and start the writer thread."""
        if self._thread is not None or self._closed:
            raise RuntimeError("a RecordStore starts once")
        try:
            conn = connect(self.path)
            migrate(conn)
        except (OSError, sqlite3.Error) as exc:
            raise RuntimeError(f"cannot open the record store {self.path.resolve()}: {exc}") from exc
        self._rollups.start(conn)
        self._thread = threading.Thread(target=self._run, args=(conn,), name="modeltap-store", daemon=True)
        self._thread.start()

    def on_session(self, event: SessionEvent) -> None:
        """Record a session's opening (so it is listed even before its first exchange), closing or
        rollout outcome. Non-blocking: session events are rare, so they bypass the back-pressure slots."""
        if self._closed or self._thread is None:
            raise StoreClosed("the record store is not running")
        self._queue.put((event, None, None))

    def on_exchange(self, exchange: Exchange) -> Awaitable[None] | None:
        """Queue `exchange` at once; return what the relay waits for: room in the queue when it is
        over its size, or with `sync` the commit. None when there is nothing to wait for."""
        return self._enqueue(exchange, wait=self.sync)

    async def submit(self, exchange: Exchange, *, wait: bool = False) -> None:
        """Queue `exchange` and wait for room; with `wait`, also for the commit."""
        pending = self._enqueue(exchange, wait=wait)
        if pending is not None:
            await pending

    def _enqueue(self, exchange: Exchange, *, wait: bool) -> Awaitable[None] | None:
        if self._closed or self._thread is None:
            raise StoreClosed("the record store is not running")
        loop = asyncio.get_running_loop()
        future = loop.create_future() if wait else None
        self._submitted += 1
        self._queue.put((exchange, loop, future))
        if self._submitted - self._finished > self._queue_size:
            return self._room_for(loop, future)
        return future

    async def _room_for(self, loop: asyncio.AbstractEventLoop, commit: asyncio.Future[None] | None) -> None:
        """Wait until the queue is back within its size (and for `commit`, when given)."""
        while self._submitted - self._finished > self._queue_size:
            if self._room is None:
                self._room, self._room_loop = asyncio.Event(), loop
            room = self._room
            # Look again after publishing the event: the writer counts before it looks for a waiter,
            # so one of the two sees the other.
            if self._submitted - self._finished <= self._queue_size:
                break
            await room.wait()
        if commit is not None:
            await commit

    async def close(self) -> None:
        """Drain the queue, commit, and stop the writer. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None:
            return
        # The writer says when it is done, rather than being joined in a worker thread: at interpreter
        # exit (an AReaL worker ending without modeltap.adapter.shutdown()) the default executor
        # already refuses new work.
        loop, finished = asyncio.get_running_loop(), asyncio.Event()
        self._on_exit = lambda: _call_soon(loop, finished.set)
        self._queue.put(None)
        try:
            await asyncio.wait_for(finished.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error(
                "record store writer did not finish within %.0f s; some records may be lost", CLOSE_TIMEOUT_S
            )

    # -- the writer thread -------------------------------------------------------------------------

    def _run(self, conn: sqlite3.Connection) -> None:
        try:
            while True:
                first = self._queue.get()
                batch = [first] if first is not None else []
                stop = first is None
                while not stop and len(batch) < BATCH_MAX:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stop = True
                    else:
                        batch.append(nxt)
                if batch:
                    self._write_batch(conn, batch)
                    self._check_size()
                if stop:
                    return
        finally:
            conn.close()
            if self._on_exit is not None:
                self._on_exit()

    def _write_batch(self, conn: sqlite3.Connection, batch: list[_Item]) -> None:
        """Commit a batch in one transaction; if that fails, write its items one by one, so one bad
        record costs only itself."""
        error = self._write_items(conn, batch)
        errors = [error] * len(batch)
        if error is not None and len(batch) > 1:
            errors = [self._write_items(conn, [item]) for item in batch]
        for (item, _, _), item_error in zip(batch, errors, strict=True):
            if item_error is None:
                self.written += isinstance(item, Exchange)
                continue
            self.failures += 1
            log.error("record store: failed to write a record to %s", self.path, exc_info=item_error)
            if isinstance(item, Exchange):
                self._write_minimal(conn, item, item_error)
        self._finished += sum(isinstance(item, Exchange) for item, _, _ in batch)
        room, self._room = self._room, None
        if room is not None and self._room_loop is not None:
            _call_soon(self._room_loop, room.set)
        # Only `wait`ers are woken, with one hand-off per loop per batch: a burst of thousands of
        # wake-ups fills asyncio's self-pipe, and a signal's wake-up byte is then dropped.
        settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], Exception | None]]] = {}
        for (_, loop, future), item_error in zip(batch, errors, strict=True):
            if loop is not None and future is not None:
                settled.setdefault(loop, []).append((future, item_error))
        for loop, outcomes in settled.items():
            _call_soon(loop, functools.partial(_settle, outcomes))

    def _write_items(self, conn: sqlite3.Connection, items: list[_Item]) -> Exception | None:
        try:
            self._begin(conn)
            tally = self._rollups.tally(conn)
            for item, _, _ in items:
                if isinstance(item, Exchange):
                    self._write_exchange(conn, tally, item)
                else:
                    _write_session(tally, item)
            tally.flush()
            conn.execute("COMMIT")
            return None
        except Exception as exc:  # boundary: a write must never kill the writer; the caller logs and counts
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._forget()  # the rolled-back rows may be among the remembered ones
            return exc

    def _begin(self, conn: sqlite3.Connection) -> None:
        """Open a write transaction. When another connection has written since (a prune), what the
        writer remembers of the rows (known blobs, lists, sessions) may be gone: forget it. Exact,
        since nobody else can commit until this transaction does (docs/sqlite.md §3)."""
        conn.execute("BEGIN IMMEDIATE")
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self._data_version is not None and version != self._data_version:
            self._forget()
        self._data_version = version

    def _forget(self) -> None:
        self._known.clear()
        self._last_lists.clear()
        self._linked.clear()
        self._rollups.forget()
        self.tokens.reset()

    def _check_size(self) -> None:
        """Warn once when the database (with its write-ahead log) passes `max_bytes`."""
        if self.max_bytes is None or self._size_warned:
            return
        size = sum(p.stat().st_size for p in (self.path, wal_path(self.path)) if p.exists())
        if size > self.max_bytes:
            self._size_warned = True
            log.warning(
                "records database %s is %d bytes, past --max-store-bytes %d: free space with "
                "`modeltap prune --store %s --before 7d` (or --keep-last N), then `modeltap vacuum`",
                self.path,
                size,
                self.max_bytes,
                self.path,
            )

    def _write_minimal(self, conn: sqlite3.Connection, ex: Exchange, error: Exception) -> None:
        """What can always be written of an exchange whose full record failed: its ids, times, status
        and the failure, so that no served request goes unrecorded."""
        reason = f"the record could not be written in full: {type(error).__name__}: {error}"
        try:
            self._begin(conn)
            if ex.session_id is not None:
                tally = self._rollups.tally(conn)
                tally.session(_safe_text(ex.session_id) or "", ex.started, {})  # labels may be the fault
                tally.exchange(
                    _safe_text(ex.session_id) or "",
                    started=ex.started,
                    ended=ex.ended,
                    model=None,
                    prompt=None,
                    completion=None,
                    error=True,
                )
                tally.flush()
            conn.execute(
                """INSERT OR IGNORE INTO exchanges (id, session_id, method, endpoint, path, status, streamed,
                   started, first_byte, ended, error_class, error_message, client_disconnected)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (
                    ex.id,
                    _safe_text(ex.session_id),
                    _safe_text(ex.method),
                    ex.endpoint,
                    _safe_text(ex.path),
                    ex.status,
                    ex.streamed,
                    ex.started,
                    ex.first_byte,
                    ex.ended,
                    ex.error_class or RECORD_ERROR,
                    _safe_text(f"{ex.error_message}; {reason}" if ex.error_message else reason),
                    ex.client_disconnected,
                ),
            )
            conn.execute("COMMIT")
        except Exception:  # boundary: the writer must go on; the failure is already logged and counted
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._forget()
            log.exception("record store: not even a minimal record of exchange %s could be written", ex.id)

    def _write_exchange(self, conn: sqlite3.Connection, tally: rollups.Tally, ex: Exchange) -> None:
        dialect = dialects.of_record(ex.endpoint)
        request = ex.request_json if ex.request_json is not None else _loads(ex.request)
        response, response_text = _response(ex)
        summary = dialect.summary(request, response)
        # A translated exchange's ids came with the upstream's own answer, in its format.
        upstream = dialects.of_record(ex.translated or ex.endpoint)
        answered = ex.received if ex.translated else response
        ids = token_store.recorded_ids(ex, upstream, ex.sent if ex.translated else request, answered)
        # Served ids are stored once, as shared prefixes, and not again in every turn's body.
        served = ids is not None and ex.token_ids is None
        stored = without_ids(response) if served and not ex.translated and response else response
        received = without_ids(ex.received) if served and ex.received else ex.received
        budget = ex.budget or {}
        model = summary.model or (request.get("model") if isinstance(request, dict) else None)
        model = _safe_text(model if isinstance(model, str) else None)
        session = _safe_text(ex.session_id)
        if session is not None:
            tally.session(session, ex.started, ex.labels)
            tally.exchange(
                session,
                started=ex.started,
                ended=ex.ended,
                model=model,
                prompt=summary.prompt_tokens,
                completion=summary.completion_tokens,
                error=ex.error_class is not None,
            )
        self._refs = []
        conn.execute(
            _INSERT_EXCHANGE,
            (
                ex.id,
                _safe_text(ex.session_id),
                _dumps(ex.labels),
                _safe_text(ex.method),
                ex.endpoint,
                _safe_text(ex.path),
                _safe_text(ex.upstream_url),
                ex.status,
                ex.streamed,
                ex.stream_complete,
                ex.started,
                ex.first_byte,
                ex.ended,
                model,
                self._pack_request(conn, dialect, ex.session_id, request, ex.request),
                self._pack_request(conn, upstream, None, ex.sent, b"") if ex.sent is not None else None,
                _compress_json(stored) if stored is not None else _compress_text(response_text),
                zlib.compress(ex.raw_sse) if self.keep_raw_sse and ex.raw_sse else None,
                _safe_text(summary.finish_reason),
                summary.prompt_tokens,
                summary.completion_tokens,
                len(summary.tool_calls),
                budget.get("prompt_tokens"),
                _dumps(budget) if budget else None,
                ex.error_class,
                _safe_text(ex.error_message),
                _safe_text(ex.user_agent),
                ex.retry_count,
                ex.client_disconnected,
                ex.translated,
                _compress_json(received) if received is not None else None,
                ex.synthesised,
            ),
        )
        self.tokens.write(conn, ex, ids, dialect, request, response, summary.finish_reason)
        self._link(conn, session if session is not None else NO_SESSION)

    def _link(self, conn: sqlite3.Connection, owner: str) -> None:
        """Note that session `owner` references the blobs the exchange just written uses."""
        new = []
        for digest in self._refs:
            pair = (owner, digest)
            if pair in self._linked:
                self._linked.move_to_end(pair)
                continue
            self._linked[pair] = None
            new.append(pair)
        if len(self._linked) > KNOWN_BLOBS_MAX:
            for _ in range(len(self._linked) - KNOWN_BLOBS_MAX):
                self._linked.popitem(last=False)
        conn.executemany("INSERT OR IGNORE INTO session_blobs (session_id, hash) VALUES (?, ?)", new)

    def _pack_request(
        self, conn: sqlite3.Connection, dialect: dialects.Dialect, session: str | None, body: Any, raw: bytes
    ) -> bytes | None:
        """The request as a compressed skeleton whose bulky fields are references to shared blobs."""
        if not isinstance(body, dict):
            # Not a JSON object: its bytes, losslessly (undecodable bytes as surrogate escapes).
            return _compress_json({"raw": raw.decode("utf-8", "surrogateescape")}) if raw else None
        rest: dict[str, Any] = {}
        refs: dict[str, Any] = {}
        for key, value in body.items():
            if key == dialect.history_field and isinstance(value, list):
                refs[key] = {"list": self._list(conn, (session, key), [self._blob(conn, e) for e in value])}
            elif key in dialect.context_fields and value is not None:
                refs[key] = self._blob(conn, value)
                self._refs.append(refs[key])
            else:
                rest[key] = value
        return _compress_json({"body": rest, "refs": refs, "order": list(body)})

    def _list(self, conn: sqlite3.Connection, key: tuple[str | None, str], hashes: list[str]) -> str:
        """A list node, extending the session's previous list when this one starts with it."""
        prev = self._last_lists.get(key) if key[0] is not None else None
        if prev is not None and prev[1] and hashes[: len(prev[1])] == prev[1]:
            added = hashes[len(prev[1]) :]
            node = self._blob(conn, {"prev": prev[0], "add": added})
        else:
            added = hashes
            node = self._blob(conn, {"prev": None, "add": hashes})
        self._refs += [node, *added]
        if key[0] is not None:
            self._last_lists[key] = (node, hashes)
            self._last_lists.move_to_end(key)
            if len(self._last_lists) > LAST_LISTS_MAX:
                self._last_lists.popitem(last=False)
        return node

    def _blob(self, conn: sqlite3.Connection, value: Any) -> str:
        data = _dumps(value).encode()
        # 128 bits: collisions are out of reach (2^64 blobs), and every reference costs half a SHA-256's.
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        if digest in self._known:
            self._known.move_to_end(digest)
            return digest
        conn.execute("INSERT OR IGNORE INTO blobs (hash, data) VALUES (?, ?)", (digest, zlib.compress(data)))
        self._known[digest] = None
        if len(self._known) > KNOWN_BLOBS_MAX:
            self._known.popitem(last=False)
        return digest


def wal_path(path: Path) -> Path:
    """The write-ahead log beside the database at `path`."""
    return path.with_name(path.name + "-wal")


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Hand `callback` to `loop` from the writer thread, unless the loop is already gone."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _settle(outcomes: list[tuple[asyncio.Future[None], Exception | None]]) -> None:
    """On the submitting loop: tell each `wait`er whether its record was committed."""
    for future, error in outcomes:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)


def _write_session(tally: rollups.Tally, event: SessionEvent) -> None:
    session = _safe_text(event.session_id) or ""
    tally.session(session, event.at, event.labels, _safe_text(event.upstream), opened=event.kind == "opened")
    if event.kind == "closed":
        tally.closed(session, event.at)
    elif event.outcome is not None:
        tally.outcome(session, event.outcome)


def _response(ex: Exchange) -> tuple[dict[str, Any] | None, str | None]:
    """The response for the record: its JSON object, or else the start of its text."""
    if ex.response is not None or ex.response_body is None:
        return ex.response, None
    parsed = _loads(ex.response_body)
    if isinstance(parsed, dict):
        return parsed, None
    return None, ex.response_body[:RESPONSE_TEXT_MAX_CHARS].decode("utf-8", "surrogateescape")


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return None


def _compress_json(value: Any) -> bytes:
    return zlib.compress(_dumps(value).encode())


def _compress_text(text: str | None) -> bytes | None:
    return None if text is None else _compress_json({"text": text})


# -- reading --------------------------------------------------------------------------------------

_SUMMARY_COLUMNS = (
    "seq, id, session_id, labels, method, endpoint, path, upstream_url, status, streamed, stream_complete, "
    "started, first_byte, ended, model, finish_reason, prompt_tokens, completion_tokens, tool_calls, "
    "counted_prompt_tokens, budget, error_class, error_message, user_agent, retry_count, "
    "client_disconnected, translated, synthesised"
)


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
        self._conn = connect(path, readonly=True)
        self._texts: dict[str, bytes] = {}
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            self._conn.close()
            raise RuntimeError(
                f"records database {path} has schema version {version}, newer than this modeltap "
                f"({__version__}, schema {SCHEMA_VERSION}) reads: upgrade modeltap to read it"
            )
        if version < SCHEMA_VERSION:
            self._conn.close()
            raise RuntimeError(
                f"records database {path} has schema version {version}, older than this modeltap's "
                f"{SCHEMA_VERSION}; it is upgraded in place on its next write: run `modeltap vacuum --store "
                f"{path}` once (or `modeltap serve --store {path}`)"
            )

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
        sql, args = (query or SessionQuery()).sql()
        return [_session(row) for row in self._conn.execute(sql, args)]

    def session(self, session_id: str) -> dict[str, Any] | None:
        """One session's row, as `sessions` gives it; None when there is none."""
        row = self._conn.execute(f"SELECT {SESSION_COLUMNS} FROM sessions s WHERE id = ?", (session_id,))
        found = row.fetchone()
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
        return int(self._conn.execute("SELECT COALESCE(MAX(rev), 0) FROM sessions").fetchone()[0])

    def session_ids(self, prefix: str, limit: int | None = None) -> list[str]:
        """Session ids starting with `prefix` (at most `limit`), so a person can type the first few
        characters."""
        low, high = query.id_range(prefix)
        sql = "SELECT id FROM sessions WHERE id >= ? AND id < ? ORDER BY id LIMIT ?"
        return [row[0] for row in self._conn.execute(sql, (low, high, -1 if limit is None else limit))]

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
        columns = _SUMMARY_COLUMNS + (", request, sent, response, received" if bodies else "")
        sql = f"SELECT {columns} FROM exchanges WHERE seq > ?"
        args: list[Any] = [after_seq]
        if session_id is not None:
            sql += " AND session_id = ?"
            args.append(session_id)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._snapshot():
            return [self._row(row, bodies) for row in self._conn.execute(sql, args)]

    def recent(self, session_id: str | None, count: int) -> list[dict[str, Any]]:
        """The last `count` exchanges (of one session, or of all), with their bodies, oldest first."""
        sql = f"SELECT {_SUMMARY_COLUMNS}, request, sent, response, received FROM exchanges"
        args: list[Any] = []
        if session_id is not None:
            sql += " WHERE session_id = ?"
            args.append(session_id)
        with self._snapshot():
            rows = self._conn.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, count)).fetchall()
            return [self._row(row, True) for row in reversed(rows)]

    def turn_number(self, session_id: str, seq: int) -> int:
        """The number (from 1) of exchange `seq` among its session's turns."""
        sql = "SELECT COUNT(*) FROM exchanges WHERE session_id = ? AND seq <= ?"
        return int(self._conn.execute(sql, (session_id, seq)).fetchone()[0])

    def exchange(self, exchange_id: str) -> dict[str, Any] | None:
        with self._snapshot():
            row = self._conn.execute(
                f"SELECT {_SUMMARY_COLUMNS}, request, sent, response, received FROM exchanges WHERE id = ?",
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
        out = {key: row[key] for key in row.keys() if key not in ("request", "sent", "response", "received")}
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


def _session(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out["labels"] = json.loads(out["labels"])
    out["rollout"] = json.loads(out["rollout"]) if out["rollout"] else None
    out["token_drift"] = json.loads(out["token_drift"]) if out["token_drift"] else None
    return out
