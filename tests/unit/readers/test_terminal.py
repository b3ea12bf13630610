"""modeltap/readers/terminal.py: `show` on a real pseudo-terminal is coloured and, when taller than
the screen, paged through $PAGER; in a pipe, with NO_COLOR, or as JSON it is plain text."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeltap.cli import main
from modeltap.readers.console import ConsoleLog
from modeltap.readers.show import tail_line
from modeltap.readers.terminal import coloured, emit
from modeltap.readers.text import printable
from modeltap.records.jsontext import pretty
from modeltap.records.reader import StoreReader
from modeltap.records.turns import turn_record
from modeltap.testing import exchange
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


# Every control character a terminal obeys: C0 but newline and tab, DEL, C1.
OBEYED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# What an attacker's recorded text carries: OSC 52 (the clipboard), OSC 0 (the title), an 8-bit OSC, a
# carriage return, and ordinary text around them.
ATTACKS = ["\x1b]52;c;cHduZWQ=\x07", "\x1b]0;owned\x07", "\x9d0;t\x9c", "\r", "\x1b[2J", "\x07"]
TEXTS = st.lists(
    st.one_of(st.sampled_from(ATTACKS), st.text(alphabet=st.characters(max_codepoint=0xA0), max_size=8)),
    min_size=1,
    max_size=6,
).map("".join)


def hostile_store(folder: Path, text: str) -> Path:
    """Two sessions whose tool name, arguments, tool result, reply, labels, error and ids hold `text`."""
    call = assistant(None, tool_call(f"call_{text}", f"bash{text}", json.dumps({"command": text})))
    records = []
    for session in ("s-a" + text, "s-b"):
        records += rollout(session, "t" + text, [call, assistant(f"done {text}")], labels={"k": text})
    records.append(
        exchange(
            {"model": "m", "messages": [{"role": "user", "content": text}]},
            {"error": {"message": text}},
            session_id="s-b",
            status=500,
            error_class="upstream_error",
            error_message=f"failed: {text}",
        )
    )
    return asyncio.run(recorded(folder / "r.db", *records))


def reader_outputs(path: Path, text: str) -> dict[str, str]:
    """What each reader prints of the hostile store, by command line."""
    store = ["--store", str(path)]
    commands = [
        ["sessions", *store],
        ["sessions", "--json", *store],
        ["show", "s-a" + text, *store],
        ["show", "s-a" + text, "1", "--full", *store],
        ["show", "s-b", "--json", *store],
        ["grep", ".", "--all", *store],
        ["grep", ".", "--json", *store],
        ["stats", "--label", "k", *store],
        ["groups", "--label", "k", *store],
        ["diff", "s-a" + text, "s-b", *store],
        ["diff", "s-a" + text, "s-b", "--json", *store],
    ]
    printed = {}
    for argv in commands:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(argv)
        printed[" ".join(argv[:2])] = out.getvalue()
    with StoreReader(path) as reader:
        rows = reader.exchanges()
    printed["tail"] = "\n".join(tail_line(turn_record(row, 1)) for row in rows)
    console = ConsoleLog(io.StringIO(), verbose=True)
    printed["serve"] = console.line(exchange({"model": "m"}, None, path="/v1/" + text, user_agent=text))
    console.close()
    return printed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS)
def test_no_reader_writes_a_control_character_a_recording_holds(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for command, printed in reader_outputs(hostile_store(Path(folder), text), text).items():
            assert not OBEYED.search(printed), (command, printed)


def test_json_keeps_the_recorded_text_as_escapes() -> None:
    """`--json` is still the recorded value: C0 escaped by JSON itself, DEL and C1 by modeltap."""
    evil = "\x1b]52;c;x\x07\x9d\x7f"
    assert json.loads(pretty({"t": evil}))["t"] == evil and not OBEYED.search(pretty({"t": evil}))
    assert printable(evil) == "\\x1b]52;c;x\\x07\\x9d\\x7f" and printable("a\n\tb") == "a\n\tb"
    assert printable("a\n\tb", lines=False) == "a\\x0a\\x09b"
