"""The record store's writer: one thread writing SQLite in WAL mode, fed through a bounded queue.

Owns: the writer thread and its bounded queue, content-addressed compressed bodies, and the minimal
record of an exchange whose full record could not be written. Does not own: the schema and its
migrations (schema.py), reading (reader.py), the running totals (rollups.py), token ids
(token_store.py).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import queue
import sqlite3
import threading
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from modeltap import dialects
from modeltap.dialects.token_ids import without_ids
from modeltap.records import rollups, token_store
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, Exchange, SessionEvent
from modeltap.records.jsontext import dumps as _dumps
from modeltap.records.jsontext import safe_text as _safe_text
from modeltap.records.references import NO_SESSION
from modeltap.records.schema import connect, migrate, wal_path

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
# How long close() waits for the writer to drain before saying so.
CLOSE_TIMEOUT_S = 30.0
# The error class of an exchange whose full record could not be written (its minimal record says why).
RECORD_ERROR = "record_error"


class StoreClosed(RuntimeError):
    """Raised by `submit` after `close`."""


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
        budget = ex.budget
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
                budget.prompt_tokens if budget is not None else None,
                _dumps(dataclasses.asdict(budget)) if budget is not None else None,
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
