"""`serve --token-ids` end to end: the real openai SDK through modeltap to the vLLM and SGLang stand-ins,
streamed and not, gets its answers while the records gain the ids each engine returned (asked for the
way docs/engines.md §3 says, never without the flag); against an upstream that returns none, the ids
are rendered with the served tokenizer and the continuity check still finds the breaks."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modeltap.exporters.export import write_export
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.factories import ASK, BASH_TOOL
from tests.standins import token_engine as te
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn


def client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)


async def bash_task(base_url: str, stream: bool, **extra: Any) -> list[Any]:
    """The two turns of the bash task through the openai SDK; returns each turn's parsed answer."""
    async with client(base_url) as sdk:
        first = await sdk.chat.completions.create(
            model="standin-model", messages=[ASK], tools=[BASH_TOOL], **extra
        )
        call = first.choices[0].message.tool_calls[0]
        history = [ASK, first.choices[0].message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
        if not stream:
            second = await sdk.chat.completions.create(
                model="standin-model", messages=history, tools=[BASH_TOOL]
            )
            return [first, second]
        chunks = await sdk.chat.completions.create(
            model="standin-model", messages=history, tools=[BASH_TOOL], stream=True, **extra
        )
        return [first, [chunk async for chunk in chunks]]


def tokens_export(store: Path, session: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with StoreReader(store) as reader:
        write_export(reader, session, "tokens", out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
async def test_the_openai_sdk_gets_its_answers_and_the_records_the_engines_ids(
    standin_factory: Callable[..., Any],
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    flavor: str,
    stream: bool,
) -> None:
    upstream: OpenAILikeStandIn = standin_factory(OpenAILikeStandIn, flavor=flavor)
    async with make_proxy(upstream=upstream.v1_url, token_ids=True) as proxy:
        session = proxy.sessions.open(labels={"task_id": "t1"})
        first, second = await bash_task(session.host_base_url + "/v1", stream)
    text = (
        "".join(c.choices[0].delta.content or "" for c in second if c.choices)
        if stream
        else second.choices[0].message.content
    )
    assert first.choices[0].message.tool_calls[0].function.name == "bash" and text == "42"
    calls = upstream.model_requests
    if flavor == "vllm":
        assert (
            calls[-1].body["return_token_ids"] is True
            and "x-sglext-return-input-ids" not in calls[-1].headers
        )
    else:
        # SGLang 0.5.20+ is asked by headers (and refuses return_token_ids on a streamed chat): the body
        # goes up as the client sent it.
        assert (
            "return_token_ids" not in calls[-1].body
            and calls[-1].headers["x-sglext-return-output-ids"] == "1"
        )
    [line] = tokens_export(store_path, session.id)
    prompt = te.render(calls[-1].body["messages"], calls[-1].body["tools"])
    assert line["input_ids"] == prompt + te.completion("42") and line["source"] == "served"
    assert line["labels"] == {"task_id": "t1"} and sum(line["loss_mask"]) > len(te.completion("42"))


async def test_without_the_flag_nothing_is_asked_and_the_body_goes_up_byte_for_byte(
    vllm_standin: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=vllm_standin.v1_url) as proxy:
        await bash_task(proxy.host_base_url + "/v1", stream=True)
    assert all("return_token_ids" not in call.body for call in vllm_standin.model_requests)
    assert not [r for r in vllm_standin.requests if r.path in ("/version", "/server_info")]
    with StoreReader(store_path) as reader:
        [session] = reader.sessions()
        assert reader.token_turns(session["id"]) == []


async def test_logprobs_are_asked_and_exported_on_the_completion_ids(
    vllm_standin: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=vllm_standin.v1_url, token_ids=True, logprobs=True) as proxy:
        session = proxy.sessions.open()
        await bash_task(session.host_base_url + "/v1", stream=True)
    assert all(call.body["logprobs"] is True for call in vllm_standin.model_requests)
    [line] = tokens_export(store_path, session.id)
    # The stand-in's logprob of each id is -id/1000: each sits on its own id, null off the completions.
    assert all(
        (lp is None) == (mask == 0) and (lp is None or lp == pytest.approx(-token / 1000))
        for token, mask, lp in zip(line["input_ids"], line["loss_mask"], line["logprobs"], strict=True)
    )


async def test_an_explicit_engine_skips_the_probe_and_auto_probes_once(
    sglang_standin: OpenAILikeStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    async with make_proxy(upstream=sglang_standin.v1_url, token_ids=True, engine="sglang") as proxy:
        await bash_task(proxy.host_base_url + "/v1", stream=True)
        assert "asked of sglang (--engine)" in proxy.context.token_ids_report
    assert not [r for r in sglang_standin.requests if r.method == "GET"]
    async with make_proxy(upstream=sglang_standin.v1_url, token_ids=True) as proxy:
        await bash_task(proxy.host_base_url + "/v1", stream=False)
        assert "asked of sglang 0.5.23" in proxy.context.token_ids_report
    probes = [r.path for r in sglang_standin.requests if r.method == "GET"]
    assert probes == ["/v1/models", "/version", "/server_info", "/get_server_info", "/health"]


async def test_without_ids_from_the_server_they_are_rendered_and_breaks_still_found(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, qwen_dir: str
) -> None:
    async with make_proxy(upstream=areal.url, token_ids=True, tokenizer=qwen_dir, budget="off") as proxy:
        assert "rendered with" in proxy.context.token_ids_report
        upstream_session = areal.open_session("t")
        session = proxy.sessions.open(upstream_key=upstream_session.api_key)
        await bash_task(session.host_base_url + "/v1", stream=True)
    assert all("return_token_ids" not in call.body for call in areal.model_requests)
    with StoreReader(store_path) as reader:
        rows = reader.token_turns(session.id)
        assert [row["source"] for row in rows] == ["rendered", "rendered"]
        [drift] = [s["token_drift"] for s in reader.sessions()]
    # This Qwen template writes an empty think block into the reply it renders last, and none into the
    # same reply once it is history: re-rendering breaks the token history at the reply.
    assert drift is not None and (drift["turn"], drift["kind"], drift["role"]) == (
        2,
        "rerendered",
        "assistant",
    )
    assert drift["position"] == drift["previous_prompt_length"] and drift["source"] == "rendered"
    assert drift["expected"]["text"][drift["position"] - drift["expected"]["start"]] == "<think>"
    assert [line["turns"] for line in tokens_export(store_path, session.id)] == [[1], [2]]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_translated_request_is_asked_as_the_chat_request_it_becomes(
    standin_factory: Callable[..., Any], make_proxy: Callable[..., Proxy], store_path: Path, stream: bool
) -> None:
    upstream: OpenAILikeStandIn = standin_factory(OpenAILikeStandIn, flavor="vllm", chat_only=True)
    ask = [{"role": "user", "content": "hello"}]
    async with make_proxy(upstream=upstream.url, layout="chat-only", token_ids=True) as proxy:
        client = anthropic.AsyncAnthropic(base_url=proxy.host_base_url, api_key="k", max_retries=0)
        if stream:
            async with client.messages.stream(model="standin-model", max_tokens=64, messages=ask) as events:
                reply = await events.get_final_message()
        else:
            reply = await client.messages.create(model="standin-model", max_tokens=64, messages=ask)
        await client.close()
    assert reply.content[0].text == "Shell arithmetic check"  # type: ignore[union-attr]
    [call] = upstream.model_requests
    assert call.path == "/v1/chat/completions" and call.body["return_token_ids"] is True
    with StoreReader(store_path) as reader:
        [session] = reader.sessions()
        [row] = reader.token_turns(session["id"])
        [recorded] = reader.exchanges(session["id"])
    assert (row["source"], row["prompt_length"]) == ("served", len(te.render(call.body["messages"])))
    assert recorded["translated"] == "chat" and recorded["received"]["choices"][0]["token_ids"].endswith(
        " token ids>"
    )
