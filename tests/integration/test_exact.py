"""`serve --tokens exact` end to end: the real openai and anthropic SDKs through modeltap to stand-in
engines on the real Qwen3 tokenizer (tests/standins/qwen_engine.py). modeltap builds each prompt's ids,
sends them to vLLM's `/v1/completions` or SGLang's `/generate`, and answers in the client's format; the
ids it records are the ones the engine logged, and a session whose agent did not edit its history
exports one line whose ids are the engine's last prompt and completion."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modeltap.exporters.export import write_export
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.factories import ASK, BASH_TOOL
from tests.standins.qwen_engine import MAX_MODEL_LEN, THOUGHT, QwenEngineStandIn, qwen_folder


@pytest.fixture(params=["vllm", "sglang"])
def engine(request: pytest.FixtureRequest) -> Iterator[QwenEngineStandIn]:
    with QwenEngineStandIn(flavor=request.param) as standin:
        yield standin


def exact_proxy(make_proxy: Callable[..., Proxy], engine: QwenEngineStandIn, **extra: Any) -> Proxy:
    return make_proxy(upstream=engine.v1_url, tokens="exact", tokenizer=str(qwen_folder()), **extra)


def tokens_export(store: Path, session: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with StoreReader(store) as reader:
        write_export(reader, session, "tokens", out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def chat_task(
    base_url: str, *, stream: bool, echo: Callable[[dict[str, Any]], dict[str, Any]] = dict
) -> str:
    """The bash task through the openai SDK: a tool call, its result, the answer. `echo` is how the
    agent writes the model's reply back into its history. Returns the answer's text."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as sdk:
        first = await sdk.chat.completions.create(model="qwen3", messages=[ASK], tools=[BASH_TOOL])
        message = first.choices[0].message
        # As vLLM's qwen3 reasoning parser answers it: the text between the tags, newlines included.
        reasoning = message.reasoning_content  # type: ignore[attr-defined]
        assert first.choices[0].finish_reason == "tool_calls" and reasoning == f"\n{THOUGHT}\n"
        [call] = message.tool_calls or []
        assert call.function.name == "bash" and json.loads(call.function.arguments) == {
            "command": "echo $((6 * 7))"
        }
        history = [ASK, echo(message.model_dump(exclude_none=True))]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
        if not stream:
            second = await sdk.chat.completions.create(model="qwen3", messages=history, tools=[BASH_TOOL])
            return second.choices[0].message.content or ""
        chunks = await sdk.chat.completions.create(
            model="qwen3",
            messages=history,
            tools=[BASH_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_session_trains_on_the_engines_own_ids(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy], store_path: Path, stream: bool
) -> None:
    async with exact_proxy(make_proxy, engine) as proxy:
        assert "exact: prompts built with" in proxy.context.token_ids_report
        session = proxy.sessions.open()
        # vLLM's qwen3 parser gives what follows `</think>` as the content, its blank line included.
        assert await chat_task(session.host_base_url + "/v1", stream=stream) == "\n\n42"
    first, second = engine.log
    assert first.path == second.path == ("/v1/completions" if engine.flavor == "vllm" else "/generate")
    # Turn 2's prompt continues turn 1's: its prompt ids, then the ids the model sampled, untouched.
    assert second.prompt[: len(first.prompt) + len(first.completion)] == first.prompt + first.completion
    [line] = tokens_export(store_path, session.id)
    assert line["input_ids"] == second.prompt + second.completion and line["source"] == "built"
    mask = [0] * len(line["input_ids"])
    for turn in (first, second):
        mask[len(turn.prompt) : len(turn.prompt) + len(turn.completion)] = [1] * len(turn.completion)
    assert line["loss_mask"] == mask and line["break_after"] is None


async def test_a_reply_echoed_otherwise_with_the_same_meaning_keeps_the_models_ids(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    # The agent re-serialises the call's arguments (another spacing), drops the reasoning and says
    # nothing for the content: a re-render would change the ids; the model's are kept.
    def rewritten(message: dict[str, Any]) -> dict[str, Any]:
        calls = [
            {
                **c,
                "function": {
                    **c["function"],
                    "arguments": json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":")),
                },
            }
            for c in message["tool_calls"]
        ]
        return {"role": "assistant", "content": "", "tool_calls": calls}

    async with exact_proxy(make_proxy, engine) as proxy:
        session = proxy.sessions.open()
        assert await chat_task(session.host_base_url + "/v1", stream=False, echo=rewritten) == "\n\n42"
    first, second = engine.log
    assert second.prompt[: len(first.prompt) + len(first.completion)] == first.prompt + first.completion
    [line] = tokens_export(store_path, session.id)
    assert line["input_ids"] == second.prompt + second.completion


