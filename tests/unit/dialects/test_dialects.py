"""Tests for modeltap/dialects/: the registry, and what each format reads: summaries, new messages per
turn, AReaL's failed tool-call parse.

Each format's non-streamed body is also streamed (split into the pieces its API streams), assembled by
the StreamAssembler, and must summarise the same, since `modeltap show` reads both kinds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap import dialects
from modeltap.dialects.base import Summary
from modeltap.dialects.roles import AsChat
from modeltap.dialects.sse import StreamAssembler
from tests.factories import (
    CREATED,
    SSE_DONE,
    assistant,
    chat_chunk,
    chat_completion,
    completion_chunk,
    function_call_item,
    message,
    message_item,
    response,
    sse_data,
    sse_event,
    text_completion,
    tool_call,
    tool_call_delta,
    usage,
)


def summarize(endpoint: str, request: Any, response: Any) -> Summary:
    return dialects.of_record(endpoint).summary(request, response)


def new_messages(endpoint: str, request: Any, previous: Any) -> list[Any]:
    return dialects.of_record(endpoint).new_messages(request, previous)


def tool_call_parse_failure(endpoint: str, response: Any) -> bool:
    dialect = dialects.of_record(endpoint)
    return isinstance(dialect, AsChat) and dialect.tool_call_parse_failure(response)


ARGUMENTS = '{"command": "echo $((6 * 7))"}'

# docs/agents.md §2.3: the non-streamed chat body openai-py got for the tool-call turn.
CHAT_TOOL_CALL = chat_completion(
    assistant(None, tool_call("call_1", "bash", ARGUMENTS)), "tool_calls", usage=usage(25, 5)
)
# docs/areal.md §10.5: AReaL's text reply, `model: "None"`.
AREAL_CHAT_TEXT = chat_completion(
    assistant("Echo: hello proxy", tool_calls=None),
    usage=usage(19, 5),
    id="chatcmpl-" + "a" * 29,
    model="None",
    logprobs=None,
)
# docs/areal.md §4.2, §10.6: malformed tool-call output that failed to parse.
RAW_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {city: Paris}\n</tool_call>'
AREAL_PARSE_FAILURE = {
    **AREAL_CHAT_TEXT,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": RAW_CALL, "tool_calls": None},
            "finish_reason": "tool_calls",
        }
    ],
}
COMPLETION = text_completion(" 42", "length", usage=usage(4, 2))
RESPONSE = response(
    [
        {"id": "rs_1", "type": "reasoning", "summary": []},
        message_item("Running it."),
        function_call_item("call_9", "bash", ARGUMENTS),
    ],
    usage={"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 7},
    created_at=CREATED,
)
# docs/agents.md §2.3, §4.4: Claude Code's non-streamed fallback body, with cache counts as
# Anthropic reports them.
MESSAGE = message(
    [
        {"type": "text", "text": "Let me run that."},
        {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": json.loads(ARGUMENTS)},
    ],
    "tool_use",
    usage={
        "input_tokens": 25,
        "output_tokens": 5,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 2000,
    },
    model="claude-opus-5-5",
)
# docs/areal.md §10.6: AReaL's /v1/messages tool call through LiteLLM (an empty text block first).
AREAL_MESSAGE = message(
    [
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_c", "name": "get_weather", "input": {"city": "Paris"}},
    ],
    "tool_use",
    usage={"input_tokens": 18, "output_tokens": 6},
    id="chatcmpl-b",
    model="None",
)

CHAT_CALL = {"id": "call_1", "name": "bash", "arguments": ARGUMENTS}


@pytest.mark.parametrize(
    ("endpoint", "request_body", "response", "expected"),
    [
        (
            "chat",
            {"model": "standin-model"},
            CHAT_TOOL_CALL,
            Summary("tool_calls", None, [CHAT_CALL], 25, 5, "standin-model"),
        ),
        (
            "chat",
            {"model": "policy"},
            AREAL_CHAT_TEXT,
            Summary("stop", "Echo: hello proxy", [], 19, 5, "policy"),
        ),
        ("completions", {"model": "m"}, COMPLETION, Summary("length", " 42", [], 4, 2, "standin-model")),
        (
            "responses",
            {"model": "gpt-x"},
            RESPONSE,
            Summary(
                "completed",
                "Running it.",
                [{"id": "call_9", "name": "bash", "arguments": ARGUMENTS}],
                30,
                7,
                "gpt-x",
                cache_read_tokens=10,
            ),
        ),
        (
            "messages",
            {"model": "claude-opus-5-5"},
            MESSAGE,
            Summary(
                "tool_use",
                "Let me run that.",
                [{"id": "toolu_1", "name": "Bash", "arguments": ARGUMENTS}],
                2125,  # input_tokens leaves the cached prompt out; the summary counts the whole prompt
                5,
                "claude-opus-5-5",
                cache_read_tokens=2000,
                cache_write_tokens=100,
            ),
        ),
        (
            "messages",
            {"model": "claude-x"},
            AREAL_MESSAGE,
            Summary(
                "tool_use",
                "",
                [{"id": "call_c", "name": "get_weather", "arguments": '{"city": "Paris"}'}],
                18,
                6,
                "claude-x",
            ),
        ),
    ],
)
def test_summary_of_each_dialect(
    endpoint: str, request_body: dict[str, Any], response: dict[str, Any], expected: Summary
) -> None:
    assert summarize(endpoint, request_body, response) == expected


def test_chat_content_given_as_parts() -> None:
    message = {"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}]}
    response = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    assert summarize("chat", None, response).text == "42"


def test_first_choice_is_index_zero() -> None:
    response = {"choices": [{"index": 1, "text": "b"}, {"index": 0, "text": "a"}]}
    assert summarize("completions", None, response).text == "a"


def test_incomplete_response_says_why() -> None:
    response = {**RESPONSE, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    assert summarize("responses", None, response).finish_reason == "max_output_tokens"


def test_custom_tool_call_in_responses() -> None:
    item = {
        "type": "custom_tool_call",
        "call_id": "call_2",
        "name": "apply_patch",
        "input": "*** Begin Patch",
    }
    summary = summarize("responses", None, {"output": [item]})
    assert summary.tool_calls == [{"id": "call_2", "name": "apply_patch", "arguments": "*** Begin Patch"}]
    assert summary.text is None


@pytest.mark.parametrize(
    ("endpoint", "usage"),
    [
        ("models", {"prompt_tokens": 8, "total_tokens": 8}),
        ("embeddings", {"prompt_tokens": 8, "total_tokens": 8}),
        ("nonsense", {"prompt_tokens": 8, "total_tokens": 8}),
        ("count_tokens", {"input_tokens": 8}),  # Anthropic's usage, as every Anthropic format reads it
    ],
)
def test_endpoints_that_generate_nothing_summarise_model_and_usage(
    endpoint: str, usage: dict[str, int]
) -> None:
    response = {"model": "emb", "usage": usage}
    assert summarize(endpoint, None, response) == Summary(prompt_tokens=8, model="emb")


@pytest.mark.parametrize(
    "response",
    [
        None,
        {"detail": "Not Found"},  # AReaL's FastAPI error
        {
            "error": {
                "message": "too long",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"choices": "nope", "content": 5, "output": {}, "usage": [1]},
        {"choices": [None, 3, {"message": "text", "finish_reason": 7}], "usage": {"prompt_tokens": True}},
    ],
)
@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses", "messages"])
def test_error_and_odd_bodies_summarise_as_absent(endpoint: str, response: Any) -> None:
    assert summarize(endpoint, {"model": "m"}, response) == Summary(model="m")
    assert tool_call_parse_failure(endpoint, response) is False


# --- streamed and non-streamed alike ----------------------------------------------------------------------


def event(name: str, obj: dict[str, Any]) -> bytes:
    return sse_event({"type": name, **obj})


def pieces(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chat_stream(body: dict[str, Any]) -> bytes:
    stamp = {key: body[key] for key in ("id", "created", "model")}
    choice, message = body["choices"][0], body["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        return sse_data(chat_chunk(delta, finish_reason, **stamp))

    out = [chunk({"role": "assistant"})] + [
        chunk({"content": p}) for p in pieces(message.get("content") or "")
    ]
    for number, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [tool_call_delta(number, "", call["id"], call["function"]["name"])]}))
        out += [
            chunk({"tool_calls": [tool_call_delta(number, p)]}) for p in pieces(call["function"]["arguments"])
        ]
    usage_chunk = {**chat_chunk({}, **stamp), "choices": [], "usage": body["usage"]}
    out += [chunk({}, choice["finish_reason"]), sse_data(usage_chunk)]
    return b"".join(out) + SSE_DONE


def completions_stream(body: dict[str, Any]) -> bytes:
    stamp = {key: body[key] for key in ("id", "created", "model")}
    choice = body["choices"][0]
    out = [sse_data(completion_chunk(p, **stamp)) for p in pieces(choice["text"])]
    out.append(sse_data(completion_chunk("", choice["finish_reason"], **stamp)))
    out.append(sse_data({**completion_chunk("", **stamp), "choices": [], "usage": body["usage"]}))
    return b"".join(out) + SSE_DONE


def messages_stream(body: dict[str, Any]) -> bytes:
    start = {**body, "content": [], "stop_reason": None, "usage": {**body["usage"], "output_tokens": 1}}
    out = [event("message_start", {"message": start})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            first, deltas = (
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": p} for p in pieces(block["text"])],
            )
        else:
            first = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p} for p in pieces(json.dumps(block["input"]))
            ]
        out.append(event("content_block_start", {"index": index, "content_block": first}))
        out += [event("content_block_delta", {"index": index, "delta": delta}) for delta in deltas]
        out.append(event("content_block_stop", {"index": index}))
    delta = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    out.append(
        event("message_delta", {"delta": delta, "usage": {"output_tokens": body["usage"]["output_tokens"]}})
    )
    return b"".join(out) + event("message_stop", {})


def responses_stream(body: dict[str, Any], *, completed: bool = True) -> bytes:
    out = [event("response.created", {"response": {**body, "status": "in_progress", "output": []}})]
    for index, item in enumerate(body["output"]):
        out.append(
            event("response.output_item.added", {"output_index": index, "item": {**item, "content": []}})
        )
        out.append(event("response.output_item.done", {"output_index": index, "item": item}))
    if completed:
        out.append(event("response.completed", {"response": body}))
    return b"".join(out)


STREAMS = {"chat": chat_stream, "completions": completions_stream, "messages": messages_stream}


def assembled(endpoint: str, stream: bytes) -> dict[str, Any] | None:
    assembler = StreamAssembler(dialects.named(endpoint))
    for offset in range(0, len(stream), 7):
        assembler.feed(stream[offset : offset + 7])
    result = assembler.result()
    return result.body


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", CHAT_TOOL_CALL),
        ("chat", AREAL_CHAT_TEXT),
        ("chat", AREAL_PARSE_FAILURE),
        ("completions", COMPLETION),
        ("messages", MESSAGE),
        ("messages", AREAL_MESSAGE),
        ("responses", RESPONSE),
    ],
)
def test_streamed_and_non_streamed_summarise_alike(endpoint: str, body: dict[str, Any]) -> None:
    stream = responses_stream(body) if endpoint == "responses" else STREAMS[endpoint](body)
    request = {"model": "requested"}
    assert summarize(endpoint, request, assembled(endpoint, stream)) == summarize(endpoint, request, body)
    assert tool_call_parse_failure(endpoint, assembled(endpoint, stream)) == tool_call_parse_failure(
        endpoint, body
    )


def test_responses_cut_before_completed_still_summarise_the_reply() -> None:
    summary = summarize(
        "responses", None, assembled("responses", responses_stream(RESPONSE, completed=False))
    )
    full = summarize("responses", None, RESPONSE)
    assert (summary.text, summary.tool_calls) == (full.text, full.tool_calls)
    assert summary.finish_reason == "in_progress"


# --- AReaL's failed tool-call parse ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "response", "failed"),
    [
        ("chat", AREAL_PARSE_FAILURE, True),
        (
            "chat",
            {
                **AREAL_PARSE_FAILURE,
                "choices": [{"message": {"content": RAW_CALL}, "finish_reason": "tool_calls"}],
            },
            True,
        ),
        ("chat", CHAT_TOOL_CALL, False),
        ("chat", AREAL_CHAT_TEXT, False),
        ("messages", {**AREAL_MESSAGE, "content": [{"type": "text", "text": RAW_CALL}]}, True),
        ("messages", AREAL_MESSAGE, False),
        ("messages", MESSAGE, False),
        ("responses", RESPONSE, False),
        ("completions", COMPLETION, False),
    ],
)
def test_tool_call_parse_failure(endpoint: str, response: dict[str, Any], failed: bool) -> None:
    assert tool_call_parse_failure(endpoint, response) is failed


# --- new messages per turn ------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are opencode."}
USER = {"role": "user", "content": "Run echo $((6 * 7))"}
ASSISTANT = {
    "role": "assistant",
    "content": None,
    "tool_calls": CHAT_TOOL_CALL["choices"][0]["message"]["tool_calls"],
}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}


def test_chat_first_turn_is_all_new() -> None:
    assert new_messages("chat", {"messages": [SYSTEM, USER]}, None) == [SYSTEM, USER]


def test_chat_next_turn_adds_the_echoed_reply_and_tool_result() -> None:
    turn1 = {"messages": [SYSTEM, USER]}
    turn2 = {"messages": [SYSTEM, USER, ASSISTANT, TOOL]}
    assert new_messages("chat", turn2, turn1) == [ASSISTANT, TOOL]
    assert new_messages("chat", turn2, turn2) == []


def test_chat_after_a_side_request_shows_from_the_first_changed_message() -> None:
    # docs/agents.md §3.5: opencode's title request has its own system prompt, so turn 1 is all new.
    title = {"messages": [{"role": "system", "content": "You are a title generator."}, USER]}
    assert new_messages("chat", {"messages": [SYSTEM, USER]}, title) == [SYSTEM, USER]


CLAUDE_SYSTEM = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
ENVIRONMENT = {"role": "system", "content": [{"type": "text", "text": "cwd: /work"}]}


def claude_user(content: str, cached: bool) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": content}
    if cached:
        block["cache_control"] = {"type": "ephemeral"}
    return {"role": "user", "content": [block]}


def test_claude_code_turns() -> None:
    # docs/agents.md §4.3: roles ["user","system"] then ["user","system","assistant","user"], and the
    # cache_control marker moves to the newest message.
    turn1 = {"system": CLAUDE_SYSTEM, "messages": [claude_user("Run it", cached=True), ENVIRONMENT]}
    reply = {"role": "assistant", "content": MESSAGE["content"]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}
    turn2 = {
        "system": CLAUDE_SYSTEM,
        "messages": [claude_user("Run it", cached=False), ENVIRONMENT, reply, result],
    }
    assert new_messages("messages", turn1, None) == [
        {"role": "system", "content": CLAUDE_SYSTEM},
        *turn1["messages"],
    ]
    assert new_messages("messages", turn2, turn1) == [reply, result]


def test_a_changed_system_prompt_is_shown_again() -> None:
    turn1 = {"system": "be brief", "messages": [USER]}
    turn2 = {"system": "be thorough", "messages": [USER]}
    assert new_messages("messages", turn2, turn1) == [{"role": "system", "content": "be thorough"}]


def test_responses_turns() -> None:
    turn1 = {"instructions": "be brief", "input": "Run echo"}
    assert new_messages("responses", turn1, None) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Run echo"},
    ]
    call = {"type": "function_call", "call_id": "call_9", "name": "bash", "arguments": ARGUMENTS}
    output = {"type": "function_call_output", "call_id": "call_9", "output": "42"}
    turn2 = {"instructions": "be brief", "input": [{"role": "user", "content": "Run echo"}, call, output]}
    assert new_messages("responses", turn2, turn1) == [call, output]
    # Chained by previous_response_id, the request carries only what is new.
    chained = {"instructions": "be brief", "previous_response_id": "resp_1", "input": [output]}
    assert new_messages("responses", chained, turn2) == [output]


def test_completions_prompt_growth() -> None:
    assert new_messages("completions", {"prompt": "2+2="}, None) == [{"role": "prompt", "content": "2+2="}]
    assert new_messages("completions", {"prompt": "2+2=4\n3+3="}, {"prompt": "2+2="}) == [
        {"role": "prompt", "content": "4\n3+3="}
    ]
    assert new_messages("completions", {"prompt": "2+2="}, {"prompt": "2+2="}) == []
    assert new_messages("completions", {"prompt": "x"}, {"prompt": "y"}) == [
        {"role": "prompt", "content": "x"}
    ]
    assert new_messages("completions", {"prompt": [1, 2]}, None) == [{"role": "prompt", "content": [1, 2]}]


def test_new_messages_leaves_the_request_alone() -> None:
    turn = {"system": "s", "messages": [USER]}
    snapshot = json.loads(json.dumps(turn))
    new_messages("messages", turn, None).append({"role": "user", "content": "more"})
    assert turn == snapshot


@pytest.mark.parametrize("endpoint", ["models", "embeddings", "count_tokens"])
def test_new_messages_of_endpoints_without_a_conversation(endpoint: str) -> None:
    assert new_messages(endpoint, {"messages": [USER]}, None) == []


# --- never raises ---------------------------------------------------------------------------------------

KEYS = st.sampled_from(
    "choices message content text tool_calls function name arguments id index finish_reason usage model"
    " prompt_tokens input_tokens output_tokens cache_read_input_tokens output type status call_id input"
    " incomplete_details reason stop_reason messages system instructions previous_response_id prompt".split()
)
VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=6)
    | st.sampled_from(
        ["tool_calls", "tool_use", "text", "message", "function_call", "output_text", "incomplete"]
    )
)
BODIES = st.recursive(
    VALUES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)
ENDPOINTS = st.sampled_from(["chat", "completions", "responses", "messages", "models"])


@settings(max_examples=400, deadline=None)
@given(endpoint=ENDPOINTS, request=BODIES, previous=BODIES, response=BODIES)
def test_no_body_shape_raises(endpoint: str, request: Any, previous: Any, response: Any) -> None:
    summary = summarize(endpoint, request, response)
    assert summary.text is None or isinstance(summary.text, str)
    assert all(isinstance(call["arguments"], str | None) for call in summary.tool_calls)
    assert isinstance(tool_call_parse_failure(endpoint, response), bool)
    assert isinstance(new_messages(endpoint, request, previous), list)


def test_every_format_is_found_by_its_name_and_route() -> None:
    for dialect in dialects.DIALECTS:
        assert dialects.named(dialect.name) is dialect
        assert dialects.for_route(dialect.route) == (dialect, None)
    assert dialects.for_route("models/m1") == (dialects.named("models"), "m1")
    assert dialects.for_route("chat/completions/x") is None
    with pytest.raises(ValueError, match="no dialect 'chatt'"):
        dialects.named("chatt")


def test_an_unrouted_record_reads_as_nothing() -> None:
    unrouted = dialects.of_record(None)
    assert unrouted.summary({"model": "m"}, {"choices": [{"message": {"content": "x"}}]}) == Summary(
        model="m"
    )
    assert unrouted.new_messages({"messages": [USER]}, None) == []
