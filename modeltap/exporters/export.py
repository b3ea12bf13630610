"""`modeltap export`: a recorded session in the formats other tools read.

Owns: the command's formats and writing one session in one of them: HAR 1.2 (har.py), JSON lines
(jsonl.py), chat messages for SFT (messages.py), token lines for RL trainers (modeltap's own in
tokens.py, verl's in verl.py, slime's in slime.py), and
OpenTelemetry spans sent to a tracing backend (otlp.py, with the `[otlp]` extra). Does not own any
format's content.

    with StoreReader(path) as reader:
        write_export(reader, "s-3f2a", "har", sys.stdout)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from modeltap.exporters.har import har
from modeltap.exporters.jsonl import jsonl
from modeltap.exporters.messages import conversation, final_exchange
from modeltap.exporters.slime import slime_line
from modeltap.exporters.tokens import line, stretches
from modeltap.exporters.verl import verl_line
from modeltap.records.jsontext import dumps, pretty
from modeltap.records.reader import StoreReader

FORMATS = ("har", "jsonl", "messages", "otlp", "slime", "tokens", "verl")
# The token formats: a session's continuous stretches, each written as one line of its trainer's shape.
_TOKEN_LINES = {"tokens": line, "verl": verl_line, "slime": slime_line}


def write_export(reader: StoreReader, session_id: str, fmt: str, out: TextIO) -> None:
    """Write session `session_id` to `out` in `fmt`: "har", "jsonl", "messages", or a token format
    ("tokens", "verl", "slime")."""
    if fmt == "har":
        out.write(pretty(har(reader, session_id)) + "\n")
    elif fmt == "jsonl":
        for line in jsonl(reader, session_id):
            out.write(line + "\n")
    elif fmt == "messages":
        out.write(dumps(conversation(reader.exchanges(session_id)), compact=False) + "\n")
    elif fmt in _TOKEN_LINES:
        with_ids = {turn["exchange_id"] for turn in reader.token_turns(session_id) if turn["source"]}
        exchanges = [ex for ex in reader.exchanges(session_id) if ex["id"] in with_ids]
        if not exchanges:
            raise ValueError(
                f"session {session_id} has no token ids: record it with `serve --tokens observe` (or exact)"
            )
        shape = _TOKEN_LINES[fmt]
        for stretch in stretches(reader, session_id, final_exchange(exchanges, "generating")["id"]):
            out.write(dumps(shape(stretch), compact=False) + "\n")
    else:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def send_otlp(sessions: Iterable[tuple[StoreReader, str]], endpoint: str, *, content: bool) -> int:
    """Send the exchanges of the sessions (each named with the store it is in) to an OTLP/HTTP traces
    `endpoint` as spans with their original times, a session at a time; returns how many were sent."""
    try:
        from modeltap.exporters.otlp import backfill  # the optional extra, loaded only when asked for
    except ImportError as exc:
        raise ValueError(str(exc)) from exc
    rows = (row for reader, session_id in sessions for row in reader.exchanges(session_id))
    return backfill(rows, endpoint, content=content)
