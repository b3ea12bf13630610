"""The small pieces of text every terminal view of the records shares: aligned columns, clock times,
numbers that may be missing, text shortened to a width.

Owns: those four spellings, so `sessions`, `groups`, `show`, `tail` and `diff` print alike. Does not
own: what any view prints (show.py, sessions.py, diff.py).

    print(columns([("SESSION", "TURNS"), ("s-1", num(3))]))
"""

from __future__ import annotations

import time
from collections.abc import Sequence


def columns(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows of cells, each column as wide as its widest cell, two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def when(ts: float | None) -> str:
    """A Unix time as the local clock time, or `-`."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def num(value: int | None) -> str:
    return "-" if value is None else str(value)


def short(text: str, limit: int = 40) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
