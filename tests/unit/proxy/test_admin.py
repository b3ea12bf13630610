"""modeltap/proxy/admin.py: the admin API opens, lists and closes sessions for a caller with the admin
key, on loopback; it shows a token only to the request that opened its session."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from modeltap.proxy.admin import PREFIX, session_request, session_view
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy

KEY = "admin-key-for-tests"


@pytest.fixture
async def proxy(store_path: Path) -> AsyncIterator[Proxy]:
    config = ProxyConfig(host="127.0.0.1", port=0, store=str(store_path), admin_key=KEY)
    async with Proxy(config) as started:
        yield started


async def call(
    proxy: Proxy, method: str, path: str = "", key: str | None = KEY, **kwargs: object
) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as http:
        async with http.request(
            method, proxy.host_base_url + PREFIX + path, headers=headers, **kwargs
        ) as reply:
            return reply.status, (await reply.json(content_type=None) if reply.status != 204 else None)


async def test_open_list_close(proxy: Proxy) -> None:
    status, opened = await call(
        proxy, "POST", json={"upstream": "http://up:1", "upstream_key": "k", "labels": {"a": "b"}}
    )
    assert status == 201 and isinstance(opened, dict)
    assert opened["token"] and opened["base_url"].endswith("/s/" + opened["token"])
    assert "upstream_key" not in opened
    status, listed = await call(proxy, "GET")
    assert listed == {"sessions": [{"id": opened["id"], "upstream": "http://up:1", "labels": {"a": "b"}}]}
    assert (await call(proxy, "DELETE", "/" + opened["id"]))[0] == 204
    status, gone = await call(proxy, "DELETE", "/" + opened["id"])
    assert status == 404 and "no open session" in gone["error"]["message"]  # type: ignore[index]


@pytest.mark.parametrize("key", [None, "wrong-key"])
async def test_without_the_admin_key_is_401(proxy: Proxy, key: str | None) -> None:
    status, body = await call(proxy, "GET", key=key)
    assert status == 401 and body["error"]["code"] == "invalid_api_key"  # type: ignore[index]


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"labels": []}', b'{"upstream": "ftp://x"}'],
)
async def test_bad_bodies_are_400(proxy: Proxy, body: bytes) -> None:
    status, answer = await call(proxy, "POST", data=body)
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"  # type: ignore[index]


async def test_a_token_shows_only_in_the_answer_that_opened_its_session(proxy: Proxy) -> None:
    session = proxy.sessions.open(upstream_key="k")
    assert "token" not in session_view(session, with_token=False)
    assert session_view(session, with_token=True)["token"] == session.token


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"upstream": 42}, "upstream must be a URL"),
        ({"upstream": "http://up:1/a b"}, "upstream must be a URL"),
        ({"upstream": "http://up:1/\r\nX-Injected: 1"}, "upstream must be a URL"),
        ({"upstream": "file:///etc/passwd"}, "http(s) URL with a host"),
        ({"upstream": "http://areal:1/rl"}, "control routes"),
        ({"upstream": "http://areal:1/v1/internal/x"}, "control routes"),
        ({"upstream_key": 7}, "upstream_key must be"),
        ({"upstream_key": "sk\r\nX-Injected: 1"}, "upstream_key must be"),
        ({"upstream_key": ""}, "upstream_key must be"),
        ({"upstream_key": "k" * 5000}, "upstream_key must be"),
        ({"labels": {"task": "\ud800"}}, "printable text"),
        ({"labels": {"task": "a\nb"}}, "printable text"),
        ({"labels": {"bad name": "x"}}, "label name"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "at most 64"),
        ({"labels": {"task": [1]}}, "printable text"),
        ({"token": "mine"}, "unknown field 'token'"),
    ],
)
def test_session_requests_are_checked_field_by_field(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        session_request(body)


def test_a_good_session_request_passes_as_it_is() -> None:
    body = {"upstream": "http://10.0.0.5:41235", "upstream_key": "sk-abc_123", "labels": {"task_id": "t-1"}}
    assert session_request(body) == ("http://10.0.0.5:41235", "sk-abc_123", {"task_id": "t-1"})
    assert session_request({}) == (None, None, {})
    assert session_request({"labels": {"sample_index": 3}})[2] == {
        "sample_index": 3
    }  # the registry keeps "3"
