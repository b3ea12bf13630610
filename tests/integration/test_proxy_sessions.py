"""Sessions and the rules around them, through the real openai and anthropic SDKs in
front of the AReaL stand-in: per-session tokens and base URLs, the admin API, labels in every record,
expiry and close, no key lent to anonymous callers on a network listener, the client's own
credentials passed through untouched, AReaL's control routes never forwarded, and the session token
kept from the upstream, the log and the store.

The network-listener tests bind dockerd's bridge address (172.17.0.1), the one non-loopback address
these tests may listen on; a client dialling it is seen from that address, so the proxy's loopback
rules meet a genuinely non-loopback caller.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from modeltap.proxy.config import DEFAULT_SESSION_TTL_S
from modeltap.proxy.naming import SESSION_HINTS
from modeltap.proxy.server import Proxy, startup_report
from modeltap.proxy.sessions import Session
from modeltap.records.reader import StoreReader
from tests.agents import arun_agent, codex_command
from tests.factories import ASK, CONTROL_PATHS
from tests.integration.conftest import records
from tests.integration.test_proxy_sdks import anthropic_client, openai_client
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import DEFAULT_MODEL, OpenAILikeStandIn

ADMIN_KEY = "admin-key-for-tests"
CHAT: dict[str, Any] = {"model": "policy", "messages": [ASK]}
MESSAGES: dict[str, Any] = {"model": "claude-x", "max_tokens": 64, "messages": [ASK]}
SESSIONS_PATH = "/_modeltap/sessions"
# Long enough that a request right after opening is never late on a loaded machine.
TTL_S = 1.0
# How our own 401 for a closed or expired token ends; AReaL's own 401 says "expired" too.
GONE = "ask whoever gave you the URL for a new session"


def proxy_log(caplog: pytest.LogCaptureFixture) -> str:
    """What modeltap and aiohttp logged, exceptions included (the SDKs' own debug log is the client's)."""
    formatter = logging.Formatter()
    lines = [formatter.format(r) for r in caplog.records if r.name.startswith(("modeltap", "aiohttp"))]
    assert lines, "nothing logged: the test would pass whatever the proxy logs"
    return "\n".join(lines)


def admin_headers(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def clients(proxy: Proxy, session: Session, via: str) -> tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic]:
    """SDK clients that present `session` by its base URL (`via="path"`) or as their API key."""
    if via == "path":
        return openai_client(session.host_base_url + "/v1"), anthropic_client(session.host_base_url)
    return (
        openai_client(proxy.host_base_url + "/v1", key=session.token),
        anthropic_client(proxy.host_base_url, key=session.token),
    )


# -- opening sessions ------------------------------------------------------------------------------


async def test_open_in_process_returns_a_token_and_base_urls(areal: ArealStandIn, areal_proxy: Proxy) -> None:
    upstream = areal.open_session("t")
    first = areal_proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "t"})
    second = areal_proxy.sessions.open(upstream_key=upstream.api_key)
    assert first.token != second.token and first.id != second.id
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first.token)  # 256 random bits, URL-safe
    assert first.host_base_url == f"http://127.0.0.1:{areal_proxy.port}/s/{first.token}"
    assert first.container_base_url is None  # a container's 127.0.0.1 is the container itself
    assert first.token not in repr(first) and upstream.api_key not in repr(first)
    for base in (first.host_base_url, first.host_base_url + "/v1"):
        async with openai_client(base) as client:
            reply = await client.chat.completions.create(**CHAT)
        assert reply.choices[0].finish_reason == "stop"
    assert [r.headers["Authorization"] for r in areal.model_requests] == [f"Bearer {upstream.api_key}"] * 2


async def test_a_network_listener_gives_sessions_a_container_url(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], bridge_host: str
) -> None:
    upstream = areal.open_session("t")
    async with make_proxy(upstream=areal.url, host=bridge_host) as proxy:
        session = proxy.sessions.open(upstream_key=upstream.api_key)
        assert session.container_base_url == f"http://{bridge_host}:{proxy.port}/s/{session.token}"
        assert session.host_base_url == session.container_base_url  # bound to one address: all dial it
        async with anthropic_client(session.container_base_url) as client:
            message = await client.messages.create(**MESSAGES)
    assert message.stop_reason == "end_turn"


# -- the admin API ---------------------------------------------------------------------------------


async def test_admin_api_opens_lists_and_closes_sessions(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    upstream = areal.open_session("t")
    labels = {"task_id": "t7", "sample_index": 3}
    async with (
        make_proxy(upstream=areal.url, admin_key=ADMIN_KEY) as proxy,
        aiohttp.ClientSession(headers=admin_headers()) as http,
    ):
        url = proxy.host_base_url + SESSIONS_PATH
        async with http.post(
            url, json={"upstream": areal.url, "upstream_key": upstream.api_key, "labels": labels}
        ) as r:
            assert r.status == 201
            opened = await r.json()
        assert set(opened) == {"id", "upstream", "labels", "token", "base_url", "container_base_url"}
        assert opened["labels"] == {"task_id": "t7", "sample_index": "3"}
        assert opened["base_url"] == f"{proxy.host_base_url}/s/{opened['token']}"
        async with openai_client(opened["base_url"] + "/v1") as client:
            await client.chat.completions.create(**CHAT)
        assert areal.model_requests[-1].headers["Authorization"] == f"Bearer {upstream.api_key}"

        async with http.get(url) as r:
            listed = await r.text()
        assert json.loads(listed) == {
            "sessions": [{"id": opened["id"], "upstream": areal.url, "labels": opened["labels"]}]
        }
        assert opened["token"] not in listed and upstream.api_key not in listed

        async with http.delete(f"{url}/{opened['id']}") as r:
            assert r.status == 204
        async with openai_client(opened["base_url"] + "/v1") as client:
            with pytest.raises(openai.AuthenticationError, match=GONE):
                await client.chat.completions.create(**CHAT)
        async with http.delete(f"{url}/{opened['id']}") as r:
            assert r.status == 404
            assert (await r.json())["error"]["code"] == "unknown_url"
        async with http.get(url) as r:
            assert await r.json() == {"sessions": []}
    with StoreReader(store_path) as reader:
        [row] = [s for s in reader.sessions() if s["id"] == opened["id"]]
    # The 401 after the close is not the session's: its token no longer names it.
    assert row["labels"] == opened["labels"] and row["closed"] is not None and row["exchanges"] == 1


@pytest.mark.parametrize("where", ["Authorization", "x-api-key"])
async def test_admin_api_takes_the_key_as_bearer_or_x_api_key(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], where: str
) -> None:
    value = f"Bearer {ADMIN_KEY}" if where == "Authorization" else ADMIN_KEY
    async with make_proxy(upstream=areal.url, admin_key=ADMIN_KEY) as proxy, aiohttp.ClientSession() as http:
        async with http.post(proxy.host_base_url + SESSIONS_PATH, json={}, headers={where: value}) as r:
            assert r.status == 201
        assert len(proxy.sessions) == 1


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_admin_api_without_the_admin_key_is_401(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], method: str
) -> None:
    upstream = areal.open_session("t")
    async with make_proxy(upstream=areal.url, admin_key=ADMIN_KEY) as proxy, aiohttp.ClientSession() as http:
        session = proxy.sessions.open(upstream_key=upstream.api_key)
        url = proxy.host_base_url + SESSIONS_PATH + (f"/{session.id}" if method == "DELETE" else "")
        wrong = [
            {},
            {"Authorization": "Bearer not-the-key"},
            {"x-api-key": "not-the-key"},
            {"Authorization": f"Bearer {ADMIN_KEY[:-1]}"},
            {"Authorization": f"Basic {ADMIN_KEY}"},
            {"Authorization": f"Bearer {session.token}"},  # a session token is no admin key
            {"Authorization": f"Bearer {upstream.api_key}"},
        ]
        for headers in wrong:
            async with http.request(method, url, json={}, headers=headers) as r:
                body = await r.json()
                assert r.status == 401, headers
            assert body["error"]["code"] == "invalid_api_key" and "admin key" in body["error"]["message"]
        assert [s.id for s in proxy.sessions] == [session.id]  # nothing opened, nothing closed


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1]", "each optional"),
        (b'{"labels": ["task"]}', "each optional"),
        (b'{"upstream": "file:///etc/passwd"}', "must be an http(s) URL"),
    ],
)
async def test_admin_api_refuses_bad_bodies(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], body: bytes, message: str
) -> None:
    async with make_proxy(upstream=areal.url, admin_key=ADMIN_KEY) as proxy, aiohttp.ClientSession() as http:
        async with http.post(proxy.host_base_url + SESSIONS_PATH, data=body, headers=admin_headers()) as r:
            assert r.status == 400
            assert message in (await r.json())["error"]["message"]
        assert len(proxy.sessions) == 0


async def test_admin_api_answers_only_loopback_callers_unless_admin_remote(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], bridge_host: str, tmp_path: Path
) -> None:
    """The caller dials the bridge address, so the proxy sees it come from 172.17.0.1, not loopback;
    headers that claim otherwise change nothing (aiohttp trusts only the socket's peer)."""
    spoofs = [
        {},
        {"X-Forwarded-For": "127.0.0.1"},
        {"Forwarded": "for=127.0.0.1"},
        {"X-Real-IP": "127.0.0.1"},
    ]
    async with (
        make_proxy(upstream=areal.url, host=bridge_host, admin_key=ADMIN_KEY) as proxy,
        aiohttp.ClientSession() as http,
    ):
        session = proxy.sessions.open()
        url = proxy.host_base_url + SESSIONS_PATH
        for method, path in (("POST", ""), ("GET", ""), ("DELETE", f"/{session.id}")):
            for spoof in spoofs:
                async with http.request(method, url + path, json={}, headers=admin_headers() | spoof) as r:
                    body = await r.json()
                    assert r.status == 403, (method, spoof)
                assert body["error"]["code"] == "forbidden" and "--admin-remote" in body["error"]["message"]
        assert [s.id for s in proxy.sessions] == [session.id]
    async with (
        make_proxy(
            upstream=areal.url,
            host=bridge_host,
            admin_key=ADMIN_KEY,
            admin_remote=True,
            store=str(tmp_path / "remote.db"),
        ) as proxy,
        aiohttp.ClientSession() as http,
    ):
        url = proxy.host_base_url + SESSIONS_PATH
        async with http.post(url, json={}) as r:
            assert r.status == 401  # remote callers allowed, but still only with the key
        async with http.post(url, json={}, headers=admin_headers()) as r:
            assert r.status == 201
            assert (await r.json())["container_base_url"].startswith(f"http://{bridge_host}:{proxy.port}/s/")


async def test_admin_key_is_random_and_printed_unless_given(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], tmp_path: Path
) -> None:
    async with (
        make_proxy(upstream=areal.url) as first,
        make_proxy(upstream=areal.url, store=str(tmp_path / "second.db")) as second,
    ):
        assert first.admin_key != second.admin_key
        assert len(first.admin_key) >= 22  # 128 bits or more, URL-safe
        assert f"Authorization: Bearer {first.admin_key}" in startup_report(first, None)
    async with make_proxy(upstream=areal.url, admin_key=ADMIN_KEY, store=str(tmp_path / "third.db")) as given:
        assert given.admin_key == ADMIN_KEY


