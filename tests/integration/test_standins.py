"""The stand-in upstreams behave like the backends they replace (tests/standins/), proven with real clients.

The real openai and anthropic SDKs, raw aiohttp where the bytes matter, and the real opencode and
Claude Code CLIs talk to each stand-in directly, with no modeltap in between. Expected values come
from docs/: agents.md §2-§4 (CLI requests and SSE), areal.md §10.5-§10.6 (AReaL 1.0.4's statuses and
bodies), token-budgets.md §1.4 and §2.3 (SGLang flat and vLLM nested errors).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from tests.agents import run_claude, run_opencode
from tests.factories import BASH_TOOL
from tests.standins import (
    FINAL_ANSWER,
    TITLE,
    TOOL_COMMAND,
    AnthropicLikeStandIn,
    ArealStandIn,
    OpenAILikeStandIn,
    StandIn,
    approx_tokens,
)
from tests.standins import token_engine as te
from tests.standins.areal import BAD_SESSION_KEY, MISSING_TOKEN

USER = [{"role": "user", "content": "hello"}]
CLAUDE_BASH = {
    "name": "Bash",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
    },
}
NOT_FOUND = {"detail": "Not Found"}

Factory = Callable[..., Any]


async def _post(
    url: str, body: Any = None, headers: dict[str, str] | None = None, **kwargs: Any
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=body, headers=headers, **kwargs) as response,
    ):
        text = await response.text()
        return response.status, json.loads(text) if text else None


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, await response.json(content_type=None)


def _sse_data(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`."""
    lines = [line[len("data: ") :] for line in raw.decode().split("\n") if line.startswith("data: ")]
    return [line if line == "[DONE]" else json.loads(line) for line in lines]


# --- The agent CLIs, run for real ---------------------------------------------------------------------


@pytest.mark.agents
def test_opencode_runs_the_tool_task_against_vllm_in_three_streamed_requests(
    vllm_standin: OpenAILikeStandIn, tmp_path: Path
) -> None:
    run = run_opencode(vllm_standin.v1_url, "sk-test-opencode", tmp_path / "proj")

    assert run.exit_code == 0 and run.final_text == FINAL_ANSWER, run.describe()
    title, turn1, turn2 = vllm_standin.model_requests
    assert [r.path for r in (title, turn1, turn2)] == ["/v1/chat/completions"] * 3
    assert "tools" not in title.body and title.body["messages"][0]["content"].startswith(
        "You are a title generator"
    )
    assert all(
        r.body["stream"] is True and r.body["stream_options"] == {"include_usage": True}
        for r in (turn1, turn2)
    )
    assert (
        turn2.body["messages"][-1]["role"] == "tool" and turn2.body["messages"][-1]["content"].strip() == "42"
    )
    assert turn1.headers["Authorization"] == "Bearer sk-test-opencode"
    # opencode read the usage chunk: the input tokens it reports are the stand-in's count for turn 1.
    finished = [e for e in run.output if e.get("type") == "step_finish"]
    assert finished[0]["part"]["tokens"]["input"] == approx_tokens(
        turn1.body["messages"], turn1.body["tools"]
    )


@pytest.mark.agents
def test_opencode_accepts_areals_single_chunk_stream_at_the_bare_path(
    areal_standin: ArealStandIn, tmp_path: Path
) -> None:
    session = areal_standin.open_session("opencode")

    run = run_opencode(areal_standin.url, session.api_key, tmp_path / "proj")

    assert run.exit_code == 0 and run.final_text == FINAL_ANSWER, run.describe()
    assert [r.path for r in areal_standin.model_requests] == ["/chat/completions"] * 3
    assert len(areal_standin.session(session.session_id).interactions) == 3