async def test_an_edited_reply_is_rendered_from_the_edit_and_recorded_as_a_break(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    def edited(message: dict[str, Any]) -> dict[str, Any]:
        return {**message, "content": "I will run it."}

    async with exact_proxy(make_proxy, engine) as proxy:
        session = proxy.sessions.open()
        assert await chat_task(session.host_base_url + "/v1", stream=False, echo=edited) == "\n\n42"
    first, second = engine.log
    assert second.prompt[: len(first.prompt)] == first.prompt
    assert second.prompt[: len(first.prompt) + len(first.completion)] != first.prompt + first.completion
    lines = tokens_export(store_path, session.id)
    assert [line["turns"] for line in lines] == [[1], [2]]
    assert lines[0]["break_after"]["kind"] == "assistant_text_changed"
    assert lines[1]["input_ids"] == second.prompt + second.completion


async def test_claude_codes_format_streams_through_the_token_endpoint(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    tool = {
        "name": "bash",
        "description": "run a shell command",
        "input_schema": BASH_TOOL["function"]["parameters"],
    }
    async with exact_proxy(make_proxy, engine) as proxy:
        session = proxy.sessions.open()
        sdk = anthropic.AsyncAnthropic(base_url=session.host_base_url, api_key="sk-test", max_retries=0)
        async with sdk.messages.stream(
            model="qwen3", max_tokens=1024, messages=[ASK], tools=[tool]
        ) as events:
            first = await events.get_final_message()
        [use] = [block for block in first.content if block.type == "tool_use"]
        assert first.stop_reason == "tool_use" and use.input == {"command": "echo $((6 * 7))"}
        history = [
            ASK,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42\n"}]},
        ]
        async with sdk.messages.stream(
            model="qwen3", max_tokens=1024, messages=history, tools=[tool]
        ) as events:
            second = await events.get_final_message()
        await sdk.close()
    assert [b.text for b in second.content if b.type == "text"] == ["\n\n42"]
    *_, last = engine.log
    [line] = tokens_export(store_path, session.id)
    assert line["input_ids"] == last.prompt + last.completion


async def test_a_chat_request_that_names_no_cap_may_fill_the_window(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    async with exact_proxy(make_proxy, engine, budget="off") as proxy:
        async with openai.AsyncOpenAI(
            base_url=proxy.host_base_url + "/v1", api_key="k", max_retries=0
        ) as sdk:
            await sdk.chat.completions.create(model="qwen3", messages=[ASK])
            await sdk.chat.completions.create(model="qwen3", messages=[ASK], max_tokens=7)
    uncapped, capped = (r.body for r in engine.model_requests)
    cap = "max_tokens" if engine.flavor == "vllm" else "max_new_tokens"
    limits = (
        (uncapped, capped)
        if engine.flavor == "vllm"
        else (uncapped["sampling_params"], capped["sampling_params"])
    )
    prompt = len(engine.log[0].prompt)
    assert limits[0][cap] == MAX_MODEL_LEN - 1 - prompt and limits[1][cap] == 7


async def test_a_prompt_past_the_window_is_refused_in_the_clients_shape(
    engine: QwenEngineStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    long = {"role": "user", "content": "word " * 40_000}
    async with exact_proxy(make_proxy, engine, budget="reject") as proxy:
        async with openai.AsyncOpenAI(
            base_url=proxy.host_base_url + "/v1", api_key="k", max_retries=0
        ) as sdk:
            with pytest.raises(openai.BadRequestError) as refused:
                await sdk.chat.completions.create(model="qwen3", messages=[long])
    assert refused.value.code == "context_length_exceeded"
    assert engine.log == []
    with StoreReader(store_path) as reader:
        [record] = reader.exchanges()
    assert record["status"] == 400 and record["budget"]["prompt_tokens"] > MAX_MODEL_LEN