# -- labels, expiry, close -------------------------------------------------------------------------


async def test_labels_are_in_every_record_of_the_session(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path
) -> None:
    labels = {"task_id": "t3", "sample_index": "2", "agent_role": "solver", "areal_session_id": "t3-0"}
    upstream = areal.open_session("t3")
    session = areal_proxy.sessions.open(upstream_key=upstream.api_key, labels=labels)
    base = session.host_base_url
    async with openai_client(base + "/v1") as oa, anthropic_client(base) as an:
        await oa.chat.completions.create(**CHAT)
        async for _ in await oa.chat.completions.create(**CHAT, stream=True):
            pass
        await an.messages.create(**MESSAGES)
        areal.inject("500")
        with pytest.raises(openai.InternalServerError):
            await oa.chat.completions.create(**CHAT)
        with pytest.raises(anthropic.PermissionDeniedError):
            await an.post("/rl/set_reward", cast_to=dict, body={"reward": 1.0})
    async with aiohttp.ClientSession() as http:
        async with http.post(
            base + "/v1/chat/completions", data=b"{oops", headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
        async with http.get(base + "/v1/chat/completions") as r:
            assert r.status == 405
        control = areal_proxy.host_base_url + "/rl/set_reward"
        async with http.post(control, json={}, headers={"x-api-key": session.token}) as r:
            assert r.status == 403
    await areal_proxy.stop()
    rows = records(store_path)
    assert [r["status"] for r in rows] == [200, 200, 200, 500, 403, 400, 405, 403]
    assert all(r["session_id"] == session.id for r in rows)
    # Each record carries the session's labels, and the client its User-Agent names where it names one.
    clients = ["openai-python"] * 2 + ["anthropic-python", "openai-python", "anthropic-python"] + [None] * 3
    assert [r["labels"] for r in rows] == [labels | ({"client": c} if c else {}) for c in clients]
    with StoreReader(store_path) as reader:
        [row] = [s for s in reader.sessions() if s["id"] == session.id]
    assert row["labels"] == labels and row["exchanges"] == len(rows)


@pytest.mark.parametrize("via", ["path", "key"])
@pytest.mark.parametrize("ending", ["closed", "expired"])
async def test_an_ended_session_is_401_at_once_in_each_clients_shape(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, via: str, ending: str
) -> None:
    upstream = areal.open_session("t")
    ttl = TTL_S if ending == "expired" else DEFAULT_SESSION_TTL_S
    async with make_proxy(upstream=areal.url, session_ttl_s=ttl) as proxy:
        session = proxy.sessions.open(upstream_key=upstream.api_key)
        oa, an = clients(proxy, session, via)
        async with oa, an:
            await oa.chat.completions.create(**CHAT)
            if ending == "closed":
                assert proxy.sessions.close(session.id)
            else:
                await asyncio.sleep(2 * TTL_S)
            forwarded = len(areal.requests)
            with pytest.raises(openai.AuthenticationError, match=GONE) as oa_error:
                await oa.chat.completions.create(**CHAT)
            with pytest.raises(anthropic.AuthenticationError, match=GONE) as an_error:
                await an.messages.create(**MESSAGES)
        assert len(areal.requests) == forwarded  # refused here: the token never went upstream
        assert proxy.sessions.get(session.id) is None
    assert oa_error.value.body == {
        "message": oa_error.value.body["message"],
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert an_error.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": an_error.value.body["error"]["message"]},
    }
    assert [r["status"] for r in records(store_path)] == [200, 401, 401]


async def test_idle_sessions_are_swept_and_recorded_closed(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=areal.url, session_ttl_s=0.2) as proxy:
        session = proxy.sessions.open(labels={"task_id": "idle"})
        for _ in range(100):  # the sweep runs every second at most
            if len(proxy.sessions) == 0:
                break
            await asyncio.sleep(0.1)
        # `get` does not look at the TTL, only the sweep can have closed it.
        assert proxy.sessions.get(session.id) is None and proxy.sessions.was_closed(session.token)
    with StoreReader(store_path) as reader:
        [row] = reader.sessions()
    assert (row["id"], row["labels"]) == (session.id, {"task_id": "idle"}) and row["closed"] is not None


# -- the key and the client's credentials ----------------------------------------------------------


async def test_a_network_listener_never_lends_its_key_to_anonymous_callers(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], bridge_host: str
) -> None:
    upstream = areal.open_session("t")
    async with make_proxy(upstream=areal.url, upstream_key=upstream.api_key, host=bridge_host) as proxy:
        base = proxy.host_base_url
        async with (
            openai_client(base + "/v1", key="sk-mine") as oa,
            anthropic_client(base, key="sk-mine") as an,
        ):
            with pytest.raises(openai.AuthenticationError) as oa_error:
                await oa.chat.completions.create(**CHAT)
            with pytest.raises(anthropic.AuthenticationError) as an_error:
                await an.messages.create(**MESSAGES)
        async with aiohttp.ClientSession() as http, http.post(base + "/chat/completions", json=CHAT) as r:
            assert r.status == 401
        for message in (oa_error.value.message, an_error.value.message):
            assert "/s/TOKEN" in message and "POST /_modeltap/sessions" in message
        assert areal.requests == []

        session = proxy.sessions.open()  # no key of its own: the configured one is lent to it
        for oa in openai_client(session.host_base_url), openai_client(base, key=session.token):
            async with oa:
                await oa.chat.completions.create(**CHAT)
    assert [r.headers["Authorization"] for r in areal.model_requests] == [f"Bearer {upstream.api_key}"] * 2


