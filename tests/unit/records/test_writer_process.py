"""modeltap/records/writer_process.py: the writer in its own process, started, killed, stopped and
restarted for real; what reaches the store is read back. Nothing here depends on timing: each test
waits for a state (a new pid, a record acknowledged), bounded only so that a bug cannot hang it."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest

from modeltap.records import channel as channel_module
from modeltap.records import writer_process
from modeltap.records.channel import RecordChannel
from modeltap.records.exchange import SessionEvent
from modeltap.records.reader import StoreReader
from modeltap.records.sql_writer import RECORD_ERROR
from modeltap.records.writer_process import WriterOptions, WriterProcess
from tests.token_sessions import served_turn, tool_session
from tests.unit.records.test_store import chat_exchange

# Bounds on waiting for a state, so that a bug fails the test instead of hanging it.
STATE_TIMEOUT_S = 60.0


@asynccontextmanager
async def writer_and_channel(
    path: Path, **options: Any
) -> AsyncIterator[tuple[WriterProcess, RecordChannel]]:
    sync = options.pop("sync", False)
    queue_size = options.pop("queue_size", None)
    writer = WriterProcess(WriterOptions(str(path), **options))
    await writer.start()
    extra = {} if queue_size is None else {"queue_size": queue_size}
    channel = RecordChannel(writer.address, writer.options, sync=sync, **extra)
    await channel.start()
    try:
        yield writer, channel
    finally:
        await channel.close()
        await writer.stop()


async def until(condition: Callable[[], bool]) -> None:
    """Wait for `condition`, looking again every few milliseconds."""
    async with asyncio.timeout(STATE_TIMEOUT_S):
        while not condition():  # noqa: ASYNC110 - a state of other processes: nothing to wait on
            await asyncio.sleep(0.01)


def exchange_ids(path: Path, session: str) -> list[str]:
    with StoreReader(path) as reader:
        return [row["id"] for row in reader.exchanges(session)]


async def test_with_sync_a_record_is_committed_when_its_wait_ends(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    async with writer_and_channel(path, sync=True) as (_, channel):
        channel.on_session(SessionEvent("opened", "s1", {"task_id": "t"}))
        for turn in range(3):
            sent = chat_exchange("s1", turn)
            wait = channel.on_exchange(sent)
            assert wait is not None
            await wait
            assert exchange_ids(path, "s1")[-1] == sent.id  # read while serve still runs
        assert channel.written == 3
    with StoreReader(path) as reader:
        [session] = reader.sessions()
        assert (session["id"], session["exchanges"], session["labels"]) == ("s1", 3, {"task_id": "t"})


async def test_a_killed_writer_is_restarted_and_no_record_sent_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.db"
    sent = [chat_exchange("k", turn % 4) for turn in range(60)]
    async with writer_and_channel(path) as (writer, channel):
        for ex in sent[:30]:
            await channel.submit(ex)
        first = writer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # whatever it had not acknowledged is sent again
        for ex in sent[30:]:
            await channel.submit(ex)
        await until(lambda: writer.pid not in (first, None))
    assert sorted(exchange_ids(path, "k")) == sorted(ex.id for ex in sent)  # each once
    assert writer.restarts == 1 and channel.written == 60
    assert f"the record writer (pid {first}) died with signal 9; restarting it" in caplog.text


async def test_the_writer_ignores_sigint_and_sigterm_and_drains_when_serve_stops(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    sent = [chat_exchange("t", turn) for turn in range(20)]
    async with writer_and_channel(path) as (writer, channel):
        pid = writer.pid
        assert pid is not None
        for sig in (signal.SIGINT, signal.SIGTERM):  # a Ctrl-C or a kill of serve's process group
            os.kill(pid, sig)
        for ex in sent:
            await channel.submit(ex)
        await channel.submit(chat_exchange("t", 20), wait=True)
        assert (writer.pid, writer.restarts) == (pid, 0)
    assert len(exchange_ids(path, "t")) == 21  # the close flushed what was still queued


async def test_back_pressure_holds_the_relay_while_the_writer_cannot_keep_up(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    async with writer_and_channel(path, queue_size=2) as (writer, channel):
        assert writer.pid is not None
        os.kill(writer.pid, signal.SIGSTOP)  # a writer that acknowledges nothing
        try:
            assert channel.on_exchange(chat_exchange("bp", 0)) is None
            assert channel.on_exchange(chat_exchange("bp", 1)) is None
            third = channel.on_exchange(chat_exchange("bp", 2))
            assert third is not None
            waiting = asyncio.ensure_future(third)
            for _ in range(20):  # however long it waits, nothing can free room: the writer is stopped
                await asyncio.sleep(0.01)
            assert not waiting.done()
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        await asyncio.wait_for(waiting, STATE_TIMEOUT_S)
    assert len(exchange_ids(path, "bp")) == 3


def dying_decoder(_: str | None) -> Callable[[list[int]], NoReturn]:
    """A decoder that kills the writer process: a record that does so every time it is written."""

    def decode(ids: list[int]) -> NoReturn:
        os._exit(3)

    return decode


async def test_a_record_the_writer_dies_on_twice_is_kept_as_its_minimal_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "r.db"
    histories, replies = tool_session()
    histories[2] = [histories[2][0], *histories[2][2:]]  # a message removed: a break, which is decoded
    turns = [served_turn(h, r, session_id="s") for h, r in zip(histories, replies, strict=True)]
    decoder = "tests.unit.records.test_writer_process:dying_decoder"
    async with writer_and_channel(path, decoder=decoder) as (writer, channel):
        for ex in turns:
            await channel.submit(ex)
        await channel.submit(chat_exchange("after", 0), wait=True)  # the writer serves on after it
    assert writer.restarts == 2 and "died with status 3" in caplog.text
    with StoreReader(path) as reader:
        rows = {row["id"]: row for row in reader.exchanges("s")}
        assert len(reader.exchanges("after")) == 1
    poison = rows[turns[2].id]
    assert poison["error_class"] == RECORD_ERROR and "died twice while writing it" in poison["error_message"]
    assert [rows[ex.id]["error_class"] for ex in turns[:2]] == [None, None]


async def test_a_writer_that_keeps_dying_is_given_up_and_serve_writes_its_records_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_process, "MAX_RESTARTS", 1)
    monkeypatch.setattr(channel_module, "MAX_RESTARTS", 1)
    path = tmp_path / "r.db"
    async with writer_and_channel(path) as (writer, channel):
        for death in range(2):
            pid = writer.pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            if death == 0:
                await until(lambda: writer.pid != pid)  # noqa: B023 - awaited here, in this pass
                await channel.submit(chat_exchange("g", 0), wait=True)
        await until(lambda: channel.in_process and writer.gave_up)
        await channel.submit(chat_exchange("g", 1), wait=True)
    assert len(exchange_ids(path, "g")) == 2 and channel.written == 2
    assert "not restarting it" in caplog.text and "writes its records itself" in caplog.text


async def test_a_store_that_cannot_be_opened_stops_the_start_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "a-folder.db").mkdir()
    writer = WriterProcess(WriterOptions(str(tmp_path / "a-folder.db")))
    with pytest.raises(RuntimeError, match="cannot open the record store"):
        await writer.start()
    await writer.stop()


def test_options_cross_to_the_process_as_json() -> None:
    options = WriterOptions("r.db", keep_raw_sse=True, max_bytes=5, decoder="m:f", decoder_arg="/tok")
    assert WriterOptions.from_json(options.to_json()) == options
