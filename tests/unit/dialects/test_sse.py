"""Tests for modeltap/proxy/sse.py: the SSE decoder and the stream assemblers.

The transcripts are the SSE the real clients accepted (docs/agents.md §2.1, §2.2) and what AReaL's
proxy sent (docs/areal.md §1.1.7, §10.5-§10.6), plus Responses and thinking streams in the shapes the
OpenAI and Anthropic APIs document. Every one is fed whole, split at every byte offset, byte by byte
and with each line ending, and must give the same events and the same assembled body.
"""

from __future__ import annotations

import itertools
import json
from functools import partial
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from modeltap import dialects
from modeltap.dialects.roles import Streams
from modeltap.dialects.sse import Assembled, SSEDecoder, SSEEvent, StreamAssembler
from tests.factories import (
    SSE_DONE,
    assistant,
    chat_chunk,
    chat_completion,
    completion_chunk,
    message,
    sse_data,
    sse_event,
    text_completion,
    tool_call,
    usage,
)
from tests.factories import tool_call_delta as call

ARGUMENTS = '{"command": "echo $((6 * 7))", "description": "Print the product"}'
OPENCODE_ID = "chatcmpl-7f3a"
# An OpenAI chat chunk as the stand-in of docs/agents.md §2.1 framed it.
chunk = partial(chat_chunk, id=OPENCODE_ID)


USAGE = usage(25, 5)
USAGE_CHUNK = {**chunk({}), "choices": [], "usage": USAGE}

# docs/agents.md §2.1: opencode's tool-call turn, arguments split mid-key, usage in a `choices: []` chunk.
OPENCODE_TOOL_CALL = b"".join(
    [
        sse_data(chunk({"role": "assistant", "content": ""})),
        sse_data(chunk({"tool_calls": [call(0, "", "call_01", "bash")]})),
        sse_data(chunk({"tool_calls": [call(0, ARGUMENTS[:36])]})),
        sse_data(chunk({"tool_calls": [call(0, ARGUMENTS[36:])]})),
        sse_data(chunk({}, "tool_calls")),
        sse_data(USAGE_CHUNK),
        SSE_DONE,
    ]
)
OPENCODE_TOOL_CALL_BODY = chat_completion(
    assistant("", tool_call("call_01", "bash", ARGUMENTS)),
    "tool_calls",
    usage=USAGE,
    id=OPENCODE_ID,
    logprobs=None,
)

OPENCODE_TEXT = b"".join(
    [
        sse_data(chunk({"role": "assistant", "content": ""})),
        sse_data(chunk({"content": "4"})),
        sse_data(chunk({"content": "2"})),
        sse_data(chunk({}, "stop")),
        sse_data(USAGE_CHUNK),
        SSE_DONE,
    ]
)


# AReaL's chunk: `model: "None"`, a 29-hex id (docs/areal.md §1.1.6).
areal_chunk = partial(chat_chunk, id="chatcmpl-" + "a" * 29, model="None")


AREAL_USAGE = {"completion_tokens": 5, "prompt_tokens": 19, "total_tokens": 24}
# docs/areal.md §10.5: three chunks (role and "", the whole text, an empty delta with finish_reason and
# usage, although no stream_options was sent), then [DONE].
AREAL_TEXT = b"".join(
    [
        sse_data(areal_chunk({"role": "assistant", "content": ""})),
        sse_data(areal_chunk({"content": "Echo: hello proxy"})),
        sse_data(areal_chunk({}, "stop", usage=AREAL_USAGE)),
        SSE_DONE,
    ]
)
# docs/areal.md §10.6: AReaL 1.0.4 sends each tool call in ONE chunk with its id, name and full arguments.
AREAL_TOOL_CALL = b"".join(
    [
        sse_data(areal_chunk({"role": "assistant", "content": ""})),
        sse_data(
            areal_chunk({"tool_calls": [call(0, '{"city": "Paris"}', "call_" + "b" * 24, "get_weather")]})
        ),
        sse_data(areal_chunk({}, "tool_calls", usage=AREAL_USAGE)),
        SSE_DONE,
    ]
)

