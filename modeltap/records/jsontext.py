"""Text the records database can always store: JSON and text columns whatever a request held.

Owns: compact JSON that UTF-8 can always encode, and text column values likewise (a lone surrogate
kept as its JSON escape); and JSON indented for a person (`pretty`). Does not own: where they are
stored (store.py, rollups.py).

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
