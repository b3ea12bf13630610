"""modeltap in front of AReaL 1.0.4's real proxy server: what AReaL trains on equals what modeltap recorded.

Each test plays one AReaL episode by hand, the way `OpenAIProxyWorkflow.arun_episode` does
(docs/areal.md §3.1): grant capacity, start an AReaL session, give the agent a
modeltap session whose upstream key is AReaL's session key, set the reward on the last interaction, end
the session, export. The agent never sees AReaL's key or address.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal_server import ArealProxyServer, ArealSession
from conftest import ENGINE_MAX_TOKENS
from fake_engine import BASH_TOOL, TOOL_COMMAND, TOOL_RESULT_ANSWER
from sdk_turns import anthropic_tool_turns

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.proxy.sessions import Session
from modeltap.records.reader import StoreReader
from tests.agents import arun_agent, arun_claude, arun_opencode, codex_command

QUESTION = "What is six times seven? Use the shell."


@dataclass
class Episode:
    """One AReaL session and the modeltap session that fronts it."""

    areal: ArealSession
    tap: Session


def tap_config(areal_server: ArealProxyServer, tmp_path: Path, **settings: Any) -> ProxyConfig:
    """modeltap on loopback with AReaL's proxy as its upstream, recording into the test's folder."""
    store = str(tmp_path / "records.db")
    return ProxyConfig(upstream=areal_server.base_url, host="127.0.0.1", port=0, store=store, **settings)


@pytest.fixture
async def modeltap(areal_server: ArealProxyServer, tmp_path: Path) -> AsyncIterator[Proxy]:
    """modeltap in front of AReaL, path layout found by probing."""
    async with Proxy(tap_config(areal_server, tmp_path, layout="auto")) as proxy:
        yield proxy


async def open_episode(areal_server: ArealProxyServer, proxy: Proxy, task_id: str) -> Episode:
    areal = await areal_server.open_session(task_id)
    tap = proxy.sessions.open(
        upstream=areal_server.base_url, upstream_key=areal.api_key, labels={"task_id": task_id}
    )
    return Episode(areal, tap)


async def finish_episode(
    areal_server: ArealProxyServer, proxy: Proxy, episode: Episode, reward: float | None
) -> tuple[dict[str, InteractionWithTokenLogpReward], list[dict[str, Any]]]:
    """Reward the last interaction (as the trainer does; None: leave it unset), export the episode from
    AReaL, and read modeltap's records of the session (after a stop, which flushes them)."""
    if reward is not None:
        await areal_server.set_last_reward(episode.areal, reward)
    exported = await areal_server.close_and_export(episode.areal)
    await proxy.stop()
    with StoreReader(proxy.config.store_path) as reader:
        return exported, reader.exchanges(session_id=episode.tap.id)


def assert_records_match(
    exported: dict[str, InteractionWithTokenLogpReward], records: list[dict[str, Any]], reward: float
) -> None:
    """modeltap recorded exactly the model calls AReaL will train on, in order, with AReaL's token
    counts, and the reward sits on the last of them."""
    assert [record["status"] for record in records] == [200] * len(exported)
    for record, (interaction_id, interaction) in zip(records, exported.items(), strict=True):
        mask = interaction.to_tensor_dict()["loss_mask"][0].tolist()
        assert (record["prompt_tokens"], record["completion_tokens"]) == (mask.index(1), sum(mask))
        # AReaL 1.0.4 streams /v1/messages through litellm, which invents its own "msg_<uuid>" id;
        # every other response carries the interaction id.
        if record["streamed"] and record["endpoint"] == "messages":
            assert record["response"]["id"].startswith("msg_")
        else:
            assert record["response"]["id"] == interaction_id
    assert [interaction.reward for interaction in exported.values()][-1] == reward


async def test_openai_sdk_at_v1_reaches_areal_and_is_recorded_turn_for_turn(
    areal_server: ArealProxyServer, modeltap: Proxy
) -> None:
    episode = await open_episode(areal_server, modeltap, "openai-sdk")
    # The habit AReaL answers with 404 on its own (test_areal_baseline): base_url ends in /v1.
    client = openai.AsyncOpenAI(base_url=episode.tap.host_base_url + "/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]

    first = await client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42\n"},
    ]
    stream = await client.chat.completions.create(
        model="policy", messages=messages, tools=[BASH_TOOL], stream=True
    )
    chunks = [chunk async for chunk in stream]
    exported, records = await finish_episode(areal_server, modeltap, episode, 1.0)

    assert json.loads(call.function.arguments) == {"command": TOOL_COMMAND}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TOOL_RESULT_ANSWER
    assert len(exported) == 2 and next(iter(exported)) == first.id
    assert_records_match(exported, records, 1.0)
    assert [record["streamed"] for record in records] == [False, True]
    # The layout probe settled on AReaL's bare path; the session token never went upstream.
    assert all(record["upstream_url"] == areal_server.base_url + "/chat/completions" for record in records)
    assert all(episode.tap.token not in json.dumps(record) for record in records)


