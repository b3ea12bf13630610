"""The proxy core driven by the real openai and anthropic SDKs, in front of the AReaL stand-in and a
vLLM-like one: every base-URL habit, streaming and not, records of each exchange, errors in each
client's shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modeltap.proxy.server import Proxy
from tests.factories import ASK, BASH_TOOL
from tests.integration.conftest import records
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn

BASH_ANTHROPIC = {
    "name": "bash",
    "description": BASH_TOOL["function"]["description"],
    "input_schema": BASH_TOOL["function"]["parameters"],
}


def openai_client(base_url: str, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0)


def anthropic_client(base_url: str, key: str = "unused") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key=key, max_retries=0)


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
async def test_openai_sdk_reaches_areal_bare_path_with_the_session_key(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path, suffix: str
) -> None:
    upstream_session = areal.open_session("t1")
    session = areal_proxy.sessions.open(upstream_key=upstream_session.api_key, labels={"task_id": "t1"})
    async with openai_client(session.host_base_url + suffix) as client:
        first = await client.chat.completions.create(model="policy", messages=[ASK], tools=[BASH_TOOL])
        call = first.choices[0].message.tool_calls[0]
        assert (call.function.name, json.loads(call.function.arguments)["command"]) == (
            "bash",
            "echo $((6 * 7))",
        )
        history = [ASK, first.choices[0].message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
        stream = await client.chat.completions.create(
            model="policy", messages=history, tools=[BASH_TOOL], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "42"
    await areal_proxy.stop()

    chat_calls = [r for r in areal.requests if r.path.endswith("/chat/completions")]
    assert [r.path for r in chat_calls][-2:] == ["/chat/completions", "/chat/completions"]
    assert all(r.headers["Authorization"] == f"Bearer {upstream_session.api_key}" for r in chat_calls)
    assert len(upstream_session.interactions) == 2  # AReaL recorded both turns in its own session

    rows = records(store_path, session.id)
    assert [(r["endpoint"], r["status"], r["streamed"]) for r in rows] == [
        ("chat", 200, False),
        ("chat", 200, True),
    ]
    assert rows[0]["finish_reason"] == "tool_calls" and rows[0]["tool_calls"] == 1
    assert rows[1]["response"]["choices"][0]["message"]["content"] == "42"
    assert rows[1]["completion_tokens"] is not None and rows[1]["stream_complete"]
    assert all(r["labels"] == {"task_id": "t1", "client": "openai-python"} for r in rows)
    assert all(session.token not in r["path"] for r in rows)


@pytest.mark.parametrize("suffix", ["", "/v1"])
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_through_any_base(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path, suffix: str, stream: bool
) -> None:
    upstream_session = areal.open_session("t2")
    session = areal_proxy.sessions.open(upstream_key=upstream_session.api_key)
    async with anthropic_client(session.host_base_url + suffix) as client:
        kwargs: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 256,
            "messages": [ASK],
            "tools": [BASH_ANTHROPIC],
        }
        if stream:
            async with client.messages.stream(**kwargs) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
    [tool_use] = [b for b in message.content if b.type == "tool_use"]
    assert tool_use.input == {"command": "echo $((6 * 7))"} and message.stop_reason == "tool_use"
    await areal_proxy.stop()
    [row] = records(store_path, session.id)
    assert (row["endpoint"], row["status"], row["streamed"], row["finish_reason"]) == (
        "messages",
        200,
        stream,
        "tool_use",
    )
    assert row["path"].startswith(("/s/…/v1/messages", "/s/…/v1/v1/messages"))
    assert areal.requests[-1].path == "/v1/messages"


async def test_models_served_locally_and_count_tokens_without_tokenizer(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    async with make_proxy(upstream=areal.url, model="qwen-policy") as proxy:
        async with openai_client(proxy.host_base_url + "/v1") as client:
            assert [m.id for m in (await client.models.list()).data] == ["qwen-policy"]
            assert (await client.models.retrieve("qwen-policy")).id == "qwen-policy"
        async with anthropic_client(proxy.host_base_url) as client:
            assert [m.id for m in (await client.models.list()).data] == ["qwen-policy"]
            with pytest.raises(anthropic.APIStatusError) as info:
                await client.messages.count_tokens(model="m", messages=[ASK])
    assert info.value.status_code == 501 and "--tokenizer" in info.value.message


async def test_vllm_layout_passes_api_404_through_without_fallback(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    with OpenAILikeStandIn() as vllm:
        async with make_proxy(upstream=vllm.url) as proxy, openai_client(proxy.host_base_url) as client:
            reply = await client.chat.completions.create(model=vllm.config.model, messages=[ASK])
            assert reply.choices[0].finish_reason == "stop"
            with pytest.raises(openai.NotFoundError) as info:
                await client.chat.completions.create(model="no-such-model", messages=[ASK])
        assert "no-such-model" in info.value.message  # the API's own 404, passed through
        assert [r.path for r in vllm.model_requests] == ["/v1/chat/completions"] * 2
    rows = records(store_path)
    assert rows[-1]["status"] == 404 and rows[-1]["error_class"] == "client_error"


async def test_errors_in_each_clients_shape(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=areal.url, max_body_bytes=4096) as proxy:
        base = proxy.host_base_url
        async with openai_client(base + "/v1") as oa, anthropic_client(base) as an:
            with pytest.raises(openai.NotFoundError, match="no such endpoint"):
                await oa.post("/nope", cast_to=dict, body={})
            with pytest.raises(anthropic.NotFoundError):
                await an.post("/v1/messages/nope", cast_to=dict, body={})
            with pytest.raises(openai.APIStatusError) as too_big:
                await oa.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "x" * 8000}]
                )
            with pytest.raises(anthropic.PermissionDeniedError, match="never forwards"):
                await an.post("/rl/set_reward", cast_to=dict, body={"reward": 1.0})
    assert too_big.value.status_code == 413 and too_big.value.body["code"] == "request_too_large"
    rows = records(store_path)
    assert [r["status"] for r in rows] == [404, 404, 413, 403]
    assert not any(r.path.startswith("/rl") for r in areal.requests)


async def test_upstream_down_is_502_and_slow_is_504(
    make_proxy: Callable[..., Proxy], areal: ArealStandIn
) -> None:
    async with (
        make_proxy(upstream="http://127.0.0.1:1") as proxy,
        openai_client(proxy.host_base_url) as client,
    ):
        with pytest.raises(openai.APIStatusError) as down:
            await client.chat.completions.create(model="m", messages=[ASK])
    assert down.value.status_code == 502 and "cannot connect" in down.value.message
    areal.inject("stall", stall_s=5)
    async with (
        make_proxy(upstream=areal.url, read_timeout_s=0.3) as proxy,
        openai_client(proxy.host_base_url) as client,
    ):
        with pytest.raises(openai.APIStatusError) as slow:
            await client.chat.completions.create(model="m", messages=[ASK])
    assert slow.value.status_code == 504 and slow.value.body["code"] == "upstream_timeout"


async def test_completions_responses_and_embeddings_through_every_prefix(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    with OpenAILikeStandIn() as vllm:
        model = vllm.config.model
        async with make_proxy(upstream=vllm.url) as proxy:
            for base in (proxy.host_base_url, proxy.host_base_url + "/v1"):
                async with openai_client(base) as client:
                    completion = await client.completions.create(model=model, prompt="6 * 7 =", max_tokens=8)
                    response = await client.responses.create(model=model, input="Say hi")
                    streamed = await client.responses.create(model=model, input="Say hi", stream=True)
                    events = [event.type async for event in streamed]
                    embedding = await client.embeddings.create(model=model, input="hello")
                assert completion.choices[0].text and response.output_text
                assert events[-1] == "response.completed" and len(embedding.data[0].embedding) > 0
        paths = [r.path for r in vllm.model_requests]
    assert paths == ["/v1/completions", "/v1/responses", "/v1/responses", "/v1/embeddings"] * 2
    rows = records(store_path)
    assert [r["endpoint"] for r in rows] == ["completions", "responses", "responses", "embeddings"] * 2
    assert all(r["status"] == 200 and r["error_class"] is None for r in rows)
    streamed_row = rows[2]
    assert streamed_row["streamed"] and streamed_row["response"]["object"] == "response"