async def test_lend_key_to_anonymous_is_the_operators_opt_in(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], bridge_host: str
) -> None:
    upstream = areal.open_session("t")
    async with (
        make_proxy(
            upstream=areal.url, upstream_key=upstream.api_key, host=bridge_host, lend_key_to_anonymous=True
        ) as proxy,
        anthropic_client(proxy.host_base_url, key="sk-mine") as client,
    ):
        await client.messages.create(**MESSAGES)
    [sent] = areal.requests
    assert (sent.headers["Authorization"], sent.headers["x-api-key"]) == (
        f"Bearer {upstream.api_key}",
        upstream.api_key,
    )
    assert "sk-mine" not in str(dict(sent.headers))


async def test_a_loopback_listener_lends_its_key_to_anonymous_callers(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    upstream = areal.open_session("t")
    async with (
        make_proxy(upstream=areal.url, upstream_key=upstream.api_key) as proxy,
        openai_client(proxy.host_base_url, key="sk-mine") as client,
    ):
        await client.chat.completions.create(**CHAT)
    assert areal.requests[0].headers["Authorization"] == f"Bearer {upstream.api_key}"


@pytest.mark.parametrize("listener", ["loopback", "network"])
async def test_without_session_or_key_the_clients_credentials_pass_untouched(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], request: pytest.FixtureRequest, listener: str
) -> None:
    upstream = areal.open_session("t")
    host = "127.0.0.1" if listener == "loopback" else request.getfixturevalue("bridge_host")
    own = {
        "Authorization": f"bearer {upstream.api_key}",  # scheme in lower case, as some clients send it
        "x-api-key": "client-x-api-key",
        "Cookie": "sid=client-cookie",
        "X-Custom": "kept",
    }
    async with make_proxy(upstream=areal.url, host=host) as proxy, aiohttp.ClientSession() as http:
        for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)):
            async with http.post(proxy.host_base_url + path, json=body, headers=own) as r:
                assert r.status == 200, await r.text()
    for sent in areal.requests:
        assert {name: sent.headers[name] for name in own} == own