@pytest.mark.parametrize("credential", ["path", "api_key"])
async def test_anthropic_sdk_reaches_areal_messages_and_is_recorded(
    areal_server: ArealProxyServer, modeltap: Proxy, credential: str
) -> None:
    episode = await open_episode(areal_server, modeltap, f"anthropic-{credential}")
    # A session is reachable by its URL, or by the proxy's plain URL with the token as the API key.
    if credential == "path":
        client = anthropic.AsyncAnthropic(base_url=episode.tap.host_base_url, api_key="unused", max_retries=0)
    else:
        client = anthropic.AsyncAnthropic(
            base_url=modeltap.host_base_url, api_key=episode.tap.token, max_retries=0
        )

    _, tool_use, second = await anthropic_tool_turns(client, QUESTION)
    exported, records = await finish_episode(areal_server, modeltap, episode, 1.0)

    assert tool_use.input == {"command": TOOL_COMMAND}
    assert [block.text for block in second.content if block.type == "text"] == [TOOL_RESULT_ANSWER]
    assert_records_match(exported, records, 1.0)
    assert all(record["upstream_url"] == areal_server.base_url + "/v1/messages" for record in records)


@pytest.mark.parametrize(
    "path", ["/rl/set_reward", "/v1/rl/set_reward", "/export_trajectories", "/grant_capacity"]
)
async def test_a_session_token_cannot_reach_areals_control_routes(
    areal_server: ArealProxyServer, modeltap: Proxy, path: str
) -> None:
    episode = await open_episode(areal_server, modeltap, "no-self-reward")
    body = {"interaction_id": None, "reward": 1.0, "session_id": episode.areal.session_id}
    async with httpx.AsyncClient(timeout=30) as client:
        answered = await client.post(
            episode.tap.host_base_url + "/v1/chat/completions",
            json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
        )
        in_path = await client.post(episode.tap.host_base_url + path, json=body)
        as_key = await client.post(
            modeltap.host_base_url + path, json=body, headers={"Authorization": f"Bearer {episode.tap.token}"}
        )
    exported, _ = await finish_episode(areal_server, modeltap, episode, reward=None)

    assert (answered.status_code, in_path.status_code, as_key.status_code) == (200, 403, 403)
    assert in_path.json()["error"]["type"] == as_key.json()["error"]["type"]
    # Nothing reached AReaL: had the agent's set_reward gone through, its interaction would hold 1.0.
    assert [interaction.reward for interaction in exported.values()] == [0.0]


async def test_opencode_trains_through_modeltap_one_interaction_per_model_call(
    areal_server: ArealProxyServer, modeltap: Proxy, tmp_path: Path
) -> None:
    episode = await open_episode(areal_server, modeltap, "opencode")

    run = await arun_opencode(episode.tap.host_base_url + "/v1", "unused", tmp_path / "project")
    exported, records = await finish_episode(areal_server, modeltap, episode, 1.0)

    assert (run.exit_code, run.final_text) == (0, TOOL_RESULT_ANSWER), run.describe()
    # opencode's title request, the turn that calls bash, the turn that reads its result
    # (docs/agents.md §3.5): AReaL trains on all three, modeltap recorded all three.
    assert len(exported) == 3
    assert_records_match(exported, records, 1.0)
    assert all(record["streamed"] for record in records)
    assert [record["tool_calls"] for record in records] == [0, 1, 0]


async def test_claude_code_trains_through_modeltap_one_interaction_per_model_call(
    areal_server: ArealProxyServer, modeltap: Proxy, tmp_path: Path
) -> None:
    """Claude Code sends the assistant's tool call as a lone tool_use block; AReaL 1.0.4's litellm turns
    that into `content: None`, on which the Qwen chat template fails (500). modeltap gives such a turn a
    leading empty text block on its way to AReaL (compat.areal.messages_body_for_areal), so both turns
    reach the engine and train, and the record keeps what Claude Code sent."""
    episode = await open_episode(areal_server, modeltap, "claude-code")

    run = await arun_claude(episode.tap.host_base_url, "unused", tmp_path / "project", max_retries=0)
    exported, records = await finish_episode(areal_server, modeltap, episode, 1.0)

    assert run.exit_code == 0 and run.final_text == "42", run.describe()
    assert all(
        record["upstream_url"] == areal_server.base_url + "/v1/messages?beta=true" for record in records
    )
    assert records[0]["tool_calls"] == 1
    sent_turn = next(m for m in records[1]["sent"]["messages"] if m["role"] == "assistant")
    recorded_turn = next(m for m in records[1]["request"]["messages"] if m["role"] == "assistant")
    assert sent_turn["content"][0] == {"type": "text", "text": ""}
    assert [b["type"] for b in recorded_turn["content"]] == ["tool_use"]
    assert len(exported) == 2
    assert_records_match(exported, records, 1.0)


