"""SqlWriter: the one connection that writes a records database, and what it remembers between batches.

Owns: writing a batch of exchanges and session events in one transaction (one by one when the batch
fails, so one bad record costs only itself), content-addressed compressed bodies, the minimal record
of an exchange whose full record could not be written, and the counts of what was written and what
failed. Does not own: who calls it and from where (store.py runs it on a thread of the serving
process; writer_process.py in a process of its own), the schema (schema.py), the running totals
(rollups.py), token ids (token_store.py).

Bodies are stored so that a long session costs about its final size, not the sum of its turns: each
element of a request's history (the dialect's `history_field`: `messages`, `input`) and its context
fields (`tools`, `system`, `instructions`) is a blob keyed by a 128-bit BLAKE2b digest of its JSON.
A list that extends the session's previous list is stored as a node `{"prev": <previous node>, "add":
[<hashes of the new elements>]}`, so a turn costs its new messages plus a few references, not
references to its whole history. Token ids are stored the same way, by records/token_store.py, which
runs after each exchange.

    writer = SqlWriter(".modeltap/records.db")
    writer.open()
    errors = writer.write([exchange, event])   # blocking: one item per error, None where written
    writer.close()
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sqlite3
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from modeltap import dialects
from modeltap.dialects.token_ids import without_ids
from modeltap.records import rollups, token_store
from modeltap.records.exchange import Exchange, SessionEvent, text_body
from modeltap.records.jsontext import count as _count
from modeltap.records.jsontext import dumps as _dumps
from modeltap.records.jsontext import safe_text as _safe_text
from modeltap.records.references import NO_SESSION
from modeltap.records.schema import connect, migrate, wal_path

log = logging.getLogger(__name__)

# Hashes of blobs known to be stored, kept in memory so an unchanged message is neither compressed
# nor re-sent to SQLite on every turn. 64k hashes is ~6 MB.
KNOWN_BLOBS_MAX = 65536
# Sessions whose latest message list the writer remembers, to store the next turn as an extension.
LAST_LISTS_MAX = 4096
# The error class of an exchange whose full record could not be written (its minimal record says why).
RECORD_ERROR = "record_error"
# Exchange ids asked about at once by `stored` (SQLite's default limit of host parameters is 32766).
IDS_PER_QUERY = 500

Item = Exchange | SessionEvent

_EXCHANGE_COLUMNS = (
    "id, session_id, labels, method, endpoint, path, upstream_url, status, streamed, stream_complete, "
    "started, first_byte, ended, model, request, sent, response, raw_sse, finish_reason, prompt_tokens, "
    "completion_tokens, tool_calls, counted_prompt_tokens, budget, error_class, error_message, user_agent, "
    "retry_count, client_disconnected, translated, received, synthesised"
)
_PLACEHOLDERS = ", ".join(["?"] * (_EXCHANGE_COLUMNS.count(",") + 1))
_INSERT_EXCHANGE = f"INSERT INTO exchanges ({_EXCHANGE_COLUMNS}) VALUES ({_PLACEHOLDERS})"


class SqlWriter:
    """The single writing connection of one records database. Not open → open → closed; every method
    blocks, so it runs off the event loop (a thread, or the writer process)."""

    def __init__(self, path: Path | str, *, keep_raw_sse: bool = False, max_bytes: int | None = None) -> None:
        self.path = Path(path)
        self.keep_raw_sse = keep_raw_sse
        self.max_bytes = max_bytes
        self.written = 0
        self.failures = 0
        self._conn: sqlite3.Connection | None = None
        self._known: OrderedDict[str, None] = OrderedDict()
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

    def open(self) -> None:
        """Open the database, creating and migrating it; RuntimeError saying why when it cannot."""
        try:
            conn = connect(self.path)
            migrate(conn)
        except (OSError, sqlite3.Error) as exc:
            raise RuntimeError(f"cannot open the record store {self.path.resolve()}: {exc}") from exc
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write(self, batch: Sequence[Item]) -> list[Exception | None]:
        """Commit `batch` in one transaction; if that fails, write its items one by one, so one bad
        record costs only itself. Each failure is logged and counted, and an exchange that failed gets
        its minimal record. Returns each item's error (None: written)."""
        conn = self._connection()
        error = self._write_items(conn, batch)
        errors = [error] * len(batch)
        if error is not None and len(batch) > 1:
            errors = [self._write_items(conn, [item]) for item in batch]
        for item, item_error in zip(batch, errors, strict=True):
            if item_error is None:
                self.written += isinstance(item, Exchange)
            else:
                self.failed(item, item_error)
        self._check_size()
        return errors

    def failed(self, item: Item, error: BaseException) -> None:
        """Count and log a record that could not be written in full; write an exchange's minimal record."""
        self.failures += 1
        log.error("record store: failed to write a record to %s", self.path, exc_info=error)
        if isinstance(item, Exchange):
            self._write_minimal(self._connection(), item, error)

    def stored(self, ids: Iterable[str]) -> set[str]:
        """Which of these exchange ids the database already holds (a record sent again after the
        writer process died may have been committed before it did)."""
        conn, wanted, found = self._connection(), list(ids), set()
        for start in range(0, len(wanted), IDS_PER_QUERY):
            part = wanted[start : start + IDS_PER_QUERY]
            marks = ", ".join("?" * len(part))
            found |= {row[0] for row in conn.execute(f"SELECT id FROM exchanges WHERE id IN ({marks})", part)}
        return found

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the SqlWriter is not open")
        return self._conn

    def _write_items(self, conn: sqlite3.Connection, items: Sequence[Item]) -> Exception | None:
        try:
            self._begin(conn)
            tally = self._rollups.tally(conn)
            for item in items:
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

    def _write_minimal(self, conn: sqlite3.Connection, ex: Exchange, error: BaseException) -> None:
        """What can always be written of an exchange whose full record failed: its ids, times, status
        and the failure, so that no served request goes unrecorded; and its bodies, each whole and
        without shared blobs, unless that body is itself what cannot be stored (`_plain_bodies`)."""
        reason = f"the record could not be written in full: {type(error).__name__}: {error}"
        bodies = _plain_bodies(ex)
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
                   started, first_byte, ended, error_class, error_message, client_disconnected, request,
                   sent, response, received)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
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
                    *bodies,
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
        if session != ex.session_id:
            ex = dataclasses.replace(ex, session_id=session)  # every table names the session alike
        prompt_tokens, completion_tokens = _count(summary.prompt_tokens), _count(summary.completion_tokens)
        if session is not None:
            tally.session(session, ex.started, ex.labels)
            tally.exchange(
                session,
                started=ex.started,
                ended=ex.ended,
                model=model,
                prompt=prompt_tokens,
                completion=completion_tokens,
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
                prompt_tokens,
                completion_tokens,
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
        self.tokens.write(conn, ex, ids, dialect, request, response)
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


def _plain_bodies(ex: Exchange) -> tuple[bytes | None, bytes | None, bytes | None, bytes | None]:
    """The request, sent, response and received columns of a minimal record: each body packed whole
    (a request as a skeleton with no references, as the reader unpacks it), the request's bytes when
    its parsed form cannot be, and None only for a body that cannot be stored at all."""
    body = ex.request_json if ex.request_json is not None else _loads(ex.request)
    request = _packed(lambda: _skeleton(body)) if isinstance(body, dict) else None
    if request is None and ex.request:
        raw = ex.request.decode("utf-8", "surrogateescape")
        request = _packed(lambda: _compress_json({"raw": raw}))
    sent_body = ex.sent
    sent = _packed(lambda: _skeleton(sent_body)) if sent_body is not None else None
    response, text = _response(ex)
    answer = _packed(lambda: _compress_json(response) if response is not None else _compress_text(text))
    received = _packed(lambda: _compress_json(ex.received)) if ex.received is not None else None
    return request, sent, answer, received


def _skeleton(body: dict[str, Any]) -> bytes:
    """A request body packed as `_pack_request` packs one, with every field inline."""
    return _compress_json({"body": body, "refs": {}, "order": list(body)})


def _packed(pack: Callable[[], bytes | None]) -> bytes | None:
    try:
        return pack()
    except Exception:  # boundary: one body that cannot be stored must not cost the others
        log.exception("record store: a body of a minimal record could not be stored")
        return None


def _write_session(tally: rollups.Tally, event: SessionEvent) -> None:
    session = _safe_text(event.session_id) or ""
    tally.session(session, event.at, event.labels, _safe_text(event.upstream), opened=event.kind == "opened")
    if event.kind == "closed":
        tally.closed(session, event.at)
    elif event.outcome is not None:
        tally.outcome(session, event.outcome)


def _response(ex: Exchange) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """The response for the record: its JSON object, or else the start of its text (`text_body`)."""
    if ex.response is not None or ex.response_body is None:
        return ex.response, None
    parsed = _loads(ex.response_body)
    if isinstance(parsed, dict):
        return parsed, None
    return None, text_body(ex.response_body)


def _loads(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return None


def _compress_json(value: Any) -> bytes:
    return zlib.compress(_dumps(value).encode())


def _compress_text(text: dict[str, str] | None) -> bytes | None:
    return None if text is None else _compress_json(text)