async def test_a_session_without_any_key_sends_no_credentials_upstream(
    make_proxy: Callable[..., Proxy],
) -> None:
    with OpenAILikeStandIn() as vllm:
        async with make_proxy(upstream=vllm.url) as proxy:
            session = proxy.sessions.open()
            for via in ("path", "key"):
                oa, an = clients(proxy, session, via)
                async with oa, an:
                    await oa.chat.completions.create(model=vllm.config.model, messages=[ASK])
        assert len(vllm.requests) == 2
        for sent in vllm.requests:
            assert "Authorization" not in sent.headers and "x-api-key" not in sent.headers


# -- control routes and the token ------------------------------------------------------------------


@pytest.mark.parametrize("control", CONTROL_PATHS)
async def test_control_routes_are_never_forwarded_even_for_a_valid_session(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path, control: str
) -> None:
    upstream = areal.open_session("t")
    session = areal_proxy.sessions.open(upstream_key=upstream.api_key)
    async with openai_client(session.host_base_url) as client:
        await client.chat.completions.create(**CHAT)  # an interaction a forged reward could land on
    forwarded = len(areal.requests)
    tries = [
        (session.host_base_url + control, {}),
        (session.host_base_url + "/v1" + control, {}),
        (session.host_base_url + "/v1/v1" + control, {}),
        (areal_proxy.host_base_url + control, {"Authorization": f"Bearer {session.token}"}),
        (areal_proxy.host_base_url + "/v1" + control, {"x-api-key": session.token}),
        (areal_proxy.host_base_url + control, {"Authorization": f"Bearer {upstream.api_key}"}),
    ]
    async with aiohttp.ClientSession() as http:
        for url, headers in tries:
            for method in ("POST", "GET", "PUT"):
                async with http.request(method, url, json={"reward": 1.0}, headers=headers) as r:
                    body = await r.json()
                    assert r.status == 403, (method, url)
                assert body["error"]["code"] == "forbidden" and "never forwards" in body["error"]["message"]
    assert len(areal.requests) == forwarded
    assert [i.reward for i in upstream.interactions] == [None]
    await areal_proxy.stop()
    rows = records(store_path)[1:]
    assert len(rows) == 3 * len(tries)
    assert all(r["status"] == 403 and r["upstream_url"] is None for r in rows)
    assert sum(r["session_id"] == session.id for r in rows) == 3 * 5  # all but the one with AReaL's key


