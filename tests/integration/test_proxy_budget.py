"""Token budgets through the proxy: over-long requests get the canonical 400 in each client's shape
before the upstream sees them, clamps rewrite only the client's field, count_tokens answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.proxy.server import Proxy
from tests.integration.conftest import records
from tests.standins.areal import ArealStandIn

CONTEXT = 4096


@pytest.fixture(scope="module")
def counter(qwen_dir: str) -> TokenCounter:
    return TokenCounter.load(qwen_dir)


@pytest.fixture
def budget_proxy(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], qwen_dir: str
) -> Callable[..., Proxy]:
    def make(**overrides: object) -> Proxy:
        return make_proxy(upstream=areal.url, tokenizer=qwen_dir, context_length=CONTEXT, **overrides)

    return make


def long_messages(words: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": " ".join(f"word{i}" for i in range(words))}]


async def test_over_budget_is_the_canonical_400_and_never_reaches_areal(
    areal: ArealStandIn, budget_proxy: Callable[..., Proxy], store_path: Path, counter: TokenCounter
) -> None:
    messages = long_messages(3000)
    prompt = counter.count(dialects.named("chat"), {"messages": messages})
    async with budget_proxy(budget="reject") as proxy:
        client = openai.AsyncOpenAI(base_url=proxy.host_base_url + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="m", messages=messages, max_tokens=1000)
        await client.close()
    assert info.value.code == "context_length_exceeded"
    # The limit stated is the one in force, C - 1 (pre-fix SGLang refuses P + M == C:
    # docs/token-budgets.md §1.2).
    assert info.value.body["message"] == (
        f"This model's maximum context length is {CONTEXT - 1} tokens. However, you requested "
        f"{prompt + 1000} tokens ({prompt} in the messages, 1000 in the completion). Please reduce the "
        "length of the messages or completion. modeltap refused this request before the upstream saw it: "
        f"the limit is the context length {CONTEXT} less 1, since some servers refuse a prompt and "
        "completion that fill the window exactly; at least 1000 completion tokens must fit."
    )
    assert info.value.response.headers["x-modeltap-budget"] == f"rejected {prompt}+1000>{CONTEXT - 1}"
    assert areal.model_requests == []
    [row] = records(store_path)
    assert (row["status"], row["error_class"], row["budget"]["action"]) == (400, "model_fault", "reject")
    assert row["budget"]["prompt_tokens"] == prompt


async def test_clamp_rewrites_only_the_clients_field(
    areal: ArealStandIn, budget_proxy: Callable[..., Proxy], store_path: Path, counter: TokenCounter
) -> None:
    session = areal.open_session("clamp")
    messages = long_messages(200)
    prompt = counter.count(dialects.named("chat"), {"messages": messages})
    async with budget_proxy() as proxy:
        client = openai.AsyncOpenAI(
            base_url=proxy.host_base_url + "/v1", api_key=session.api_key, max_retries=0
        )
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=messages, max_tokens=100_000
        )
        await client.chat.completions.create(model="m", messages=messages)  # M absent: made explicit
        await client.close()
    assert raw.headers["x-modeltap-budget"] == f"clamped 100000->{CONTEXT - 1 - prompt}"
    sent = [r.body for r in areal.model_requests]
    assert sent[0]["max_tokens"] == CONTEXT - 1 - prompt and "max_completion_tokens" not in sent[0]
    assert "max_tokens" not in sent[1] or "max_completion_tokens" not in sent[1]  # never both: AReaL 500s
    assert (sent[1].get("max_completion_tokens") or sent[1].get("max_tokens")) == CONTEXT - 1 - prompt
    rows = records(store_path)
    assert [r["budget"]["action"] for r in rows] == ["clamp", "clamp"]
    assert rows[0]["request"]["max_tokens"] == 100_000  # the record keeps what the agent sent
    assert rows[0]["budget"]["allowed"] == CONTEXT - 1 - prompt


async def test_anthropic_gets_prompt_is_too_long_and_count_tokens_counts(
    areal: ArealStandIn, budget_proxy: Callable[..., Proxy], counter: TokenCounter
) -> None:
    short = [{"role": "user", "content": "hello"}]
    async with budget_proxy(budget="reject") as proxy:
        client = anthropic.AsyncAnthropic(base_url=proxy.host_base_url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as info:
            await client.messages.create(model="m", max_tokens=1000, messages=long_messages(3000))
        counted = await client.messages.count_tokens(model="m", messages=short)
        await client.close()
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["message"].startswith("prompt is too long: ")
    assert counted.input_tokens == counter.count(dialects.named("count_tokens"), {"messages": short})
    assert areal.model_requests == []
