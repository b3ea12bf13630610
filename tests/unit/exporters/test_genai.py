"""modeltap/exporters/genai.py: an exchange's span attributes in the GenAI conventions, built by hand from
Exchanges (no server, no SDK): the attributes of each format, failures, the budget event, and the
content kept behind `--otlp-content`, cut to size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from modeltap import dialects
from modeltap.exporters import genai
from modeltap.exporters.genai import Call, attributes, span_name
from modeltap.records.exchange import BudgetRecord
from modeltap.records.reader import StoreReader
from modeltap.testing import exchange
from tests.factories import (
    ASK,
    BASH_TOOL,
    MODEL,
    assistant,
    chat_completion,
    message,
    recorded,
    tool_call,
    usage,
)

STARTED = 1764457200.0
ARGUMENTS = '{"command": "echo $((6 * 7))"}'
ANTHROPIC_BODY = {
    "model": "claude-x",
    "max_tokens": 512,
    "system": "You are terse.",
    "stream": True,
    "tools": [{"name": "bash", "description": "run a shell command", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": "Run it."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42\n"}]},
    ],
}
ANTHROPIC_REPLY = message(
    [{"type": "thinking", "thinking": "It printed 42."}, {"type": "text", "text": "42"}],
    "end_turn",
    usage={
        "input_tokens": 20,
        "output_tokens": 3,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2000,
    },
    id="msg_7",
    model="claude-x-1",
)


def call(ex: Any, content: bool = False) -> Call:
    return Call.of_exchange(ex, content=content)


def chat_exchange(**fields: Any) -> Any:
    body = {"model": "policy", "messages": [ASK], "tools": [BASH_TOOL], "temperature": 0.5, "top_p": 1}
    reply = chat_completion(
        assistant(None, tool_call("call_1", "bash", ARGUMENTS)), "tool_calls", usage=usage(25, 5)
    )
    settings = {
        "session_id": "s-1",
        "labels": {"task_id": "t1", "attempt": "2"},
        "started": STARTED,
        "ended": STARTED + 0.25,
        "upstream_url": "http://10.0.0.5:8000/v1/chat/completions?key=not-for-spans",
        "user_agent": "opencode/1.18.33",
        "response_body": json.dumps(reply).encode(),
    }
    return exchange(body, None, **(settings | fields))


def test_a_chat_exchange_has_the_conventions_attributes_and_no_upstream_path() -> None:
    ex = chat_exchange()
    assert span_name(dialects.of_record("chat"), call(ex)) == "chat policy"
    assert attributes(call(ex), content=False) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "policy",
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.stream": False,
        "gen_ai.response.model": MODEL,
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "gen_ai.usage.input_tokens": 25,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.conversation.id": "s-1",
        "session.id": "s-1",
        "http.response.status_code": 200,
        "user_agent.original": "opencode/1.18.33",
        "modeltap.exchange.id": ex.id,
        "modeltap.endpoint": "chat",
        "server.address": "10.0.0.5",
        "server.port": 8000,
        "modeltap.label.task_id": "t1",
        "modeltap.label.attempt": "2",
        # OpenInference's, beside them (Phoenix reads these: openinference.py)
        "openinference.span.kind": "LLM",
        "llm.model_name": "policy",
        "llm.token_count.prompt": 25,
        "llm.token_count.completion": 5,
        "llm.token_count.total": 30,
    }


def test_an_anthropic_stream_has_its_cache_tokens_and_time_to_first_chunk() -> None:
    ex = exchange(
        ANTHROPIC_BODY,
        ANTHROPIC_REPLY,
        endpoint="messages",
        path="/v1/messages",
        streamed=True,
        stream_complete=True,
        started=STARTED,
        first_byte=STARTED + 0.125,
        ended=STARTED + 0.5,
    )
    attrs = attributes(call(ex), content=False)
    assert span_name(dialects.of_record("messages"), call(ex)) == "chat claude-x"
    assert {key: value for key, value in attrs.items() if key.startswith(("gen_ai.", "modeltap.stream"))} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.request.max_tokens": 512,
        "gen_ai.request.stream": True,
        "gen_ai.response.model": "claude-x-1",
        "gen_ai.response.id": "msg_7",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 2120,  # Anthropic's input_tokens plus both cache counts
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 2000,
        "gen_ai.usage.cache_creation.input_tokens": 100,
        "gen_ai.response.time_to_first_chunk": 0.125,
        "modeltap.stream.complete": True,
    }


def test_the_cap_reported_is_the_one_the_model_got_after_a_clamp() -> None:
    body = {"model": "policy", "messages": [ASK], "max_completion_tokens": 4000}
    ex = exchange(body, None, sent=body | {"max_completion_tokens": 1000})
    assert attributes(call(ex), content=False)["gen_ai.request.max_tokens"] == 1000


def test_a_failure_has_its_error_type_and_no_response_attributes() -> None:
    error = {"error": {"message": "prompt of 9000 tokens: too long", "type": "BadRequestError"}}
    ex = chat_exchange(
        status=400,
        response_body=json.dumps(error).encode(),
        error_class="model_fault",
        error_message="too long",
    )
    attrs = attributes(call(ex), content=False)
    assert attrs["error.type"] == "model_fault" and attrs["http.response.status_code"] == 400
    assert not {"gen_ai.response.model", "gen_ai.response.id", "gen_ai.usage.input_tokens"} & attrs.keys()
    assert genai.error_description(call(ex), content=False) == "model_fault"
    assert genai.error_description(call(ex), content=True) == "model_fault: too long"
    assert genai.error_description(call(chat_exchange()), content=True) is None


def test_the_budget_decision_is_an_event_of_primitive_values() -> None:
    budget = BudgetRecord("clamped 4000->1000", "clamp", prompt_tokens=900, requested=4000, allowed=1000)
    assert genai.budget_event(call(chat_exchange(budget=budget))) == {
        "modeltap.budget.summary": "clamped 4000->1000",
        "modeltap.budget.action": "clamp",
        "modeltap.budget.prompt_tokens": 900,
        "modeltap.budget.requested": 4000,
        "modeltap.budget.allowed": 1000,
    }
    assert genai.budget_event(call(chat_exchange())) is None


def test_a_call_of_no_model_is_named_by_its_format_without_genai_operation() -> None:
    ex = exchange(None, {"object": "list", "data": []}, method="GET", path="/v1/models", endpoint="models")
    assert span_name(dialects.of_record("models"), call(ex)) == "models"
    assert "gen_ai.operation.name" not in attributes(call(ex), content=False)
    unrouted = exchange(None, None, path="/v2/whatever", endpoint=None, status=404)
    assert span_name(dialects.of_record(None), call(unrouted)) == "unrouted"


def test_without_content_the_snapshot_holds_no_request_body_and_no_text() -> None:
    ex = chat_exchange()
    assert call(ex).request is None and call(ex, content=True).request is ex.request_json
    text = json.dumps(attributes(call(ex), content=False))
    assert "echo" not in text and ASK["content"] not in text and "gen_ai.input.messages" not in text


# -- content -----------------------------------------------------------------------------------------------


def test_openai_chat_content_in_the_conventions_shapes() -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        ASK,
        assistant(None, tool_call("call_1", "bash", ARGUMENTS)),
        {"role": "tool", "tool_call_id": "call_1", "content": "42\n"},
    ]
    body = {"model": "policy", "messages": history, "tools": [BASH_TOOL]}
    reply = chat_completion(assistant("42", reasoning_content="It printed 42."), usage=usage(40, 2))
    attrs = attributes(call(exchange(body, reply), content=True), content=True)
    assert json.loads(attrs["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": ASK["content"]}]},
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1",
                    "name": "bash",
                    "arguments": {"command": "echo $((6 * 7))"},
                }
            ],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": "42\n"}]},
    ]
    assert json.loads(attrs["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "reasoning", "content": "It printed 42."}, {"type": "text", "content": "42"}],
            "finish_reason": "stop",
        }
    ]
    assert json.loads(attrs["gen_ai.tool.definitions"]) == [
        {"type": "function", "name": "bash", "description": "run a shell command"}
    ]
    assert "gen_ai.system_instructions" not in attrs  # OpenAI's system message belongs to the history


def test_anthropic_content_has_its_system_apart_and_tool_results_as_responses() -> None:
    ex = exchange(ANTHROPIC_BODY, ANTHROPIC_REPLY, endpoint="messages", path="/v1/messages")
    attrs = attributes(call(ex, content=True), content=True)
    assert json.loads(attrs["gen_ai.system_instructions"]) == [{"type": "text", "content": "You are terse."}]
    assert json.loads(attrs["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Run it."}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "toolu_1", "name": "bash", "arguments": {}}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "toolu_1", "response": "42\n"}]},
    ]
    assert json.loads(attrs["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [{"type": "reasoning", "content": "It printed 42."}, {"type": "text", "content": "42"}],
            "finish_reason": "stop",  # Anthropic's end_turn, in the schema's words
        }
    ]
    assert json.loads(attrs["gen_ai.tool.definitions"]) == [
        {"type": "function", "name": "bash", "description": "run a shell command"}
    ]


def test_a_failed_exchange_exports_its_input_and_no_output() -> None:
    ex = exchange({"model": "policy", "messages": [ASK]}, None, status=502, error_class="upstream_error")
    attrs = attributes(call(ex, content=True), content=True)
    assert len(json.loads(attrs["gen_ai.input.messages"])) == 1
    assert "gen_ai.output.messages" not in attrs


def test_long_texts_are_cut_and_the_oldest_messages_left_out_with_valid_json() -> None:
    long = "x" * (genai.CONTENT_TEXT_MAX_CHARS + 10)
    history = [{"role": "user", "content": f"{n} {long}"} for n in range(40)]
    ex = exchange(
        {"model": "policy", "messages": history}, chat_completion(assistant("ok"), usage=usage(1, 1))
    )
    attrs = attributes(call(ex, content=True), content=True)
    kept = json.loads(attrs["gen_ai.input.messages"])
    assert len(attrs["gen_ai.input.messages"]) <= genai.CONTENT_ATTRIBUTE_MAX_CHARS
    assert attrs["modeltap.content.left_out"] == 40 - len(kept) > 0
    assert (
        kept[-1]["parts"][0]["content"]
        == f"39 {long}"[: genai.CONTENT_TEXT_MAX_CHARS] + "… [13 more characters]"
    )


def test_an_unreadable_history_is_no_content_but_still_a_span() -> None:
    ex = exchange({"model": "policy", "messages": 5}, chat_completion(assistant("ok"), usage=usage(1, 1)))
    attrs = attributes(call(ex, content=True), content=True)
    assert attrs["modeltap.content.unreadable"] is True and attrs["gen_ai.usage.output_tokens"] == 1


# -- the same call, live or recorded ------------------------------------------------------------------------


@pytest.mark.parametrize("content", [False, True])
async def test_a_recorded_exchange_maps_as_the_live_one_did(tmp_path: Path, content: bool) -> None:
    live = [
        chat_exchange(budget=BudgetRecord("passed 30+1<=100", "pass", prompt_tokens=30)),
        exchange(ANTHROPIC_BODY, ANTHROPIC_REPLY, endpoint="messages", path="/v1/messages", session_id="s-1"),
    ]
    with StoreReader(await recorded(tmp_path / "r.db", *live)) as reader:
        rows = reader.exchanges("s-1")
    for ex, row in zip(live, rows, strict=True):
        recorded_call = Call.of_record(row, content=content)
        assert attributes(recorded_call, content=content) == attributes(call(ex, content), content=content)
        assert genai.budget_event(recorded_call) == genai.budget_event(call(ex))


def test_content_carries_openinference_input_and_output_for_phoenix() -> None:
    """Phoenix lists a session by its first input and last output: the user's message and the reply,
    as text, with each message flattened as OpenInference readers expect."""
    attrs = attributes(call(chat_exchange(), content=True), content=True)
    assert (attrs["input.value"], attrs["input.mime_type"]) == (ASK["content"], "text/plain")
    assert attrs["output.value"] == f"bash({ARGUMENTS})" and attrs["output.mime_type"] == "text/plain"
    assert attrs["llm.input_messages.0.message.role"] == "user"
    assert attrs["llm.input_messages.0.message.content"] == ASK["content"]
    assert attrs["llm.output_messages.0.message.role"] == "assistant"
    assert attrs["llm.output_messages.0.message.tool_calls.0.tool_call.function.name"] == "bash"
    assert attrs["llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments"] == ARGUMENTS
    # An Anthropic turn after a tool result: its newest message is the result; the reply's text out.
    ex = exchange(ANTHROPIC_BODY, ANTHROPIC_REPLY, endpoint="messages", path="/v1/messages")
    attrs = attributes(call(ex, content=True), content=True)
    assert attrs["input.value"] == "42\n" and attrs["output.value"] == "42"
    assert attrs["llm.input_messages.0.message.role"] == "system"
    assert attrs["llm.input_messages.3.message.tool_call_id"] == "toolu_1"
    assert not any(key.startswith(("input.", "output.", "llm.input", "llm.output")) for key in
                   attributes(call(ex), content=False))  # fmt: skip
