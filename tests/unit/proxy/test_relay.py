"""modeltap/proxy/relay.py: the one boundary (anything unexpected is a 500 in the client's shape,
recorded as proxy_error, and the server keeps serving) and a stream whose client is gone (answers.py
writes it). A small aiohttp app stands in for the upstream."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from modeltap.dialects.sse import StreamAssembler
from modeltap.proxy import relay
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.factories import SSE_DONE, assistant, chat_chunk, chat_completion, sse_data, usage

ASK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHUNKS = [
    sse_data(chat_chunk({"role": "assistant", "content": ""})),
    *(sse_data(chat_chunk({"content": w})) for w in ("4", "2")),
]


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if not body.get("stream"):
        return web.json_response(chat_completion(assistant("42"), usage=usage(3, 2)))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for chunk in CHUNKS:
        await response.write(chunk)
        await asyncio.sleep(0.01)
    await response.write(sse_data(chat_chunk({}, "stop")) + SSE_DONE)
    return response


async def _messages(request: web.Request) -> web.Response:
    return web.json_response({"type": "message", "role": "assistant", "content": [], "usage": {}})


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/messages", _messages)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/")


@pytest.fixture
async def proxy(upstream: str, store_path: Path) -> AsyncIterator[Proxy]:
    config = ProxyConfig(
        upstream=upstream, host="127.0.0.1", port=0, layout="openai", store=str(store_path), sync=True
    )
    async with Proxy(config) as started:
        yield started


def rows(store_path: Path) -> list[dict[str, Any]]:
    with StoreReader(store_path) as reader:
        return reader.exchanges()


async def recorded_once(store_path: Path) -> dict[str, Any]:
    """The one record, waited for: a cut stream reaches the client before its record is committed."""
    for _ in range(100):
        found = rows(store_path)
        if found:
            [row] = found
            return row
        await asyncio.sleep(0.02)
    raise AssertionError("nothing was recorded")


async def post(proxy: Proxy, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(proxy.host_base_url + path, json=body) as reply:
        return reply.status, await reply.json(content_type=None)


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", lambda body: body["error"]["code"] == "internal_error"),
        ("/v1/messages", lambda body: body["type"] == "error" and body["error"]["type"] == "api_error"),
    ],
)
async def test_an_unexpected_exception_is_a_500_in_the_clients_shape_and_recorded(
    proxy: Proxy,
    store_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    path: str,
    shape: Callable[[Any], bool],
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in a stage")

    monkeypatch.setattr(relay, "_identify", broken)
    with caplog.at_level(logging.ERROR, "modeltap.proxy.relay"):
        status, body = await post(proxy, path, {**ASK, "max_tokens": 8})
    assert status == 500 and shape(body), body
    assert "RuntimeError: a bug in a stage" in json.dumps(body)
    [logged] = caplog.records
    assert logged.exc_info is not None and "a bug in a stage" in str(logged.exc_info[1])
    [row] = rows(store_path)
    assert (row["status"], row["error_class"]) == (500, "proxy_error")
    monkeypatch.undo()
    assert (await post(proxy, "/v1/chat/completions", ASK))[0] == 200  # the server keeps serving


async def test_an_exception_mid_stream_cuts_the_stream_and_records_what_was_said(
    proxy: Proxy, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_feed = StreamAssembler.feed
    fed: list[bytes] = []

    def feed_then_break(self: Any, chunk: bytes) -> None:
        real_feed(self, chunk)
        fed.append(chunk)
        if len(fed) == 2:
            raise RuntimeError("a bug after two chunks")

    monkeypatch.setattr(StreamAssembler, "feed", feed_then_break)
    async with aiohttp.ClientSession() as http:
        async with http.post(
            proxy.host_base_url + "/v1/chat/completions", json={**ASK, "stream": True}
        ) as reply:
            assert reply.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await reply.read()  # cut, not ended cleanly: no SDK takes it for a whole answer
    row = await recorded_once(store_path)
    assert (row["status"], row["error_class"], row["streamed"]) == (200, "proxy_error", True)
    assert row["response"]["choices"][0]["message"]["content"] == "4"


@pytest.fixture
async def plain_upstream() -> AsyncIterator[str]:
    """An upstream that is no aiohttp app (so patching aiohttp's writes touches the proxy only): it
    answers every request with the same SSE stream, a chunk every 10 ms."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(
            next(
                line.split(b":")[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
        )
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for chunk in [*CHUNKS, sse_data(chat_chunk({}, "stop")) + SSE_DONE]:
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_write_into_a_client_that_left_mid_stream_is_recorded_with_what_it_got(
    plain_upstream: str, store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_write = web.StreamResponse.write
    writes: list[bytes] = []

    async def write_then_fail(self: web.StreamResponse, data: bytes) -> None:
        writes.append(data)
        if len(writes) == 3:
            raise ConnectionResetError("Cannot write to closing transport")
        await real_write(self, data)

    monkeypatch.setattr(web.StreamResponse, "write", write_then_fail)
    config = ProxyConfig(
        upstream=plain_upstream, host="127.0.0.1", port=0, layout="openai", store=str(store_path)
    )
    with caplog.at_level(logging.ERROR):
        async with Proxy(config) as proxy, aiohttp.ClientSession() as http:
            url = proxy.host_base_url + "/v1/chat/completions"
            async with http.post(url, json={**ASK, "stream": True}) as reply:
                await reply.read()
    row = await recorded_once(store_path)
    assert (row["error_class"], row["client_disconnected"], row["stream_complete"]) == (
        "client_disconnect",
        True,
        False,
    )
    assert row["response"]["choices"][0]["message"]["content"] == "4"  # what reached the client
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback: an ordinary end
