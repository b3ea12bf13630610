"""modeltap/proxy/upstream_check.py: what serve says at start of an upstream that lists models, one
that has no model list (AReaL), one that refuses the key, one that is down (and then comes up: the
start failed nothing), one that does not answer in time; and config.py's refusal of an upstream URL
that names an endpoint."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from modeltap.proxy import upstream_check
from modeltap.proxy.admin import session_request
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy, startup_report
from modeltap.proxy.upstream_check import upstream_found
from tests.factories import ASK
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn


def config(store_path: Path, **fields: Any) -> ProxyConfig:
    return ProxyConfig(**{"host": "127.0.0.1", "port": 0, "store": str(store_path)} | fields)


@pytest.fixture
def vllm() -> Iterator[OpenAILikeStandIn]:
    with OpenAILikeStandIn() as standin:
        yield standin


async def test_an_upstream_s_models_are_named_in_the_banner(
    vllm: OpenAILikeStandIn, store_path: Path
) -> None:
    async with Proxy(config(store_path, upstream=vllm.url, upstream_key="sk-right-key-0123")) as proxy:
        found = await upstream_found(proxy.context)
        report = startup_report(proxy, None, found)
    assert found == "answers; lists 1 model: standin-model"
    assert f"upstream  {vllm.url}\n            answers; lists 1 model: standin-model" in report


async def test_a_refused_key_is_said_at_start_and_not_quoted(store_path: Path, aiohttp_server: Any) -> None:
    async def refuse(request: web.Request) -> web.Response:
        key = request.headers["Authorization"].removeprefix("Bearer ")
        error = {"message": f"Incorrect API key provided: {key}", "type": "invalid_request_error"}
        return web.json_response({"error": error}, status=401)

    app = web.Application()
    app.router.add_get("/{tail:.*}", refuse)
    server = await aiohttp_server(app)
    upstream = str(server.make_url("")).rstrip("/")
    async with Proxy(config(store_path, upstream=upstream, upstream_key="sk-wrong-key-0123")) as proxy:
        found = await upstream_found(proxy.context)
    assert found.startswith("answers, but refuses the key (401") and "check --upstream-key" in found
    assert "sk-wrong-key-0123" not in found and "[masked key]" in found


async def test_an_upstream_without_a_model_list_asks_for_model(store_path: Path) -> None:
    with ArealStandIn() as areal:
        async with Proxy(config(store_path, upstream=areal.url)) as proxy:
            found = await upstream_found(proxy.context)
        assert "lists no models" in found and "give --model NAME" in found
        async with Proxy(config(store_path, upstream=areal.url, model="policy")) as proxy:
            found = await upstream_found(proxy.context)
        assert "GET /v1/models lists --model policy" in found


async def test_a_dead_upstream_is_said_at_start_and_served_once_it_comes_up(store_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with Proxy(config(store_path, upstream=f"http://127.0.0.1:{port}")) as proxy:
        found = await upstream_found(proxy.context)
        assert (
            found.startswith("not reachable yet: cannot connect") and "each request tries it again" in found
        )
        later = OpenAILikeStandIn().start(port)
        try:
            async with aiohttp.ClientSession() as http:
                body = {"model": "standin-model", "messages": [ASK], "max_tokens": 8}
                async with http.post(proxy.host_base_url + "/v1/chat/completions", json=body) as reply:
                    assert reply.status == 200
            assert len(later.model_requests) == 1
        finally:
            later.stop()


async def test_an_upstream_that_does_not_answer_in_time_holds_the_start_up_only_briefly(
    store_path: Path, aiohttp_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream_check, "CHECK_TIMEOUT_S", 0.2)
    gone = asyncio.Event()

    async def silent(request: web.Request) -> web.Response:
        await gone.wait()
        return web.Response()

    app = web.Application()
    app.router.add_get("/{tail:.*}", silent)
    server = await aiohttp_server(app)
    async with Proxy(config(store_path, upstream=str(server.make_url("")).rstrip("/"))) as proxy:
        found = await upstream_found(proxy.context)
        gone.set()
    assert found == "no answer within 0.2 s (each request tries it again)"


@pytest.mark.parametrize(
    "url",
    ["http://gpu:8000/v1/chat/completions", "http://gpu:8000/v1/messages/", "http://gpu:8000/completions"],
)
def test_an_upstream_that_names_an_endpoint_is_refused_with_the_base_to_give(url: str) -> None:
    with pytest.raises(ValueError, match=r"base URL, not an endpoint: give http://gpu:8000(/v1)? "):
        ProxyConfig(upstream=url)
    with pytest.raises(ValueError, match="not an endpoint"):
        session_request({"upstream": url})
    assert ProxyConfig(upstream="http://gpu:8000/v1/").upstream == "http://gpu:8000/v1"
