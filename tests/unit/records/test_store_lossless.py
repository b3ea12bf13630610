"""modeltap/records/store.py under hostile input: whatever a served request held (a lone surrogate in
the content, the model, a key or a label, bytes that are not UTF-8 in a header or the body) is stored
losslessly and read back as sent; a value no column holds (a count of 2**64, a 400-digit logprob)
costs only its column; a record that still cannot be written leaves a minimal one, bodies kept."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeltap.dialects.token_ids import without_ids
from modeltap.records.jsontext import COUNT_MAX
from modeltap.records.reader import StoreReader
from modeltap.records.sql_writer import SqlWriter
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


# -- values that reach columns ---------------------------------------------------------------------

CHAT_BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _chat_reply(usage: Any = None, logprob: Any = -0.5, weight_version: Any = "w1") -> dict[str, Any]:
    """A chat answer carrying served token ids, a logprob per id and a weight version: every value of
    an answer that becomes a column (usage, finish reason, model, ids, logprobs, version)."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "ok"},
        "finish_reason": "stop",
        "token_ids": [7, 8],
        "logprobs": {"content": [{"token": "ok", "logprob": logprob}, {"token": "!", "logprob": -1.0}]},
    }
    return {
        "model": "m",
        "choices": [choice],
        "usage": usage if usage is not None else {"prompt_tokens": 3, "completion_tokens": 2},
        "prompt_token_ids": [1, 2, 3],
        "metadata": {"weight_version": weight_version},
    }


def _written(path: Path, *items: Any) -> tuple[SqlWriter, list[dict[str, Any]]]:
    writer = SqlWriter(path)
    writer.open()
    try:
        for item in items:
            writer.write([item])
    finally:
        writer.close()
    with StoreReader(path) as reader:
        return writer, reader.exchanges()


@pytest.mark.parametrize(
    ("reply", "fields"),
    [
        (_chat_reply({"prompt_tokens": 2**64, "completion_tokens": 2}), {}),
        (_chat_reply({"prompt_tokens": 3, "completion_tokens": -(2**70)}), {}),
        (_chat_reply({"prompt_tokens": 2**62, "completion_tokens": 2**62}), {"session_id": "s-sum"}),
        (_chat_reply(logprob=-int("9" * 400)), {}),
        (_chat_reply(weight_version="v" + HALF_EMOJI), {}),
        (_chat_reply(), {"session_id": "s-" + HALF_EMOJI}),
    ],
)
def test_a_value_no_column_holds_costs_the_column_not_the_record(
    tmp_path: Path, reply: dict[str, Any], fields: dict[str, Any]
) -> None:
    writer, [row] = _written(tmp_path / "r.db", exchange(CHAT_BODY, reply, **fields))
    assert (writer.written, writer.failures, row["error_class"]) == (1, 0, None)
    assert (row["request"], row["response"]) == (CHAT_BODY, without_ids(reply))
    for column in ("prompt_tokens", "completion_tokens"):
        assert row[column] is None or 0 <= row[column] <= COUNT_MAX


def test_a_record_that_fails_keeps_its_bodies(tmp_path: Path) -> None:
    # Whatever else fails, the bodies of an exchange the client was answered are kept.
    reply = _chat_reply()
    poison = exchange(CHAT_BODY, reply, budget={"x": object()}, sent={"model": "m", "messages": []})
    writer, [row] = _written(tmp_path / "r.db", poison)
    assert (writer.written, writer.failures, row["error_class"]) == (0, 1, RECORD_ERROR)
    assert (row["request"], row["sent"], row["response"]) == (
        CHAT_BODY,
        {"model": "m", "messages": []},
        reply,
    )


# Numbers as JSON carries them: any integer, floats up to overflow, and floats past it (inf).
json_numbers = st.integers() | st.floats(allow_nan=False) | st.integers(300, 500).map(lambda n: int("9" * n))
any_text = st.text(st.characters(codec=None, exclude_categories=()))
odd_values = st.none() | st.booleans() | json_numbers | any_text
counts = st.dictionaries(
    st.sampled_from(["prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "total_tokens"]),
    odd_values,
)
endpoints = st.sampled_from(
    [("chat", "/v1/chat/completions"), ("messages", "/v1/messages"), ("responses", "/v1/responses")]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    usage=counts,
    logprob=odd_values,
    version=odd_values,
    finish=odd_values,
    model=odd_values,
    session=st.none() | any_text.filter(bool),
    endpoint=endpoints,
)
def test_no_value_an_answer_holds_loses_its_record(
    tmp_path_factory: pytest.TempPathFactory,
    usage: dict[str, Any],
    logprob: Any,
    version: Any,
    finish: Any,
    model: Any,
    session: str | None,
    endpoint: tuple[str, str],
) -> None:
    reply = _chat_reply(usage, logprob, version) | {"model": model, "stop_reason": finish, "status": finish}
    reply["choices"][0]["finish_reason"] = finish
    name, path = endpoint
    ex = exchange(CHAT_BODY, reply, endpoint=name, path=path, session_id=session)
    writer, [row] = _written(tmp_path_factory.mktemp("fuzz") / "r.db", ex)
    assert (writer.written, writer.failures, row["error_class"]) == (1, 0, None)
    kept = without_ids(reply) if name == "chat" else reply
    assert json.dumps(row["response"]) == json.dumps(kept)
    for column in ("prompt_tokens", "completion_tokens"):
        assert row[column] is None or 0 <= row[column] <= COUNT_MAX