@pytest.mark.agents
def test_opencode_reads_a_400_context_error_as_context_overflow_and_tries_compaction(
    vllm_standin: OpenAILikeStandIn, tmp_path: Path
) -> None:
    vllm_standin.inject("400ctx", times=None)

    run = run_opencode(vllm_standin.v1_url, "sk-test", tmp_path / "proj")

    assert run.exit_code == 1, run.describe()
    assert {e["error"]["name"] for e in run.output if e.get("type") == "error"} == {"ContextOverflowError"}
    systems = [r.body["messages"][0]["content"] for r in vllm_standin.model_requests]
    assert systems[-1].startswith("You are a context summarization agent")


@pytest.mark.agents
def test_claude_code_runs_the_tool_task_against_anthropic_like_in_two_requests(
    anthropic_standin: AnthropicLikeStandIn, tmp_path: Path
) -> None:
    run = run_claude(anthropic_standin.url, "sk-ant-test", tmp_path / "proj")

    assert run.exit_code == 0 and run.final_text == FINAL_ANSWER, run.describe()
    assert run.output[-1]["num_turns"] == 2
    first, second = anthropic_standin.model_requests
    assert [r.path_qs for r in (first, second)] == ["/v1/messages?beta=true"] * 2
    assert first.headers["x-api-key"] == "sk-ant-test" and "authorization" not in first.headers
    results = [b for m in second.body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    assert any(b.get("type") == "tool_result" and b.get("content") == "42" for b in results)


@pytest.mark.agents
def test_claude_code_with_a_bearer_session_key_completes_against_areal(
    areal_standin: ArealStandIn, tmp_path: Path
) -> None:
    session = areal_standin.open_session("claude")

    run = run_claude(areal_standin.url, session.api_key, tmp_path / "proj", bearer=True)

    assert run.exit_code == 0 and run.final_text == FINAL_ANSWER, run.describe()
    requests = areal_standin.model_requests
    assert [r.path_qs for r in requests] == ["/v1/messages?beta=true"] * 2
    assert requests[0].headers["Authorization"] == f"Bearer {session.api_key}"


@pytest.mark.agents
def test_claude_code_repeats_a_broken_stream_without_streaming(
    anthropic_standin: AnthropicLikeStandIn, tmp_path: Path
) -> None:
    anthropic_standin.inject("badsse", times=None)

    run = run_claude(anthropic_standin.url, "sk-ant-test", tmp_path / "proj")

    assert run.exit_code == 0 and run.final_text == FINAL_ANSWER, run.describe()
    assert [r.body["stream"] for r in anthropic_standin.model_requests] == [True, False, True, False]


# --- AReaL: routes, auth, validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("POST", "/v1/messages/count_tokens"),
        ("POST", "/v1/responses"),
    ],
)
async def test_areal_has_no_v1_chat_models_or_count_tokens(
    areal_standin: ArealStandIn, method: str, path: str
) -> None:
    session = areal_standin.open_session()
    headers = {"Authorization": f"Bearer {session.api_key}"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, areal_standin.url + path, json={}, headers=headers) as r,
    ):
        assert (r.status, await r.json()) == (404, NOT_FOUND)


def test_areal_answers_the_openai_sdk_only_at_the_bare_path(areal_standin: ArealStandIn) -> None:
    session = areal_standin.open_session()
    at_v1 = openai.OpenAI(base_url=areal_standin.url + "/v1", api_key=session.api_key, max_retries=0)
    bare = openai.OpenAI(base_url=areal_standin.url, api_key=session.api_key, max_retries=0)

    with pytest.raises(openai.NotFoundError) as missing:
        at_v1.chat.completions.create(model="policy", messages=USER)
    answer = bare.chat.completions.create(model="policy", messages=USER)

    assert missing.value.body == NOT_FOUND
    assert answer.choices[0].message.content == TITLE and answer.model == "None"
    assert answer.id.startswith("chatcmpl-") and len(answer.id) == len("chatcmpl-") + 29


