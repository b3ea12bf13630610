"""Tests for the translation half of modeltap/dialects/: Anthropic Messages and Responses requests as
OpenAI chat (anthropic_messages.py, openai_responses.py), their streams written from chat chunks as
they arrive, chat upstream errors in each client's shape (base.py), and the chat side they share
(openai_chat.py: `chunks`, `ChatDeltas`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from modeltap import dialects
from modeltap.compat.layouts import parse_error
from modeltap.dialects.openai_chat import ChatDeltas, chunks

MESSAGES = dialects.named("messages")
RESPONSES = dialects.named("responses")
CHAT = dialects.named("chat")
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}}


def chat_reply(
    content: str | None = "42", calls: list[Any] | None = None, finish: str = "stop"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    }


BASH_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
}


def translated(dialect: Any, chat: dict[str, Any], request: dict[str, Any] | None = None) -> dict[str, Any]:
    """The client's body, written from `chat`'s chunks by the dialect's translator and assembled."""
    translator = dialect.chat_translator(request or {"model": "claude-x"})
    assembler = dialect.assembler()
    events = [
        e for chunk in chunks(chat, include_usage=True) for e in translator.feed(chunk)
    ] + translator.end()
    for event in events:
        assembler.add(event)
    body = assembler.body()
    assert body is not None
    return body


# -- Anthropic Messages -> chat ---------------------------------------------------------------------------


def test_a_messages_request_as_chat_keeps_system_tools_and_tool_ids() -> None:
    body = {
        "model": "claude-x",
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "max_tokens": 1000,
        "stop_sequences": ["END"],
        "stream": True,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "tools": [
            {"name": "Bash", "description": "shell", "input_schema": BASH_SCHEMA},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "messages": [
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "use ls", "signature": "sig"},
                    {"type": "text", "text": "Running it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "no such dir",
                        "is_error": True,
                    },
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                    },
                    {"type": "text", "text": "why?"},
                ],
            },
        ],
    }
    chat = MESSAGES.chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "Running it.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command": "ls"}'},
                }
            ],
            "reasoning_content": "use ls",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such dir"},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "why?"},
            ],
        },
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "Bash", "parameters": BASH_SCHEMA, "description": "shell"}}
    ]
    assert (chat["tool_choice"], chat["parallel_tool_calls"]) == ("required", False)
    assert (chat["max_completion_tokens"], chat["stop"], chat["stream"]) == (1000, ["END"], True)
    assert chat["stream_options"] == {"include_usage": True}


def test_a_late_system_message_reaches_a_chat_server_as_a_noted_user_message() -> None:
    body = {
        "model": "claude-opus-5-5",
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "env"}],
    }
    roles = [m["role"] for m in MESSAGES.chat_request(body)["messages"]]
    assert roles == ["user", "user"]


def test_a_chat_tool_call_comes_back_as_a_tool_use_block_with_its_id() -> None:
    body = translated(MESSAGES, chat_reply("", [BASH_CALL], "tool_calls"))
    assert body["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "bash", "input": {"command": "ls"}}
    ]
    assert (body["stop_reason"], body["model"]) == ("tool_use", "claude-x")
    assert body["usage"] == {"input_tokens": 30, "output_tokens": 5}


@pytest.mark.parametrize(
    ("finish", "stop"),
    [("stop", "end_turn"), ("length", "max_tokens"), ("content_filter", "refusal"), ("odd", "end_turn")],
)
def test_finish_reasons_map_to_stop_reasons(finish: str, stop: str) -> None:
    assert translated(MESSAGES, chat_reply(finish=finish))["stop_reason"] == stop


def test_reasoning_comes_back_as_a_thinking_block_before_the_text() -> None:
    chat = chat_reply("42")
    chat["choices"][0]["message"]["reasoning_content"] = "six times seven"
    blocks = translated(MESSAGES, chat)["content"]
    assert [(b["type"], b.get("thinking") or b.get("text")) for b in blocks] == [
        ("thinking", "six times seven"),
        ("text", "42"),
    ]


def test_a_reply_with_nothing_in_it_still_has_a_text_block() -> None:
    assert translated(MESSAGES, chat_reply(""))["content"] == [{"type": "text", "text": ""}]


