"""`modeltap grep`: a regular expression searched in what agents and models said, across sessions.

Owns: the pieces of a turn that are searched (each message the turn added, each tool call it made
with its arguments, its reply, its error), finding a pattern in them, and a hit's line (`SESSION
#TURN role: …text around the match…`) and JSON. Turns come from records/turns.py, so every wire
format is searched alike, and a message is searched in the turn that added it, not again in every
later turn that repeats the history. Does not own: which sessions (records/query.py,
records/stores.py), what a turn holds (records/turns.py).

    with Stores.open(["records.db"]) as stores:
        for hit in search(stores.selected(SessionQuery(limit=50)), re.compile("Traceback")):
            print(hit_line(hit))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from modeltap.readers.text import printable
from modeltap.records.message_text import call_text, describe_message
from modeltap.records.reader import StoreReader
from modeltap.records.turns import Turn, turns

# Characters of context a hit's line shows on each side of the match: a terminal line holds a
# match and a sentence around it.
CONTEXT_CHARS = 50
# How a terminal shows the match: bold red, as grep --color does.
_MATCH, _RESET = "\x1b[1;31m", "\x1b[0m"


def compile_pattern(pattern: str, *, ignore_case: bool = False, fixed: bool = False) -> re.Pattern[str]:
    """`pattern` as a regular expression (`fixed`: as literal text), or a ValueError naming the fault."""
    try:
        return re.compile(re.escape(pattern) if fixed else pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a regular expression: {exc} (-F: literal text)") from None


def search(
    sessions: Iterable[tuple[StoreReader, dict[str, Any]]], pattern: re.Pattern[str]
) -> Iterator[dict[str, Any]]:
    """The hits of `pattern` in `sessions` (`Stores.selected`), session by session, turn by turn: one
    per message, tool call, reply or error that matches, at its first match, with `matches` counting
    them all. Each names its `store`, `session`, `turn` and `role`."""
    for reader, session in sessions:
        rows = reader.exchanges(session["id"])
        for turn, echoed in with_echoes(turns(rows)):
            for role, text in turn_pieces(turn, echoed):
                found = list(pattern.finditer(text))
                if found:
                    yield _hit(session, turn, role, text, found)


def turn_pieces(turn: Turn, echoed: str | None = None) -> Iterator[tuple[str, str]]:
    """(role, text) of what a turn added: its new messages (less `echoed`, the reply of the turn it
    continues, which the agent echoes back and which was searched there), tool calls, reply and error."""
    for message in turn.new_messages:
        role, text = describe_message(message)
        if role == "assistant" and echoed is not None and _squeezed(text) == echoed:
            echoed = None  # once: the same words said again later are new
            continue
        yield role, text
    for call in turn.tool_calls:
        yield "tool call", call_text(call)
    if turn.reply:
        yield "reply", turn.reply
    if turn.error:
        yield "error", f"{turn.error.error_class}: {turn.error.message or ''}"


def said(turn: Turn) -> str:
    """A turn's reply and tool calls as `describe_message` renders them when the agent echoes them back
    in its next request."""
    return " ".join(p for p in [turn.reply or "", *map(call_text, turn.tool_calls)] if p)


def hit_line(hit: dict[str, Any], *, with_store: bool = False, highlight: bool = False) -> str:
    """`SESSION #TURN role: …context…`, on one line (and `[store]` first with `with_store`; the match
    in bold red with `highlight`, for a terminal)."""
    more = f"  (+{hit['matches'] - 1} more)" if hit["matches"] > 1 else ""
    where = f"[{hit['store']}] " if with_store else ""
    # Recorded text, its control characters escaped before the highlight adds ours (text.printable).
    said = printable(hit["context"], lines=False)
    match = printable(_one_line(hit["match"]).strip(), lines=False) if highlight else ""
    at = said.find(match) if match else -1
    if at >= 0:
        said = f"{said[:at]}{_MATCH}{match}{_RESET}{said[at + len(match) :]}"
    head = printable(f"{where}{hit['session']} #{hit['turn']} {hit['role']}: ", lines=False)
    return f"{head}{said}{more}"


def _hit(
    session: dict[str, Any], turn: Turn, role: str, text: str, found: list[re.Match[str]]
) -> dict[str, Any]:
    first = found[0]
    return {
        "store": session["store"],
        "session": session["id"],
        "turn": turn.number,
        "exchange_id": turn.id,
        "role": role,
        "match": first.group(),
        "start": first.start(),
        "end": first.end(),
        "matches": len(found),
        "context": context(text, first.start(), first.end()),
    }


def context(text: str, start: int, end: int, chars: int = CONTEXT_CHARS) -> str:
    """The match `text[start:end]` with up to `chars` characters either side, on one line, an ellipsis
    where the text goes on."""
    before, after = text[max(start - chars, 0) : start], text[end : end + chars]
    line = (_one_line(before) + _one_line(text[start:end]) + _one_line(after)).strip()
    return ("…" if start > chars else "") + line + ("…" if end + chars < len(text) else "")


def _one_line(text: str) -> str:
    return re.sub(r"\s", " ", text)


def with_echoes(listed: list[Turn]) -> list[tuple[Turn, str | None]]:
    """Each of `turns` with what the turn it continues said, squeezed (see `turn_pieces`), or None."""
    by_number = {turn.number: turn for turn in listed}
    out = []
    for turn in listed:
        continued = by_number.get(turn.continues) if turn.continues is not None else None
        out.append((turn, _squeezed(said(continued)) if continued is not None else None))
    return out


def _squeezed(text: str) -> str:
    """`text` without whitespace: an agent echoes tool-call arguments re-serialised, spaced its own way."""
    return "".join(text.split())
