"""modeltap/records/store.py under hostile input: whatever a served request held (a lone surrogate in
the content, the model, a key or a label, bytes that are not UTF-8 in a header or the body) is stored
losslessly and read back as sent; a record that still cannot be written leaves a minimal one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from modeltap.records.reader import StoreReader
from modeltap.records.store import RECORD_ERROR, RecordStore
from modeltap.testing import exchange
from tests.factories import recorded

HALF_EMOJI = "\ud83d"  # what a JavaScript agent sends after cutting "😀" in half
NOT_UTF8_HEADER = "curl/8 \udcff"  # aiohttp's surrogate escape of a 0xff byte in a header


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "cut " + HALF_EMOJI}]}, {}),
        ({"model": HALF_EMOJI, "messages": []}, {}),
        ({"model": "m", "messages": [{"role": "user", HALF_EMOJI: "key"}]}, {}),
        ({"model": "m", "messages": []}, {"user_agent": NOT_UTF8_HEADER}),
        ({"model": "m", "messages": []}, {"labels": {"task": "\ud800"}, "session_id": "s-x"}),
        ({"model": "m", "messages": []}, {"path": "/v1/chat/completions/\udced"}),
    ],
)
async def test_what_was_sent_is_stored_and_read_back_as_sent(
    tmp_path: Path, body: dict[str, Any], fields: dict[str, Any]
) -> None:
    reply = {"choices": [{"message": {"content": "ok " + HALF_EMOJI}, "finish_reason": "stop"}]}
    ex = exchange(body, reply, **fields)
    path = await recorded(tmp_path / "r.db", ex)
    with StoreReader(path) as reader:
        [row] = reader.exchanges()
    assert row["request"] == body
    assert row["response"]["choices"][0]["message"]["content"] == "ok " + HALF_EMOJI
    for key, value in fields.items():
        # JSON values come back as sent; a text column keeps an unencodable character as its escape.
        assert row[key] == (json.dumps(value)[1:-1] if isinstance(value, str) else value), key


async def test_a_body_that_is_not_json_is_kept_byte_for_byte(tmp_path: Path) -> None:
    raw = b'{"model": "m", "messages": [\xff\xfe'
    path = await recorded(tmp_path / "r.db", exchange(None, None, request=raw, request_json=None, status=400))
    with StoreReader(path) as reader:
        [row] = reader.exchanges()
    assert row["request"].encode("utf-8", "surrogateescape") == raw


async def test_a_record_that_cannot_be_written_leaves_a_minimal_one(tmp_path: Path) -> None:
    store = RecordStore(tmp_path / "r.db")
    store.start()
    poison = dataclasses.replace(exchange({}, {}, session_id="s-p", status=200), budget={"x": object()})
    await store.submit(poison)
    await store.close()
    assert (store.written, store.failures) == (0, 1)
    with StoreReader(tmp_path / "r.db") as reader:
        [row] = reader.exchanges()
    assert (row["id"], row["session_id"], row["status"], row["error_class"]) == (
        poison.id,
        "s-p",
        200,
        RECORD_ERROR,
    )
    assert "could not be written in full" in row["error_message"]
