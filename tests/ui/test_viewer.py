"""modeltap/readers/ui: the local viewer in headless Chromium on a session the openai SDK recorded
through a real Proxy, and its API. Screenshots land in tests/artifacts/ui/."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.readers.ui import viewer_app
from modeltap.records.store import RecordStore
from tests.factories import ASK, BASH_TOOL
from tests.standins import token_engine as te
from tests.standins.openai_like import OpenAILikeStandIn
from tests.ui.browser import Browser
from tests.unit.records.test_reader import hostile, store

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "ui"


async def agent_turns(client: openai.AsyncOpenAI) -> None:
    """The SDK's tool loop: a tool call, then the streamed answer once the result is in."""
    first = await client.chat.completions.create(model="standin-model", messages=[ASK], tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]
    history = [ASK, first.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
    stream = await client.chat.completions.create(
        model="standin-model", messages=history, tools=[BASH_TOOL], stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "42"


async def test_viewer_shows_a_session_its_tool_calls_and_errors_and_updates_live(
    vllm_standin: OpenAILikeStandIn, store_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    async with Proxy(_config(vllm_standin, store_path, sync=True)) as proxy:
        session = proxy.sessions.open(labels={"agent": "openai-sdk"})
        client = openai.AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="k", max_retries=0)
        await agent_turns(client)
        vllm_standin.inject("400ctx")
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="standin-model", messages=[ASK])
        server: TestServer = await aiohttp_server(viewer_app(store_path))

        async with Browser() as browser:
            await browser.goto(str(server.make_url("/")))
            item = f'[data-session-id="{session.id}"]'
            await browser.wait_for(f"document.querySelector('{item}') !== null")
            assert "agent=openai-sdk" in await browser.text(item)
            await browser.click(item)
            await browser.wait_for("document.querySelectorAll('.turn').length === 3")
            row = await browser.text('.turn[data-turn="1"] .turn-row')
            assert "#1" in row and "200" in row and "tool_calls" in row
            assert '→ bash({"command": "echo $((6 * 7))"})' in row
            widths = await browser.evaluate(
                "[...document.querySelectorAll('.bar span')].map(s => s.style.width)"
            )
            assert any(w not in ("0%", "") for w in widths)  # token and latency bars are drawn
            await browser.screenshot(ARTIFACTS / "viewer-timeline.png")

            await browser.click('.turn[data-turn="1"] .turn-row')
            call = await browser.wait_for("document.querySelector('.detail .tool-call')?.innerText")
            assert "bash" in call and '"command": "echo $((6 * 7))"' in call
            await browser.click('.turn[data-turn="2"] .turn-row')
            detail = await browser.wait_for(
                "document.querySelector('.turn[data-turn=\"2\"] .detail')?.textContent"
            )
            assert "Tool results" in detail and "42" in detail and "Reply" in detail
            await browser.click('.turn[data-turn="3"] .turn-row')
            error = await browser.wait_for(
                "document.querySelector('.turn[data-turn=\"3\"] .error-box')?.innerText"
            )
            assert "model_fault" in error and "maximum context length is 8192" in error
            await browser.click('.turn[data-turn="1"] .full')
            full = await browser.wait_for(
                "document.querySelector('.turn[data-turn=\"1\"] .full-bodies')?.textContent"
            )
            assert "Request" in full and '"messages": [' in full and '"finish_reason": "tool_calls"' in full
            await browser.screenshot(ARTIFACTS / "viewer-turns.png")

            # Live: a new turn of the open session and a new session show up without a reload.
            await client.chat.completions.create(
                model="standin-model", messages=[ASK, {"role": "user", "content": "again"}]
            )
            await browser.wait_for("document.querySelectorAll('.turn').length === 4")
            other = proxy.sessions.open(labels={"agent": "second"})
            second = openai.AsyncOpenAI(base_url=other.host_base_url + "/v1", api_key="k", max_retries=0)
            await second.chat.completions.create(model="standin-model", messages=[ASK])
            await browser.wait_for(f"document.querySelector('[data-session-id=\"{other.id}\"]') !== null")
            # What was open stays open, full bodies included.
            assert '"finish_reason": "tool_calls"' in await browser.text('.turn[data-turn="1"] .full-bodies')
            await browser.screenshot(ARTIFACTS / "viewer-live.png")
            assert browser.errors == []
        await client.close()
        await second.close()


async def test_viewer_highlights_a_token_drift_with_both_sides_decoded(
    vllm_standin: OpenAILikeStandIn, store_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    # The record writer in this process, so the break's sides can be decoded with the toy tokenizer
    # whose ids the vLLM stand-in serves.
    config = _config(vllm_standin, store_path, sync=True, token_ids=True, record_writer="thread")
    async with Proxy(config) as proxy:
        assert isinstance(proxy.context.store, RecordStore)
        proxy.context.store.tokens.decoder = te.decode_each
        session = proxy.sessions.open()
        client = openai.AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="k", max_retries=0)
        first = await client.chat.completions.create(model="standin-model", messages=[ASK], tools=[BASH_TOOL])
        echoed = first.choices[0].message.model_dump(exclude_none=True) | {"content": "Running it."}
        result = {
            "role": "tool",
            "tool_call_id": first.choices[0].message.tool_calls[0].id,
            "content": "42\n",
        }
        await client.chat.completions.create(
            model="standin-model", messages=[ASK, echoed, result], tools=[BASH_TOOL]
        )
        await client.close()
        server: TestServer = await aiohttp_server(viewer_app(store_path))

        async with Browser() as browser:
            await browser.goto(str(server.make_url("/")) + f"#session={session.id}")
            badge = await browser.wait_for("document.querySelector('.session-item .badge.drift')?.innerText")
            assert badge == "token drift #2"
            await browser.wait_for("document.querySelector('.turn.drift') !== null")
            assert await browser.evaluate(
                "[...document.querySelectorAll('.turn.drift')].map(t => t.dataset.turn)"
            ) == ["2"]
            title = await browser.text(".drift-box .drift-title")
            assert "the assistant's text came back changed" in title and "continues #1" in title
            sides = await browser.evaluate(
                "[...document.querySelectorAll('.drift-side .diverge')].map(token => token.textContent)"
            )
            # Where #1's completion began with its tool call, this prompt has the text the agent added.
            assert sides == ["<tool_call>", "R"]
            assert "Token history breaks at turn #2" in await browser.text(".drift-note")
            await browser.screenshot(ARTIFACTS / "viewer-token-drift.png")
            assert browser.errors == []


async def test_api_waits_for_records_exports_and_answers_only_loopback_names(
    vllm_standin: OpenAILikeStandIn, store_path: Path, aiohttp_client: Callable[..., Any]
) -> None:
    client: TestClient = await aiohttp_client(viewer_app(store_path))
    waiting = await (await client.get("/api/sessions")).json()
    assert (waiting["stores"], waiting["waiting"], waiting["sessions"]) == ([], [str(store_path)], [])

    async with Proxy(_config(vllm_standin, store_path)) as proxy:
        session = proxy.sessions.open()
        sdk = openai.AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="k", max_retries=0)
        await agent_turns(sdk)
        await sdk.close()

    listed = await (await client.get("/api/sessions")).json()
    assert [s["id"] for s in listed["sessions"]] == [session.id] and listed["waiting"] == []
    turns = (await (await client.get(f"/api/sessions/{session.id}/turns")).json())["turns"]
    assert [t["finish_reason"] for t in turns] == ["tool_calls", "stop"] and "request" not in turns[0]
    full = await (await client.get(f"/api/sessions/{session.id}/turns/2")).json()
    assert full["request"]["stream"] is True and full["response"]["choices"][0]["message"]["content"] == "42"
    assert (await client.get(f"/api/sessions/{session.id}/turns/3")).status == 404

    har = await client.get(f"/api/sessions/{session.id}/export/har")
    assert har.headers["Content-Disposition"] == f'attachment; filename="{session.id}.har"'
    assert len(json.loads(await har.text())["log"]["entries"]) == 2
    messages = await client.get(f"/api/sessions/{session.id}/export/messages")
    assert json.loads(await messages.text())["messages"][-1] == {"role": "assistant", "content": "42"}
    assert (await client.get(f"/api/sessions/{session.id}/export/csv")).status == 404
    assert "app.js" in await (await client.get("/")).text()

    # A page on another origin that rebinds its name to 127.0.0.1 cannot read the records.
    rebound = await client.get("/api/sessions", headers={"Host": "attacker.example:80"})
    assert rebound.status == 421