async def test_the_session_token_reaches_neither_upstream_nor_log_nor_store(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    upstream = areal.open_session("t")
    session = areal_proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "t"})
    token, base = session.token, session.host_base_url
    for via in ("path", "key"):
        oa, an = clients(areal_proxy, session, via)
        async with oa, an:
            await oa.chat.completions.create(**CHAT)
            async for _ in await oa.chat.completions.create(**CHAT, stream=True):
                pass
            async with an.messages.stream(**MESSAGES) as events:
                await events.get_final_message()
            areal.inject("500")
            with pytest.raises(openai.InternalServerError):
                await oa.chat.completions.create(**CHAT)
    async with aiohttp.ClientSession() as http:
        for method, url, data, status in [
            ("POST", base + "/v1/chat/completions", b"{oops", 400),
            ("POST", base + "/v1/nope", b"{}", 404),
            ("POST", base + "/rl/set_reward", b'{"reward": 1}', 403),
            ("POST", areal_proxy.host_base_url + "/v1/s/" + token + "/chat/completions", b"{}", 404),
            ("GET", base + "/v1/models", None, 200),
            ("GET", base + "/v1/chat/completions", None, 405),
        ]:
            async with http.request(
                method, url, data=data, headers={"Content-Type": "application/json"}
            ) as r:
                assert r.status == status, url
        # On an OpenAI route the upstream key replaces only Authorization: an x-api-key must be dropped.
        async with http.post(
            areal_proxy.host_base_url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": token}
        ) as r:
            assert r.status == 200
        areal_proxy.sessions.close(session.id)
        for url, headers in [
            (base + "/v1/chat/completions", {}),
            (areal_proxy.host_base_url + "/v1/chat/completions", {"Authorization": f"Bearer {token}"}),
        ]:
            async with http.post(url, json=CHAT, headers=headers) as r:
                assert r.status == 401
    await areal_proxy.stop()

    assert len(areal.model_requests) == 9
    for sent in areal.requests:
        assert token not in sent.path_qs and token.encode() not in sent.raw
        assert not any(token in value for value in sent.headers.values())
    assert token not in proxy_log(caplog)
    stored = b"".join(p.read_bytes() for p in store_path.parent.glob(store_path.name + "*"))
    assert token.encode() not in stored
    rows = records(store_path)
    assert len(rows) == 17 and all(token not in (r["path"] + (r["error_message"] or "")) for r in rows)


