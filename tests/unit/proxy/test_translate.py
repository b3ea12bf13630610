"""Tests for modeltap/proxy/translate.py: a translated stream fed the upstream's bytes at any split,
the non-streamed answer agreeing with the streamed one, the Responses conversations kept for
`previous_response_id`, and the stream made for a client that asked for one from a JSON answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap import dialects
from modeltap.dialects.openai_chat import chunks
from modeltap.dialects.sse import StreamAssembler, data_event
from modeltap.proxy.errors import BadRequest
from modeltap.proxy.translate import ResponseChains, TranslatedStream, Translation, synthesised, value_size
from tests.factories import (
    assistant,
    chat_completion,
    function_call_item,
    message,
    message_item,
    response,
    text_completion,
    usage,
)

CHAT = dialects.named("chat")
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok", "tool_calls": [CALL]},
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
UPSTREAM_BYTES = b"".join(data_event(c) for c in chunks(COMPLETION, include_usage=True)) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("endpoint", ["messages", "responses"])
def test_a_translated_stream_says_the_same_however_the_bytes_are_split(endpoint: str) -> None:
    client = dialects.named(endpoint)
    whole = TranslatedStream(client, {"model": "m"})
    expected = whole.relay(UPSTREAM_BYTES) + whole.end()
    for cut in range(1, len(UPSTREAM_BYTES)):
        stream = TranslatedStream(client, {"model": "m"})
        out = stream.relay(UPSTREAM_BYTES[:cut]) + stream.relay(UPSTREAM_BYTES[cut:]) + stream.end()
        assert _types(client, out) == _types(client, expected)
    result = whole.result()
    assert result.complete and result.error is None
    assert client.summary({}, result.body).tool_calls[0]["id"] == "call_1"
    assert whole.received is not None and whole.received["choices"][0]["message"]["tool_calls"] == [CALL]


def _types(client: Any, raw: bytes) -> list[str]:
    """The event types `raw` holds, ids aside (each stream makes its own)."""
    assembler = StreamAssembler(client)
    assembler.feed(raw)
    return [line for line in raw.decode().splitlines() if line.startswith("event:")]


def test_a_translated_stream_cut_short_is_recorded_as_such() -> None:
    stream = TranslatedStream(dialects.named("messages"), {"model": "m"})
    out = stream.relay(data_event(chunks(COMPLETION, include_usage=False)[0])) + stream.end()
    result = stream.result()
    assert b"message_start" in out and b"message_stop" not in out
    assert not result.complete and "ended before" in (result.error or "")


@pytest.mark.parametrize("endpoint", ["messages", "responses"])
def test_the_whole_answer_matches_the_streamed_one(endpoint: str) -> None:
    client = dialects.named(endpoint)
    translation = Translation(client, {"model": "m", "messages": [], "input": "hi"}, None)
    events, streamed = translation.events(COMPLETION)
    whole = translation.reply(COMPLETION)
    assert streamed is not None and whole is not None and events
    assert client.summary({}, streamed).tool_calls == client.summary({}, whole).tool_calls
    assert client.summary({}, whole).text == "ok"


def test_a_request_continuing_an_unknown_response_is_refused() -> None:
    with pytest.raises(BadRequest, match="previous_response_id 'resp_x'"):
        Translation.start(
            dialects.named("responses"),
            {"input": "hi", "previous_response_id": "resp_x"},
            ResponseChains(),
            "s",
        )


def test_kept_conversations_belong_to_their_session_and_the_oldest_go_first() -> None:
    chains = ResponseChains(limit=2)
    chains.keep("s1", "r1", [{"role": "user", "content": "1"}])
    chains.keep("s1", "r2", [])
    assert chains.get("s2", "r1") is None and chains.get("s1", "r1") is not None  # r1 now the newest
    chains.keep("s1", "r3", [])
    assert chains.get("s1", "r2") is None and chains.get("s1", "r1") is not None


def test_a_translated_response_is_remembered_for_the_next_request() -> None:
    client, chains = dialects.named("responses"), ResponseChains()
    first = Translation.start(client, {"model": "m", "input": "hi"}, chains, "s")
    reply = first.reply(COMPLETION)
    assert reply is not None
    first.remember(chains, "s", COMPLETION, reply)
    output = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}
    second = Translation.start(
        client, {"model": "m", "input": [output], "previous_response_id": reply["id"]}, chains, "s"
    )
    roles = [m["role"] for m in second.chat_body["messages"]]
    assert roles == ["user", "assistant", "tool"]


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", chat_completion(assistant("42"), usage=usage(3, 1))),
        ("completions", text_completion("42", usage=usage(3, 1))),
        (
            "messages",
            message(
                [{"type": "text", "text": "42"}],
                "end_turn",
                usage={"input_tokens": 3, "output_tokens": 1},
                model="m",
            ),
        ),
        ("responses", response([message_item("42")], usage={"input_tokens": 3})),
        ("responses", response([function_call_item("c1", "bash", '{"command": "ls"}')], usage={})),
    ],
)
def test_a_json_answer_to_a_streamed_request_becomes_the_stream_its_format_defines(
    endpoint: str, body: Any
) -> None:
    dialect = dialects.named(endpoint)
    made = synthesised(dialect, {"stream": True, "stream_options": {"include_usage": True}}, _json(body))
    assert made is not None
    events, parsed = made
    assembler = StreamAssembler(dialect)
    assembler.feed(b"".join(events))
    result = assembler.result()
    assert result.complete and result.error is None and parsed == body
    assert dialect.summary({}, result.body) == dialect.summary({}, body)


def test_an_answer_that_is_not_a_json_object_is_not_made_a_stream() -> None:
    assert synthesised(CHAT, {"stream": True}, b"<html>") is None
    assert synthesised(CHAT, {"stream": True}, b"[1]") is None


def _json(body: Any) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize("endpoint", ["messages", "responses"])
def test_the_record_of_a_translated_stream_is_what_the_client_got(endpoint: str) -> None:
    """The record is rebuilt from the chat stream, and says what the stream said, ids included (a
    later `previous_response_id` names the id the client got)."""
    client = dialects.named(endpoint)
    stream = TranslatedStream(client, {"model": "m"})
    written = stream.relay(UPSTREAM_BYTES) + stream.end()
    assembler = StreamAssembler(client)
    assembler.feed(written)
    assert stream.result().body == assembler.result().body


# A degenerate policy at its token limit: tool-call arguments nested past what Python's JSON reads.
DEEP_ARGUMENTS = "[" * 1200


@pytest.mark.parametrize("streamed", [True, False])
def test_tool_call_arguments_nested_past_the_parser_still_end_the_anthropic_answer(streamed: bool) -> None:
    deep = {**CALL, "function": {"name": "bash", "arguments": DEEP_ARGUMENTS}}
    completion = chat_completion(assistant(None, deep), "tool_calls", usage=usage(3, 2))
    client = dialects.named("messages")
    if streamed:
        stream = TranslatedStream(client, {"model": "m"})
        raw = b"".join(data_event(c) for c in chunks(completion, include_usage=False)) + b"data: [DONE]\n\n"
        out = stream.relay(raw) + stream.end()
        body = stream.result().body
        assert out.rstrip().endswith(b'data: {"type": "message_stop"}')
    else:
        body = Translation(client, {"model": "m", "messages": []}, None).reply(completion)
    assert body is not None and body["stop_reason"] == "tool_use"
    assert body["content"][0]["input"] == DEEP_ARGUMENTS  # the raw text, kept as the evidence


@pytest.mark.parametrize(("endpoint", "last"), [("messages", "error"), ("responses", "response.failed")])
def test_a_chat_stream_that_never_finishes_ends_in_the_clients_error(endpoint: str, last: str) -> None:
    client = dialects.named(endpoint)
    for upstream in (data_event(chunks(COMPLETION, include_usage=False)[1]), b'data: {"detail": "ok"}\n\n'):
        stream = TranslatedStream(client, {"model": "m"})
        out = stream.relay(upstream + b"data: [DONE]\n\n") + stream.end()
        events = [json.loads(line[6:]) for line in out.decode().splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == last, events
        assert "ended before its finish reason" in json.dumps(events[-1])
        result = stream.result()
        assert not stream.complete and "ended before" in (result.error or "")


def test_kept_conversations_are_bounded_by_their_bytes_not_only_their_count() -> None:
    # 24 conversations of a (scaled-down) 16 MB transcript each: only what fits the bound is kept,
    # the newest first.
    chains = ResponseChains(max_bytes=100_000)
    transcript = [{"role": "user", "content": "x" * 16_000}]
    for n in range(24):
        chains.keep("s", f"r{n}", transcript)
        assert chains.bytes <= chains.max_bytes
    kept = [n for n in range(24) if chains.get("s", f"r{n}") is not None]
    assert kept == list(range(24 - len(kept), 24)) and len(kept) == 100_000 // value_size(transcript)
    assert chains.bytes == len(kept) * value_size(transcript)


def test_a_conversation_over_the_bound_alone_is_not_kept_and_a_kept_one_is_counted_once() -> None:
    chains = ResponseChains(max_bytes=1000)
    chains.keep("s", "small", [{"role": "user", "content": "hi"}])
    chains.keep("s", "small", [{"role": "user", "content": "hi again"}])
    chains.keep("s", "huge", [{"role": "user", "content": "x" * 1000}])
    assert chains.get("s", "huge") is None and chains.get("s", "small") is not None
    assert chains.bytes == value_size([{"role": "user", "content": "hi again"}])


def test_the_size_of_a_conversation_is_never_less_than_its_text_and_takes_any_depth() -> None:
    messages = [{"role": "user", "content": "héllo"}, {"role": "assistant", "content": None, "n": 3}]
    assert value_size(messages) >= len(json.dumps(messages, ensure_ascii=False, separators=(",", ":")))
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert value_size(deep) > 100_000


_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=5)
_fields = st.sampled_from(
    ["content", "output", "usage", "choices", "message", "status", "type", "text", "input", "stop_reason"]
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_fields | _text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(
    endpoint=st.sampled_from(["chat", "messages", "responses", "completions", "generate"]),
    body=st.dictionaries(_fields, _json_values, max_size=5),
    options=_json_values,
)
def test_a_stream_made_from_any_json_answer_ends_in_its_terminal_event(
    endpoint: str, body: dict[str, Any], options: Any
) -> None:
    dialect = dialects.named(endpoint)
    made = synthesised(dialect, {"stream": True, "stream_options": options}, json.dumps(body).encode())
    assert made is not None
    assembler = StreamAssembler(dialect)
    assembler.feed(b"".join(made[0]))
    assert assembler.result().complete
