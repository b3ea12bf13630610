"""Text the records database can always store: JSON and text columns whatever a request held.

Owns: compact JSON that UTF-8 can always encode, and text column values likewise (a lone surrogate
kept as its JSON escape); and JSON indented for a person (`pretty`). Does not own: where they are
stored (store.py, rollups.py).

    dumps({"content": "\\ud83d"})      # '{"content":"\\\\ud83d"}': lossless, and json.loads reads it back
"""

from __future__ import annotations

import json
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


def pretty(value: Any) -> str:
    """`value` as indented JSON, for a person. Indenting recurses in Python, a few frames a level, so a
    body nested hundreds deep (the proxy accepts what its JSON parser does) comes out compact instead,
    which the C encoder writes as deep as the parser read. UTF-8 can encode it (see dumps)."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False)
    except RecursionError:
        return dumps(value, compact=False)
    return text if text.isascii() or _encodes(text) else json.dumps(value, indent=2)