@pytest.mark.parametrize(
    ("headers", "status", "detail"),
    [
        ({}, 401, MISSING_TOKEN),
        ({"Authorization": "Bearer standin-admin-key"}, 401, BAD_SESSION_KEY),
        ({"Authorization": "Basic abc"}, 401, MISSING_TOKEN),
    ],
)
async def test_areal_refuses_model_calls_without_a_session_key(
    areal_standin: ArealStandIn, headers: dict[str, str], status: int, detail: str
) -> None:
    body = {"model": "m", "messages": USER}
    assert await _post(areal_standin.url + "/chat/completions", body, headers) == (status, {"detail": detail})


@pytest.mark.parametrize("auth", ["bearer {key}", "BEARER {key}", "x-api-key"])
async def test_areal_takes_the_session_key_as_bearer_any_case_or_x_api_key(
    areal_standin: ArealStandIn, auth: str
) -> None:
    key = areal_standin.open_session().api_key
    headers = {"x-api-key": key} if auth == "x-api-key" else {"Authorization": auth.format(key=key)}

    status, body = await _post(
        areal_standin.url + "/chat/completions", {"model": "m", "messages": USER}, headers
    )

    assert status == 200 and body["choices"][0]["message"]["content"] == TITLE


async def test_areal_validates_content_type_then_body_with_fastapi_422s(areal_standin: ArealStandIn) -> None:
    auth = {"Authorization": f"Bearer {areal_standin.open_session().api_key}"}

    wrong_type = await _post(
        areal_standin.url + "/chat/completions", data=b"{}", headers={**auth, "Content-Type": "text/plain"}
    )
    no_model = await _post(areal_standin.url + "/chat/completions", {"messages": USER}, auth)

    assert wrong_type[0] == 422 and wrong_type[1]["detail"][0]["loc"] == ["header", "content-type"]
    assert no_model[0] == 422
    assert [e["loc"][1:] for e in no_model[1]["detail"]] == [
        ["CompletionCreateParamsNonStreaming", "model"],
        ["CompletionCreateParamsStreaming", "model"],
        ["CompletionCreateParamsStreaming", "stream"],
    ]


# --- AReaL: streams and the length gate ---------------------------------------------------------------


async def test_areal_streams_the_whole_text_in_one_chunk_and_usage_last_unasked(
    areal_standin: ArealStandIn,
) -> None:
    auth = {"Authorization": f"Bearer {areal_standin.open_session().api_key}"}
    body = {"model": "m", "messages": USER, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(areal_standin.url + "/chat/completions", json=body, headers=auth) as r,
    ):
        raw = await r.read()
        headers = r.headers

    *chunks, done = _sse_data(raw)
    assert (
        headers["Content-Type"] == "text/event-stream; charset=utf-8" and headers["X-Accel-Buffering"] == "no"
    )
    assert done == "[DONE]" and len(chunks) == 3
    assert (
        chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        and chunks[0]["choices"][0]["delta"]["content"] == ""
    )
    assert chunks[1]["choices"][0]["delta"]["content"] == TITLE
    assert chunks[2]["choices"][0]["finish_reason"] == "stop" and chunks[2]["usage"]["total_tokens"] > 0
    assert all(chunk["usage"] is None for chunk in chunks[:2])


def test_areal_streams_each_tool_call_in_one_chunk_with_its_whole_arguments(
    areal_standin: ArealStandIn,
) -> None:
    client = openai.OpenAI(
        base_url=areal_standin.url, api_key=areal_standin.open_session().api_key, max_retries=0
    )

    chunks = list(client.chat.completions.create(model="m", messages=USER, tools=[BASH_TOOL], stream=True))

    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].function is not None
    assert json.loads(calls[0][0].function.arguments or "") == {"command": TOOL_COMMAND}
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and chunks[-1].usage is not None


