"""modeltap/exporters/export.py: re-synthesised streams, HAR 1.2, JSON lines, and the SFT conversation."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from modeltap import dialects
from modeltap.dialects.sse import StreamAssembler, split_events
from modeltap.exporters.export import write_export
from modeltap.exporters.har import har
from modeltap.exporters.jsonl import JSONL_FORMAT_VERSION
from modeltap.exporters.messages import conversation
from modeltap.records.exchange import Exchange
from modeltap.records.reader import StoreReader
from modeltap.records.streams import stream_events
from modeltap.testing import exchange
from tests.factories import (
    assistant,
    chat_completion,
    function_call_item,
    message,
    message_item,
    recorded,
    response,
    text_completion,
    tool_call,
    usage,
)

# Bodies of model "m", made at the exchanges' own time (1700000000).
CHAT = chat_completion(
    assistant(
        "Let me look. ",
        tool_call("call_1", "bash", '{"command": "ls"}'),
        tool_call("call_2", "read", '{"path": "é"}'),
        reasoning_content="The user wants 6*7.",
    ),
    "tool_calls",
    usage=usage(30, 12),
    created=1700000000,
    model="m",
    logprobs={"content": [{"token": "Let", "logprob": -0.1}]},
)
COMPLETION = text_completion("42", usage=usage(3, 1), created=1700000000, model="m")
MESSAGE = message(
    [
        {"type": "thinking", "thinking": "6*7", "signature": "sig"},
        {"type": "text", "text": "Running it."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo $((6 * 7))"}},
    ],
    "tool_use",
    usage={"input_tokens": 25, "output_tokens": 9, "cache_read_input_tokens": 3},
    model="claude",
)
RESPONSE = response(
    [message_item("Running it."), function_call_item("call_1", "bash", '{"command": "ls"}')],
    usage={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    model="m",
)


def assembled(endpoint: str, stream: bytes, step: int) -> tuple[dict[str, Any] | None, bool]:
    """What the proxy's own assembler rebuilds from `stream` fed `step` bytes at a time."""
    assembler = StreamAssembler(dialects.named(endpoint))
    for start in range(0, len(stream), step):
        assembler.feed(stream[start : start + step])
    result = assembler.result()
    assert result.error is None or not result.complete
    return result.body, result.complete


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [("chat", CHAT), ("completions", COMPLETION), ("messages", MESSAGE), ("responses", RESPONSE)],
)
def test_resynthesised_stream_rebuilds_the_recorded_body(endpoint: str, body: dict[str, Any]) -> None:
    stream = b"".join(dialects.named(endpoint).synthesise(body, include_usage=True))
    for step in (1, 7, len(stream)):  # the client may read it split anywhere
        assert assembled(endpoint, stream, step) == (body, True)


def test_stream_events_follow_the_recorded_request_and_completeness() -> None:
    request = {"model": "m", "messages": [], "stream": True}
    ex = {"endpoint": "chat", "request": request, "response": CHAT, "stream_complete": True}
    events = stream_events(ex, None)
    assert events[-1] == b"data: [DONE]\n\n"
    # No usage chunk unless the request asked for one: a chunk with `choices: []` breaks clients that
    # index choices[0] (OpenAI sends it only with stream_options.include_usage).
    assert not any(b'"choices": []' in e for e in events)
    with_usage = stream_events(
        {**ex, "request": {**request, "stream_options": {"include_usage": True}}}, None
    )
    assert b'"choices": [], "usage"' in with_usage[-2]
    cut = stream_events({**ex, "stream_complete": False}, None)
    assert cut == events[:-1]
    # A chunk stream is whole once every choice has its finish reason, [DONE] or not (transformers serve
    # sends none: docs/engines.md §8); a stream recorded cut was cut before its finish, and reads so.
    unfinished = {**CHAT, "choices": [{**CHAT["choices"][0], "finish_reason": None}]}
    cut = stream_events({**ex, "response": unfinished, "stream_complete": False}, None)
    body, complete = assembled("chat", b"".join(cut), 5)
    assert not complete and body is not None and body["choices"][0]["finish_reason"] is None
    body, complete = assembled("chat", b"".join(events[:-1]), 5)
    assert complete and body is not None and body["choices"][0]["finish_reason"] == "tool_calls"
    raw = b"data: {}\r\n\r\ndata: [DONE]\r\n\r\n"
    assert stream_events(ex, raw) == [b"data: {}\r\n\r\n", b"data: [DONE]\r\n\r\n"]