def test_cached_prompt_tokens_are_counted_apart_as_anthropic_does() -> None:
    chat = chat_reply()
    chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 20}
    assert translated(MESSAGES, chat)["usage"] == {
        "input_tokens": 10,
        "output_tokens": 5,
        "cache_read_input_tokens": 20,
    }


# -- Responses -> chat ------------------------------------------------------------------------------------


def test_a_responses_request_as_chat() -> None:
    body = {
        "model": "m",
        "instructions": "be brief",
        "max_output_tokens": 500,
        "tool_choice": {"type": "function", "name": "exec_command"},
        "parallel_tool_calls": False,
        "tools": [
            {"type": "function", "name": "exec_command", "description": "run", "parameters": BASH_SCHEMA},
            {"type": "web_search"},
        ],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "you code"}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "list"},
                    {"type": "input_image", "image_url": "data:x"},
                ],
            },
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "ls it"}]},
            {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
    }
    chat = RESPONSES.chat_request(body)
    assert chat["messages"] == [
        {"role": "system", "content": "be brief\n\nyou code"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "list"},
                {"type": "image_url", "image_url": {"url": "data:x"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "ls it",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "exec_command"}}
    assert (chat["parallel_tool_calls"], chat["max_completion_tokens"]) == (False, 500)


def test_a_chained_request_continues_the_kept_conversation_with_its_own_instructions() -> None:
    first = {"model": "m", "instructions": "old", "input": "hi"}
    sent = RESPONSES.chat_request(first)
    kept = RESPONSES.continued(first, sent, chat_reply("hello"))
    assert kept == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    second = {"model": "m", "instructions": "new", "previous_response_id": "resp_1", "input": "again"}
    assert RESPONSES.previous_id(second) == "resp_1"
    assert [m["content"] for m in RESPONSES.chat_request(second, kept)["messages"]] == [
        "new",
        "hi",
        "hello",
        "again",
    ]


def test_a_response_asked_not_to_be_stored_is_not_kept() -> None:
    assert RESPONSES.reply_id({"store": False}, {"id": "resp_1"}) is None
    assert RESPONSES.reply_id({}, {"id": "resp_1"}) == "resp_1"


def test_a_chat_tool_call_comes_back_as_a_function_call_item() -> None:
    body = translated(RESPONSES, chat_reply("", [BASH_CALL], "tool_calls"), {"model": "m", "tools": []})
    [item] = body["output"]
    assert (item["type"], item["call_id"], item["name"], item["arguments"]) == (
        "function_call",
        "call_1",
        "bash",
        '{"command": "ls"}',
    )
    assert (
        body["status"] == "completed"
        and body["usage"]["input_tokens"] == 30
        and body["usage"]["total_tokens"] == 35
    )


def test_a_cut_off_reply_is_an_incomplete_response() -> None:
    body = translated(RESPONSES, chat_reply("4", finish="length"), {"model": "m"})
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert RESPONSES.summary({}, body).text == "4"


def test_response_events_are_numbered_in_order() -> None:
    translator = RESPONSES.chat_translator({"model": "m"})
    events = [
        e for c in chunks(chat_reply("42"), include_usage=True) for e in translator.feed(c)
    ] + translator.end()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"


# -- streams as they arrive -------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", [MESSAGES, RESPONSES], ids=lambda d: d.name)
def test_each_chunk_is_translated_when_it_arrives(dialect: Any) -> None:
    """No buffering: a text piece is in the events of the chunk that carried it; the closing events
    wait only for the chat stream's end."""
    translator = dialect.chat_translator({"model": "m"})
    stamp = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for piece in ("4", "2"):
        events = translator.feed({**stamp, "choices": [{"index": 0, "delta": {"content": piece}}]})
        assert piece in json.dumps(events)
    finish = translator.feed({**stamp, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert not any(e["type"] in ("message_stop", "response.completed") for e in finish)
    assert translator.end()[-1]["type"] in ("message_stop", "response.completed")


@pytest.mark.parametrize("dialect", [MESSAGES, RESPONSES], ids=lambda d: d.name)
def test_a_chat_stream_cut_before_its_finish_gets_no_closing_events(dialect: Any) -> None:
    translator = dialect.chat_translator({"model": "m"})
    translator.feed({"id": "c", "choices": [{"index": 0, "delta": {"content": "4"}}]})
    assert translator.end() == []


@pytest.mark.parametrize("dialect", [MESSAGES, RESPONSES], ids=lambda d: d.name)
def test_arguments_streamed_in_pieces_reassemble(dialect: Any) -> None:
    translator = dialect.chat_translator({"model": "m"})
    assembler = dialect.assembler()
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": ""}}
    deltas = [
        {"tool_calls": [head]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"command": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]},
    ]
    events = [e for d in deltas for e in translator.feed({"id": "c", "choices": [{"index": 0, "delta": d}]})]
    events += translator.feed(
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    )
    for event in events + translator.end():
        assembler.add(event)
    [call] = dialect.summary({}, assembler.body()).tool_calls
    assert (call["id"], call["name"], json.loads(call["arguments"] or "")) == (
        "call_1",
        "bash",
        {"command": "ls"},
    )


def test_chat_deltas_name_each_tool_call_once() -> None:
    deltas = ChatDeltas()
    call = {"index": 0, "id": "c1", "function": {"name": "bash", "arguments": "{}"}}
    first = deltas.read({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    again = deltas.read(
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": " "}}]}}]}
    )
    assert first == [("call", 0, {"id": "c1", "name": "bash"}), ("arguments", 0, "{}")]
    assert again == [("arguments", 0, " ")]


def test_chat_chunks_rebuild_the_completion() -> None:
    chat = chat_reply("", [BASH_CALL], "tool_calls")
    assembler = CHAT.assembler()
    for chunk in chunks(chat, include_usage=True):
        assembler.add(chunk)
    assert assembler.body()["choices"][0]["message"]["tool_calls"] == [BASH_CALL]  # type: ignore[index]


# -- errors -----------------------------------------------------------------------------------------------


AREAL_OVERFLOW = (
    b'{"detail": "Streaming setup failed: 500: len of prompt tokens 609 exceeds max_total_tokens 256"}'
)


def test_an_upstream_overflow_is_claude_codes_prompt_too_long_400() -> None:
    status, error = MESSAGES.upstream_error(500, parse_error(500, AREAL_OVERFLOW))
    assert status == 400
    assert MESSAGES.error_body(error) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 609 tokens > 256 maximum. The upstream said: "
            "Streaming setup failed: 500: len of prompt tokens 609 exceeds max_total_tokens 256",
        },
    }


def test_an_overflow_without_numbers_still_says_prompt_is_too_long() -> None:
    info = parse_error(400, {"error": {"message": "too big", "code": "context_length_exceeded"}})
    assert MESSAGES.upstream_error(400, info)[1].message == "prompt is too long: too big"


def test_an_upstream_overflow_is_codexs_context_length_exceeded() -> None:
    status, error = RESPONSES.upstream_error(500, parse_error(500, AREAL_OVERFLOW))
    body = RESPONSES.error_body(error)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in body["error"]["message"]


@pytest.mark.parametrize(
    ("status", "kind"), [(404, "not_found_error"), (429, "rate_limit_error"), (502, "api_error")]
)
def test_other_upstream_errors_keep_their_status_and_message(status: int, kind: str) -> None:
    answered, error = MESSAGES.upstream_error(status, parse_error(status, b'{"detail": "nope"}'))
    assert (answered, error.message, MESSAGES.error_body(error)["error"]["type"]) == (status, "nope", kind)


def test_an_error_chunk_mid_stream_is_an_error_event_in_each_format_and_other_choices_are_left_out() -> None:
    # vLLM and SGLang end a failing stream with a chunk holding `error` instead of choices; a request
    # translated to chat asked for one choice, so a chunk of another is not the client's.
    stamp = {"id": "c", "model": "m"}
    stream = [
        {**stamp, "choices": [{"index": 0, "delta": {"content": "4"}}]},
        {**stamp, "choices": [{"index": 1, "delta": {"content": "not ours"}}]},
        {**stamp, "error": {"message": "engine died", "code": 500}},
    ]
    anthropic = MESSAGES.chat_translator({"model": "m"})
    events = [e for chunk in stream for e in anthropic.feed(chunk)]
    assert "not ours" not in json.dumps(events)
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "engine died"}}
    responses = RESPONSES.chat_translator({"model": "m"})
    last = [e for chunk in stream for e in responses.feed(chunk)][-1]
    assert (last["type"], last["code"], last["message"]) == ("error", "upstream_error", "engine died")
    assert ChatDeltas().read({"error": "plain text"}) == [("error", 0, "plain text")]