# vLLM-style reasoning, and two tool calls whose chunks interleave (parallel tool calls).
REASONING_PARALLEL_CALLS = b"".join(
    [
        sse_data(chunk({"role": "assistant", "reasoning_content": "Two "})),
        sse_data(chunk({"reasoning_content": "cities."})),
        sse_data(chunk({"tool_calls": [call(0, "", "call_a", "w"), call(1, "", "call_b", "w")]})),
        sse_data(chunk({"tool_calls": [call(1, '{"city": "Oslo"}')]})),
        sse_data(chunk({"tool_calls": [call(0, '{"city": ')]})),
        sse_data(chunk({"tool_calls": [call(0, '"Rome"}')]})),
        sse_data(chunk({}, "tool_calls")),
        SSE_DONE,
    ]
)


COMPLETIONS = b"".join(
    [
        sse_data(completion_chunk("4")),
        sse_data(completion_chunk("2", "stop")),
        sse_data({**completion_chunk(""), "choices": [], "usage": USAGE}),
        SSE_DONE,
    ]
)
COMPLETIONS_BODY = text_completion("42", usage=USAGE)

ANTHROPIC_USAGE = {
    "input_tokens": 25,
    "output_tokens": 1,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}
CLAUDE_MESSAGE = partial(message, id="msg_01", model="claude-opus-5-5")
MESSAGE_START = {"type": "message_start", "message": CLAUDE_MESSAGE([], None, usage=ANTHROPIC_USAGE)}


def anthropic(*blocks: bytes, stop_reason: str, output_tokens: int = 5) -> bytes:
    """message_start, the blocks, message_delta and message_stop as Claude Code accepted them."""
    return b"".join(
        [
            sse_event(MESSAGE_START),
            *blocks,
            sse_event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                },
            ),
            sse_event({"type": "message_stop"}),
        ]
    )


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse_event({"type": "content_block_start", "index": index, "content_block": block})


def block_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse_event({"type": "content_block_delta", "index": index, "delta": delta})


def block_stop(index: int) -> bytes:
    return sse_event({"type": "content_block_stop", "index": index})


def block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> bytes:
    return block_start(index, start) + b"".join(block_delta(index, d) for d in deltas) + block_stop(index)


def text(piece: str) -> dict[str, Any]:
    return {"type": "text_delta", "text": piece}


# docs/agents.md §2.2: Claude Code's tool-use turn, with a ping between the block start and its deltas.
CLAUDE_TOOL_USE = anthropic(
    block_start(0, {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {}}),
    sse_event({"type": "ping"}),
    block_delta(0, {"type": "input_json_delta", "partial_json": ARGUMENTS[:40]}),
    block_delta(0, {"type": "input_json_delta", "partial_json": ARGUMENTS[40:]}),
    block_stop(0),
    stop_reason="tool_use",
)
CLAUDE_TOOL_USE_BODY = CLAUDE_MESSAGE(
    [{"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": json.loads(ARGUMENTS)}],
    "tool_use",
    usage={**ANTHROPIC_USAGE, "output_tokens": 5},
)
CLAUDE_TEXT = anthropic(block(0, {"type": "text", "text": ""}, text("42")), stop_reason="end_turn")

# docs/areal.md §10.5-§10.6: AReaL's /v1/messages stream through LiteLLM. message_start echoes the
# request's model with usage 0/0; message_delta carries the real usage; the tool input arrives in
# one delta.
AREAL_MESSAGE = {
    **MESSAGE_START["message"],
    "model": "claude-x",
    "usage": {"input_tokens": 0, "output_tokens": 0},
}
AREAL_MESSAGE_START = {"type": "message_start", "message": AREAL_MESSAGE}
AREAL_ANTHROPIC_TOOL_USE = b"".join(
    [
        sse_event(AREAL_MESSAGE_START),
        block(0, {"type": "text", "text": ""}),
        block(
            1,
            {"type": "tool_use", "id": "call_c", "name": "get_weather", "input": {}},
            {"type": "input_json_delta", "partial_json": '{"city": "Paris"}'},
        ),
        sse_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                "usage": {"input_tokens": 18, "output_tokens": 6},
            },
        ),
        sse_event({"type": "message_stop"}),
    ]
)

CITATION = {"type": "char_location", "cited_text": "6 * 7", "document_index": 0}
THINKING = anthropic(
    block(
        0,
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "thinking_delta", "thinking": "six times "},
        {"type": "thinking_delta", "thinking": "seven"},
        {"type": "signature_delta", "signature": "c2ln"},
    ),
    block(
        1,
        {"type": "text", "text": ""},
        text("4"),
        {"type": "citations_delta", "citation": CITATION},
        text("2"),
    ),
    stop_reason="end_turn",
)