def _config(vllm: OpenAILikeStandIn, store_path: Path, **overrides: Any) -> ProxyConfig:
    return ProxyConfig(upstream=vllm.url, host="127.0.0.1", port=0, store=str(store_path), **overrides)


async def test_the_viewer_answers_a_hostile_store_in_json(tmp_path: Path, aiohttp_client: Any) -> None:
    good = await store(tmp_path)
    bad = hostile(tmp_path, good)
    client = await aiohttp_client(viewer_app([str(bad["view"])]))
    answer = await client.get("/api/sessions")
    assert answer.status == 503 and str(bad["view"]) in (await answer.json())["error"]["message"]
    client = await aiohttp_client(viewer_app([str(good), str(bad["text"])]))
    listed = await (await client.get("/api/sessions")).json()
    assert [s["id"] for s in listed["sessions"]][-1] == "s-1" and str(bad["text"]) in listed["refused"][0]
    missing = await client.get("/api/sessions/nope/turns")
    assert missing.status == 404 and "nope" in (await missing.json())["error"]["message"]


def test_a_viewer_on_a_hostile_store_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    good = asyncio.run(store(tmp_path))
    view = hostile(tmp_path, good)["view"]
    viewer = subprocess.Popen(
        [sys.executable, "-m", "modeltap", "ui", "--store", str(view), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert viewer.stdout is not None
        listening = next(line for line in viewer.stdout if "listening on" in line).split("listening on ")[1]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(listening.strip() + "/api/sessions", timeout=30)
        assert refused.value.code == 503 and str(view) in json.loads(refused.value.read())["error"]["message"]
        viewer.send_signal(signal.SIGTERM)
        assert viewer.wait(30) == 0
    finally:
        viewer.kill()
        viewer.wait()