async def test_areal_refuses_a_prompt_that_reaches_engine_max_tokens_with_its_500(
    standin_factory: Factory,
) -> None:
    prompt_tokens = approx_tokens(USER)
    areal = standin_factory(ArealStandIn, engine_max_tokens=prompt_tokens)  # cap - prompt <= 0 fails
    session = areal.open_session()
    auth = {"Authorization": f"Bearer {session.api_key}"}
    too_long = f"len of prompt tokens {prompt_tokens} exceeds max_total_tokens {prompt_tokens}"

    chat = await _post(areal.url + "/chat/completions", {"model": "m", "messages": USER}, auth)
    stream = await _post(
        areal.url + "/chat/completions", {"model": "m", "messages": USER, "stream": True}, auth
    )
    messages = await _post(
        areal.url + "/v1/messages", {"model": "m", "max_tokens": 9, "messages": USER}, auth
    )

    assert chat == (500, {"detail": too_long})
    assert stream == (500, {"detail": f"Streaming setup failed: 500: {too_long}"})
    assert messages == (500, {"detail": too_long})
    assert areal.session(session.session_id).interactions == []


async def test_areal_responses_without_tools_fail_after_recording_the_interaction(
    areal_standin: ArealStandIn,
) -> None:
    session = areal_standin.open_session()
    auth = {"Authorization": f"Bearer {session.api_key}"}

    failed = await _post(areal_standin.url + "/responses", {"model": "m", "input": "hi"}, auth)
    answered = await _post(areal_standin.url + "/responses", {"model": "m", "input": "hi", "tools": []}, auth)

    assert failed[0] == 500 and failed[1]["detail"].startswith("1 validation error for Response\ntools")
    assert answered[0] == 200 and answered[1]["output"][0]["content"][0]["text"] == TITLE
    assert [i.response is None for i in areal_standin.session(session.session_id).interactions] == [
        True,
        False,
    ]


def test_areal_translates_messages_with_an_empty_text_block_before_the_tool_use(
    areal_standin: ArealStandIn,
) -> None:
    client = anthropic.Anthropic(
        base_url=areal_standin.url, api_key=areal_standin.open_session().api_key, max_retries=0
    )

    message = client.messages.create(model="claude-x", max_tokens=64, messages=USER, tools=[CLAUDE_BASH])
    with client.messages.stream(
        model="claude-x", max_tokens=64, messages=USER, tools=[CLAUDE_BASH]
    ) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_message()

    assert [b.type for b in message.content] == ["text", "tool_use"] and message.model == "None"
    assert message.stop_reason == streamed.stop_reason == "tool_use" and streamed.model == "claude-x"
    assert [b.type for b in streamed.content] == ["text", "tool_use"]
    assert events[0] == "message_start" and events[-1] == "message_stop" and "ping" not in events


# --- AReaL: the control routes ------------------------------------------------------------------------


async def test_areal_control_routes_want_the_admin_key_and_capacity(areal_standin: ArealStandIn) -> None:
    url, admin = areal_standin.url, {"Authorization": f"Bearer {areal_standin.admin_key}"}

    assert await _post(url + "/grant_capacity") == (401, {"detail": MISSING_TOKEN})
    assert await _post(url + "/grant_capacity", headers={"Authorization": "Bearer nope"}) == (
        403,
        {"detail": "Invalid admin API key."},
    )
    assert await _post(url + "/rl/start_session", {"task_id": "t0"}, admin) == (
        429,
        {"detail": "No available capacity to start a new session"},
    )
    assert [(await _post(url + "/grant_capacity", headers=admin))[1] for _ in range(3)] == [
        {"capacity": 1},
        {"capacity": 2},
        {"capacity": 3},
    ]
    status, started = await _post(url + "/rl/start_session", {"task_id": "t0"}, admin)
    assert status == 200 and started["session_id"] == "t0-0" and len(started["api_key"]) == 43
    reuse_admin = {"task_id": "t0", "api_key": areal_standin.admin_key}
    assert await _post(url + "/rl/start_session", reuse_admin, admin) == (
        400,
        {"detail": "Cannot use the admin API key as a session key."},
    )
    assert await _post(
        url + "/rl/start_session", {"task_id": "t0", "api_key": started["api_key"]}, admin
    ) == (
        409,
        {"detail": "API key is already bound to active session t0-0."},
    )


