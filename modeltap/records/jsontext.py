"""Values the records database can always store: JSON, text and count columns whatever a request or
an answer held.

Owns: compact JSON that UTF-8 can always encode, and text column values likewise (a lone surrogate
kept as its JSON escape); count column values SQLite's 64-bit integers hold, sums included (`count`);
and JSON indented for a person (`pretty`). Does not own: where they are stored (sql_writer.py,
rollups.py, token_store.py).

    dumps({"content": "\\ud83d"})      # '{"content":"\\\\ud83d"}': lossless, and json.loads reads it back
"""

from __future__ import annotations

import json
import re
from typing import Any


def dumps(value: Any, *, compact: bool = True) -> str:
    """JSON that UTF-8 can always encode (compact, or with json's default spacing for a line people
    read): text as it is, unless it holds a lone surrogate (a JavaScript agent cutting an emoji in
    half, a header byte that is not UTF-8), which is then kept as its `\\uXXXX` escape: lossless, and
    still what `json.loads` reads back."""
    separators = (",", ":") if compact else None
    text = json.dumps(value, ensure_ascii=False, separators=separators)
    if text.isascii() or _encodes(text):
        return text
    return json.dumps(value, ensure_ascii=True, separators=separators)


def safe_text(value: str | None) -> str | None:
    """A text column's value that UTF-8 can encode: itself, or its JSON escape when it holds a lone
    surrogate (see dumps)."""
    if value is None or value.isascii() or _encodes(value):
        return value
    return json.dumps(value)[1:-1]


# The largest count a column takes. No prompt or completion has 2**32 tokens; and below it, any sum of
# counts a reader or a rollup makes (a session's, a label group's) stays within SQLite's 64-bit
# integers, which refuse a larger value (a bound Python int) or fail the whole query (SUM).
COUNT_MAX = 2**32 - 1


def count(value: int | None) -> int | None:
    """A count column's value: `value` when it is a count (0 to COUNT_MAX), else None. The body the
    count was read from is stored as it came, so nothing is lost to an upstream's `2**64`."""
    return value if value is not None and 0 <= value <= COUNT_MAX else None


def _encodes(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# What JSON leaves as it is that a terminal obeys: DEL and the C1 controls (json escapes C0 itself).
_JSON_UNESCAPED_CONTROLS = re.compile("[\x7f-\x9f]")


def for_terminal(text: str) -> str:
    """JSON text with DEL and the C1 controls written as `\\u` escapes, as it already writes C0: the
    same JSON value, which a terminal shows instead of obeying (they occur only inside strings)."""
    return _JSON_UNESCAPED_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def pretty(value: Any) -> str:
    """`value` as indented JSON, for a person. Indenting recurses in Python, a few frames a level, so a
        body nested hundreds deep (the proxy accepts what its JSON parser does) comes out compact instead,
        which the C encoder writes as deep as the parser read. UTF-8 can encode it (see dumps), and no
    control character is left unescaped (for_terminal)."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False)
    except RecursionError:
        return for_terminal(dumps(value, compact=False))
    return for_terminal(text) if text.isascii() or _encodes(text) else json.dumps(value, indent=2)