def test_split_events_at_every_kind_of_blank_line() -> None:
    raw = b"event: a\ndata: 1\n\ndata: 2\r\n\r\ndata: 3\r\rdata: tail"
    assert split_events(raw) == [b"event: a\ndata: 1\n\n", b"data: 2\r\n\r\n", b"data: 3\r\r", b"data: tail"]
    assert b"".join(split_events(raw)) == raw
    assert not hasattr(dialects.named("embeddings"), "synthesise")


def row(
    endpoint: str, request: dict[str, Any], response: dict[str, Any], status: int = 200
) -> dict[str, Any]:
    return {"endpoint": endpoint, "request": request, "response": response, "status": status}


def test_conversation_of_a_chat_session_skips_side_requests() -> None:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    history = [{"role": "system", "content": "agent"}, {"role": "user", "content": "6*7?"}]
    reply = {"role": "assistant", "content": None, "tool_calls": CHAT["choices"][0]["message"]["tool_calls"]}
    turn_1 = row("chat", {"messages": history, "tools": tools}, {"choices": [{"message": reply}]})
    result = {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    turn_2 = row(
        "chat",
        {"messages": [*history, reply, result], "tools": tools},
        {"choices": [{"message": {"role": "assistant", "content": "42", "refusal": None}}]},
    )
    title = row("chat", {"messages": [{"role": "user", "content": "title?"}]}, {"choices": [{"message": {}}]})
    failed = row("chat", {"messages": history, "tools": tools}, {"error": {"message": "boom"}}, status=500)
    assert conversation([turn_1, turn_2, title, failed]) == {
        "messages": [*history, reply, result, {"role": "assistant", "content": "42"}],
        "tools": tools,
    }
    with pytest.raises(ValueError, match="no successful chat, messages or responses"):
        conversation([failed])


def test_conversation_of_an_anthropic_session_in_openai_format() -> None:
    request = {
        "system": [{"type": "text", "text": "billing"}, {"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": "6*7?"},
            {"role": "system", "content": []},  # Claude Code's bare-mode system entry (docs/agents.md §4.3)
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_0", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_0",
                        "content": [{"type": "text", "text": "ok"}],
                    },
                    {"type": "text", "text": "continue"},
                ],
            },
        ],
        "tools": [
            {"name": "Bash", "description": "shell", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
    }
    exported = conversation([row("messages", request, MESSAGE)])
    call_0 = {"id": "toolu_0", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
    call_1 = {
        "id": "toolu_1",
        "type": "function",
        "function": {"name": "Bash", "arguments": '{"command": "echo $((6 * 7))"}'},
    }
    assert exported["messages"] == [
        {"role": "system", "content": "billing\nYou are Claude Code."},
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": None, "tool_calls": [call_0]},
        {"role": "tool", "tool_call_id": "toolu_0", "content": "ok"},
        {"role": "user", "content": "continue"},
        {"role": "assistant", "content": "Running it.", "tool_calls": [call_1], "reasoning_content": "6*7"},
    ]
    assert exported["tools"] == [
        {
            "type": "function",
            "function": {"name": "Bash", "description": "shell", "parameters": {"type": "object"}},
        }
    ]


def test_conversation_of_a_chained_responses_session() -> None:
    tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
    first = row("responses", {"instructions": "be brief", "input": "list files", "tools": tools}, RESPONSE)
    output = {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}
    done = {
        **RESPONSE,
        "id": "resp_2",
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a.txt"}]}
        ],
    }
    second = row(
        "responses",
        {"instructions": "be brief", "previous_response_id": "resp_1", "input": [output], "tools": tools},
        done,
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls"}'},
    }
    assert conversation([first, second]) == {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": "Running it.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
            {"role": "assistant", "content": "a.txt"},
        ],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}],
    }


def streamed_chat(raw: bytes | None) -> Exchange:
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return exchange(
        request,
        CHAT,
        path="/s/…/v1/chat/completions?x=1",
        session_id="s-h",
        upstream_url="http://127.0.0.1:9/v1/chat/completions?x=1",
        raw_sse=raw,
        streamed=True,
        stream_complete=True,
        started=1700000000.0,
        first_byte=1700000000.5,
        ended=1700000002.0,
        user_agent="opencode/1.18.33",
    )


def refused() -> Exchange:
    body = {
        "error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    return exchange(
        None,
        body,
        session_id="s-h",
        request=b"{x",
        status=400,
        started=1700000003.0,
        ended=1700000003.001,
        error_class="client_error",
        error_message="too long",
    )