RESPONSE_USAGE = {"input_tokens": 30, "output_tokens": 2, "total_tokens": 32}
MESSAGE_ITEM = {"id": "msg_9", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
DONE_ITEM = {
    **MESSAGE_ITEM,
    "status": "completed",
    "content": [{"type": "output_text", "text": "42", "annotations": []}],
}
RESPONSE = {"id": "resp_9", "object": "response", "created_at": 1764457200, "model": "gpt-x", "output": []}


def responses(*events: tuple[str, dict[str, Any]]) -> bytes:
    """Responses events as the API frames them: `event: <type>` and a data line, sequence-numbered."""
    return b"".join(
        sse_event({"type": kind, "sequence_number": number, **obj})
        for number, (kind, obj) in enumerate(events)
    )


TEXT_PART = {"item_id": "msg_9", "output_index": 0, "content_index": 0}
EMPTY_TEXT = {"type": "output_text", "text": "", "annotations": []}
RESPONSES_TEXT_EVENTS = [
    ("response.created", {"response": {**RESPONSE, "status": "in_progress"}}),
    ("response.in_progress", {"response": {**RESPONSE, "status": "in_progress"}}),
    ("response.output_item.added", {"output_index": 0, "item": MESSAGE_ITEM}),
    ("response.content_part.added", {**TEXT_PART, "part": EMPTY_TEXT}),
    ("response.output_text.delta", {**TEXT_PART, "delta": "4"}),
    ("response.output_text.delta", {**TEXT_PART, "delta": "2"}),
    ("response.output_text.done", {**TEXT_PART, "text": "42"}),
    ("response.content_part.done", {**TEXT_PART, "part": DONE_ITEM["content"][0]}),
    ("response.output_item.done", {"output_index": 0, "item": DONE_ITEM}),
]
RESPONSES_BODY = {**RESPONSE, "status": "completed", "output": [DONE_ITEM], "usage": RESPONSE_USAGE}
RESPONSES_TEXT = responses(*RESPONSES_TEXT_EVENTS, ("response.completed", {"response": RESPONSES_BODY}))

TRANSCRIPTS = {
    "opencode tool call": ("chat", OPENCODE_TOOL_CALL),
    "opencode text": ("chat", OPENCODE_TEXT),
    "AReaL text": ("chat", AREAL_TEXT),
    "AReaL 1.0.4 one-chunk tool call": ("chat", AREAL_TOOL_CALL),
    "reasoning, parallel tool calls": ("chat", REASONING_PARALLEL_CALLS),
    "legacy completions": ("completions", COMPLETIONS),
    "Claude Code tool use": ("messages", CLAUDE_TOOL_USE),
    "Claude Code text": ("messages", CLAUDE_TEXT),
    "AReaL Anthropic tool use": ("messages", AREAL_ANTHROPIC_TOOL_USE),
    "thinking": ("messages", THINKING),
    "Responses text": ("responses", RESPONSES_TEXT),
}


def assemble(endpoint: str, *chunks: bytes) -> Assembled:
    assembler = StreamAssembler(dialects.named(endpoint))
    for piece in chunks:
        assembler.feed(piece)
    return assembler.result()


def decode(*chunks: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = [e for piece in chunks for e in decoder.feed(piece)]
    return events + decoder.flush()


# --- the decoder --------------------------------------------------------------------------------


def test_decoder_reads_fields_comments_and_multiline_data() -> None:
    stream = b": keep-alive\nevent: update\nid: 7\ndata: first\ndata:second\ndata:  third\n\n"
    stream += b"retry: 1500\ndata\n\n"
    decoder = SSEDecoder()
    assert decoder.feed(stream) == [
        SSEEvent("update", "first\nsecond\n third", "7"),
        SSEEvent("message", "", "7"),  # the id persists across events, as the spec says
    ]
    assert decoder.retry_ms == 1500


def test_decoder_ignores_what_the_spec_ignores() -> None:
    stream = b"event: ping\n\nid: a\x00b\nretry: 10s\nfoo: bar\ndata: x\n\n"
    decoder = SSEDecoder()
    # an event without data is not dispatched; an id with NUL, a non-numeric retry and unknown fields
    # are ignored
    assert decoder.feed(stream) == [SSEEvent("message", "x", None)]
    assert decoder.retry_ms is None


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_decoder_accepts_every_line_ending(ending: bytes) -> None:
    stream = b"event: e\ndata: a\ndata: b\n\ndata: c\n\n".replace(b"\n", ending)
    assert decode(stream) == [SSEEvent("e", "a\nb"), SSEEvent("message", "c")]


def test_decoder_joins_a_cr_and_lf_split_across_chunks() -> None:
    # Were the \n opening the second chunk a line end of its own, it would be a blank line and
    # dispatch "a" alone.
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\ndata: b\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r") == [SSEEvent("message", "a\nb")]
    assert decoder.feed(b"\ndata: c\r\n\r\n") == [SSEEvent("message", "c")]


def test_decoder_strips_one_leading_bom_even_split_across_chunks() -> None:
    assert decode(b"\xef", b"\xbb", b"\xbfdata: x\n\n") == [SSEEvent("message", "x")]
    # Only at the very start: later, a BOM is part of the field name, which then means nothing.
    assert decode(b"data: x\n\n\xef\xbb\xbfdata: y\n\n") == [SSEEvent("message", "x")]


def test_decoder_keeps_utf8_characters_split_across_chunks() -> None:
    stream = "data: héllo — 日本 🎉\n\n".encode()
    expected = [SSEEvent("message", "héllo — 日本 🎉")]
    for cut in range(len(stream)):
        assert decode(stream[:cut], stream[cut:]) == expected


def test_decoder_replaces_invalid_utf8_instead_of_raising() -> None:
    assert decode(b"data: \xff\xfe\n\n") == [SSEEvent("message", "\ufffd\ufffd")]


def test_flush_returns_an_event_the_stream_did_not_finish() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]\n\ndata: tail") == [SSEEvent("message", "[DONE]")]
    assert decoder.flush() == [SSEEvent("message", "tail")]
    assert decoder.flush() == []


@pytest.mark.parametrize("name", sorted(TRANSCRIPTS))
def test_every_split_gives_the_same_events_and_body(name: str) -> None:
    endpoint, stream = TRANSCRIPTS[name]
    events = decode(stream)
    whole = assemble(endpoint, stream)
    assert whole.complete and whole.error is None and whole.events == len(events)
    for cut in range(1, len(stream)):
        assert decode(stream[:cut], stream[cut:]) == events, cut
        assert assemble(endpoint, stream[:cut], stream[cut:]) == whole, cut
    one_by_one = [stream[i : i + 1] for i in range(len(stream))]
    assert decode(*one_by_one) == events
    assert assemble(endpoint, *one_by_one) == whole


@pytest.mark.parametrize("ending", [b"\r\n", b"\r"])
@pytest.mark.parametrize("name", ["opencode tool call", "Claude Code tool use", "Responses text"])
def test_every_split_with_other_line_endings(name: str, ending: bytes) -> None:
    endpoint, stream = TRANSCRIPTS[name]
    whole = assemble(endpoint, stream)
    other = stream.replace(b"\n", ending)
    assert decode(other) == decode(stream)
    for cut in range(1, len(other)):
        assert assemble(endpoint, other[:cut], other[cut:]) == whole, cut


# --- assembled bodies --------------------------------------------------------------------------------


def test_opencode_tool_call_rebuilds_the_non_streamed_body() -> None:
    assert assemble("chat", OPENCODE_TOOL_CALL) == Assembled(OPENCODE_TOOL_CALL_BODY, 7, True, None)


def test_opencode_text_turn() -> None:
    body = assemble("chat", OPENCODE_TEXT).body
    assert body is not None
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "42"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == USAGE


def test_areal_text_takes_usage_from_the_finishing_chunk() -> None:
    result = assemble("chat", AREAL_TEXT)
    assert result.complete and result.events == 4
    assert result.body == {
        "id": "chatcmpl-" + "a" * 29,
        "object": "chat.completion",
        "created": 1764457200,
        "model": "None",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Echo: hello proxy"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": AREAL_USAGE,
    }


def test_areal_one_chunk_tool_call() -> None:
    body = assemble("chat", AREAL_TOOL_CALL).body
    assert body is not None
    assert body["choices"][0]["message"]["tool_calls"] == [
        {
            "id": "call_" + "b" * 24,
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_and_interleaved_parallel_tool_calls() -> None:
    body = assemble("chat", REASONING_PARALLEL_CALLS).body
    assert body is not None
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == "Two cities."
    assert message["content"] is None  # no content delta ever arrived, as a non-streamed body says
    assert [(c["id"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("call_a", '{"city": "Rome"}'),
        ("call_b", '{"city": "Oslo"}'),
    ]


def test_chat_keeps_choices_apart_and_concatenates_logprobs() -> None:
    def choice(index: int, text: str, token: str) -> dict[str, Any]:
        logprobs = {"content": [{"token": token, "logprob": -0.5}]}
        return {"index": index, "delta": {"content": text}, "finish_reason": None, "logprobs": logprobs}

    stream = b"".join(
        [
            sse_data({**chunk({}), "choices": [choice(1, "b", "b"), choice(0, "a", "a")]}),
            sse_data({**chunk({}), "choices": [choice(0, "c", "c")]}),
            SSE_DONE,
        ]
    )
    body = assemble("chat", stream).body
    assert body is not None
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "ac"), (1, "b")]
    assert [t["token"] for t in body["choices"][0]["logprobs"]["content"]] == ["a", "c"]


def test_legacy_completions() -> None:
    assert assemble("completions", COMPLETIONS) == Assembled(COMPLETIONS_BODY, 4, True, None)


def test_claude_code_tool_use_parses_the_concatenated_partial_json() -> None:
    assert assemble("messages", CLAUDE_TOOL_USE) == Assembled(CLAUDE_TOOL_USE_BODY, 8, True, None)


def test_claude_code_text_turn() -> None:
    body = assemble("messages", CLAUDE_TEXT).body
    assert body is not None
    assert body["content"] == [{"type": "text", "text": "42"}]
    assert body["stop_reason"] == "end_turn"


def test_areal_anthropic_usage_merges_message_start_and_message_delta() -> None:
    body = assemble("messages", AREAL_ANTHROPIC_TOOL_USE).body
    assert body is not None
    assert body["model"] == "claude-x"
    assert body["usage"] == {"input_tokens": 18, "output_tokens": 6}
    assert body["content"] == [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_c", "name": "get_weather", "input": {"city": "Paris"}},
    ]


def test_thinking_blocks_keep_text_and_signature() -> None:
    body = assemble("messages", THINKING).body
    assert body is not None
    assert body["content"] == [
        {"type": "thinking", "thinking": "six times seven", "signature": "c2ln"},
        {"type": "text", "text": "42", "citations": [CITATION]},
    ]


def test_message_delta_keeps_cache_counts_it_leaves_out() -> None:
    usage = {**ANTHROPIC_USAGE, "cache_read_input_tokens": 9}
    start = {**MESSAGE_START, "message": {**MESSAGE_START["message"], "usage": usage}}
    stream = CLAUDE_TEXT.replace(sse_event(MESSAGE_START), sse_event(start))
    body = assemble("messages", stream).body
    assert body is not None
    assert body["usage"] == {**usage, "output_tokens": 5}


def test_responses_body_is_the_completed_response() -> None:
    assert assemble("responses", RESPONSES_TEXT) == Assembled(RESPONSES_BODY, 10, True, None)


def test_responses_cut_short_rebuilds_the_output_so_far() -> None:
    stream = responses(*RESPONSES_TEXT_EVENTS[:6])  # up to the second text delta
    result = assemble("responses", stream)
    assert not result.complete
    assert result.error == "stream ended before response.completed after 6 events"
    assert result.body == {
        **RESPONSE,
        "status": "in_progress",
        "output": [{**MESSAGE_ITEM, "content": [{"type": "output_text", "text": "42", "annotations": []}]}],
    }


def test_responses_cut_short_keeps_partial_function_arguments() -> None:
    item = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "bash", "arguments": ""}
    stream = responses(
        ("response.created", {"response": {**RESPONSE, "status": "in_progress"}}),
        ("response.output_item.added", {"output_index": 0, "item": item}),
        ("response.function_call_arguments.delta", {"output_index": 0, "delta": '{"comm'}),
        ("response.function_call_arguments.delta", {"output_index": 0, "delta": 'and": "ls"'}),
    )
    body = assemble("responses", stream).body
    assert body is not None
    assert body["output"] == [{**item, "arguments": '{"command": "ls"'}]


def test_garbage_indices_count_as_zero() -> None:
    # Negative, huge or non-integer indices must neither raise nor make a part list grow to match.
    stream = responses(
        ("response.created", {"response": {**RESPONSE, "status": "in_progress"}}),
        ("response.output_item.added", {"output_index": -1, "item": MESSAGE_ITEM}),
        ("response.content_part.added", {**TEXT_PART, "content_index": 10**12, "part": EMPTY_TEXT}),
        ("response.output_text.delta", {**TEXT_PART, "content_index": "0", "delta": "42"}),
    )
    result = assemble("responses", stream)
    assert result.body is not None
    assert result.body["output"] == [{**MESSAGE_ITEM, "content": [{**EMPTY_TEXT, "text": "42"}]}]
    assert result.error == "stream ended before response.completed after 4 events"


def test_responses_incomplete_is_a_proper_end() -> None:
    details = {"reason": "max_output_tokens"}
    incomplete = {**RESPONSES_BODY, "status": "incomplete", "incomplete_details": details}
    stream = responses(*RESPONSES_TEXT_EVENTS, ("response.incomplete", {"response": incomplete}))
    assert assemble("responses", stream) == Assembled(incomplete, 10, True, None)


# --- agreement with the official SDKs' own stream accumulators -------------------------------------


def without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [without_none(item) for item in value]
    return value


def sdk_view(body: dict[str, Any]) -> dict[str, Any]:
    """What a chat completion says, as (content, reasoning, tool calls, finish reason) per choice."""
    return {
        "id": body["id"],
        "model": body["model"],
        "usage": without_none(body.get("usage")),
        "choices": [
            (
                c["message"].get("content"),
                c["message"].get("reasoning_content"),
                [
                    (t["id"], t["function"]["name"], t["function"]["arguments"])
                    for t in c["message"].get("tool_calls") or []
                ],
                c["finish_reason"],
            )
            for c in body["choices"]
        ],
    }


@pytest.mark.parametrize(
    "name", sorted(name for name, (endpoint, _) in TRANSCRIPTS.items() if endpoint == "chat")
)
def test_chat_bodies_agree_with_the_openai_sdk(name: str) -> None:
    stream = TRANSCRIPTS[name][1]
    state = ChatCompletionStreamState()  # what openai-py's `chat.completions.stream()` accumulates with
    for e in decode(stream):
        if e.data != "[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(e.data)))
    body = assemble("chat", stream).body
    assert body is not None
    ChatCompletion.model_validate(body)  # a valid non-streamed body by the SDK's own types
    assert sdk_view(body) == sdk_view(state.get_final_completion().model_dump())


@pytest.mark.parametrize(
    "name", sorted(name for name, (endpoint, _) in TRANSCRIPTS.items() if endpoint == "messages")
)
def test_message_bodies_agree_with_the_anthropic_sdk(name: str) -> None:
    stream = TRANSCRIPTS[name][1]
    # accumulate_event is what anthropic-py's MessageStream builds its final message with (private in
    # 2.14.0; the version is pinned).
    snapshot, buffers = None, {}
    for e in decode(stream):
        obj = json.loads(e.data)
        if obj["type"] != "ping":
            snapshot = accumulate_event(event=obj, current_snapshot=snapshot, json_bufs=buffers)
    assert snapshot is not None
    assert without_none(assemble("messages", stream).body) == without_none(snapshot.model_dump())


# --- malformed streams --------------------------------------------------------------------------------


def test_data_that_is_not_json_is_named_with_its_event_number() -> None:
    stream = sse_data(chunk({"role": "assistant"})) + sse_data(chunk({"content": "4"}))
    stream += b"data: {not json\n\n" + SSE_DONE
    result = assemble("chat", stream)
    assert result.error == "event 3: data is not JSON: '{not json'"
    assert result.complete and result.events == 4
    assert result.body is not None and result.body["choices"][0]["message"]["content"] == "4"


def test_claude_code_bad_sse_stand_in() -> None:
    # docs/agents.md §4.4 (error injection: §0): the stand-in's `badsse` mode on /v1/messages.
    result = assemble("messages", b"event: message_start\ndata: {not json\n\n")
    assert result == Assembled(None, 1, False, "event 1: data is not JSON: '{not json'")


def test_long_bad_data_is_quoted_short() -> None:
    result = assemble("chat", b"data: " + b"x" * 500 + b"\n\n")
    assert result.error == "event 1: data is not JSON: '" + "x" * 80 + "…'"


def test_json_that_is_not_an_object() -> None:
    result = assemble("chat", b"data: [1, 2]\n\n" + SSE_DONE)
    assert result.error == "event 1: data is not a JSON object: '[1, 2]'"


@pytest.mark.parametrize(
    ("endpoint", "stream"), [("messages", CLAUDE_TOOL_USE), ("responses", RESPONSES_TEXT)]
)
def test_missing_terminal_event_is_a_truncated_stream(endpoint: str, stream: bytes) -> None:
    last = stream.rstrip(b"\n").rfind(b"\n\n") + 2
    result = assemble(endpoint, stream[:last])
    end = {"messages": "message_stop", "responses": "response.completed"}[endpoint]
    events = len(decode(stream)) - 1
    assert result.complete is False
    assert result.error == f"stream ended before {end} after {events} events"


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_chunk_stream_is_whole_once_every_choice_finished_without_done(endpoint: str) -> None:
    """transformers serve ends its streams at the finish chunk, which carries the usage, and never
    sends [DONE] (docs/engines.md §8): whole. Cut before a choice finished: truncated."""
    stream = OPENCODE_TEXT if endpoint == "chat" else COMPLETIONS
    events = decode(stream)
    assert events[-1].data == "[DONE]"
    without_done = stream[: stream.rindex(b"data: [DONE]")]
    whole = assemble(endpoint, without_done)
    assert whole == Assembled(assemble(endpoint, stream).body, len(events) - 1, True, None)
    finish = next(i for i, e in enumerate(events) if '"finish_reason":"' in e.data.replace(" ", ""))
    cut = stream[: stream.index(events[finish].data.encode()) - len(b"data: ")]
    truncated = assemble(endpoint, cut)
    assert truncated.complete is False
    assert truncated.error == f"stream ended before [DONE] after {finish} events"


def test_two_choices_are_whole_only_when_both_finished() -> None:
    first = sse_data({**chunk({}, "stop"), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    second = sse_data(
        {**chunk({}, None), "choices": [{"index": 1, "delta": {"content": "x"}, "finish_reason": None}]}
    )
    assert not assemble("chat", second, first).complete
    done = sse_data({**chunk({}, None), "choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]})
    assert assemble("chat", second, first, done).complete


def test_truncated_mid_event() -> None:
    cut = OPENCODE_TOOL_CALL.index(b"data: ", len(sse_data(chunk({"role": "assistant", "content": ""})))) + 20
    result = assemble("chat", OPENCODE_TOOL_CALL[:cut])
    assert result.complete is False
    assert result.error == 'event 2: stream ended mid-event: \'{"id":"chatcmp\''
    assert result.body is not None and result.body["choices"][0]["message"]["content"] == ""


def test_truncated_tool_input_keeps_the_raw_json() -> None:
    cut = CLAUDE_TOOL_USE.index(b"event: content_block_stop")
    body = assemble("messages", CLAUDE_TOOL_USE[:cut]).body
    assert body is not None
    assert body["content"][0]["input"] == json.loads(ARGUMENTS)  # both deltas arrived before the cut
    cut = CLAUDE_TOOL_USE.index(b"event: content_block_delta", CLAUDE_TOOL_USE.index(b"input_json_delta") + 1)
    body = assemble("messages", CLAUDE_TOOL_USE[:cut]).body
    assert body is not None
    assert body["content"][0]["input"] == ARGUMENTS[:40]


def test_the_stream_ending_before_anything_arrived() -> None:
    assert assemble("chat") == Assembled(None, 0, False, "stream ended before [DONE] after 0 events")


def test_openai_error_event_mid_stream() -> None:
    # docs/token-budgets.md §1.4, §2.3: SGLang and vLLM send errors mid-stream as `data: {"error": {...}}`.
    error = {"error": {"message": "engine died", "type": "InternalServerError", "param": None, "code": 500}}
    result = assemble("chat", sse_data(chunk({"content": "4"})) + sse_data(error) + SSE_DONE)
    assert result.error == "event 2: upstream error: InternalServerError: engine died"
    assert result.complete is True


def test_long_upstream_error_is_cut_and_a_bare_string_is_its_message() -> None:
    # docs/areal.md §4.1: "Failed after N retries" carries the whole prompt's token ids.
    detail = "Failed after 3 retries each. Payload: " + "151644, " * 5000
    result = assemble("chat", sse_data({"error": {"message": detail}}) + SSE_DONE)
    assert result.error == "event 1: upstream error: " + detail[:1000] + "…"
    assert assemble("chat", sse_data({"error": "boom"}) + SSE_DONE).error == "event 1: upstream error: boom"


def test_anthropic_error_event() -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    result = assemble("messages", sse_event(MESSAGE_START) + sse_event(error))
    assert result.error == "event 2: upstream error: overloaded_error: Overloaded"
    assert result.complete is False
    assert result.body is not None and result.body["id"] == "msg_01"


def test_responses_error_and_failed_events() -> None:
    error_event = responses(("error", {"code": "server_error", "message": "boom", "param": None}))
    assert assemble("responses", error_event).error == "event 1: upstream error: server_error: boom"
    failed = {**RESPONSE, "status": "failed", "error": {"code": "server_error", "message": "fell over"}}
    result = assemble("responses", responses(("response.failed", {"response": failed})))
    assert result == Assembled(failed, 1, True, "event 1: upstream error: server_error: fell over")


def test_done_ends_only_openai_chunk_streams() -> None:
    with_done, without = assemble("messages", CLAUDE_TEXT + SSE_DONE), assemble("messages", CLAUDE_TEXT)
    assert (with_done.body, with_done.complete, with_done.error) == (without.body, True, None)
    result = assemble("messages", sse_event(MESSAGE_START) + SSE_DONE)
    assert result.complete is False and result.error is not None and "message_stop" in result.error


def test_events_after_the_end_are_counted_not_merged() -> None:
    result = assemble("chat", OPENCODE_TEXT + sse_data(chunk({"content": "late"})))
    assert result.events == 7
    assert result.body is not None and result.body["choices"][0]["message"]["content"] == "42"
    assert result.error is None


def test_result_is_final() -> None:
    assembler = StreamAssembler(dialects.named("chat"))
    assembler.feed(OPENCODE_TEXT)
    first = assembler.result()
    assembler.feed(sse_data(chunk({"content": "more"})))
    assert assembler.result() is first


def test_only_a_format_that_streams_has_an_assembler() -> None:
    assert not isinstance(dialects.named("embeddings"), Streams)
    assert not hasattr(dialects.named("embeddings"), "assembler")


# --- never raises -------------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


# Values of the wrong type or range for whatever field they land in, tried before arbitrary JSON.
WRONG = st.sampled_from([None, True, 0, -1, 10**12, 1.5, "", "x", [], [1], {}, {"type": "x"}]) | JSON


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value, the value itself included."""
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        items = ()
    return [prefix, *(path for key, item in items for path in paths(item, (*prefix, key)))]


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def corrupted_transcripts(draw: st.DrawFn) -> tuple[str, bytes]:
    """A real transcript with a few places in its events given wrong values, so every branch of every
    assembler meets values of every JSON type where it expects a particular one."""
    endpoint, stream = TRANSCRIPTS[draw(st.sampled_from(sorted(TRANSCRIPTS)))]
    bodies = [json.loads(e.data) for e in decode(stream) if e.data != "[DONE]"]
    for _ in range(draw(st.integers(1, 3))):
        places = [(index, path) for index, body in enumerate(bodies) for path in paths(body)]
        index, path = draw(st.sampled_from(places))
        bodies[index] = replaced(bodies[index], path, draw(WRONG))
    return endpoint, b"".join(sse_data(body) for body in bodies) + SSE_DONE


@settings(max_examples=500, deadline=None)
@given(corrupted_transcripts())
def test_no_event_shape_breaks_an_assembler(transcript: tuple[str, bytes]) -> None:
    result = assemble(*transcript)
    assert result.error is None or "assembler failed" not in result.error, result.error


@settings(max_examples=300, deadline=None)
@given(
    endpoint=st.sampled_from(["chat", "completions", "responses", "messages"]),
    stream=st.binary(max_size=200) | st.sampled_from(list(TRANSCRIPTS.values())).map(lambda t: t[1]),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=5),
)
def test_any_bytes_in_any_pieces(endpoint: str, stream: bytes, cuts: list[int]) -> None:
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    result = assemble(endpoint, *(stream[a:b] for a, b in itertools.pairwise(bounds)))
    assert result.error is None or "assembler failed" not in result.error, result.error
