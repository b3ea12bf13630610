"""Broken input and broken upstreams through the proxy: each client gets its own error shape, the
record says what happened, and no secret reaches the store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.integration.conftest import records
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.script import Conversation, Reply

CHAT = {"model": "standin-model", "messages": [{"role": "user", "content": "hi"}]}


async def until_written(proxy: Proxy) -> None:
    """Wait until the proxy's store has written a record (a hang-up's is sealed after the client left);
    the bound only catches a hang."""
    for _ in range(600):
        if proxy.context.store.written:
            return
        await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    ("path", "body", "content_type", "status", "message"),
    [
        ("/v1/chat/completions", b"{not json", "application/json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", "application/json", 400, "must be a JSON object"),
        ("/v1/chat/completions", b'{"a": 1}', "text/plain", 400, "Content-Type must be application/json"),
        ("/v1/messages", b"{not json", "application/json", 400, "not valid JSON"),
        (
            "/v1/chat/completions",
            b"[" * 100_000 + b"]" * 100_000,
            "application/json",
            400,
            "nested too deeply",
        ),
    ],
)
async def test_bad_bodies_are_400_in_the_dialect_and_recorded(
    areal_proxy: Proxy, store_path: Path, path: str, body: bytes, content_type: str, status: int, message: str
) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            areal_proxy.host_base_url + path, data=body, headers={"Content-Type": content_type}
        ) as resp:
            doc = await resp.json()
    assert resp.status == status
    if "messages" in path:
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert message in doc["error"]["message"]
    else:
        assert doc["error"]["type"] == "invalid_request_error" and message in doc["error"]["message"]
    await areal_proxy.stop()
    [row] = records(store_path)
    assert (row["status"], row["error_class"]) == (status, "client_error")
    assert message in row["error_message"]


async def test_gzip_upstream_is_decoded_for_client_and_record(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    with OpenAILikeStandIn() as vllm:
        vllm.inject("gzip", times=2)
        async with make_proxy(upstream=vllm.url) as proxy, aiohttp.ClientSession() as http:
            for stream in (False, True):
                async with http.post(
                    proxy.host_base_url + "/v1/chat/completions", json=CHAT | {"stream": stream}
                ) as r:
                    body = await r.read()
                    assert r.status == 200 and "Content-Encoding" not in r.headers
                    assert b"chat.completion" in body
        rows = records(store_path)
    assert [r["response"]["object"] for r in rows] == ["chat.completion", "chat.completion"]
    assert rows[1]["streamed"] and rows[1]["stream_complete"]


async def test_client_hanging_up_mid_stream_is_recorded(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    areal.control.chunk_delay_s = 0.3  # the stream trickles, so the client leaves in the middle of it
    async with make_proxy(upstream=areal.url) as proxy:
        session = areal.open_session("t")
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                proxy.host_base_url + "/chat/completions",
                json=CHAT | {"stream": True},
                headers={"Authorization": f"Bearer {session.api_key}"},
            )
            first = await resp.content.readany()
            assert first.startswith(b"data: ")
            resp.close()  # hang up
        await until_written(proxy)
    [row] = records(store_path)
    assert row["client_disconnected"] and row["error_class"] == "client_disconnect"
    assert row["streamed"] and not row["stream_complete"]


@pytest.mark.parametrize("ids", ["off", "rendered"])
async def test_a_client_hanging_up_after_the_final_event_loses_nothing(
    make_proxy: Callable[..., Proxy], store_path: Path, areal: ArealStandIn, qwen_dir: str, ids: str
) -> None:
    # The openai SDK closes the connection at `[DONE]`; an upstream that ends its stream a moment later
    # must not turn the complete answer the client had into a failure, nor leave its ids unrendered
    # (AReaL's proxy returns none).
    options = {"token_ids": True, "tokenizer": qwen_dir, "budget": "off"} if ids == "rendered" else {}
    areal.inject("linger", stall_s=30)
    async with make_proxy(upstream=areal.url, **options) as proxy:
        session = proxy.sessions.open(upstream_key=areal.open_session("t").api_key)
        async with aiohttp.ClientSession() as http:
            resp = await http.post(session.host_base_url + "/chat/completions", json=CHAT | {"stream": True})
            seen = b""
            while b"data: [DONE]" not in seen:
                seen += await resp.content.readany()
            resp.close()  # hang up, as the SDK does
        await until_written(proxy)
    [row] = records(store_path)
    assert (row["client_disconnected"], row["error_class"], row["stream_complete"]) == (True, None, True)
    assert row["response"]["choices"][0]["finish_reason"] == "stop"
    with StoreReader(store_path) as reader:
        turns = [(t["source"], len(reader.token_completion(t)) > 0) for t in reader.token_turns(session.id)]
    assert turns == ([("rendered", True)] if ids == "rendered" else [])


async def test_a_whole_answer_over_the_limit_is_a_502_in_the_clients_shape_and_recorded(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    limit = 1024

    def verbose(conversation: Conversation) -> Reply:
        return Reply(text="x" * limit if "long" in conversation.last_user_text else "short")

    long = CHAT | {"messages": [{"role": "user", "content": "long"}]}
    with OpenAILikeStandIn(script=verbose) as vllm:
        async with make_proxy(upstream=vllm.url, max_reply_bytes=limit) as proxy:
            async with aiohttp.ClientSession() as http:
                url = proxy.host_base_url + "/v1/chat/completions"
                async with http.post(url, json=CHAT) as r:
                    short = r.status
                async with http.post(url, json=long) as r:
                    refused = (r.status, await r.json())
                async with http.post(url, json=long | {"stream": True}) as r:
                    streamed = (r.status, await r.read())
        rows = records(store_path)
    assert short == 200 and refused[0] == 502 and refused[1]["error"]["type"] == "server_error"
    assert f"more than {limit} bytes in one piece (--max-reply-bytes" in refused[1]["error"]["message"]
    assert streamed[0] == 200 and b"[DONE]" in streamed[1]  # a stream has no such limit
    statuses = [(r["status"], r["error_class"]) for r in rows]
    assert statuses == [(200, None), (502, "upstream_error"), (200, None)]


async def test_broken_and_truncated_streams_are_recorded(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    with OpenAILikeStandIn() as vllm:
        vllm.inject("badsse")
        vllm.inject("truncate")
        async with make_proxy(upstream=vllm.url) as proxy, aiohttp.ClientSession() as http:
            url = proxy.host_base_url + "/v1/chat/completions"
            async with http.post(url, json=CHAT | {"stream": True}) as r:
                assert b"{not json" in await r.read()  # relayed as sent: the bytes themselves arrived whole
                assert r.status == 200
            async with http.post(url, json=CHAT | {"stream": True}) as r:
                assert r.status == 200  # the status was sent before the stream broke
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()  # the break is passed on, not turned into a clean end
        rows = records(store_path)
    assert [r["error_class"] for r in rows] == ["upstream_error", "upstream_error"]
    assert "not JSON" in rows[0]["error_message"]
    assert not rows[1]["stream_complete"] and "broke" in rows[1]["error_message"]


async def test_no_secret_reaches_the_store(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    upstream_session = areal.open_session("secret")
    async with make_proxy(upstream=areal.url) as proxy:
        session = proxy.sessions.open(upstream_key=upstream_session.api_key)
        async with aiohttp.ClientSession() as http:
            for url, headers in [
                (session.host_base_url + "/v1/chat/completions", {}),
                (proxy.host_base_url + "/v1/chat/completions", {"Authorization": f"Bearer {session.token}"}),
                (
                    proxy.host_base_url + "/v1/messages",
                    {"x-api-key": session.token, "Cookie": "sid=cookie-secret"},
                ),
            ]:
                async with http.post(url, json=CHAT | {"max_tokens": 16}, headers=headers) as r:
                    assert r.status == 200, await r.text()
    data = b"".join(p.read_bytes() for p in store_path.parent.glob("records.db*"))
    for secret in (session.token, upstream_session.api_key, "cookie-secret"):
        assert secret.encode() not in data
    assert len(records(store_path, session.id)) == 3
