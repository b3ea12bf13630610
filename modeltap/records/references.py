"""Which sessions reference which blobs (`session_blobs`), and how many do (`blobs.refs`), so that
deleting sessions deletes a blob only once no session left references it: the messages two rollouts
of a task share stay with the one kept.

Owns: the table, the triggers that keep each blob's count of sessions as links come and go, the
backfill when an older store is upgraded (each stored request skeleton read once, session by
session, following its list nodes), and the owner of the blobs of exchanges that belong to no
session (never pruned). A count rather than an index of links by blob: a blob's row is where the
writer has just been (it wrote the blob, or it is a shared one that stays cached), while an index by
hash takes an insert at a random place for every link (docs/sqlite.md §6, §7). Does not own: linking
new blobs as they are written (the writer, store.py) or deleting (prune.py).

    references.upgrade(conn)        # inside the migration's transaction
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlite3 import Connection

# The owner in `session_blobs` of the blobs of exchanges that belong to no session: never pruned.
NO_SESSION = ""

SCHEMA_3 = (
    "ALTER TABLE blobs ADD COLUMN refs INTEGER NOT NULL DEFAULT 0",
    """CREATE TABLE session_blobs (
        session_id TEXT NOT NULL,
        hash TEXT NOT NULL,
        PRIMARY KEY (session_id, hash)
    ) WITHOUT ROWID""",
    """CREATE TRIGGER session_blobs_linked AFTER INSERT ON session_blobs
       BEGIN UPDATE blobs SET refs = refs + 1 WHERE hash = NEW.hash; END""",
    """CREATE TRIGGER session_blobs_unlinked AFTER DELETE ON session_blobs
       BEGIN UPDATE blobs SET refs = refs - 1 WHERE hash = OLD.hash; END""",
)


def upgrade(conn: Connection) -> None:
    """Schema 2 -> 3: create `session_blobs` and fill it (and so the counts) from what is stored."""
    for statement in SCHEMA_3:
        conn.execute(statement)
    rows = conn.execute(
        "SELECT COALESCE(session_id, ?), request, sent FROM exchanges ORDER BY session_id, seq", (NO_SESSION,)
    )
    owner: str | None = None
    seen: set[str] = set()
    for session_id, *packed in rows:
        if session_id != owner:
            owner, seen = session_id, set()
        new = [h for body in packed if body is not None for h in _references(conn, body, seen)]
        conn.executemany(
            "INSERT OR IGNORE INTO session_blobs (session_id, hash) VALUES (?, ?)", [(owner, h) for h in new]
        )


def _references(conn: Connection, packed: bytes, seen: set[str]) -> Iterator[str]:
    """The blobs a stored request skeleton references that are not in `seen` yet (added as they are
    found): its context blobs, its list nodes back to the first one seen already, and their elements."""
    doc = json.loads(zlib.decompress(packed))
    for ref in doc.get("refs", {}).values():
        node = ref["list"] if isinstance(ref, dict) else ref
        while node is not None and node not in seen:
            seen.add(node)
            yield node
            if not isinstance(ref, dict):
                break
            row = conn.execute("SELECT data FROM blobs WHERE hash = ?", (node,)).fetchone()
            listed = json.loads(zlib.decompress(row[0])) if row is not None else {"prev": None, "add": []}
            for element in listed["add"]:
                if element not in seen:
                    seen.add(element)
                    yield element
            node = listed["prev"]
