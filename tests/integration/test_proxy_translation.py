"""Translation through the proxy, with the real SDKs and CLIs: a context overflow the chat upstream
reports, or modeltap's budget finds in the chat form, reaches each client as the refusal it acts on;
count_tokens is answered locally; the record keeps both sides."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.proxy.server import Proxy
from tests.agents import MODEL, arun_agent, arun_claude, codex_command
from tests.integration.conftest import records
from tests.standins import ArealStandIn, OpenAILikeStandIn

ASK = [{"role": "user", "content": "Run `echo $((6 * 7))`."}]
BASH = {"name": "bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
CONTEXT = 3000


@pytest.fixture
def chat_only() -> OpenAILikeStandIn:
    with OpenAILikeStandIn(chat_only=True) as upstream:
        yield upstream  # type: ignore[misc]


async def test_an_upstream_overflow_reaches_the_anthropic_sdk_as_prompt_too_long(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    with ArealStandIn(gateway=True, engine_max_tokens=8) as gateway:
        key = gateway.open_session("t").api_key
        async with make_proxy(upstream=gateway.url, layout="areal-gateway") as proxy:
            client = anthropic.AsyncAnthropic(base_url=proxy.host_base_url, api_key=key, max_retries=0)
            with pytest.raises(anthropic.BadRequestError) as info:
                await client.messages.create(model="m", max_tokens=64, messages=ASK, tools=[BASH])
            await client.close()
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert info.value.body["error"]["message"].startswith("prompt is too long: ")  # type: ignore[index]
    assert " tokens > 8 maximum. The upstream said: " in info.value.body["error"]["message"]  # type: ignore[index]
    [row] = records(store_path)
    assert (row["status"], row["error_class"], row["translated"]) == (400, "model_fault", "chat")
    assert row["sent"]["messages"][-1] == {"role": "user", "content": ASK[0]["content"]}
    assert row["received"] == {"detail": row["error_message"]} or row["received"] is None


@pytest.mark.parametrize("layout", ["areal-gateway", "auto"])
async def test_behind_the_v2_gateway_models_are_answered_here_and_responses_go_through_chat(
    make_proxy: Callable[..., Proxy], layout: str
) -> None:
    """The v2 gateway keeps /v1/models for its admin key (a session key gets 403) and serves no
    /responses: modeltap answers the one and translates the other, under `areal-gateway` and under
    `auto` with the upstream named by the session (the adapter's shape), which finds the gateway by its
    /health."""
    with ArealStandIn(gateway=True) as gateway:
        key = gateway.open_session("t").api_key
        upstream = gateway.url if layout == "areal-gateway" else None
        async with make_proxy(upstream=upstream, layout=layout, model="policy") as proxy:
            session = proxy.sessions.open(upstream=gateway.url, upstream_key=key)
            base_url = session.host_base_url + "/v1"
            client = openai.AsyncOpenAI(base_url=base_url, api_key=session.token, max_retries=0)
            models = await client.models.list()
            reply = await client.responses.create(model="policy", input="Run `echo $((6 * 7))`.")
            await client.close()
        paths = [request.path for request in gateway.control.requests]
    assert [model.id for model in models.data] == ["policy"]
    assert reply.status == "completed"
    assert "/v1/models" not in paths and "/models" not in paths
    assert [p for p in paths if p in ("/v1/chat/completions", "/responses", "/v1/responses")] == [
        "/v1/chat/completions"
    ]


async def test_the_budget_counts_the_chat_form_and_refuses_in_the_clients_words(
    chat_only: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path, qwen_dir: str
) -> None:
    words = [{"role": "user", "content": " ".join(f"w{i}" for i in range(4000))}]
    counted = TokenCounter.load(qwen_dir).count(dialects.named("chat"), {"messages": words})
    async with make_proxy(
        upstream=chat_only.url,
        layout="chat-only",
        tokenizer=qwen_dir,
        context_length=CONTEXT,
    ) as proxy:
        client = anthropic.AsyncAnthropic(base_url=proxy.host_base_url, api_key="k", max_retries=0)
        responses = openai.AsyncOpenAI(base_url=proxy.host_base_url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model=MODEL, max_tokens=64, messages=words)
        with pytest.raises(openai.BadRequestError) as codex_like:
            await responses.responses.create(model=MODEL, input=words[0]["content"], max_output_tokens=64)
        count = await client.messages.count_tokens(model=MODEL, messages=ASK)
        fits = await client.messages.create(model=MODEL, max_tokens=8000, messages=ASK)
        await client.close()
        await responses.close()
    assert refused.value.body["error"]["message"].startswith(  # type: ignore[index]
        f"prompt is too long: {counted} tokens > {CONTEXT - 2} maximum. modeltap refused"
    )
    assert codex_like.value.code == "context_length_exceeded"
    assert count.input_tokens > 0 and fits.stop_reason == "end_turn"
    assert [r.path for r in chat_only.model_requests] == ["/v1/chat/completions"]  # only the one that fits
    rows = records(store_path)
    assert [r["budget"]["action"] for r in rows if r["budget"]] == ["reject", "reject", "clamp"]
    clamped = rows[-1]
    assert clamped["request"]["max_tokens"] == 8000
    assert clamped["sent"]["max_completion_tokens"] == clamped["budget"]["allowed"] < 8000


@pytest.mark.agents
async def test_claude_code_stops_on_prompt_too_long_from_a_chat_only_upstream(
    chat_only: OpenAILikeStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    tmp_path: Path,
    qwen_dir: str,
) -> None:
    async with make_proxy(upstream=chat_only.url, tokenizer=qwen_dir, context_length=CONTEXT) as proxy:
        run = await arun_claude(proxy.host_base_url, "k", tmp_path, model=MODEL)
    assert run.exit_code == 1 and "Prompt is too long" in (run.final_text or ""), run.describe()
    assert chat_only.model_requests == []


@pytest.mark.agents
async def test_codex_stops_on_context_length_exceeded_from_a_chat_only_upstream(
    chat_only: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], tmp_path: Path, qwen_dir: str
) -> None:
    async with make_proxy(upstream=chat_only.url, tokenizer=qwen_dir, context_length=CONTEXT) as proxy:
        run = await arun_agent(codex_command, proxy.host_base_url + "/v1", "k", tmp_path)
    assert run.exit_code == 1 and "ran out of room" in run.stdout, run.describe()
    assert chat_only.model_requests == []
