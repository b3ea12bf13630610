"""modeltap/proxy/browsers.py and the content type request_body.py requires, through a live loopback
proxy that lends its upstream key: a request a web page could make (a name that is not the listener's,
a form or plain-text body, another origin, a preflight) never reaches the upstream with the key, is
refused in the client's shape and recorded; an origin the operator allows gets through. The Host
values are fuzzed with hypothesis; tests/ui/test_pages.py does the same from a real Chromium page."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modeltap.compat.hosts import own_host
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from tests.factories import ASK
from tests.integration.conftest import ThreadedProxy, records
from tests.integration.test_fuzz import _in_a_dialect
from tests.standins.openai_like import OpenAILikeStandIn

KEY = "sk-operator-0123456789"
CHAT = json.dumps({"model": "standin-model", "messages": [ASK], "max_tokens": 8}).encode()
MESSAGES = json.dumps({"model": "standin-model", "messages": [ASK], "max_tokens": 8}).encode()
PAGE = "http://evil.example"
THROUGH_THE_PROXY = settings(
    max_examples=120, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow]
)
# What a client may put in Host: visible ASCII and spaces (http.client refuses control characters).
host_values = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    st.sampled_from(
        ["localhost", "127.0.0.1", "[::1]", "evil.example", "127.0.0.1.nip.io", "LOCALHOST."]
    ).flatmap(lambda name: st.integers(0, 70000).map(lambda port: f"{name}:{port}")),
)


@pytest.fixture
def upstream() -> Iterator[OpenAILikeStandIn]:
    with OpenAILikeStandIn(api_key=KEY) as standin:
        yield standin


def _config(upstream: OpenAILikeStandIn, store: Path, **overrides: Any) -> ProxyConfig:
    return ProxyConfig(
        **{
            "upstream": upstream.url,
            "upstream_key": KEY,
            "host": "127.0.0.1",
            "port": 0,
            "store": str(store),
            "record_writer": "thread",
        }
        | overrides
    )


def _post(
    port: int, path: str, body: bytes, headers: dict[str, str], method: str = "POST"
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_any_host_is_answered_only_when_it_is_the_listener_s_own(tmp_path: Path) -> None:
    """A rebinding page's requests name its own host: whatever Host a request carries, it goes
    upstream with the key only when it names the listener's own; else it is refused (421 in the
    client's shape, recorded; or 400 when aiohttp cannot parse it)."""
    store = tmp_path / "records.db"
    refused = 0
    with OpenAILikeStandIn(api_key=KEY) as upstream, ThreadedProxy(_config(upstream, store)) as proxy:
        assert proxy.port is not None
        port = proxy.port

        @example(host="evil.example:8840")
        @example(host="localhost:8840")
        @THROUGH_THE_PROXY
        @given(host=host_values)
        def one(host: str) -> None:
            nonlocal refused
            before = len(upstream.model_requests)
            status, body = _post(
                port, "/v1/chat/completions", CHAT, {"Host": host, "Content-Type": "application/json"}
            )
            forwarded = upstream.model_requests[before:]
            if own_host(host, "127.0.0.1"):
                assert status == 200 and len(forwarded) == 1, body
            else:
                assert forwarded == [] and status in (400, 421), body
                assert _in_a_dialect(body)
                refused += status == 421

        one()
    assert refused > 0
    assert sum(r["status"] == 421 and r["error_class"] == "client_error" for r in records(store)) == refused


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [("/v1/chat/completions", CHAT, "openai"), ("/v1/messages", MESSAGES, "anthropic")],
)
@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
async def test_a_body_a_page_may_send_unasked_is_refused_in_the_client_s_shape_and_recorded(
    upstream: OpenAILikeStandIn,
    store_path: Path,
    path: str,
    body: bytes,
    shape: str,
    content_type: str | None,
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    async with (
        Proxy(_config(upstream, store_path)) as proxy,
        aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as http,
        http.post(proxy.host_base_url + path, data=body, headers=headers) as reply,
    ):
        status, answer = reply.status, await reply.read()
    assert status == 400 and upstream.model_requests == []
    doc = json.loads(answer)
    assert (doc.get("type") == "error") is (shape == "anthropic") and "Content-Type" in str(doc)
    [row] = records(store_path)
    assert row["status"] == 400 and "Content-Type" in row["error_message"]


async def test_a_page_of_another_origin_is_refused_and_its_preflight_too(
    upstream: OpenAILikeStandIn, store_path: Path
) -> None:
    async with Proxy(_config(upstream, store_path)) as proxy, aiohttp.ClientSession() as http:
        base = proxy.host_base_url
        json_post = {"Origin": PAGE, "Content-Type": "application/json"}
        async with http.post(base + "/v1/chat/completions", data=CHAT, headers=json_post) as reply:
            assert reply.status == 403 and _in_a_dialect(await reply.read())
        async with http.get(base + "/v1/models", headers={"Sec-Fetch-Site": "cross-site"}) as reply:
            assert reply.status == 403
        preflight = {"Origin": PAGE, "Access-Control-Request-Method": "POST"}
        async with http.options(base + "/v1/chat/completions", headers=preflight) as reply:
            assert reply.status == 403 and "access-control-allow-origin" not in reply.headers
    assert upstream.model_requests == [] and not any(r.path == "/v1/models" for r in upstream.requests)
    assert sorted(r["status"] for r in records(store_path)) == [403, 403, 403]


async def test_an_origin_the_operator_allows_gets_its_preflight_and_its_answers(
    upstream: OpenAILikeStandIn, store_path: Path
) -> None:
    async with (
        Proxy(_config(upstream, store_path, allow_origins=[PAGE + "/"])) as proxy,
        aiohttp.ClientSession() as http,
    ):
        url = proxy.host_base_url + "/v1/chat/completions"
        ask = {
            "Origin": PAGE,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-stainless-os",
            "Access-Control-Request-Private-Network": "true",
        }
        async with http.options(url, headers=ask) as reply:
            assert reply.status == 204
            assert reply.headers["Access-Control-Allow-Origin"] == PAGE
            assert reply.headers["Access-Control-Allow-Headers"] == "content-type,x-stainless-os"
            assert reply.headers["Access-Control-Allow-Private-Network"] == "true"
        headers = {"Origin": PAGE, "Content-Type": "application/json"}
        async with http.post(url, data=CHAT, headers=headers) as reply:
            assert reply.status == 200 and reply.headers["Access-Control-Allow-Origin"] == PAGE
        other = {"Origin": "http://other.example", "Content-Type": "application/json"}
        async with http.post(url, data=CHAT, headers=other) as reply:
            assert reply.status == 403
    assert len(upstream.model_requests) == 1


async def test_beyond_loopback_a_session_token_needs_no_particular_host(
    upstream: OpenAILikeStandIn, store_path: Path
) -> None:
    """Containers reach the host by any name (a compose service's): the token is what is checked."""
    config = _config(upstream, store_path, host="0.0.0.0")
    async with Proxy(config) as proxy, aiohttp.ClientSession() as http:
        session = proxy.sessions.open()
        headers = {"Host": "modeltap-service:8840", "Content-Type": "application/json"}
        url = f"{session.host_base_url}/v1/chat/completions"
        async with http.post(url, data=CHAT, headers=headers) as reply:
            assert reply.status == 200, await reply.text()


async def test_beyond_loopback_a_key_lent_to_anyone_is_guarded_by_the_host_too(
    upstream: OpenAILikeStandIn, store_path: Path
) -> None:
    """--lend-key-to-anonymous lends the key as a loopback listener does: the same check applies."""
    config = _config(upstream, store_path, host="0.0.0.0", lend_key_to_anonymous=True)
    async with Proxy(config) as proxy, aiohttp.ClientSession() as http:
        url = proxy.host_base_url + "/v1/chat/completions"
        headers = {"Host": "evil.example:8840", "Content-Type": "application/json"}
        async with http.post(url, data=CHAT, headers=headers) as reply:
            assert reply.status == 421
        async with http.post(url, data=CHAT, headers={"Content-Type": "application/json"}) as reply:
            assert reply.status == 200
    assert len(upstream.model_requests) == 1
