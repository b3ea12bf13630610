"""Running aggregates of the records: each session row's totals, and each label group's, kept by the
writer so that listing, filtering and grouping read what they print, never the whole store.

Owns: schema 3's tables and indexes (a session's totals, rollout outcome and revision;
`session_labels`; `label_groups` and `label_outcomes`), their backfill from an older store, the
writer's `Tally` (what one transaction adds, applied once per session and group before it commits),
and moving a session's totals into or out of its groups (a relabel, a prune). Does not own: the
writer thread, the exchange rows or the blobs (store.py), the queries that read these tables
(query.py), deleting sessions (prune.py).

A session's `rev` is the store's revision counter at its last change, so a reader that polls asks only
for `rev > last seen` (the viewer's live update). The counter lives in the store (`revision`, one row),
read at the start of each write transaction and written back before it commits: several writers of
one store (a second `serve`, `replay`, the demo) take turns at SQLite's write lock, so each continues
where the last one stopped and no two changes share a revision; a pruned session takes none back.
Every function here runs on a connection the caller holds inside a transaction: the writer thread's,
or prune's.

    tally = rollups.tally(conn)
    tally.exchange("s-1", labels, started=..., ended=..., model="m", prompt=12, completion=3, error=False)
    tally.flush()                      # then COMMIT
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modeltap.records.exchange import RolloutOutcome
from modeltap.records.jsontext import dumps, safe_text
from modeltap.records.sql import statements

if TYPE_CHECKING:
    from sqlite3 import Connection

# Sessions whose labels the writer remembers (a session's groups are looked up on each of its
# exchanges); beyond this many the oldest is read back from `session_labels` when it writes again.
KNOWN_SESSIONS_MAX = 16384

SCHEMA_3 = """
ALTER TABLE sessions ADD COLUMN exchanges INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN first REAL;
ALTER TABLE sessions ADD COLUMN last REAL;
ALTER TABLE sessions ADD COLUMN prompt_tokens INTEGER;
ALTER TABLE sessions ADD COLUMN completion_tokens INTEGER;
ALTER TABLE sessions ADD COLUMN errors INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN model TEXT;
ALTER TABLE sessions ADD COLUMN reward REAL;
ALTER TABLE sessions ADD COLUMN outcome TEXT;
ALTER TABLE sessions ADD COLUMN rollout TEXT;
ALTER TABLE sessions ADD COLUMN rev INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sessions_created ON sessions (created);
CREATE INDEX sessions_outcome ON sessions (outcome, created);
CREATE INDEX sessions_reward ON sessions (reward, created);
CREATE INDEX sessions_errors ON sessions (created) WHERE errors > 0;
CREATE INDEX sessions_active ON sessions (COALESCE(last, created));
CREATE INDEX sessions_rev ON sessions (rev);
CREATE TABLE session_labels (
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
CREATE INDEX session_labels_pair ON session_labels (key, value, created);
CREATE INDEX session_labels_value ON session_labels (value);
CREATE TABLE label_groups (
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    sessions INTEGER NOT NULL DEFAULT 0,
    exchanges INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    rewarded INTEGER NOT NULL DEFAULT 0,
    reward_sum REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (key, value)
) WITHOUT ROWID;
CREATE TABLE label_outcomes (
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    outcome TEXT NOT NULL,
    sessions INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (key, value, outcome)
) WITHOUT ROWID
"""

# Schemas 1 and 2 kept no totals: one pass over its exchanges (once, at the upgrade) fills them in.
_BACKFILL = """
UPDATE sessions SET (exchanges, first, last, prompt_tokens, completion_tokens, errors) = (
    SELECT COUNT(*), MIN(started), MAX(COALESCE(ended, started)), SUM(prompt_tokens),
           SUM(completion_tokens), COALESCE(SUM(error_class IS NOT NULL), 0)
    FROM exchanges e WHERE e.session_id = sessions.id);
UPDATE sessions SET model = (
    SELECT model FROM exchanges e WHERE e.session_id = sessions.id AND model IS NOT NULL
    ORDER BY seq DESC LIMIT 1);
INSERT INTO session_labels (session_id, key, value, created)
    SELECT s.id, j.key, CAST(j.value AS TEXT), s.created FROM sessions s, json_each(s.labels) j
    WHERE json_valid(s.labels) AND json_type(s.labels) = 'object';
INSERT INTO label_groups (key, value, sessions, exchanges, prompt_tokens, completion_tokens, errors)
    SELECT l.key, l.value, COUNT(*), SUM(s.exchanges), COALESCE(SUM(s.prompt_tokens), 0),
           COALESCE(SUM(s.completion_tokens), 0), SUM(s.errors)
    FROM session_labels l JOIN sessions s ON s.id = l.session_id GROUP BY l.key, l.value
"""


# A later schema step: the revision counter as a row of the store, so that writers in several processes
# share it (before, each continued from the sessions' highest `rev` once, at its start, and two writers
# handed out the same revisions: the viewer's live update missed changes).
REVISION_MIGRATION = """
CREATE TABLE revision (id INTEGER PRIMARY KEY CHECK (id = 0), rev INTEGER NOT NULL);
INSERT INTO revision (id, rev) SELECT 0, COALESCE(MAX(rev), 0) FROM sessions
"""


def revision(conn: Connection) -> int:
    """The store's revision counter: every change so far has a revision at most this."""
    return int(conn.execute("SELECT rev FROM revision").fetchone()[0])


def upgrade(conn: Connection) -> None:
    """Schema 2 -> 3: add the tables and columns, and fill them from what is stored."""
    for script in (SCHEMA_3, _BACKFILL):
        for statement in statements(script):
            conn.execute(statement)


@dataclass(slots=True)
class _Delta:
    """What one transaction adds to one session's totals."""

    exchanges: int = 0
    first: float | None = None
    last: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    errors: int = 0
    model: str | None = None


@dataclass(slots=True)
class Totals:
    """A session's share of its groups: what moves when it is relabelled or pruned."""

    exchanges: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    reward: float | None = None
    outcome: str | None = None
    sessions: int = 1


class Rollups:
    """The writer's side of the aggregates: the revision counter of the transaction under way and the
    sessions it knows exist."""

    def __init__(self) -> None:
        self.rev = 0
        self._labels: OrderedDict[str, dict[str, str]] = OrderedDict()

    def forget(self) -> None:
        """Drop what is remembered of the rows: a rollback undid it, or another process (prune)
        changed them."""
        self._labels.clear()

    def tally(self, conn: Connection) -> Tally:
        """A tally for one write transaction on `conn` (begun): it continues the store's revision
        counter as the transaction finds it, and `flush` writes the counter back."""
        self.rev = revision(conn)
        return Tally(self, conn, self.rev)

    def next_rev(self) -> int:
        self.rev += 1
        return self.rev

    def known(self, session_id: str) -> dict[str, str] | None:
        labels = self._labels.get(session_id)
        if labels is not None:
            self._labels.move_to_end(session_id)
        return labels

    def remember(self, session_id: str, labels: dict[str, str]) -> None:
        self._labels[session_id] = labels
        self._labels.move_to_end(session_id)
        if len(self._labels) > KNOWN_SESSIONS_MAX:
            self._labels.popitem(last=False)


@dataclass(slots=True)
class Tally:
    """What one write transaction changes in the aggregates. Rows are created at once; totals are
    added up in memory and applied by `flush`, one UPDATE per session and one per group, with the
    revision counter (`_rev`: as the store holds it)."""

    rollups: Rollups
    conn: Connection
    _rev: int
    _deltas: dict[str, _Delta] = field(default_factory=dict)

    def session(
        self,
        session_id: str,
        created: float,
        labels: Mapping[str, str],
        upstream: str | None = None,
        *,
        opened: bool = False,
    ) -> None:
        """Make sure the session has its row. `opened` (a session opening): its labels and upstream
        are the session's own, and replace what an earlier row said."""
        stored = dumps(dict(labels))
        labels = _pairs(labels)
        known = self.rollups.known(session_id)
        if known is not None and not opened:
            return
        if known is None:
            inserted = self.conn.execute(
                """INSERT INTO sessions (id, created, labels, upstream, rev) VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (id) DO NOTHING""",
                (session_id, created, stored, upstream, self.rollups.next_rev()),
            ).rowcount
            if inserted:
                _insert_labels(self.conn, session_id, labels, created)
                add_to_groups(self.conn, labels, Totals())
                self.rollups.remember(session_id, labels)
                return
            known = stored_labels(self.conn, session_id)
        if opened:
            self.conn.execute(
                "UPDATE sessions SET upstream = ?, rev = ? WHERE id = ?",
                (upstream, self.rollups.next_rev(), session_id),
            )
            if known != labels:
                self.relabel(session_id, known, labels, stored)
                known = labels
        self.rollups.remember(session_id, known)

    def relabel(self, session_id: str, old: Mapping[str, str], new: Mapping[str, str], stored: str) -> None:
        """Move the session's totals from the groups of `old` to those of `new` (`stored`: the new
        labels as the session row keeps them)."""
        self.flush()
        totals = session_totals(self.conn, session_id)
        if totals is None:
            return
        add_to_groups(self.conn, old, totals, sign=-1)
        self.conn.execute("DELETE FROM session_labels WHERE session_id = ?", (session_id,))
        created = self.conn.execute("SELECT created FROM sessions WHERE id = ?", (session_id,)).fetchone()[0]
        _insert_labels(self.conn, session_id, new, created)
        self.conn.execute("UPDATE sessions SET labels = ? WHERE id = ?", (stored, session_id))
        add_to_groups(self.conn, new, totals)

    def exchange(
        self,
        session_id: str,
        *,
        started: float,
        ended: float | None,
        model: str | None,
        prompt: int | None,
        completion: int | None,
        error: bool,
    ) -> None:
        """Count one exchange of a session whose row exists (see `session`)."""
        delta = self._deltas.setdefault(session_id, _Delta())
        delta.exchanges += 1
        end = ended if ended is not None else started
        delta.first = started if delta.first is None else min(delta.first, started)
        delta.last = end if delta.last is None else max(delta.last, end)
        delta.prompt_tokens = _plus(delta.prompt_tokens, prompt)
        delta.completion_tokens = _plus(delta.completion_tokens, completion)
        delta.errors += error
        delta.model = model or delta.model

    def closed(self, session_id: str, at: float) -> None:
        self.conn.execute(
            "UPDATE sessions SET closed = ?, rev = ? WHERE id = ?", (at, self.rollups.next_rev(), session_id)
        )

    def outcome(self, session_id: str, outcome: RolloutOutcome) -> None:
        """Set the session's rollout outcome (replacing an earlier one in its groups' counts)."""
        labels = self._labels(session_id)
        before = session_totals(self.conn, session_id)
        if before is not None and before.outcome is not None:
            add_to_groups(self.conn, labels, _outcome_only(before.reward, before.outcome), sign=-1)
        self.conn.execute(
            "UPDATE sessions SET reward = ?, outcome = ?, rollout = ?, rev = ? WHERE id = ?",
            (
                outcome.reward,
                outcome.outcome,
                dumps(outcome.details()),
                self.rollups.next_rev(),
                session_id,
            ),
        )
        add_to_groups(self.conn, labels, _outcome_only(outcome.reward, outcome.outcome))

    def _labels(self, session_id: str) -> dict[str, str]:
        known = self.rollups.known(session_id)
        return known if known is not None else stored_labels(self.conn, session_id)

    def flush(self) -> None:
        """Apply the totals added so far: to each session row, then to each of its groups."""
        groups: dict[tuple[str, str], Totals] = {}
        for session_id, d in self._deltas.items():
            self.conn.execute(
                """UPDATE sessions SET exchanges = exchanges + ?,
                       first = MIN(COALESCE(first, ?), ?), last = MAX(COALESCE(last, ?), ?),
                       prompt_tokens = CASE WHEN ? IS NULL THEN prompt_tokens
                                       ELSE COALESCE(prompt_tokens, 0) + ? END,
                       completion_tokens = CASE WHEN ? IS NULL THEN completion_tokens
                                           ELSE COALESCE(completion_tokens, 0) + ? END,
                       errors = errors + ?, model = COALESCE(?, model), rev = ?
                   WHERE id = ?""",
                (
                    d.exchanges,
                    d.first,
                    d.first,
                    d.last,
                    d.last,
                    d.prompt_tokens,
                    d.prompt_tokens,
                    d.completion_tokens,
                    d.completion_tokens,
                    d.errors,
                    d.model,
                    self.rollups.next_rev(),
                    session_id,
                ),
            )
            for pair in self._labels(session_id).items():
                total = groups.setdefault(pair, Totals(sessions=0))
                total.exchanges += d.exchanges
                total.prompt_tokens += d.prompt_tokens or 0
                total.completion_tokens += d.completion_tokens or 0
                total.errors += d.errors
        self._deltas.clear()
        for (key, value), total in groups.items():
            _add_to_group(self.conn, key, value, total, 1)
        if self.rollups.rev != self._rev:
            self.conn.execute("UPDATE revision SET rev = ?", (self.rollups.rev,))
            self._rev = self.rollups.rev


def session_totals(conn: Connection, session_id: str) -> Totals | None:
    """The session's share of its groups, as its row says; None when it has no row."""
    row = conn.execute(
        """SELECT exchanges, COALESCE(prompt_tokens, 0), COALESCE(completion_tokens, 0), errors, reward,
                  outcome
           FROM sessions WHERE id = ?""",
        (session_id,),
    ).fetchone()
    return None if row is None else Totals(*row)


def add_to_groups(conn: Connection, labels: Mapping[str, str], totals: Totals, *, sign: int = 1) -> None:
    """Add `totals` (times `sign`) to the group of each of `labels`; a group left with no session goes."""
    for key, value in labels.items():
        _add_to_group(conn, key, value, totals, sign)
        if totals.outcome is not None:
            conn.execute(
                """INSERT INTO label_outcomes (key, value, outcome, sessions) VALUES (?, ?, ?, ?)
                   ON CONFLICT (key, value, outcome) DO UPDATE SET sessions = sessions + excluded.sessions""",
                (key, value, totals.outcome, sign),
            )
        if sign < 0:
            for table in ("label_outcomes", "label_groups"):
                sql = f"DELETE FROM {table} WHERE key = ? AND value = ? AND sessions <= 0"
                conn.execute(sql, (key, value))


def _add_to_group(conn: Connection, key: str, value: str, t: Totals, sign: int) -> None:
    rewarded = t.reward is not None
    conn.execute(
        """INSERT INTO label_groups (key, value, sessions, exchanges, prompt_tokens, completion_tokens,
                                     errors, rewarded, reward_sum)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
           ON CONFLICT (key, value) DO UPDATE SET
               sessions = sessions + excluded.sessions, exchanges = exchanges + excluded.exchanges,
               prompt_tokens = prompt_tokens + excluded.prompt_tokens,
               completion_tokens = completion_tokens + excluded.completion_tokens,
               errors = errors + excluded.errors, rewarded = rewarded + excluded.rewarded,
               reward_sum = reward_sum + excluded.reward_sum""",
        (
            key,
            value,
            sign * t.sessions,
            sign * t.exchanges,
            sign * t.prompt_tokens,
            sign * t.completion_tokens,
            sign * t.errors,
            sign * rewarded,
            sign * (t.reward or 0.0),
        ),
    )


def _outcome_only(reward: float | None, outcome: str) -> Totals:
    return Totals(reward=reward, outcome=outcome, sessions=0)


def _insert_labels(conn: Connection, session_id: str, labels: Mapping[str, str], created: float) -> None:
    conn.executemany(
        "INSERT OR REPLACE INTO session_labels (session_id, key, value, created) VALUES (?, ?, ?, ?)",
        [(session_id, key, value, created) for key, value in labels.items()],
    )


def stored_labels(conn: Connection, session_id: str) -> dict[str, str]:
    rows: Iterable[Any] = conn.execute(
        "SELECT key, value FROM session_labels WHERE session_id = ?", (session_id,)
    )
    return {key: value for key, value in rows}


def _plus(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


def _pairs(labels: Mapping[str, str]) -> dict[str, str]:
    """Labels as their text columns hold them (see modeltap.records.jsontext)."""
    return {safe_text(str(k)) or "": safe_text(str(v)) or "" for k, v in labels.items()}
