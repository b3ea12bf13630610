"""`modeltap tail`: following one or several records databases while `serve` writes them.

Owns: waiting for each database to appear (so `tail` may start before `serve`) and for the session
asked for to begin (each said once on stderr), printing each one's last exchanges, then each new one
as it is recorded, numbered within its session, named with its store when there are several. What
it reads follows what it prints: the last few rows, then the rows after the last one seen, and one
count per session it meets. Does not own: a row as a turn (records/turns.py) or a line (show.py),
reading (records/reader.py).

    follow(["node1/records.db", "node2/records.db"], session="s-3f", stop=threading.Event())
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from modeltap.readers.show import tail_line
from modeltap.records.jsontext import dumps, for_terminal
from modeltap.records.reader import StoreReader, StoreUnreadable
from modeltap.records.schema import SCHEMA_VERSION, connect
from modeltap.records.turns import turn_record

# How often `tail` looks for new exchanges: fast enough to feel live, and a poll of an idle WAL
# database costs one indexed query.
TAIL_POLL_S = 0.5
# How many recorded exchanges `tail` prints before following, as `tail` prints 10 lines.
TAIL_HISTORY = 10


@dataclass
class _Followed:
    """One database being followed: its reader once it exists, and where printing got to."""

    path: Path
    name: str | None
    reader: StoreReader | None = None
    session: str | None = None
    # The id (or first characters) asked for, while no session of this store has it yet.
    awaited: str | None = None
    last_seq: int = 0
    numbers: dict[str, int] = field(default_factory=dict)
    said_waiting: bool = False
    said_awaiting: bool = False
    refused: bool = False


def follow(
    paths: Path | str | Sequence[Path | str],
    *,
    session: str | None = None,
    history: int = TAIL_HISTORY,
    as_json: bool = False,
    out: TextIO = sys.stdout,
    poll_s: float = TAIL_POLL_S,
    stop: threading.Event | None = None,
) -> None:
    """Print the last `history` exchanges of each database (of `session`, or of all), then each new
    one as it is recorded, until `stop` is set (or for ever). Reads through read-only connections:
    safe beside the writer."""
    stop = stop or threading.Event()
    listed = [paths] if isinstance(paths, str | Path) else list(paths)
    several = len(listed) > 1
    followed = [_Followed(Path(p), str(p) if several else None) for p in listed]
    try:
        while True:
            for one in followed:
                if one.refused:
                    continue
                if one.reader is None:
                    _open(one, session, history, as_json, out)
                elif one.awaited is not None:
                    _look_for_session(one, history, as_json, out)
                else:
                    for row in one.reader.exchanges(one.session, after_seq=one.last_seq):
                        _print(one, row, as_json, out)
            if stop.wait(poll_s):
                return
    finally:
        for one in followed:
            if one.reader is not None:
                one.reader.close()


def _open(one: _Followed, session: str | None, history: int, as_json: bool, out: TextIO) -> None:
    """Open `one` if it is ready (at the schema this modeltap reads) and print its last exchanges."""
    try:
        one.reader = StoreReader(one.path)
    except FileNotFoundError:
        if not one.said_waiting:
            print(
                f"modeltap tail: waiting for records at {one.path} (is `modeltap serve` running?)",
                file=sys.stderr,
            )
            one.said_waiting = True
        return
    except StoreUnreadable as exc:
        # Not a records database, or not one modeltap made: waiting will not change it. Alone it ends
        # the tail; among several it is skipped, said once.
        if one.name is None:
            raise
        if not one.refused:
            print(f"modeltap tail: skipped: {exc}", file=sys.stderr)
            one.refused = True
        return
    except RuntimeError:
        if one.path.exists() and _newer_schema(one.path):
            raise
        return  # being created or upgraded by `serve`: look again at the next poll
    if session is not None:
        one.awaited = session
        _look_for_session(one, history, as_json, out)
        return
    _start(one, None, history, as_json, out)


def _look_for_session(one: _Followed, history: int, as_json: bool, out: TextIO) -> None:
    """Follow the session `one` awaits once its store has it (the id, or the first characters of
    exactly one id); until then say, once, that it is waited for."""
    assert one.reader is not None and one.awaited is not None
    matches = one.reader.session_ids(one.awaited, limit=2)
    if one.awaited in matches or len(matches) == 1:
        found = one.awaited if one.awaited in matches else matches[0]
        if one.said_awaiting:
            print(f"modeltap tail: session {found} began; following it", file=sys.stderr)
        one.awaited = None
        _start(one, found, history, as_json, out)
    elif not one.said_awaiting:
        what = "names several sessions" if matches else "does not exist yet"
        print(
            f"modeltap tail: session {one.awaited} {what} in {one.path}; waiting for it",
            file=sys.stderr,
        )
        one.said_awaiting = True


def _start(one: _Followed, session: str | None, history: int, as_json: bool, out: TextIO) -> None:
    """Print the last `history` exchanges (of `session`, or of all), then follow from there."""
    assert one.reader is not None
    one.session = session
    recent = one.reader.recent(session, history) if history > 0 else []
    for row in recent:
        _print(one, row, as_json, out)
    if not recent:
        last = one.reader.recent(session, 1)
        one.last_seq = last[0]["seq"] if last else 0


def _print(one: _Followed, row: dict[str, Any], as_json: bool, out: TextIO) -> None:
    one.last_seq = row["seq"]
    session = row["session_id"]
    number = None
    if session is not None and one.reader is not None:
        known = one.numbers.get(session)
        number = known + 1 if known is not None else one.reader.turn_number(session, row["seq"])
        one.numbers[session] = number
    turn = turn_record(row, number)
    if as_json:
        line = for_terminal(dumps(turn.as_json() | ({"store": one.name} if one.name else {}), compact=False))
    else:
        line = (f"[{one.name}] " if one.name else "") + tail_line(turn)
    out.write(line + "\n")
    out.flush()


def _newer_schema(path: Path) -> bool:
    """True when the database is from a newer modeltap, which waiting will not fix (a database still
    being created by `serve` has a lower version for a moment)."""
    conn = connect(path, readonly=True)
    try:
        return bool(conn.execute("PRAGMA user_version").fetchone()[0] > SCHEMA_VERSION)
    finally:
        conn.close()
