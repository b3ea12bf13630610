"""AReaL 1.0.4's real proxy on its own: the behaviour modeltap is built around, checked at the source.

Each test pins one fact from docs/areal.md §10.5 that modeltap's layouts, budget or error
classification depend on, so a change of AReaL version that breaks one of them fails here first.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from areal_server import ArealProxyServer
from conftest import ENGINE_MAX_TOKENS
from fake_engine import (
    BASH_TOOL,
    DEFAULT_POLICY_VERSION,
    TOOL_COMMAND,
    TOOL_RESULT_ANSWER,
    fake_logprob,
)
from sdk_turns import anthropic_tool_turns


def openai_client(server: ArealProxyServer, api_key: str, path: str = "") -> openai.AsyncOpenAI:
    # max_retries=0: SDK retries leave orphan completions in AReaL's session (docs/areal.md §7).
    return openai.AsyncOpenAI(base_url=server.base_url + path, api_key=api_key, max_retries=0)


async def test_chat_completions_live_at_the_bare_path_only(areal_server: ArealProxyServer) -> None:
    session = await areal_server.open_session("bare-path")
    messages = [{"role": "user", "content": "hello proxy"}]

    with pytest.raises(openai.NotFoundError) as not_found:
        await openai_client(areal_server, session.api_key, "/v1").chat.completions.create(
            model="policy", messages=messages
        )
    reply = await openai_client(areal_server, session.api_key).chat.completions.create(
        model="policy", messages=messages
    )

    assert not_found.value.response.json() == {"detail": "Not Found"}
    assert reply.choices[0].message.content == "Echo: hello proxy"
    assert reply.id.startswith("chatcmpl-")
    await areal_server.close_and_export(session)


async def test_overlong_prompt_is_a_500_naming_both_counts(
    areal_server: ArealProxyServer, qwen_tokenizer
) -> None:
    session = await areal_server.open_session("overlong")
    # " word" is one Qwen token, so this lands just past the cap.
    messages = [{"role": "user", "content": "word" + " word" * ENGINE_MAX_TOKENS}]
    prompt_tokens = len(
        qwen_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    )
    assert prompt_tokens > ENGINE_MAX_TOKENS
    headers = {"Authorization": f"Bearer {session.api_key}"}
    body = {"model": "policy", "messages": messages}

    async with httpx.AsyncClient(base_url=areal_server.base_url, headers=headers, timeout=60) as client:
        plain = await client.post("/chat/completions", json=body)
        streamed = await client.post("/chat/completions", json={**body, "stream": True})

    detail = f"len of prompt tokens {prompt_tokens} exceeds max_total_tokens {ENGINE_MAX_TOKENS}"
    assert (plain.status_code, plain.json()) == (500, {"detail": detail})
    assert (streamed.status_code, streamed.json()) == (
        500,
        {"detail": f"Streaming setup failed: 500: {detail}"},
    )
    # Rejected before generation: nothing of it is left to train on.
    assert await areal_server.close_and_export(session) == {}


async def test_admin_endpoints_take_only_the_configured_key(areal_server: ArealProxyServer) -> None:
    async with httpx.AsyncClient(base_url=areal_server.base_url, timeout=30) as client:
        anonymous = await client.post("/grant_capacity")
        default_key = await client.post(
            "/grant_capacity", headers={"Authorization": "Bearer areal-admin-key"}
        )
        configured = await client.post("/grant_capacity", headers=areal_server.admin_headers())

    assert anonymous.status_code == 401
    assert (default_key.status_code, default_key.json()) == (403, {"detail": "Invalid admin API key."})
    assert configured.status_code == 200 and "capacity" in configured.json()


async def test_scripted_tool_turns_export_as_two_trainable_interactions(
    areal_server: ArealProxyServer, qwen_tokenizer
) -> None:
    session = await areal_server.open_session("tool-turns")
    client = openai_client(areal_server, session.api_key)
    messages: list[dict] = [{"role": "user", "content": "What is six times seven? Use the shell."}]

    first = await client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "42\n"},
    ]
    second = await client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
    await areal_server.set_last_reward(session, 1.0)
    exported = await areal_server.close_and_export(session, discount=0.5)

    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": TOOL_COMMAND})
    assert second.choices[0].message.content == TOOL_RESULT_ANSWER
    assert list(exported) == [first.id, second.id]
    assert [interaction.reward for interaction in exported.values()] == [0.5, 1.0]
    for completion, interaction in zip((first, second), exported.values(), strict=True):
        tensors = interaction.to_tensor_dict()
        ids = tensors["input_ids"][0].tolist()
        mask = tensors["loss_mask"][0].tolist()
        prompt_len = mask.index(1)
        output = ids[prompt_len:]
        assert (prompt_len, len(output)) == (
            completion.usage.prompt_tokens,
            completion.usage.completion_tokens,
        )
        assert sum(mask) == len(output) and output[-1] == qwen_tokenizer.eos_token_id
        assert tensors["versions"][0].tolist() == [-1] * prompt_len + [DEFAULT_POLICY_VERSION] * len(output)
        expected_logprobs = [fake_logprob(token, i) for i, token in enumerate(output)]
        assert tensors["logprobs"][0, prompt_len:].tolist() == pytest.approx(expected_logprobs)


async def test_anthropic_sdk_gets_tool_use_then_the_answer(areal_server: ArealProxyServer) -> None:
    session = await areal_server.open_session("anthropic")
    client = anthropic.AsyncAnthropic(base_url=areal_server.base_url, api_key=session.api_key, max_retries=0)

    first, tool_use, second = await anthropic_tool_turns(client, "What is six times seven?")
    exported = await areal_server.close_and_export(session)

    assert first.stop_reason == "tool_use"
    assert (tool_use.name, tool_use.input) == ("Bash", {"command": TOOL_COMMAND})
    assert [block.text for block in second.content if block.type == "text"] == [TOOL_RESULT_ANSWER]
    assert len(exported) == 2


async def test_areal_renders_tools_with_their_keys_in_openais_typeddict_order(
    areal_server: ArealProxyServer, qwen_tokenizer
) -> None:
    """AReaL validates the body into openai's TypedDicts, which rebuild each tool as {"function", "type"}
    whatever order the client sent; the template's `tool | tojson` renders that order. A counter that
    must agree with AReaL's prompt tokens has to reorder the same way."""
    session = await areal_server.open_session("tool-order")
    messages = [{"role": "user", "content": "What is six times seven? Use the shell."}]
    reordered = {"function": BASH_TOOL["function"], "type": BASH_TOOL["type"]}

    def count(tool: dict) -> int:
        return len(
            qwen_tokenizer.apply_chat_template(
                messages, tools=[tool], add_generation_prompt=True, return_dict=False
            )
        )

    reply = await openai_client(areal_server, session.api_key).chat.completions.create(
        model="policy", messages=messages, tools=[BASH_TOOL]
    )
    await areal_server.close_and_export(session)

    assert list(BASH_TOOL) == ["type", "function"]
    assert reply.usage.prompt_tokens == count(reordered) != count(BASH_TOOL)
