"""modeltap/records/channel.py: the serving side of the writer process. With a stand-in writer (a Unix
socket server in the test that greets and then never acknowledges), the channel's own rules; with the
real one, what it sends."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from modeltap.records import channel as channel_module
from modeltap.records import frames
from modeltap.records.channel import RecordChannel
from modeltap.records.exchange import SessionEvent
from modeltap.records.reader import StoreReader
from modeltap.records.sql_writer import RECORD_ERROR
from modeltap.records.store import StoreClosed
from modeltap.records.writer_process import WriterOptions
from tests.unit.records.test_store import chat_exchange
from tests.unit.records.test_writer_process import STATE_TIMEOUT_S, until, writer_and_channel


class SilentWriter:
    """A writer that greets each connection, reads what it is sent and acknowledges nothing."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.frames: list[frames.Frame] = []
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.address)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        writer.write(frames.encode_ack(frames.Ack(-1, 0)))
        incoming = frames.FrameReader()
        while data := await reader.read(65536):
            self.frames += incoming.feed(data)

    async def die(self) -> None:
        """Stop listening and drop every connection: the writer is gone, and nothing takes its place."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()


async def test_a_writer_gone_for_good_leaves_the_records_to_a_thread_of_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(channel_module, "WRITER_GONE_S", 0.2)
    path = tmp_path / "r.db"
    writer = SilentWriter(str(tmp_path / "w.sock"))
    await writer.start()
    channel = RecordChannel(writer.address, WriterOptions(str(path)), sync=True)
    await channel.start()
    channel.on_session(SessionEvent("opened", "f", {"task_id": "t"}))
    waits = [channel.on_exchange(chat_exchange("f", turn)) for turn in range(3)]
    await until(lambda: len(writer.frames) == 4)  # sent, and never acknowledged
    await writer.die()
    for wait in waits:  # each --sync waiter learns of its commit from the thread instead
        assert wait is not None
        await asyncio.wait_for(wait, STATE_TIMEOUT_S)
    assert channel.in_process
    await channel.submit(chat_exchange("f", 3), wait=True)
    await channel.close()
    with pytest.raises(StoreClosed):
        channel.on_exchange(chat_exchange("f", 4))
    with StoreReader(path) as reader:
        [session] = reader.sessions()
    assert (session["id"], session["exchanges"], session["labels"]) == ("f", 4, {"task_id": "t"})
    assert channel.written == 4 and "could not be reached for 0 s" in caplog.text


async def test_a_channel_that_cannot_reach_its_writer_does_not_start(tmp_path: Path) -> None:
    channel = RecordChannel(str(tmp_path / "nobody.sock"), WriterOptions(str(tmp_path / "r.db")))
    with pytest.raises(RuntimeError, match="cannot reach the record writer"):
        await channel.start()
    await channel.close()


async def test_an_exchange_that_cannot_be_sent_is_kept_as_its_minimal_record(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    unsendable = dataclasses.replace(chat_exchange("u", 0), labels={"task": lambda: None})  # type: ignore[dict-item]
    async with writer_and_channel(path) as (_, channel):
        with pytest.raises(RuntimeError, match="could not be sent to the record writer"):
            await channel.submit(unsendable, wait=True)
    with StoreReader(path) as reader:
        [row] = reader.exchanges("u")
    assert row["id"] == unsendable.id and row["error_class"] == RECORD_ERROR
    assert "could not be sent to the record writer" in row["error_message"]
