"""modeltap/proxy/browsers.py from a real headless Chromium: a page of another origin cannot make a
loopback proxy spend its upstream key (a CORS-simple `no-cors` POST, a JSON POST behind a preflight),
a page whose name was rebound to 127.0.0.1 cannot read what the proxy answers, and a page of an
origin the operator allows (`--allow-origin`) gets its answer. Chromium resolves the pages' names to
127.0.0.1 itself (`--host-resolver-rules`), as a rebinding DNS server would make it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from tests.factories import ASK
from tests.integration.conftest import records
from tests.standins.openai_like import OpenAILikeStandIn
from tests.ui.browser import Browser

KEY = "sk-operator-0123456789"
CHAT = {"model": "standin-model", "messages": [ASK], "max_tokens": 8}
# The attacker's page and the name it rebinds, both resolved to loopback by Chromium itself.
RESOLVE = "--host-resolver-rules=MAP page.test 127.0.0.1, MAP rebound.test 127.0.0.1"


def _config(upstream: OpenAILikeStandIn, store: Path, **overrides: Any) -> ProxyConfig:
    return ProxyConfig(
        upstream=upstream.url, upstream_key=KEY, host="127.0.0.1", port=0, store=str(store), **overrides
    )


async def _page(aiohttp_server: Callable[..., Any]) -> str:
    """A page of another origin: an empty document at http://page.test:PORT/."""
    app = web.Application()

    async def index(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>a page</title>", content_type="text/html")

    app.router.add_get("/", index)
    server: TestServer = await aiohttp_server(app)
    return f"http://page.test:{server.port}"


def _fetch(url: str, **init: Any) -> str:
    """JavaScript that fetches `url` and gives back the status and text it could read, or the error."""
    return (
        f"fetch({json.dumps(url)}, {json.dumps(init)})"
        ".then(async r => ({status: r.status, type: r.type, text: await r.text()}))"
        ".catch(e => ({error: String(e)}))"
    )


async def test_a_page_of_another_origin_cannot_spend_the_key(
    store_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    with OpenAILikeStandIn(api_key=KEY) as upstream:
        async with Proxy(_config(upstream, store_path)) as proxy:
            url = proxy.host_base_url + "/v1/chat/completions"
            async with Browser(RESOLVE) as browser:
                await browser.goto(await _page(aiohttp_server) + "/")
                simple = await browser.evaluate(
                    _fetch(url, method="POST", mode="no-cors", body=json.dumps(CHAT))
                )
                preflighted = await browser.evaluate(
                    _fetch(
                        url,
                        method="POST",
                        headers={"Content-Type": "application/json"},
                        body=json.dumps(CHAT),
                    )
                )
        assert upstream.model_requests == []
    assert simple["type"] == "opaque"  # sent, and unreadable to the page in any case
    assert "error" in preflighted  # the preflight was refused: the POST never left
    assert sorted(r["status"] for r in records(store_path)) == [403, 403]  # the POST, the preflight


async def test_a_rebound_name_reads_nothing(store_path: Path) -> None:
    with OpenAILikeStandIn(api_key=KEY) as upstream:
        async with Proxy(_config(upstream, store_path)) as proxy:
            origin = f"http://rebound.test:{proxy.port}"
            async with Browser(RESOLVE) as browser:
                await browser.goto(origin + "/v1/models")
                answer = await browser.evaluate(
                    _fetch(
                        "/v1/chat/completions",
                        method="POST",
                        headers={"Content-Type": "application/json"},
                        body=json.dumps(CHAT),
                    )
                )
        assert upstream.model_requests == []
    assert answer["status"] == 421 and "standin" not in answer["text"]
    assert {r["status"] for r in records(store_path)} == {421}


async def test_an_origin_the_operator_allows_reads_its_answer(
    store_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    with OpenAILikeStandIn(api_key=KEY) as upstream:
        page = await _page(aiohttp_server)
        async with Proxy(_config(upstream, store_path, allow_origins=[page])) as proxy:
            async with Browser(RESOLVE) as browser:
                await browser.goto(page + "/")
                answer = await browser.evaluate(
                    _fetch(
                        proxy.host_base_url + "/v1/chat/completions",
                        method="POST",
                        headers={"Content-Type": "application/json", "Authorization": "Bearer anything"},
                        body=json.dumps(CHAT),
                    )
                )
        assert len(upstream.model_requests) == 1
    assert answer["status"] == 200, answer
    assert json.loads(answer["text"])["choices"][0]["message"]