async def test_codex_trains_through_modeltap_on_areals_responses(
    areal_server: ArealProxyServer, modeltap: Proxy, tmp_path: Path
) -> None:
    """AReaL 1.0.4's /responses answers a Response JSON even to `stream: true`, and Codex reads only
    streams (docs/agents.md §6.5): modeltap writes the Responses stream from AReaL's answer (and leaves
    out the `include` and non-function tools AReaL refuses: compat.areal), so Codex completes its task,
    and AReaL trains on exactly what modeltap recorded."""
    episode = await open_episode(areal_server, modeltap, "codex")

    run = await arun_agent(codex_command, episode.tap.host_base_url + "/v1", "unused", tmp_path / "project")
    if run.exit_code != 0 or run.final_text != "42":  # say what AReaL answered (no interaction to reward)
        await modeltap.stop()
        with StoreReader(modeltap.config.store_path) as reader:
            said = [(r["status"], r["error_message"]) for r in reader.exchanges(session_id=episode.tap.id)]
        pytest.fail(f"modeltap recorded {said}\n{run.describe()}")
    exported, records = await finish_episode(areal_server, modeltap, episode, 1.0)

    assert [(r["endpoint"], r["streamed"], r["synthesised"]) for r in records] == [
        ("responses", True, True)
    ] * 2
    assert all(r["upstream_url"] == areal_server.base_url + "/responses" for r in records)
    assert records[0]["tool_calls"] == 1 and records[1]["finish_reason"] == "completed"
    assert len(exported) == 2
    assert_records_match(exported, records, 1.0)


@pytest.fixture
async def budgeted_modeltap(
    areal_server: ArealProxyServer, tmp_path: Path, tokenizer_path: str
) -> AsyncIterator[Proxy]:
    """modeltap counting with the served model's tokenizer, its limits set to AReaL's engine_max_tokens."""
    config = tap_config(
        areal_server,
        tmp_path,
        layout="areal",
        tokenizer=tokenizer_path,
        context_length=ENGINE_MAX_TOKENS,
        engine_max_tokens=ENGINE_MAX_TOKENS,
    )
    async with Proxy(config) as proxy:
        yield proxy


async def test_a_prompt_over_budget_gets_modeltaps_400_instead_of_areals_500(
    areal_server: ArealProxyServer, budgeted_modeltap: Proxy, qwen_tokenizer
) -> None:
    episode = await open_episode(areal_server, budgeted_modeltap, "budget")
    client = openai.AsyncOpenAI(base_url=episode.tap.host_base_url + "/v1", api_key="unused", max_retries=0)
    overlong = [{"role": "user", "content": "word" + " word" * ENGINE_MAX_TOKENS}]
    prompt_tokens = len(
        qwen_tokenizer.apply_chat_template(overlong, add_generation_prompt=True, return_dict=False)
    )

    with pytest.raises(openai.BadRequestError) as rejected:
        await client.chat.completions.create(model="policy", messages=overlong)
    # No tools: AReaL's request validation reorders each tool's keys ("function" before "type"),
    # which changes the rendered prompt by a token; modeltap counts the tools as the client sent them.
    answered = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": QUESTION}]
    )
    exported, records = await finish_episode(areal_server, budgeted_modeltap, episode, 1.0)

    assert rejected.value.status_code == 400
    assert rejected.value.code == "context_length_exceeded"
    # P + M <= C - 1 with C = E (docs/token-budgets.md §0): the -1 is for SGLang, which refuses P + M == C.
    assert f"maximum context length is {ENGINE_MAX_TOKENS - 1} tokens" in rejected.value.message
    assert f"({prompt_tokens} in the messages" in rejected.value.message
    # AReaL never saw the rejected prompt; the next one it counted exactly as modeltap did.
    assert list(exported) == [answered.id]
    assert [record["status"] for record in records] == [400, 200]
    assert records[1]["counted_prompt_tokens"] == answered.usage.prompt_tokens
