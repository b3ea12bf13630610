"""`modeltap export --format jsonl`: a recorded session as one JSON object per exchange.

Owns: the line's fields (the stored exchange with its bodies, its turn number, the format's name and
version, the raw SSE when it was kept, the session's rollout) and their versioning. Does not own:
reading the store (records/reader.py).

    for line in jsonl(reader, "s-3f2a"):
        print(line)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from modeltap.records.jsontext import dumps
from modeltap.records.reader import StoreReader

# Each JSONL line says which format it is in; a reader checks it before trusting the fields.
JSONL_FORMAT = "modeltap.exchange"
JSONL_FORMAT_VERSION = 1


def jsonl(reader: StoreReader, session_id: str) -> Iterator[str]:
    """One JSON object per exchange, in recording order, with its bodies, turn number and format
    version; `raw_sse` is the stream's text when it was kept; `rollout` the session's reward, outcome,
    check scores, duration, exit status and log tail when it is a rollout, else null."""
    rollout = _rollout(reader.session(session_id))
    for number, ex in enumerate(reader.exchanges(session_id), 1):
        raw = reader.raw_sse(ex["id"]) if ex["streamed"] else None
        line = {"format": JSONL_FORMAT, "format_version": JSONL_FORMAT_VERSION, "turn": number, **ex}
        line["rollout"] = rollout
        line["raw_sse"] = raw.decode("utf-8", "replace") if raw is not None else None
        yield dumps(line, compact=False)


def _rollout(session: dict[str, Any] | None) -> dict[str, Any] | None:
    if session is None or session["outcome"] is None:
        return None
    return {"reward": session["reward"], "outcome": session["outcome"], **(session["rollout"] or {})}
