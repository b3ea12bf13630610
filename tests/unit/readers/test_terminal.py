"""modeltap/readers/terminal.py: `show` on a real pseudo-terminal is coloured and, when taller than
the screen, paged through $PAGER; in a pipe, with NO_COLOR, or as JSON it is plain text."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from modeltap.readers.terminal import coloured, emit
from tests.factories import assistant, recorded, rollout, tool_call

REPO = Path(__file__).resolve().parents[3]
ESC = "\x1b["


def run_on_a_terminal(argv: list[str], rows: int, env: dict[str, str]) -> tuple[str, int]:
    """`python -m modeltap ARGV` with its stdout on a pseudo-terminal `rows` tall: what the terminal
    showed, and the exit status."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, 120, 0, 0))
    inherited = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "PAGER", "LESS")}
    full_env = inherited | {"PYTHONPATH": str(REPO)}  # (coverage's settings for children pass through)
    process = subprocess.Popen(
        [sys.executable, "-m", "modeltap", *argv],
        stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=full_env | env,
    )  # fmt: skip
    os.close(slave)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's last writer is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    assert process.wait(30) == 0, process.stderr.read() if process.stderr else ""
    return shown.decode().replace("\r\n", "\n"), process.returncode


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A session of 12 turns (about 40 lines in `show`)."""
    calls = [assistant(None, tool_call(f"call_{n}", "bash", '{"command": "ls"}')) for n in range(11)]
    return asyncio.run(recorded(tmp_path / "r.db", *rollout("s-long", "t1", [*calls, assistant("done")])))


def test_a_view_taller_than_the_terminal_goes_through_the_pager(store: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    pager = f"sh -c 'cat > {paged}'"
    shown, _ = run_on_a_terminal(["show", "s-long", "--store", str(store)], 10, {"PAGER": pager})
    assert shown == ""  # the pager had it all
    text = paged.read_text()
    assert text.startswith(f"{ESC}1msession s-long: 12 turn(s)")  # coloured: -R shows it
    assert f"{ESC}36m    ← tool call  → bash" in text and "#12" in text


def test_a_view_that_fits_is_printed_coloured_unless_no_color(store: Path, tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    pager = {"PAGER": f"sh -c 'cat > {paged}'"}
    shown, _ = run_on_a_terminal(["show", "s-long", "--store", str(store)], 200, pager)
    assert not paged.exists()
    assert shown.startswith(f"{ESC}1msession s-long") and f"{ESC}32m    ← reply      done{ESC}0m" in shown
    shown, _ = run_on_a_terminal(["show", "s-long", "--store", str(store)], 200, pager | {"NO_COLOR": "1"})
    assert shown.startswith("session s-long") and ESC not in shown
    shown, _ = run_on_a_terminal(["show", "s-long", "--store", str(store), "--json"], 10, pager)
    assert shown.startswith("[") and ESC not in shown and not paged.exists()  # JSON: neither


def test_in_a_pipe_the_view_is_plain(store: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "modeltap", "show", "s-long", "--store", str(store)],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "PAGER": "false", "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert run.stdout.startswith("session s-long") and ESC not in run.stdout


def test_emit_and_colour_without_a_terminal() -> None:
    out = io.StringIO()
    emit("#1 x\n    ! boom", out, {})
    assert out.getvalue() == "#1 x\n    ! boom\n"
    assert (
        coloured("#1 x\n    ! boom\n    plain") == f"{ESC}1m#1 x{ESC}0m\n{ESC}31m    ! boom{ESC}0m\n    plain"
    )


class Screen(io.StringIO):
    """A terminal as `emit` sees one: it says it is a tty and has no size (80x24 then)."""

    def isatty(self) -> bool:
        return True


def test_emit_on_a_terminal_pages_only_what_is_taller_than_it(tmp_path: Path) -> None:
    paged = tmp_path / "paged.txt"
    pager = f"sh -c 'cat > {paged}'"
    tall = "\n".join(f"#{n} line" for n in range(30))
    screen = Screen()
    emit("#1 short", screen, {"PAGER": pager})
    assert screen.getvalue() == f"{ESC}1m#1 short{ESC}0m\n" and not paged.exists()
    emit("x" * 81 * 12 + "\n" * 12, Screen(), {"PAGER": pager})  # 12 lines wrapped to 24, and 12 more
    assert paged.exists()
    paged.unlink()
    emit(tall, screen := Screen(), {"PAGER": pager, "NO_COLOR": "1"})
    assert screen.getvalue() == "" and paged.read_text() == tall + "\n"  # plain: NO_COLOR
    for no_pager in ({"PAGER": "cat"}, {"PAGER": ""}, {"PAGER": "no-such-pager-here"}):
        emit(tall, screen := Screen(), no_pager | {"NO_COLOR": "1"})
        assert screen.getvalue() == tall + "\n"


def test_grep_marks_the_match_on_a_terminal_only(store: Path) -> None:
    argv = ["grep", "task t1", "--store", str(store)]
    shown, _ = run_on_a_terminal(argv, 50, {})
    assert shown == f"s-long #1 user: Solve {ESC}1;31mtask t1{ESC}0m.\n"
    shown, _ = run_on_a_terminal(argv, 50, {"NO_COLOR": "1"})
    assert shown == "s-long #1 user: Solve task t1.\n"
