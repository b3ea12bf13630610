"""modeltap/readers/tail.py: `tail` waits for a store, prints its history, then each new exchange,
numbered within its session; several stores at once, each line naming its store."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from modeltap.readers.tail import follow
from modeltap.records.schema import SCHEMA_VERSION
from modeltap.records.store import RecordStore
from tests.factories import recorded
from tests.unit.readers.test_show import ASK, CALL, RESULT, SYSTEM, chat, chat_reply


class Lines(io.StringIO):
    """What `follow` printed, waitable from the test's thread."""

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = self.getvalue().splitlines()
            if len(lines) >= count:
                return lines
            time.sleep(0.02)
        raise AssertionError(f"wanted {count} lines, got: {self.getvalue()!r}")


async def test_follow_waits_for_the_store_prints_history_then_new_exchanges(tmp_path: Path) -> None:
    path = tmp_path / "late" / "r.db"
    out, stop = Lines(), threading.Event()
    thread = threading.Thread(
        target=follow, args=(path,), kwargs={"history": 1, "out": out, "poll_s": 0.05, "stop": stop}
    )
    thread.start()  # before the database exists, as `tail` started before `serve`
    try:
        await asyncio.sleep(0.2)
        store = RecordStore(path)
        store.start()
        await store.submit(chat([SYSTEM, ASK], chat_reply(calls=CALL["tool_calls"])), wait=True)
        lines = await asyncio.to_thread(out.wait_for, 1)
        assert "s-view #1  chat  200" in lines[0] and '→ bash({"command": "echo 42"})' in lines[0]
        await store.submit(
            chat([SYSTEM, ASK, CALL, RESULT], chat_reply("42"), session_id="s-other"), wait=True
        )
        await store.submit(chat([SYSTEM, ASK, CALL, RESULT], chat_reply("42")), wait=True)
        lines = await asyncio.to_thread(out.wait_for, 3)
        assert "s-other #1" in lines[1] and "s-view #2" in lines[2] and "stop" in lines[2]
        await store.close()
    finally:
        stop.set()
        thread.join(5)

    # A second tail on the finished store: only the last exchange of the chosen session as history,
    # numbered as in the session, then JSON lines.
    out = Lines()
    stop = threading.Event()
    stop.set()
    follow(path, session="s-vi", history=1, as_json=True, out=out, stop=stop)
    [line] = out.getvalue().splitlines()
    turn = json.loads(line)
    assert (turn["turn"], turn["session_id"], turn["reply"], turn["finish_reason"]) == (
        2,
        "s-view",
        "42",
        "stop",
    )


async def test_follow_reads_several_stores_and_names_each_one(tmp_path: Path) -> None:
    first = await recorded(tmp_path / "a.db", chat([SYSTEM, ASK], chat_reply("one")))
    second = await recorded(
        tmp_path / "b.db",
        chat([SYSTEM, ASK], chat_reply("two")),
        chat([SYSTEM, ASK, CALL, RESULT], chat_reply("three")),
    )
    out, stop = Lines(), threading.Event()
    stop.set()
    follow([first, second], history=5, out=out, stop=stop)
    lines = out.getvalue().splitlines()
    # The same session id in two stores is two sessions, each numbered in its own store.
    assert [line.split()[0] for line in lines] == [f"[{first}]", f"[{second}]", f"[{second}]"]
    assert "s-view #1" in lines[0] and "s-view #1" in lines[1] and "s-view #2" in lines[2]

    out = Lines()
    follow([first, second], history=1, as_json=True, out=out, stop=stop)
    assert [(t["store"], t["turn"]) for t in map(json.loads, out.getvalue().splitlines())] == [
        (str(first), 1),
        (str(second), 2),
    ]


async def test_follow_numbers_turns_without_reading_the_whole_store(tmp_path: Path) -> None:
    """History is the last rows; a session first met later is numbered by one count."""
    path = await recorded(
        tmp_path / "r.db", *(chat([SYSTEM, ASK], chat_reply(str(n)), session_id="s-long") for n in range(30))
    )
    store = RecordStore(path)
    store.start()
    out, stop = Lines(), threading.Event()
    thread = threading.Thread(
        target=follow, args=(path,), kwargs={"history": 2, "out": out, "poll_s": 0.05, "stop": stop}
    )
    thread.start()
    try:
        lines = await asyncio.to_thread(out.wait_for, 2)
        assert "s-long #29" in lines[0] and "s-long #30" in lines[1]
        await store.submit(chat([SYSTEM, ASK], chat_reply("new"), session_id="s-long"), wait=True)
        assert "s-long #31" in (await asyncio.to_thread(out.wait_for, 3))[2]
    finally:
        await store.close()
        stop.set()
        thread.join(5)


async def test_a_session_not_there_yet_is_said_to_be_waited_for_then_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = await recorded(tmp_path / "r.db", chat([SYSTEM, ASK], chat_reply("other"), session_id="s-other"))
    store = RecordStore(path)
    store.start()
    out, stop = Lines(), threading.Event()
    thread = threading.Thread(
        target=follow,
        args=(path,),
        kwargs={"session": "s-late", "history": 5, "out": out, "poll_s": 0.05, "stop": stop},
    )
    thread.start()
    try:
        await asyncio.sleep(0.3)
        assert out.getvalue() == ""  # not s-other's exchanges
        await store.submit(chat([SYSTEM, ASK], chat_reply("here"), session_id="s-late"), wait=True)
        [line] = await asyncio.to_thread(out.wait_for, 1)
        assert "s-late #1" in line and "'here'" in line
    finally:
        await store.close()
        stop.set()
        thread.join(5)
    assert capsys.readouterr().err.splitlines() == [
        f"modeltap tail: session s-late does not exist yet in {path}; waiting for it",
        "modeltap tail: session s-late began; following it",
    ]


async def test_follow_refuses_a_store_of_a_newer_modeltap_instead_of_waiting_on_it(tmp_path: Path) -> None:
    # A store still being created by `serve` is looked at again; one a newer modeltap wrote never
    # becomes readable by waiting, so `tail` says so at once.
    path = await recorded(tmp_path / "r.db", chat([SYSTEM, ASK], chat_reply("42")))
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer than this modeltap"):
        follow(path, out=io.StringIO(), poll_s=0.01, stop=threading.Event())