async def test_areal_session_rewards_the_last_call_and_exports_after_end_session(
    areal_standin: ArealStandIn,
) -> None:
    url, admin = areal_standin.url, {"Authorization": f"Bearer {areal_standin.admin_key}"}
    session = areal_standin.open_session("t1")
    key = {"Authorization": f"Bearer {session.api_key}"}
    for _ in range(3):
        assert (await _post(url + "/chat/completions", {"model": "m", "messages": USER}, key))[0] == 200
    assert await _post(url + "/rl/set_reward", {"interaction_id": "nope", "reward": 1.0}, key) == (
        400,
        {"detail": "Interaction nope not found"},
    )
    assert await _post(url + "/rl/set_reward", {"interaction_id": None, "reward": 1.0}, key) == (
        200,
        {"message": "success"},
    )

    export = asyncio.ensure_future(
        _post(url + "/export_trajectories", {"session_id": "t1-0", "discount": 0.5}, admin)
    )
    await asyncio.sleep(0.2)
    assert not export.done()  # export waits for end_session, as AReaL's does
    assert await _post(url + "/rl/end_session", {}, key) == (
        200,
        {"message": "success", "interaction_count": 3},
    )
    status, exported = await export

    assert status == 200 and [i["reward"] for i in exported["interactions"].values()] == [0.25, 0.5, 1.0]
    assert await _post(url + "/chat/completions", {"model": "m", "messages": USER}, key) == (
        401,
        {"detail": BAD_SESSION_KEY},
    )
    assert await _post(url + "/export_trajectories", {"session_id": "t1-0"}, admin) == (
        404,
        {"detail": "Session t1-0 not found"},
    )


# --- vLLM and SGLang ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flavor", "message"),
    [
        (
            "vllm",
            "max_tokens=900 cannot be greater than max_model_len=800. Please request fewer output tokens.",
        ),
        ("sglang", "Requested token count exceeds the model's maximum context length of 800 tokens."),
    ],
)
def test_openai_like_refuses_over_long_requests_in_its_flavours_error_shape(
    standin_factory: Factory, flavor: str, message: str
) -> None:
    upstream = standin_factory(OpenAILikeStandIn, flavor=flavor, max_model_len=800)
    client = openai.OpenAI(base_url=upstream.v1_url, api_key="sk-test", max_retries=0)

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="standin-model", messages=USER, max_tokens=900)

    body = refused.value.response.json()
    error = body["error"] if flavor == "vllm" else body  # vLLM nests the error, SGLang's body is flat
    assert (
        error["message"].startswith(message) and error["code"] == 400 and error["type"] == "BadRequestError"
    )
    assert ("object" in body) == (flavor == "sglang")
    assert client.models.list().data[0].model_dump()["max_model_len"] == 800


