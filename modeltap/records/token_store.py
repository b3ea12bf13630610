"""Token ids in the records: each exchange's prompt and completion ids, stored as shared prefixes, and
each session's first token-history break.

Owns: the schema step that adds them (`MIGRATION`), the writer's part (`TokenWriter`, run by the record
store's writer thread after it inserts an exchange: which earlier turn the exchange continues, the
continuity check, the nodes, the break) and the readers' part (`session_tokens`, `load_sequence`).
Does not own: the rule and the classification (continuity.py), reading ids out of a response (the
dialects) or asking for them (proxy/token_recorder.py), the rest of the schema and the writer thread
(store.py).

Ids are stored so that a long session costs about its final length in ids, not the sum of its turns.
A node is `(prev, take, ids)`: the first `take` ids of node `prev`'s sequence, then `ids` (packed as
little-endian uint32, compressed). A turn's prompt is a node whose `prev` is the sequence (prompt +
completion) of the turn it continues and `take` the ids they share; its sequence is a node adding the
completion to the prompt. Nodes are content-addressed (a 128-bit BLAKE2b of prev, take and ids), so
the samples of a GRPO group that open with the same prompt store it once.

    writer = TokenWriter()                       # the store's writer thread owns one
    ids = recorded_ids(exchange, dialect, request, response)
    writer.write(conn, exchange, ids, dialect, request, response)
    [turn["drift"] for turn in session_tokens(conn, "s-3f2a")]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
import zlib
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeltap.dialects.roles import AsChat, ReturnsTokenIds
from modeltap.dialects.token_ids import TokenIds, common_prefix
from modeltap.records.continuity import (
    Break,
    ContinuedTurn,
    break_position,
    classify,
    describe,
    digest,
    message_digests,
    shared_messages,
    window,
)
from modeltap.records.jsontext import safe_text

if TYPE_CHECKING:
    import sqlite3

    from modeltap.dialects.roles import Dialect
    from modeltap.records.exchange import Exchange

log = logging.getLogger(__name__)

# One schema step of its own (store.py appends it to MIGRATIONS): the nodes, a row per exchange that
# has ids or was asked for them, and the session's first break as a running aggregate, so that
# `sessions` reads it without looking at a single exchange.
MIGRATION = """
CREATE TABLE token_nodes (hash TEXT PRIMARY KEY, prev TEXT, take INTEGER NOT NULL, ids BLOB NOT NULL)
    WITHOUT ROWID;
