"""`modeltap serve` in front of a real `transformers serve`: it tells the engine by its discovery
answers and counts as it prepares messages, records its streams (which end at the finish chunk, never
with [DONE]) as complete with their usage, and renders the ids the server does not return."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.conversations import TOOL
from tests.engines.conftest import TransformersServer

# The random model writes a few tokens per turn; a context far above any prompt here.
MAX_TOKENS = 6
CONTEXT_LENGTH = 32768


async def agent_session(base_url: str, model: str) -> None:
    """Three turns as an agent plays them: streamed, then a replayed tool call with its reasoning and
    content (which the server drops), streamed, then not streamed."""
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You run commands."},
        {"role": "user", "content": "List the files."},
    ]
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-none", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model=model, messages=history, tools=[TOOL], max_tokens=MAX_TOKENS, stream=True
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        history += [
            {
                "role": "assistant",
                "content": text,
                "reasoning_content": "The user wants a listing.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        ]
        stream = await sdk.chat.completions.create(
            model=model, messages=history, tools=[TOOL], max_tokens=MAX_TOKENS, stream=True
        )
        text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": "And now?"}]
        await sdk.chat.completions.create(model=model, messages=history, tools=[TOOL], max_tokens=MAX_TOKENS)


async def test_a_session_through_modeltap_is_counted_complete_and_has_ids(
    tfserve: TransformersServer, tmp_path: Path
) -> None:
    store = tmp_path / "records.db"
    config = ProxyConfig(
        host="127.0.0.1",
        port=0,
        store=str(store),
        upstream=tfserve.url,
        tokenizer=str(tfserve.folder),
        context_length=CONTEXT_LENGTH,
        token_ids=True,
    )
    async with Proxy(config) as proxy:
        assert "as transformers 5.24.0 prepares messages" in proxy.context.budget_report
        assert proxy.context.token_ids_report.startswith("rendered with")
        session = proxy.sessions.open(labels={"task_id": "tf"})
        await agent_session(session.host_base_url + "/v1", tfserve.model)
    with StoreReader(store) as reader:
        exchanges = reader.exchanges()
        turns = reader.token_turns(session.id)
    assert [(e["streamed"], e["stream_complete"]) for e in exchanges] == [(1, 1), (1, 1), (0, None)]
    for exchange in exchanges:
        assert exchange["error_class"] is None, exchange["error_message"]
        assert exchange["status"] == 200 and exchange["completion_tokens"] is not None
        assert exchange["counted_prompt_tokens"] == exchange["prompt_tokens"]
    assert [turn["source"] for turn in turns] == ["rendered"] * 3