# -- naming: who may name a session (modeltap/proxy/naming.py) ------------------------------------


VLLM_CHAT: dict[str, Any] = CHAT | {"model": DEFAULT_MODEL}
VLLM_MESSAGES: dict[str, Any] = MESSAGES | {"model": DEFAULT_MODEL}


@pytest.fixture
def vllm() -> Iterator[OpenAILikeStandIn]:
    """An upstream that asks for no key, so an anonymous caller on a network listener is served."""
    with OpenAILikeStandIn() as upstream:
        yield upstream


async def test_naming_headers_from_this_host_name_sessions_on_a_listener_bound_to_every_address(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    """`serve`'s default bind (0.0.0.0) with the caller on 127.0.0.1: the README's headers work, and
    the banner says the rule."""
    named = {"x-modeltap-session": "run-7", "x-modeltap-labels": "task_id=t1, try=2"}
    async with make_proxy(upstream=vllm.url, host="0.0.0.0") as proxy:
        assert "naming    x-modeltap-session and x-modeltap-labels" in startup_report(proxy, None)
        async with openai_client(proxy.host_base_url + "/v1") as oa:
            await oa.chat.completions.create(**VLLM_CHAT, extra_headers=named)
    [row] = records(store_path)
    assert (row["status"], row["session_id"]) == (200, "run-7")
    assert row["labels"] == {"task_id": "t1", "try": "2", "client": "openai-python"}


async def test_a_remote_caller_is_refused_the_naming_headers_in_its_clients_shape_and_recorded(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path, bridge_host: str
) -> None:
    named = {"x-modeltap-session": "run-7", "x-modeltap-labels": "task_id=t1"}
    async with make_proxy(upstream=vllm.url, host=bridge_host) as proxy:
        base = proxy.host_base_url
        async with openai_client(base + "/v1") as oa, anthropic_client(base) as an:
            with pytest.raises(openai.BadRequestError) as oa_error:
                await oa.chat.completions.create(**VLLM_CHAT, extra_headers=named)
            with pytest.raises(anthropic.BadRequestError) as an_error:
                await an.messages.create(**VLLM_MESSAGES, extra_headers=named)
            session = proxy.sessions.open(labels={"task_id": "mine"})
            async with openai_client(session.host_base_url + "/v1") as holder:
                await holder.chat.completions.create(
                    **VLLM_CHAT, extra_headers=named
                )  # beside a token: taken
    for error in (oa_error.value, an_error.value):
        assert "taken from this host (a loopback peer) or beside a session token" in error.message
        assert "this request came from " in error.message and "127.0.0.1" not in error.message
    assert isinstance(an_error.value.body, dict) and an_error.value.body["type"] == "error"
    assert len(vllm.requests) == 1  # the refused two never went upstream
    refused, taken = records(store_path)[:2], records(store_path)[2]
    assert [(r["status"], r["error_class"]) for r in refused] == [(400, "client_error")] * 2
    assert all(r["session_id"].startswith("anon-") for r in refused)
    assert (taken["session_id"], taken["labels"]["task_id"]) == (f"{session.id}:run-7", "mine")
    with StoreReader(store_path) as reader:
        listed = {row["id"] for row in reader.sessions()}
    assert {r["session_id"] for r in refused} <= listed


@pytest.mark.parametrize("hint", SESSION_HINTS)
async def test_a_remote_callers_session_hint_never_puts_it_in_a_token_session(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path, bridge_host: str, hint: str
) -> None:
    """A neighbour on the network sends a rollout's session id as its agent's session header: its
    exchange is not that rollout's."""
    async with make_proxy(upstream=vllm.url, host=bridge_host) as proxy:
        rollout = proxy.sessions.open(labels={"task_id": "t"})
        async with openai_client(rollout.host_base_url + "/v1") as own:
            await own.chat.completions.create(**VLLM_CHAT)
        async with openai_client(proxy.host_base_url + "/v1") as neighbour:
            poison = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "reward me"}]}
            await neighbour.chat.completions.create(**poison, extra_headers={hint: rollout.id})
    mine, theirs = records(store_path)
    assert mine["session_id"] == rollout.id
    assert theirs["status"] == 200 and theirs["session_id"].startswith("anon-")
    assert [r["id"] for r in records(store_path, rollout.id)] == [mine["id"]]


BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


async def test_concurrent_samples_of_one_prompt_are_one_session_each(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    """pass@4 with no session tokens: four samples send the same first request at once, each then
    its own tool call's turn; and the same one-shot request sent again later. One session per sample."""
    ask = [{"role": "user", "content": "What is 6*7? Use bash."}]

    async def sample(client: openai.AsyncOpenAI, stream: bool) -> None:
        create: Any = client.chat.completions.create  # the SDK's overloads want its typed params
        first = await create(model=DEFAULT_MODEL, messages=ask, tools=[BASH])
        [call] = first.choices[0].message.tool_calls
        history = [*ask, first.choices[0].message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        if stream:
            async for _ in await create(model=DEFAULT_MODEL, messages=history, stream=True):
                pass
        else:
            await create(model=DEFAULT_MODEL, messages=history)

    async with make_proxy(upstream=vllm.url) as proxy, openai_client(proxy.host_base_url + "/v1") as client:
        await asyncio.gather(*(sample(client, stream=n % 2 == 1) for n in range(4)))
        say_hi: list[Any] = [{"role": "user", "content": "Say hi"}]
        for _ in range(2):  # the same one-shot script, run twice
            await client.chat.completions.create(model=DEFAULT_MODEL, messages=say_hi)
    by_session: dict[str, list[dict[str, Any]]] = {}
    for row in records(store_path):
        by_session.setdefault(row["session_id"], []).append(row)
    turns = sorted(len(rows) for rows in by_session.values())
    assert turns == [1, 1, 2, 2, 2, 2]
    for rows in by_session.values():
        if len(rows) == 2:  # each sample's second turn answers the tool call its own first got
            [call] = rows[0]["response"]["choices"][0]["message"]["tool_calls"]
            assert rows[1]["request"]["messages"][2]["tool_call_id"] == call["id"]


async def _messages_sample(client: anthropic.AsyncAnthropic) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is 6*7? Use bash."}]
    tools: Any = [{"name": "bash", "input_schema": BASH["function"]["parameters"]}]
    first = await client.messages.create(model=DEFAULT_MODEL, max_tokens=64, messages=ask, tools=tools)
    [use] = [block for block in first.content if block.type == "tool_use"]
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]}
    history = [*ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]}, result]
    await client.messages.create(model=DEFAULT_MODEL, max_tokens=64, messages=history, tools=tools)