CREATE TABLE exchange_tokens (
    exchange_id TEXT PRIMARY KEY,
    session_id TEXT,
    source TEXT,
    ask TEXT,
    prompt_node TEXT,
    sequence_node TEXT,
    prompt_length INTEGER,
    completion_length INTEGER,
    logprobs BLOB,
    continues TEXT,
    shared INTEGER,
    drift TEXT
);
CREATE INDEX exchange_tokens_session ON exchange_tokens (session_id);
ALTER TABLE sessions ADD COLUMN token_drift TEXT
"""
# The second step (store.py appends it after MIGRATION): the policy version the engine reports for a
# completion, the request's sampling seed, and for rendered ids the mask of those the reply's own
# text encodes to (one byte per completion id, 0 or 1).
SAMPLING_MIGRATION = """
ALTER TABLE exchange_tokens ADD COLUMN weight_version TEXT;
ALTER TABLE exchange_tokens ADD COLUMN seed INTEGER;
ALTER TABLE exchange_tokens ADD COLUMN mask BLOB
"""
# Rebuilt sequences kept in memory by id count: 8M uint32 ids are 32 MB, the last turns of a few
# hundred long sessions; the writer rebuilds one from its nodes when it was evicted.
SEQUENCE_CACHE_IDS = 8_000_000
# Sessions whose recent turns the writer remembers, and how many turns each. A turn continues one of
# its session's recent turns (agents interleave side requests: a title, a compaction); a session idle
# while more than TRACKED_SESSIONS others were active starts its next turn as a new stretch.
TRACKED_SESSIONS = 1024
TRACKED_TURNS = 8
# zlib's fastest level: 20k Qwen3 ids of code and prose compress to 25.9 KB in 1.1 ms at level 1,
# against 22.0 KB in 9.0 ms at the default level 6, on the writer thread that every exchange waits for.
COMPRESSION_LEVEL = 1
# Node hashes known to be stored, so an unchanged node is not re-inserted.
KNOWN_NODES_MAX = 65536

Decoder = Callable[[list[int]], list[str]]


@dataclass(frozen=True, slots=True)
class _Chat:
    """One exchange as OpenAI chat (its dialect's `conversation`): history, digests, tools, reply."""

    history: list[Any]
    turn: ContinuedTurn


@dataclass(slots=True)
class _Tracked:
    """A recent turn the writer remembers, for the turns that may continue it."""

    exchange_id: str
    endpoint: str | None
    sequence_node: str
    prompt_length: int
    completion_length: int
    chat: ContinuedTurn | None
    parent: _Tracked | None


class TokenWriter:
    """The writer thread's token state. `decoder`, when set (the proxy's tokenizer), turns the ids
    around a break into text for the record; `turn_ends` (the served tokenizer's end-of-turn and stop
    ids) are the ids a completion's last may be rendered as in the next prompt (`break_position`).
    `reset` after a rolled-back transaction."""

    def __init__(self) -> None:
        self.decoder: Decoder | None = None
        self.turn_ends: frozenset[int] = frozenset()
        self._known: OrderedDict[str, None] = OrderedDict()
        self._sequences: OrderedDict[str, array[int]] = OrderedDict()
        self._cached_ids = 0
        self._sessions: OrderedDict[str, deque[_Tracked]] = OrderedDict()

    def reset(self) -> None:
        """Forget everything that may refer to rows a rollback removed."""
        self._known.clear()
        self._sequences.clear()
        self._cached_ids = 0
        self._sessions.clear()

    def write(
        self,
        conn: sqlite3.Connection,
        ex: Exchange,
        ids: TokenIds | None,
        dialect: Dialect,
        request: Any,
        response: Any,
    ) -> None:
        """Record `ids` (those of `recorded_ids`), checked against the turn `ex` continues; or, when
        modeltap asked for ids of a successful exchange and none came, that it asked."""
        if ids is None:
            if ex.token_ask is not None and ex.status == 200:
                conn.execute(
                    "INSERT INTO exchange_tokens (exchange_id, session_id, ask) VALUES (?, ?, ?)",
                    (ex.id, ex.session_id, ex.token_ask),
                )
            return
        self._write_ids(conn, ex, ids, _chat(dialect, request, response), _seed(request))

    def _write_ids(
        self, conn: sqlite3.Connection, ex: Exchange, ids: TokenIds, chat: _Chat | None, seed: int | None
    ) -> None:
        prompt, completion = array("I", ids.prompt), array("I", ids.completion)
        previous = self._predecessor(ex.session_id, ex.endpoint, chat)
        shared, drift, prompt_node = 0, None, None
        if previous is not None:
            expected = self._sequence(conn, previous.sequence_node)
            shared = common_prefix(expected, prompt)
            prompt_node = self._node(conn, previous.sequence_node, shared, prompt[shared:])
            position = break_position(
                expected,
                prompt,
                shared,
                completion_length=previous.completion_length,
                turn_ends=self.turn_ends,
            )
            if position is not None:
                drift = self._drift(conn, ex, previous, expected, prompt, position, chat, ids.source)
        if prompt_node is None:
            prompt_node = self._node(conn, None, 0, prompt)
        sequence_node = self._node(conn, prompt_node, len(prompt), completion)
        self._cache(sequence_node, prompt + completion)
        conn.execute(
            """INSERT INTO exchange_tokens (exchange_id, session_id, source, ask, prompt_node, sequence_node,
               prompt_length, completion_length, logprobs, continues, shared, drift, weight_version, seed,
               mask)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                ex.id,
                ex.session_id,
                ids.source,
                ex.token_ask,
                prompt_node,
                sequence_node,
                len(prompt),
                len(completion),
                pack_logprobs(ids.logprobs),
                previous.exchange_id if previous is not None else None,
                shared if previous is not None else None,
                json.dumps(drift) if drift is not None else None,
                safe_text(ids.weight_version),
                seed,
                bytes(ids.mask) if ids.mask is not None else None,
            ),
        )
        if drift is not None:
            conn.execute(
                "UPDATE sessions SET token_drift = ? WHERE id = ? AND token_drift IS NULL",
                (json.dumps(drift), ex.session_id),
            )
        turn = chat.turn if chat is not None else None
        tracked = _Tracked(ex.id, ex.endpoint, sequence_node, len(prompt), len(completion), turn, previous)
        self._track(ex.session_id, tracked)

    def _predecessor(self, session: str | None, endpoint: str | None, chat: _Chat | None) -> _Tracked | None:
        """The recent turn this one continues: of those of its session and format, the one whose
        conversation (history, then reply) this history shares most leading messages with, the most
        recent on a tie; none when it shares none (a side request, a new conversation). A turn whose
        history equals a recent turn's (a retry, a regenerated answer) continues what that one did.
        A format without a conversation (legacy completions) continues its session's last turn."""
        recent = self._sessions.get(session) if session is not None else None
        if not recent:
            return None
        candidates = [t for t in reversed(recent) if t.endpoint == endpoint]
        if chat is None:
            return next((t for t in candidates if t.chat is None), None)
        best, most = None, 0
        for tracked in candidates:
            if tracked.chat is None:
                continue
            if tracked.chat.digests == chat.turn.digests and tracked.chat.tools == chat.turn.tools:
                return tracked.parent
            conversation = tracked.chat.digests + digest(tracked.chat.reply)
            shared = shared_messages(conversation, chat.turn.digests)
            if shared > most:
                best, most = tracked, shared
        return best

    def _drift(
        self,
        conn: sqlite3.Connection,
        ex: Exchange,
        previous: _Tracked,
        expected: array[int],
        prompt: array[int],
        position: int,
        chat: _Chat | None,
        source: str,
    ) -> dict[str, Any]:
        """The break, as the record keeps it: where, in which message, why, and the ids around it."""
        if chat is not None and previous.chat is not None:
            found = classify(
                previous.chat,
                chat.history,
                chat.turn.digests,
                chat.turn.tools,
                position,
                previous.prompt_length,
            )
        else:
            found = Break("message_edited" if position < previous.prompt_length else "rerendered")
        expected_start, expected_ids = window(expected, position)
        got_start, got_ids = window(prompt, position)
        return {
            "turn": _turn_number(conn, ex.session_id, ex.id),
            "exchange_id": ex.id,
            "continues_turn": _turn_number(conn, ex.session_id, previous.exchange_id),
            "continues": previous.exchange_id,
            "position": position,
            "expected_length": len(expected),
            "prompt_length": len(prompt),
            "previous_prompt_length": previous.prompt_length,
            "kind": found.kind,
            "message": found.message,
            "role": found.role,
            "text": describe(found),
            "source": source,
            "expected": {"start": expected_start, "ids": expected_ids, "text": self._decode(expected_ids)},
            "got": {"start": got_start, "ids": got_ids, "text": self._decode(got_ids)},
            "changes": [dataclasses.asdict(change) for change in found.changes],
        }

    def _decode(self, ids: list[int]) -> list[str] | None:
        if self.decoder is None:
            return None
        try:
            return self.decoder(ids)
        except (ValueError, TypeError, OverflowError) as exc:
            log.debug("token ids not decoded: %s", exc)
            return None

    def _node(self, conn: sqlite3.Connection, prev: str | None, take: int, ids: Sequence[int]) -> str:
        packed = pack_ids(ids)
        key = f"{prev or ''}|{take}|".encode() + packed
        node = hashlib.blake2b(key, digest_size=16).hexdigest()
        if node in self._known:
            self._known.move_to_end(node)
            return node
        conn.execute(
            "INSERT OR IGNORE INTO token_nodes (hash, prev, take, ids) VALUES (?, ?, ?, ?)",
            (node, prev, take, zlib.compress(packed, COMPRESSION_LEVEL)),
        )
        self._known[node] = None
        if len(self._known) > KNOWN_NODES_MAX:
            self._known.popitem(last=False)
        return node

    def _sequence(self, conn: sqlite3.Connection, node: str) -> array[int]:
        cached = self._sequences.get(node)
        if cached is not None:
            self._sequences.move_to_end(node)
            return cached
        sequence = load_sequence(conn, node, self._sequences.get)
        self._cache(node, sequence)
        return sequence

    def _cache(self, node: str, sequence: array[int]) -> None:
        if node in self._sequences:
            return
        self._sequences[node] = sequence
        self._cached_ids += len(sequence)
        while self._cached_ids > SEQUENCE_CACHE_IDS and len(self._sequences) > 1:
            _, evicted = self._sequences.popitem(last=False)
            self._cached_ids -= len(evicted)

    def _track(self, session: str | None, tracked: _Tracked) -> None:
        if session is None:
            return
        recent = self._sessions.setdefault(session, deque(maxlen=TRACKED_TURNS))
        recent.append(tracked)
        self._sessions.move_to_end(session)
        if len(self._sessions) > TRACKED_SESSIONS:
            self._sessions.popitem(last=False)


def recorded_ids(ex: Exchange, dialect: Dialect, request: Any, response: Any) -> TokenIds | None:
    """The ids to record for `ex`: those modeltap rendered, else those its successful response
    carries (the writer stores the response without them: `dialects.token_ids.without_ids`)."""
    if ex.token_ids is not None:
        return ex.token_ids
    if not isinstance(dialect, ReturnsTokenIds) or ex.status != 200 or ex.error_class is not None:
        return None
    return dialect.token_ids(request, response)


def _seed(request: Any) -> int | None:
    """The request's sampling seed, when it is an integer SQLite holds (a signed 64-bit one)."""
    seed = request.get("seed") if isinstance(request, dict) else None
    if isinstance(seed, int) and not isinstance(seed, bool) and -(2**63) <= seed < 2**63:
        return seed
    return None


def _chat(dialect: Dialect, request: Any, response: Any) -> _Chat | None:
    """The exchange as OpenAI chat, or None for a format without a conversation."""
    if not isinstance(dialect, AsChat) or not isinstance(request, dict) or not isinstance(response, dict):
        return None
    try:
        conversation = dialect.conversation(request, response)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a body too odd to be a conversation
        log.debug("no conversation to classify a break with: %s", exc)
        return None
    if conversation is None or not conversation.messages:
        return None
    history, reply = conversation.messages[:-1], conversation.messages[-1]
    turn = ContinuedTurn(
        message_digests(history), digest(conversation.tools), reply if isinstance(reply, dict) else {}
    )
    return _Chat(history, turn)


def _turn_number(conn: sqlite3.Connection, session: str | None, exchange_id: str) -> int | None:
    """The exchange's turn number in its session (recording order, from 1), as `show` numbers it."""
    row = conn.execute(
        """SELECT COUNT(*) FROM exchanges WHERE session_id IS ? AND seq <=
           (SELECT seq FROM exchanges WHERE id = ?)""",
        (session, exchange_id),
    ).fetchone()
    return int(row[0]) if row and row[0] else None


# -- packing -------------------------------------------------------------------------------------


def pack_ids(ids: Sequence[int]) -> bytes:
    """Ids as little-endian uint32 bytes."""
    packed = ids if isinstance(ids, array) and ids.typecode == "I" else array("I", ids)
    if sys.byteorder == "big":
        packed = array("I", packed)
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(data: bytes) -> array[int]:
    ids = array("I")
    ids.frombytes(data)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids


def pack_logprobs(logprobs: list[float | None] | None) -> bytes | None:
    """Logprobs as compressed little-endian float32 (NaN where the server gave none), or None."""
    if logprobs is None:
        return None
    values = array("f", (float("nan") if value is None else value for value in logprobs))
    if sys.byteorder == "big":
        values.byteswap()
    return zlib.compress(values.tobytes(), COMPRESSION_LEVEL)


def unpack_logprobs(data: bytes | None) -> list[float | None] | None:
    if data is None:
        return None
    values = array("f")
    values.frombytes(zlib.decompress(data))
    if sys.byteorder == "big":
        values.byteswap()
    return [None if value != value else value for value in values]


# -- reading -------------------------------------------------------------------------------------


def load_sequence(
    conn: sqlite3.Connection, node: str, cached: Callable[[str], array[int] | None] = lambda _: None
) -> array[int]:
    """The ids node `node` stands for, rebuilt from its chain (stopping at a sequence `cached` has)."""
    chain: list[tuple[int, bytes]] = []
    current: str | None = node
    base: array[int] = array("I")
    while current is not None:
        known = cached(current)
        if known is not None:
            base = known
            break
        row = conn.execute("SELECT prev, take, ids FROM token_nodes WHERE hash = ?", (current,)).fetchone()
        if row is None:
            raise RuntimeError(f"the records database is missing token node {current}")
        chain.append((row[1], row[2]))
        current = row[0]
    sequence = array("I", base)
    for take, data in reversed(chain):
        del sequence[take:]
        sequence.extend(unpack_ids(zlib.decompress(data)))
    return sequence


def node_ids(conn: sqlite3.Connection, node: str) -> array[int]:
    """The ids node `node` adds after what it takes of its `prev` (a sequence node: the completion)."""
    row = conn.execute("SELECT ids FROM token_nodes WHERE hash = ?", (node,)).fetchone()
    if row is None:
        raise RuntimeError(f"the records database is missing token node {node}")
    return unpack_ids(zlib.decompress(row[0]))


def session_tokens(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The token rows of a session's exchanges, in recording order, each with its `turn` number, the
    exchange's finish reason, and the completion's `mask` (rendered ids: 1 where the reply's own text
    encodes, else None)."""
    rows = conn.execute(
        """SELECT e.id AS exchange_id, e.seq AS seq, e.finish_reason, t.source, t.ask, t.prompt_node,
                  t.sequence_node, t.prompt_length, t.completion_length, t.logprobs, t.continues, t.shared,
                  t.drift, t.weight_version, t.seed, t.mask
           FROM exchanges e LEFT JOIN exchange_tokens t ON t.exchange_id = e.id
           WHERE e.session_id = ? ORDER BY e.seq""",
        (session_id,),
    ).fetchall()
    out = []
    for number, row in enumerate(rows, 1):
        if row["ask"] is None and row["source"] is None:
            continue
        item = {key: row[key] for key in row.keys() if key not in ("logprobs", "drift", "mask")}
        item["turn"] = number
        item["drift"] = json.loads(row["drift"]) if row["drift"] else None
        item["logprobs"] = row["logprobs"]
        item["mask"] = list(row["mask"]) if row["mask"] is not None else None
        out.append(item)
    return out


def drop_unreachable(conn: sqlite3.Connection) -> int:
    """Delete the nodes that no remaining exchange's ids reach (after a prune deleted sessions' token
    rows), in one transaction; return the stored bytes freed. Nodes are shared along `prev` chains
    across sessions, so this walks from every live row rather than from the pruned ones: one pass over
    the token tables, as a prune is run by hand, not per exchange."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        freed = conn.execute(
            """WITH RECURSIVE live(hash) AS (
                   SELECT prompt_node FROM exchange_tokens WHERE prompt_node IS NOT NULL
                   UNION SELECT sequence_node FROM exchange_tokens WHERE sequence_node IS NOT NULL
                   UNION SELECT n.prev FROM token_nodes n JOIN live ON n.hash = live.hash
                         WHERE n.prev IS NOT NULL
               )
               DELETE FROM token_nodes WHERE hash NOT IN (SELECT hash FROM live)
               RETURNING LENGTH(ids)"""
        ).fetchall()
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return sum(size for (size,) in freed)


def token_bytes(conn: sqlite3.Connection) -> int:
    """Stored bytes of token nodes and logprobs (compressed), for storage reports."""
    nodes = conn.execute("SELECT COALESCE(SUM(LENGTH(ids)), 0) FROM token_nodes").fetchone()[0]
    logprobs = conn.execute("SELECT COALESCE(SUM(LENGTH(logprobs)), 0) FROM exchange_tokens").fetchone()[0]
    return int(nodes) + int(logprobs)