@pytest.mark.parametrize("keep_raw_sse", [False, True])
async def test_har_is_valid_1_2_with_streamed_bodies(tmp_path: Path, keep_raw_sse: bool) -> None:
    raw = b"".join(dialects.named("chat").synthesise(CHAT, include_usage=True)).replace(b"\n\n", b"\r\n\r\n")
    await recorded(tmp_path / "r.db", streamed_chat(raw), refused(), keep_raw_sse=keep_raw_sse)
    with StoreReader(tmp_path / "r.db") as reader:
        log = json.loads(json.dumps(har(reader, "s-h")))["log"]
    assert (log["version"], log["creator"]["name"], log["pages"][0]["id"]) == ("1.2", "modeltap", "s-h")
    stream, error = log["entries"]
    for entry in log["entries"]:  # the fields HAR 1.2 requires (w3c-webperf HAR spec)
        assert {"startedDateTime", "time", "request", "response", "cache", "timings"} <= set(entry)
        assert {
            "method",
            "url",
            "httpVersion",
            "cookies",
            "headers",
            "queryString",
            "headersSize",
            "bodySize",
        } <= set(entry["request"])
        assert {
            "status",
            "statusText",
            "httpVersion",
            "cookies",
            "headers",
            "content",
            "redirectURL",
            "headersSize",
            "bodySize",
        } <= set(entry["response"])
        assert {"size", "mimeType"} <= set(entry["response"]["content"])
        assert entry["time"] == pytest.approx(sum(v for v in entry["timings"].values() if v > 0))
        datetime.fromisoformat(entry["startedDateTime"])
    assert stream["startedDateTime"] == "2023-11-14T22:13:20.000Z"
    assert stream["request"]["url"] == "http://127.0.0.1:9/v1/chat/completions?x=1"
    assert stream["request"]["queryString"] == [{"name": "x", "value": "1"}]
    assert json.loads(stream["request"]["postData"]["text"])["stream"] is True
    assert stream["timings"]["wait"] == 500 and stream["timings"]["receive"] == 1500
    content = stream["response"]["content"]
    assert content["mimeType"] == "text/event-stream"
    assert (content["text"].encode() == raw) is keep_raw_sse  # byte for byte when kept
    assert assembled("chat", content["text"].encode(), 9) == (CHAT, True)
    assert stream["_modeltap"]["stream_source"] == ("raw" if keep_raw_sse else "resynthesised")
    assert stream["_modeltap"]["turn"] == 1 and stream["_modeltap"]["assembled_response"] == CHAT
    assert error["request"]["url"] == "http://modeltap.invalid/v1/chat/completions"
    assert error["request"]["postData"]["text"] == "{x"
    assert (error["response"]["status"], error["response"]["statusText"]) == (400, "Bad Request")
    assert json.loads(error["response"]["content"]["text"])["error"]["code"] == "context_length_exceeded"
    assert error["_modeltap"]["error_class"] == "client_error"


async def test_jsonl_has_a_format_version_and_every_field(tmp_path: Path) -> None:
    await recorded(tmp_path / "r.db", streamed_chat(b"data: [DONE]\n\n"), refused(), keep_raw_sse=True)
    out = io.StringIO()
    with StoreReader(tmp_path / "r.db") as reader:
        write_export(reader, "s-h", "jsonl", out)
        with pytest.raises(ValueError, match="har, jsonl, messages"):
            write_export(reader, "s-h", "csv", out)
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["format"], first["format_version"], first["turn"]) == (
        "modeltap.exchange",
        JSONL_FORMAT_VERSION,
        1,
    )
    assert first["request"]["messages"] == [{"role": "user", "content": "hi"}] and first["response"] == CHAT
    assert first["raw_sse"] == "data: [DONE]\n\n" and first["user_agent"] == "opencode/1.18.33"
    assert (second["turn"], second["status"], second["error_class"], second["raw_sse"]) == (
        2,
        400,
        "client_error",
        None,
    )


@pytest.mark.parametrize("fmt", ["har", "jsonl", "messages"])
async def test_a_reply_with_a_lone_surrogate_exports_whole(tmp_path: Path, fmt: str) -> None:
    """Valid JSON (`"\\ud800"`) that UTF-8 cannot encode: exported as its escape, never a failure."""
    odd = exchange(
        {"model": "m", "messages": [{"role": "user", "content": "half \ud800 a pair"}], "stream": True},
        chat_completion(assistant("bad \udc00 half"), usage={"prompt_tokens": 3, "completion_tokens": 2}),
        session_id="s-odd",
        streamed=True,
        stream_complete=True,
    )
    path = await recorded(tmp_path / "r.db", odd)
    out = io.StringIO()
    with StoreReader(path) as reader:
        write_export(reader, "s-odd", fmt, out)
    text = out.getvalue()
    text.encode()  # what a file or a pipe takes
    assert "\\udc00" in text
    if fmt == "har":
        [entry] = json.loads(text)["log"]["entries"]
        assert "\\udc00" in entry["response"]["content"]["text"]
