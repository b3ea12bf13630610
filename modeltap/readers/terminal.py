"""Text for a person at a terminal: a pager when it is taller than the screen, colour when it helps,
and never a control character that recorded text carries.

Owns: whether output goes to a person (stdout is a terminal), running `$PAGER` (default `less -FRX`,
as git does) for text taller than the terminal, ANSI colour on a session view's lines: only on a
terminal and only when `NO_COLOR` is unset or empty (https://no-color.org/), never in a pipe or in
JSON; and writing every view through `text.printable` (`emit`, `say`), so an escape sequence in a
recording (OSC 52 sets the clipboard, OSC 0 the title) is shown, never obeyed. Does not own: the text
(show.py and the other readers).

    emit(session_turns(session_id, rows))     # paged and coloured on a terminal, plain in a pipe
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from typing import TextIO

from modeltap.readers.text import printable

# What pages a view taller than the terminal: quit at once when it fits after all (-F), pass colour
# through (-R), leave the text on the screen on quitting (-X).
DEFAULT_PAGER = "less -FRX"
# Pagers that page nothing: text goes to the terminal as it is.
NO_PAGER = ("", "cat")

_RESET = "\x1b[0m"
# A line's colour by how it starts (after its indent): turn headlines bold, what the model said in
# green, its tool calls in cyan, errors and breaks in red, collapsed repeats dim.
_STYLES = (
    (re.compile(r"#\d+ |session "), "\x1b[1m"),
    (re.compile(r"\s*! "), "\x1b[31m"),
    (re.compile(r"\s*← tool call"), "\x1b[36m"),
    (re.compile(r"\s*← reply"), "\x1b[32m"),
    (re.compile(r".*, as in turn \d+$"), "\x1b[2m"),
)


def emit(text: str, out: TextIO | None = None, env: Mapping[str, str] | None = None) -> None:
    """Write `text` (and a newline) to `out`: on a terminal, coloured unless NO_COLOR says not, and
    through the pager when it is taller than the terminal; elsewhere as it is."""
    out = sys.stdout if out is None else out
    env = os.environ if env is None else env
    text = printable(text)
    if not out.isatty():
        out.write(text + "\n")
        return
    shown = coloured(text) if colour_wanted(env) else text
    if _rows(text, out) > _size(out).lines and _page(shown, env):
        return
    out.write(shown + "\n")


def say(text: str, out: TextIO | None = None) -> None:
    """Write `text` (and a newline) to `out` (stdout) as it is but for the control characters a
    terminal would obey, written as their escapes (text.printable): what every reader's table goes
    out through, since its cells are recorded text (labels, ids, replies)."""
    (sys.stdout if out is None else out).write(printable(text) + "\n")


def colour_wanted(env: Mapping[str, str]) -> bool:
    """No colour when NO_COLOR is set to anything but the empty string."""
    return not env.get("NO_COLOR")


def coloured(text: str) -> str:
    """`text` with each line coloured by what it is (see _STYLES)."""
    return "\n".join(_line(line) for line in text.split("\n"))


def _line(line: str) -> str:
    for pattern, style in _STYLES:
        if pattern.match(line):
            return f"{style}{line}{_RESET}"
    return line


def _page(text: str, env: Mapping[str, str]) -> bool:
    """Show `text` in the pager, which writes to this process's terminal; False when there is no pager
    to run (the caller prints instead). Ctrl-C belongs to the pager meanwhile."""
    command = shlex.split(env.get("PAGER", DEFAULT_PAGER) or "")
    if not command or " ".join(command) in NO_PAGER:
        return False
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        subprocess.run(command, input=text + "\n", text=True, check=False, env={"LESS": "FRX", **env})
    except OSError:
        return False
    finally:
        signal.signal(signal.SIGINT, previous)
    return True


def _size(out: TextIO) -> os.terminal_size:
    try:
        return os.get_terminal_size(out.fileno())
    except (OSError, ValueError):
        return os.terminal_size((80, 24))


def _rows(text: str, out: TextIO) -> int:
    """The terminal rows `text` takes, long lines wrapped."""
    columns = max(_size(out).columns, 1)
    return sum(max(1, math.ceil(len(line) / columns)) for line in text.split("\n"))