async def test_vllm_tells_an_unknown_model_from_an_unknown_route(vllm_standin: OpenAILikeStandIn) -> None:
    unknown_model = await _post(
        vllm_standin.v1_url + "/chat/completions", {"model": "other", "messages": USER}
    )
    unknown_route = await _post(
        vllm_standin.url + "/chat/completions", {"model": "standin-model", "messages": USER}
    )

    assert unknown_model == (
        404,
        {
            "error": {
                "message": "The model `other` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        },
    )
    assert unknown_route == (404, NOT_FOUND)


@pytest.mark.parametrize("include_usage", [True, False])
async def test_openai_like_sends_a_usage_chunk_only_when_asked(
    vllm_standin: OpenAILikeStandIn, include_usage: bool
) -> None:
    body = {"messages": USER, "stream": True, "stream_options": {"include_usage": include_usage}}
    async with (
        aiohttp.ClientSession() as http,
        http.post(vllm_standin.v1_url + "/chat/completions", json=body) as r,
    ):
        *chunks, done = _sse_data(await r.read())

    usage_chunks = [c for c in chunks if not c["choices"]]
    assert done == "[DONE]" and len(usage_chunks) == int(include_usage)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == TITLE


def test_openai_like_streams_tool_arguments_in_pieces_the_sdk_reassembles(
    sglang_standin: OpenAILikeStandIn,
) -> None:
    client = openai.OpenAI(base_url=sglang_standin.v1_url, api_key="sk-test", max_retries=0)

    chunks = list(client.chat.completions.create(model="any", messages=USER, tools=[BASH_TOOL], stream=True))

    pieces = [
        c.choices[0].delta.tool_calls[0].function.arguments for c in chunks if c.choices[0].delta.tool_calls
    ]
    assert len(pieces) == 3 and json.loads("".join(p or "" for p in pieces)) == {"command": TOOL_COMMAND}


async def _stream(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        return _sse_data(await r.read())


PROMPT_IDS = te.render(USER)
TITLE_IDS = te.completion(TITLE)


async def test_vllm_returns_token_ids_only_when_asked_top_level_prompt_per_choice_completion(
    vllm_standin: OpenAILikeStandIn,
) -> None:
    url = vllm_standin.v1_url + "/chat/completions"
    _, plain = await _post(url, {"messages": USER})
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    _, body = await _post(url, {"messages": USER, "return_token_ids": True, "logprobs": True})
    assert body["prompt_token_ids"] == PROMPT_IDS and body["choices"][0]["token_ids"] == TITLE_IDS
    assert len(body["choices"][0]["logprobs"]["content"]) == len(TITLE_IDS)
    *chunks, done = await _stream(url, {"messages": USER, "stream": True, "return_token_ids": True})
    # The prompt's ids on the first chunk, each chunk's own ids, the end-of-turn id on the finish chunk.
    assert done == "[DONE]" and chunks[0]["prompt_token_ids"] == PROMPT_IDS
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == TITLE_IDS
    assert chunks[-1]["choices"][0]["token_ids"] == [te.IM_END] and chunks[-1]["choices"][0]["finish_reason"]
    _, version = await _get(vllm_standin.url + "/version")
    assert version == {"version": "0.11.0"}


async def test_sglang_refuses_return_token_ids_on_a_streamed_chat_and_streams_sglext_last(
    sglang_standin: OpenAILikeStandIn,
) -> None:
    url = sglang_standin.v1_url + "/chat/completions"
    status, refusal = await _post(url, {"messages": USER, "stream": True, "return_token_ids": True})
    assert status == 400 and refusal["message"].startswith("return_token_ids is not supported with streaming")
    _, body = await _post(url, {"messages": USER, "return_token_ids": True})
    choice = body["choices"][0]
    assert (choice["prompt_token_ids"], choice["response_token_ids"]) == (PROMPT_IDS, TITLE_IDS)
    headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    *chunks, done = await _stream(url, {"messages": USER, "stream": True}, headers)
    assert done == "[DONE]" and chunks[-1]["choices"] == []
    assert chunks[-1]["sglext"] == {"input_ids": PROMPT_IDS, "output_ids": [TITLE_IDS]}
    _, info = await _get(sglang_standin.url + "/server_info")
    assert info["version"] == "0.5.23"


async def test_completions_carry_both_id_lists_per_choice_in_either_flavour(standin_factory: Factory) -> None:
    for flavor in ("vllm", "sglang"):
        upstream = standin_factory(OpenAILikeStandIn, flavor=flavor)
        url = upstream.v1_url + "/completions"
        *chunks, _ = await _stream(url, {"prompt": "hello", "stream": True, "return_token_ids": True})
        assert chunks[0]["choices"][0]["prompt_token_ids"] == te.encode("hello")
        assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == TITLE_IDS


# --- Anthropic ----------------------------------------------------------------------------------------


async def test_anthropic_like_frames_events_as_the_api_does(anthropic_standin: AnthropicLikeStandIn) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": USER, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(anthropic_standin.url + "/v1/messages", json=body) as r,
    ):
        raw = (await r.read()).decode()

    events = [block.split("\n") for block in raw.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    assert all(
        json.loads(lines[1].removeprefix("data: "))["type"] == name
        for name, lines in zip(names, events, strict=True)
    )
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert names.count("content_block_delta") == len(TITLE.split())


def test_anthropic_like_serves_the_sdk_streams_counts_and_models(
    anthropic_standin: AnthropicLikeStandIn,
) -> None:
    client = anthropic.Anthropic(base_url=anthropic_standin.url, api_key="sk-ant-test", max_retries=0)

    with client.messages.stream(
        model="claude-x", max_tokens=64, messages=USER, tools=[CLAUDE_BASH]
    ) as stream:
        message = stream.get_final_message()
    counted = client.messages.count_tokens(model="claude-x", messages=USER)

    assert message.stop_reason == "tool_use" and message.content[0].type == "tool_use"
    assert message.content[0].input == {"command": TOOL_COMMAND, "description": "Print the result of 6 * 7"}
    assert counted.input_tokens == approx_tokens(USER)
    assert [m.id for m in client.models.list().data] == ["claude-standin"]


@pytest.mark.parametrize("auth", ["x-api-key", "bearer"])
async def test_anthropic_like_checks_its_key_in_either_header(standin_factory: Factory, auth: str) -> None:
    upstream = standin_factory(AnthropicLikeStandIn, api_key="sk-ant-right")
    body = {"model": "m", "max_tokens": 8, "messages": USER}

    def header(key: str) -> dict[str, str]:
        return {"x-api-key": key} if auth == "x-api-key" else {"Authorization": f"Bearer {key}"}

    right = await _post(upstream.url + "/v1/messages?beta=true", body, header("sk-ant-right"))
    wrong = await _post(upstream.url + "/v1/messages", body, header("sk-ant-wrong"))

    assert right[0] == 200 and right[1]["content"] == [{"type": "text", "text": TITLE}]
    assert wrong == (
        401,
        {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
    )


async def test_anthropic_like_refuses_a_prompt_over_its_window_and_answers_head(
    standin_factory: Factory,
) -> None:
    upstream = standin_factory(AnthropicLikeStandIn, context_window=1)
    prompt_tokens = approx_tokens(USER)

    status, body = await _post(
        upstream.url + "/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER}
    )
    async with aiohttp.ClientSession() as http, http.head(upstream.url + "/api/hello") as head:
        head_status = head.status

    assert status == 400 and body["error"] == {
        "type": "invalid_request_error",
        "message": f"prompt is too long: {prompt_tokens} tokens > 1 maximum",
    }
    assert head_status == 200


# --- Error injection and the request log, on every stand-in -------------------------------------------

KINDS = [ArealStandIn, OpenAILikeStandIn, AnthropicLikeStandIn]


def _model_call(upstream: StandIn, stream: bool = False) -> tuple[str, dict[str, Any], dict[str, str]]:
    """URL, body and headers of one model call in the stand-in's own dialect."""
    if isinstance(upstream, ArealStandIn):
        key = upstream.open_session().api_key
        return (
            upstream.url + "/chat/completions",
            {"model": "m", "messages": USER, "stream": stream},
            {"x-api-key": key},
        )
    if isinstance(upstream, OpenAILikeStandIn):
        return (
            upstream.v1_url + "/chat/completions",
            {"model": "standin-model", "messages": USER, "stream": stream},
            {},
        )
    return (
        upstream.url + "/v1/messages",
        {"model": "m", "max_tokens": 8, "messages": USER, "stream": stream},
        {},
    )


ERROR_BODIES = {
    (ArealStandIn, "500"): {"detail": "Internal server error (stand-in)"},
    (ArealStandIn, "401"): {"detail": BAD_SESSION_KEY},
    (OpenAILikeStandIn, "429"): {
        "error": {
            "message": "Rate limit reached (stand-in)",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    },
    (OpenAILikeStandIn, "404"): {
        "error": {
            "message": "The model `standin-model` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": None,
            "code": "model_not_found",
        }
    },
    (AnthropicLikeStandIn, "400ctx"): {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum",
        },
    },
    (AnthropicLikeStandIn, "500"): {
        "type": "error",
        "error": {"type": "api_error", "message": "Internal server error"},
    },
}


@pytest.mark.parametrize(("kind", "fault"), list(ERROR_BODIES))
async def test_injected_errors_use_the_backends_shape_with_retry_headers_then_clear(
    standin_factory: Factory, kind: type[StandIn], fault: Any
) -> None:
    upstream = standin_factory(kind)
    upstream.inject(fault, times=1, retry_after_ms=1500)
    url, body, headers = _model_call(upstream)

    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as faulted:
            assert (faulted.status, await faulted.json()) == (int(fault[:3]), ERROR_BODIES[kind, fault])
            assert (faulted.headers["retry-after-ms"], faulted.headers["retry-after"]) == ("1500", "1")
        async with http.post(url, json=body, headers=headers) as healthy:
            assert healthy.status == 200


@pytest.mark.parametrize("kind", KINDS)
async def test_broken_sse_waits_for_a_streamed_call(standin_factory: Factory, kind: type[StandIn]) -> None:
    upstream = standin_factory(kind)
    upstream.inject("badsse")
    url, body, headers = _model_call(upstream)

    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers=headers) as plain:
            assert plain.status == 200 and (await plain.json())
        async with http.post(url, json={**body, "stream": True}, headers=headers) as streamed:
            assert (await streamed.read()).endswith(b"data: {not json\n\n")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fault", ["reset", "truncate"])
@pytest.mark.parametrize("stream", [False, True])
async def test_reset_and_truncation_end_the_body_early(
    standin_factory: Factory, kind: type[StandIn], fault: Any, stream: bool
) -> None:
    upstream = standin_factory(kind)
    upstream.inject(fault)
    url, body, headers = _model_call(upstream, stream)

    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


@pytest.mark.parametrize("kind", KINDS)
async def test_gzip_compresses_the_answer(standin_factory: Factory, kind: type[StandIn]) -> None:
    upstream = standin_factory(kind)
    upstream.inject("gzip")
    url, body, headers = _model_call(upstream)

    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert await response.json()  # aiohttp decompresses; the JSON inside is whole


async def test_stall_holds_back_the_headers(standin_factory: Factory) -> None:
    upstream = standin_factory(OpenAILikeStandIn)
    upstream.inject("stall", stall_s=5)
    url, body, headers = _model_call(upstream)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=0.3)) as http:
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(url, json=body, headers=headers):
                pass


async def test_every_request_is_logged_with_path_query_headers_and_body(standin_factory: Factory) -> None:
    upstream = standin_factory(AnthropicLikeStandIn)
    body = {"model": "m", "max_tokens": 8, "messages": USER}

    await _post(upstream.url + "/v1/messages?beta=true", body, {"X-Trace": "t-1"})
    await _post(upstream.url + "/nowhere", body)

    logged, missing = upstream.requests
    assert (logged.method, logged.path, logged.path_qs, logged.query) == (
        "POST",
        "/v1/messages",
        "/v1/messages?beta=true",
        {"beta": "true"},
    )
    assert logged.headers["x-trace"] == "t-1" and logged.body == body and json.loads(logged.raw) == body
    assert missing.path == "/nowhere" and upstream.model_requests == [logged]
