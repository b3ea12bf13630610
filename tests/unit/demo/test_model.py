"""modeltap/demo/model.py: the scripted model answers chat, Responses and Messages at `/v1` and bare,
streamed and not, with tool calls, and lists its model; AReaL's layout serves only AReaL's paths."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from modeltap.demo.model import DEMO_MODEL, FINAL_ANSWER, GREETING, SHELL_COMMAND, model_app, scripted_reply

ClientFactory = Callable[[web.Application], Awaitable[TestClient[Any, Any]]]
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"properties": {"command": {}}}}}
ASK = {"role": "user", "content": "Run echo $((6 * 7))"}
REQUESTS = {
    "chat/completions": {"model": DEMO_MODEL, "messages": [ASK], "tools": [BASH]},
    "responses": {
        "model": DEMO_MODEL,
        "input": [{"role": "user", "content": ASK["content"]}],
        "tools": [{"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {}}}}],
    },
    "messages": {
        "model": DEMO_MODEL,
        "max_tokens": 64,
        "messages": [ASK],
        "tools": [{"name": "Bash", "input_schema": {"properties": {"command": {}, "description": {}}}}],
    },
}


def _events(text: str) -> list[Any]:
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    return [json.loads(d) for d in data if d != "[DONE]"]


@pytest.mark.parametrize("prefix", ["/v1/", "/"])
@pytest.mark.parametrize("route", list(REQUESTS))
async def test_every_format_at_both_paths_calls_the_shell_tool(
    aiohttp_client: ClientFactory, route: str, prefix: str
) -> None:
    client = await aiohttp_client(model_app())
    answer = await (await client.post(prefix + route, json=REQUESTS[route])).json()
    text = json.dumps(answer)
    assert SHELL_COMMAND.replace("$", "") in text.replace("$", ""), answer
    if route == "responses":
        [call] = [item for item in answer["output"] if item["type"] == "function_call"]
        assert json.loads(call["arguments"]) == {"cmd": SHELL_COMMAND}
    if route == "messages":
        [call] = [block for block in answer["content"] if block["type"] == "tool_use"]
        assert call["name"] == "Bash" and set(call["input"]) == {"command", "description"}


@pytest.mark.parametrize("route", list(REQUESTS))
async def test_a_stream_ends_as_its_format_ends_one(aiohttp_client: ClientFactory, route: str) -> None:
    client = await aiohttp_client(model_app())
    response = await client.post("/v1/" + route, json=REQUESTS[route] | {"stream": True})
    assert response.content_type == "text/event-stream"
    text = await response.text()
    last = _events(text)[-1]
    ends = {"chat/completions": "[DONE]", "responses": "response.completed", "messages": "message_stop"}
    assert ends[route] in (text.rstrip().splitlines()[-1] if route == "chat/completions" else last["type"])


def test_the_script_answers_after_a_tool_result_and_greets_otherwise() -> None:
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42\n"}
    assert scripted_reply([ASK, tool], [BASH]) == {"role": "assistant", "content": FINAL_ANSWER}
    assert scripted_reply([ASK], None)["content"] == GREETING
    # Codex's `shell` takes an argv list.
    shell = {
        "type": "function",
        "function": {"name": "shell", "parameters": {"properties": {"command": {"type": "array"}}}},
    }
    [call] = scripted_reply([ASK], [shell])["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"command": ["bash", "-lc", SHELL_COMMAND]}


async def test_models_are_listed_and_a_bad_body_is_refused_in_the_format(
    aiohttp_client: ClientFactory,
) -> None:
    client = await aiohttp_client(model_app())
    for path in ("/v1/models", "/models"):
        listed = await (await client.get(path)).json()
        assert [m["id"] for m in listed["data"]] == [DEMO_MODEL]
    refused = await client.post("/v1/messages", data=b"[1]", headers={"content-type": "application/json"})
    assert refused.status == 400 and (await refused.json())["type"] == "error"
    chained = await client.post(
        "/v1/responses", json={"model": DEMO_MODEL, "input": "hi", "previous_response_id": "r"}
    )
    assert chained.status == 400 and "previous_response_id" in (await chained.json())["error"]["message"]


async def test_areal_layout_serves_only_areal_paths(aiohttp_client: ClientFactory) -> None:
    client = await aiohttp_client(model_app(areal_layout=True))
    chat = REQUESTS["chat/completions"]
    assert (await client.post("/chat/completions", json=chat)).status == 200
    assert (await client.post("/v1/chat/completions", json=chat)).status == 404
    assert (await client.post("/v1/messages", json=REQUESTS["messages"])).status == 200
    assert (await client.get("/v1/models")).status == 404