async def _responses_sample(client: openai.AsyncOpenAI) -> None:
    """As Codex plays it: `store: false`, the whole history every turn, the call echoed with its ids."""
    create: Any = client.responses.create
    ask: list[Any] = [{"role": "user", "content": "What is 6*7? Use bash."}]
    tools = [{"type": "function", "name": "bash", "parameters": BASH["function"]["parameters"]}]
    first = await create(model=DEFAULT_MODEL, input=ask, tools=tools, store=False)
    [call] = [item for item in first.output if item.type == "function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "42"}
    history = [*ask, call.model_dump(exclude_none=True), output]
    await create(model=DEFAULT_MODEL, input=history, tools=tools, store=False)


@pytest.mark.parametrize("wire", ["messages", "responses"])
async def test_concurrent_samples_are_one_session_each_in_every_format(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path, wire: str
) -> None:
    """pass@4 as above, through the anthropic SDK (Messages translated to chat) and as Codex sends
    Responses: the reply each sample echoes is the one it got, in its own format."""
    async with make_proxy(upstream=vllm.url) as proxy:
        if wire == "messages":
            async with anthropic_client(proxy.host_base_url) as an:
                await asyncio.gather(*(_messages_sample(an) for _ in range(4)))
        else:
            async with openai_client(proxy.host_base_url + "/v1") as oa:
                await asyncio.gather(*(_responses_sample(oa) for _ in range(4)))
    rows = records(store_path)
    assert all(r["status"] == 200 for r in rows) and len(rows) == 8
    assert sorted(Counter(r["session_id"] for r in rows).values()) == [2, 2, 2, 2]


@pytest.mark.agents
async def test_codex_names_its_session_with_its_own_thread_id(
    vllm: OpenAILikeStandIn, make_proxy: Callable[..., Proxy], store_path: Path, tmp_path: Path
) -> None:
    """The real Codex CLI, without a token, from this host: its requests are one session, named by the
    thread id it sends (as Claude Code's are by its own header)."""
    async with make_proxy(upstream=vllm.url) as proxy:
        run = await arun_agent(codex_command, proxy.host_base_url + "/v1", "k", tmp_path)
    assert run.exit_code == 0, run.describe()
    sent = {r.headers["thread-id"] for r in vllm.model_requests}
    rows = records(store_path)
    assert len(sent) == 1 and len(rows) == len(vllm.model_requests) >= 2
    assert {r["session_id"] for r in rows} == sent


async def test_a_responses_conversation_chained_by_previous_response_id_is_one_session(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    """Anonymous, through a chat-only upstream (modeltap keeps the chain): the chained turn is served
    from the first turn's session, and recorded in it."""
    with OpenAILikeStandIn(chat_only=True) as chat_only:
        async with (
            make_proxy(upstream=chat_only.url) as proxy,
            openai_client(proxy.host_base_url + "/v1") as oa,
        ):
            first = await oa.responses.create(model=DEFAULT_MODEL, input="Say hi")
            await oa.responses.create(model=DEFAULT_MODEL, input="again", previous_response_id=first.id)
    rows = records(store_path)
    assert [r["status"] for r in rows] == [200, 200]
    assert rows[0]["session_id"] == rows[1]["session_id"]
