"""The small pieces of text every terminal view of the records shares: aligned columns, clock times,
numbers that may be missing, text shortened to a width, and recorded text made safe for a terminal.

Owns: those spellings, so `sessions`, `groups`, `show`, `tail` and `diff` print alike, and
`printable`, through which every reader's text passes on its way to a terminal. Does not own: what
any view prints (show.py, sessions.py, diff.py).

    print(columns([("SESSION", "TURNS"), ("s-1", num(3))]))
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

# What a terminal obeys rather than shows: the C0 controls (ESC starts OSC 52, which writes the
# clipboard, and OSC 0, the window title; CR overwrites a line; BEL rings), DEL, and the C1 controls
# (U+0080-U+009F; U+009D is OSC in one character, which terminals that decode C1 obey). Recorded text
# is an agent's, a model's or a tool's: whatever it holds is shown as its escape, `\x1b`, instead.
# Newline and tab are kept where a reader writes multi-line text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROLS_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f]")


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


def printable(text: str, *, lines: bool = True) -> str:
    """`text` with every control character a terminal would obey written as its escape (`\\x1b`),
    newline and tab kept when it is multi-line text (`lines`), so what a recording holds can never
    set the clipboard or the title, move the cursor or ring the bell of the terminal that shows it.

    >>> printable("hi\\x1b]52;c;cHduZWQ=\\x07 there\\n")
    'hi\\\\x1b]52;c;cHduZWQ=\\\\x07 there\\n'
    """
    pattern = _CONTROLS if lines else _CONTROLS_ONE_LINE
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
