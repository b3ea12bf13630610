"""Hostile and broken input that test_proxy_failures.py does not already cover: CRLF and
bad bytes in headers and request lines, encoded CRLF in the query, path traversal and encoded slashes
around `/s/TOKEN`, slowloris headers and bodies, clients leaving at each stage, upstreams that reset,
stall, break their SSE or cut their body, and thousands of sessions at once.

Requests with bytes no HTTP client would send go over a raw socket. Throughout, a bystander session on
an upstream of its own keeps chatting through the same proxy and must get every answer, and the store
must end consistent: SQLite's integrity check passes, and every exchange is there once and whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modeltap.proxy.server import Proxy
from modeltap.proxy.sessions import Session
from modeltap.proxy.tasks import Tasks
from modeltap.records.schema import connect
from tests.integration.conftest import records
from tests.integration.test_proxy_sdks import ASK
from tests.integration.test_proxy_sessions import proxy_log
from tests.standins.areal import ArealSession, ArealStandIn

CHAT: dict[str, Any] = {"model": "policy", "messages": [ASK]}
MESSAGES: dict[str, Any] = {"model": "claude-x", "max_tokens": 64, "messages": [ASK]}
# Short, so that the slow-client tests take seconds; the default is 60 s.
CLIENT_TIMEOUT_S = 1.0
# How late past a timeout a drop may come on a loaded 2-core machine before it counts as not dropped.
TIMEOUT_SLACK_S = 3.0
# A raw request that gets no answer in this long has hung.
RAW_TIMEOUT_S = 15.0
TRICKLE_EVERY_S = 0.1
BYSTANDER_PAUSE_S = 0.05
READ_TIMEOUT_S = 0.5
STALL_S = 5.0
SESSIONS = 2000
CONCURRENT = 500


# -- raw HTTP --------------------------------------------------------------------------------------


@dataclass
class RawReply:
    """A response read off a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        """The error object of an OpenAI- or Anthropic-shaped error body."""
        doc = json.loads(self.body)
        assert doc.get("type") == "error" or set(doc) == {"error"}, doc
        return dict(doc["error"])


def http_request(target: str, *headers: bytes, body: bytes = b"", method: str = "POST") -> bytes:
    """One request, byte for byte: `headers` go in as they are, CR, LF and NUL included."""
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close", *headers]
    if method == "POST":
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def read_reply(reader: asyncio.StreamReader) -> RawReply:
    """One response, framed by its Content-Length or chunks: after a 408 the proxy keeps draining the
    request body for a while, so reading to EOF would wait for that too."""
    status_line, *lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    headers = {}
    for line in filter(None, lines):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readexactly(2)
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawReply(int(status_line.split()[1]), headers, body)


async def send_raw(port: int, data: bytes) -> RawReply:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(RAW_TIMEOUT_S):
            return await read_reply(reader)
    finally:
        writer.close()


async def trickle_until_dropped(port: int, start: bytes) -> float:
    """Send `start`, then one more header byte every TRICKLE_EVERY_S; return when the proxy hangs up."""
    began = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(start)
        while time.monotonic() - began < RAW_TIMEOUT_S:
            try:
                writer.write(b"a")
                await writer.drain()
                async with asyncio.timeout(TRICKLE_EVERY_S):
                    if await reader.read(1) == b"":
                        return time.monotonic() - began
            except TimeoutError:
                continue
            except ConnectionError:
                return time.monotonic() - began
    finally:
        writer.close()
    pytest.fail(f"a client trickling its headers was still connected after {RAW_TIMEOUT_S:g} s")


# -- sessions, bystanders, the store ---------------------------------------------------------------


def open_session(proxy: Proxy, areal: ArealStandIn, task: str = "victim") -> tuple[Session, ArealSession]:
    upstream = areal.open_session(task)
    return proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": task}), upstream


@contextlib.asynccontextmanager
async def bystander(proxy: Proxy) -> AsyncIterator[list[int]]:
    """Another session, on an AReaL of its own (so that no fault injected for the test reaches it),
    chatting through `proxy` for as long as the block runs. Yields the statuses it got; checks at the
    end that it got answers, every one a 200."""
    statuses: list[int] = []
    done = asyncio.Event()
    with ArealStandIn() as other:
        upstream = other.open_session("bystander")
        session = proxy.sessions.open(
            upstream=other.url, upstream_key=upstream.api_key, labels={"agent_role": "bystander"}
        )

        async def chat() -> None:
            async with aiohttp.ClientSession() as http:
                while not done.is_set():
                    async with http.post(session.host_base_url + "/v1/chat/completions", json=CHAT) as r:
                        await r.read()
                        statuses.append(r.status)
                    await asyncio.sleep(BYSTANDER_PAUSE_S)

        tasks = Tasks("test")
        talking = tasks.spawn(chat(), "bystander")
        try:
            yield statuses
        finally:
            done.set()
            await talking
    assert statuses and set(statuses) == {200}, statuses


def assert_store_consistent(store_path: Path, expected: int) -> list[dict[str, Any]]:
    """The store after a graceful stop: intact, and holding `expected` exchanges, each once and whole
    (bodies that read back, an end after the start, a status unless the client left before any)."""
    with contextlib.closing(connect(store_path, readonly=True)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = records(store_path)
    assert len(rows) == expected and len({r["id"] for r in rows}) == expected
    for row in rows:
        assert row["ended"] is not None and row["ended"] >= row["started"], row
        assert row["status"] is not None or row["client_disconnected"], row
        assert (row["error_class"] is None) == (row["error_message"] is None), row
    return rows


# -- headers and request lines ---------------------------------------------------------------------

BAD_HEADERS = {
    "bare CR": b"X-Note: a\rX-Injected: 1",
    "bare LF": b"X-Note: a\nX-Injected: 1",
    "folded": b"X-Note: a\r\n X-Injected: 1",
    "folded with a tab": b"X-Note: a\r\n\tX-Injected: 1",
    "NUL": b"X-Note: a\x00X-Injected: 1",
    "space in a name": b"X Injected: 1",
    "no colon": b"X-Injected 1",
    "Transfer-Encoding beside Content-Length": b"Transfer-Encoding: chunked",
    "a second Content-Length": b"Content-Length: 1",
    "the token, then a fold": b"Authorization: Bearer {token}\r\n X-Injected: 1",
}


@pytest.mark.parametrize("line", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
async def test_crlf_and_bad_bytes_in_headers_never_reach_the_upstream(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    caplog: pytest.LogCaptureFixture,
    line: bytes,
) -> None:
    caplog.set_level(logging.DEBUG)
    body = json.dumps(CHAT).encode()
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        target = f"/s/{session.token}/v1/chat/completions"
        bad = line.replace(b"{token}", session.token.encode())
        assert (await send_raw(proxy.port, http_request(target, bad, body=body))).status == 400
        assert areal.requests == []
        assert (await send_raw(proxy.port, http_request(target, body=body))).status == 200
    [sent] = areal.model_requests
    assert "X-Injected" not in sent.headers
    assert session.token not in proxy_log(caplog)
    assert_store_consistent(store_path, 1)  # the refused request never became an exchange


# A raw CR LF in the request line ends it early: aiohttp then reads it as HTTP/0.9 (no version) and the
# rest as headers, which the proxy refuses rather than forward. Other bad bytes stop aiohttp's parser.
BAD_REQUEST_LINES = {
    "CRLF in the query": ("/s/{token}/v1/chat/completions?x=\r\nX-Injected: 1", 1),
    "LF in the path": ("/s/{token}/v1/chat/completions\nX-Injected: 1", 1),
    "control byte": ("/s/{token}/v1/chat/completions\x01", 0),
    "space in the path": ("/s/{token}/v1/chat/ completions", 0),
}


@pytest.mark.parametrize(("target", "recorded"), BAD_REQUEST_LINES.values(), ids=BAD_REQUEST_LINES.keys())
async def test_bad_request_lines_are_refused_and_the_token_not_logged(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    caplog: pytest.LogCaptureFixture,
    target: str,
    recorded: int,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        request = http_request(target.format(token=session.token), body=json.dumps(CHAT).encode())
        assert (await send_raw(proxy.port, request)).status == 400
        assert areal.requests == []
    assert session.token not in proxy_log(caplog)
    rows = assert_store_consistent(store_path, recorded)
    assert all(r["path"].startswith("/s/…/v1/chat/completions") and r["status"] == 400 for r in rows)


async def test_an_encoded_crlf_in_the_query_stays_data_upstream(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    query = "note=%0D%0AX-Injected:%201&a=%26b&beta=true"
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        target = f"/s/{session.token}/v1/chat/completions?{query}"
        reply = await send_raw(proxy.port, http_request(target, body=json.dumps(CHAT).encode()))
        assert reply.status == 200
    [sent] = areal.model_requests
    assert "X-Injected" not in sent.headers
    assert sent.query == {"note": "\r\nX-Injected: 1", "a": "&b", "beta": "true"}  # as the client meant it
    [row] = assert_store_consistent(store_path, 1)
    assert row["path"] == f"/s/…/v1/chat/completions?{query}"


# -- paths around /s/TOKEN -------------------------------------------------------------------------

# What aiohttp hands modeltap is percent-decoded once and never normalised (no dot segments removed,
# no slashes merged, no case folded), so each of these reaches routes.resolve as written, decoded.
PATH_TRICKS = [
    ("/s/{T}/../rl/set_reward", 404),
    ("/s/{T}/v1/../../rl/set_reward", 404),
    ("/s/{T}/%2E%2E/rl/set_reward", 404),
    ("/s/{T}/..%2Frl%2Fset_reward", 404),
    ("/s/{T}%2F..%2Frl%2Fset_reward", 404),
    ("/s/{T}/v1/chat/completions/../../../rl/set_reward", 404),
    ("/s/{T}/rl%2Fset_reward", 403),
    ("/s/{T}/v1/%72l/set_reward", 403),
    ("/s/{T}/%72%6C/%73et_reward", 403),
    ("/s/{T}/rl/set_reward.", 403),
    ("/s/{T}/rl/set_reward%00", 403),
    ("/s/{T}/rl/set_reward?interaction_id=x", 403),
    ("//s/{T}/rl/set_reward", 403),
    ("/s/{T}//rl//set_reward", 404),
    ("/s/{T}/RL/set_reward", 404),
    ("/s/{T}/v1/Rl/Set_Reward", 404),
    ("/s/{T}/GRANT_CAPACITY", 404),
    ("/s/{T}/export_trajectories.", 404),
    ("/s/{T}/s/{T}/rl/set_reward", 404),
    ("/s/..%2Fs%2F{T}/chat/completions", 404),
    ("/s/%2E%2E/chat/completions", 404),
    ("/S/{T}/chat/completions", 404),
    ("/v1/s/{T}/chat/completions", 404),
    ("/s/{T}x/chat/completions", 401),
    ("/s/{T}/v1/chat/completions/", 200),
    ("/s/{T}/v1/v1/chat/completions?beta=true", 200),
    ("/%73/{T}/chat/completions", 200),  # an encoded `s` is still the session prefix
]


@pytest.mark.parametrize(("template", "status"), PATH_TRICKS, ids=[t for t, _ in PATH_TRICKS])
async def test_paths_around_the_session_prefix(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, template: str, status: int
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, upstream = open_session(proxy, areal)
        target = template.replace("{T}", session.token)
        reply = await send_raw(proxy.port, http_request(target, body=json.dumps(CHAT).encode()))
    assert reply.status == status
    if status == 200:
        [sent] = areal.model_requests
        assert (sent.path, sent.headers["Authorization"]) == (
            "/chat/completions",
            f"Bearer {upstream.api_key}",
        )
    else:
        assert areal.requests == [] and reply.error()["message"]
        assert session.token not in reply.error()["message"]
    [row] = assert_store_consistent(store_path, 1)
    assert session.token not in row["path"] + (row["error_message"] or "")
    stored = b"".join(p.read_bytes() for p in store_path.parent.glob(store_path.name + "*"))
    assert session.token.encode() not in stored


async def test_a_model_id_cannot_climb_out_of_models(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        for model_id in ("%252E%252E", "%2E%2E", "..%252F..%252Frl%252Fset_reward", "x%3Fy%3D1", "x%23y"):
            reply = await send_raw(
                proxy.port, http_request(f"/s/{session.token}/v1/models/{model_id}", method="GET")
            )
            assert reply.status == 404, model_id
    assert areal.requests  # the upstream was asked, for the ids that are single path segments
    for sent in areal.requests:
        assert sent.path.startswith(("/v1/models/", "/models/")) and sent.query == {}, sent.path_qs
    assert_store_consistent(store_path, 5)


# -- slow clients ----------------------------------------------------------------------------------


async def test_a_slowloris_that_never_finishes_its_headers_is_dropped(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=areal.url, client_timeout_s=CLIENT_TIMEOUT_S) as proxy:
        session, _ = open_session(proxy, areal)
        start = f"POST /s/{session.token}/v1/chat/completions HTTP/1.1\r\nHost: modeltap\r\nX-Pad: ".encode()
        async with bystander(proxy) as served:
            dropped_after = await asyncio.gather(
                *(trickle_until_dropped(proxy.port, start) for _ in range(3))
            )
    for seconds in dropped_after:
        assert CLIENT_TIMEOUT_S * 0.9 <= seconds < CLIENT_TIMEOUT_S + TIMEOUT_SLACK_S
    assert areal.requests == []
    assert_store_consistent(store_path, len(served))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_body_that_does_not_arrive_in_time_is_a_408_in_the_clients_shape(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, path: str
) -> None:
    async with make_proxy(upstream=areal.url, client_timeout_s=CLIENT_TIMEOUT_S) as proxy:
        session, _ = open_session(proxy, areal)
        head = http_request(f"/s/{session.token}{path}", body=b"x" * 1000)
        partial = head[: head.index(b"\r\n\r\n") + 4] + b'{"model": '
        async with bystander(proxy) as served:
            began = time.monotonic()
            reply = await send_raw(proxy.port, partial)
            waited = time.monotonic() - began
    assert reply.status == 408 and CLIENT_TIMEOUT_S * 0.9 <= waited < CLIENT_TIMEOUT_S + TIMEOUT_SLACK_S
    error = reply.error()
    assert error["type"] == ("timeout_error" if "messages" in path else "invalid_request_error")
    assert areal.requests == []
    rows = assert_store_consistent(store_path, len(served) + 1)
    [row] = [r for r in rows if r["session_id"] == session.id]
    assert (row["status"], row["error_class"], row["labels"]) == (408, "client_error", {"task_id": "victim"})


# -- clients that leave ----------------------------------------------------------------------------


async def _leave_mid_body(proxy: Proxy, session: Session, areal: ArealStandIn) -> None:
    head = http_request(f"/s/{session.token}/v1/chat/completions", body=b"x" * 1000)
    _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head[: head.index(b"\r\n\r\n") + 4] + b'{"model": ')
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()


async def _leave_while_waiting(proxy: Proxy, session: Session, areal: ArealStandIn) -> None:
    areal.inject("stall", stall_s=STALL_S)  # AReaL answers only when the whole completion is generated
    async with aiohttp.ClientSession() as http:

        async def ask() -> None:
            async with http.post(session.host_base_url + "/chat/completions", json=CHAT) as r:
                await r.read()

        asking = Tasks("test").spawn(ask(), "leaving")
        for _ in range(int(RAW_TIMEOUT_S / 0.05)):
            if areal.model_requests:
                break
            await asyncio.sleep(0.05)
        asking.cancel()  # hang up before any byte of the answer
        with contextlib.suppress(asyncio.CancelledError):
            await asking


async def _leave_mid_stream(proxy: Proxy, session: Session, areal: ArealStandIn) -> None:
    areal.control.chunk_delay_s = 0.3
    async with aiohttp.ClientSession() as http:
        response = await http.post(session.host_base_url + "/chat/completions", json=CHAT | {"stream": True})
        assert (await response.content.readany()).startswith(b"data: ")
        response.close()


LEAVING = {
    "mid-body": _leave_mid_body,
    "awaiting the answer": _leave_while_waiting,
    "mid-stream": _leave_mid_stream,
}


@pytest.mark.parametrize("moment", LEAVING)
async def test_a_client_that_leaves_is_recorded_and_costs_nobody_else(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, moment: str
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        async with bystander(proxy) as served:
            await LEAVING[moment](proxy, session, areal)
            for _ in range(100):
                await asyncio.sleep(0.05)  # the bystander keeps talking while the record is written
                if proxy.context.store.written > len(served):
                    break
    rows = assert_store_consistent(store_path, len(served) + 1)
    [row] = [r for r in rows if r["session_id"] == session.id]
    assert row["client_disconnected"] and row["error_class"] == "client_disconnect"
    assert row["labels"] == {"task_id": "victim"}
    assert row["status"] == (200 if moment == "mid-stream" else None)  # None: no answer was ever begun
    if moment == "mid-stream":
        assert row["streamed"] and not row["stream_complete"]


# -- upstreams that break --------------------------------------------------------------------------

UPSTREAM_FAULTS = [
    # fault, streamed, the status the client sees, whether its stream breaks as the upstream's did
    ("reset", False, 502, False),
    ("truncate", False, 502, False),
    ("stall", False, 504, False),
    ("reset", True, 200, True),
    ("truncate", True, 200, True),
    ("badsse", True, 200, False),
    ("stall", True, 504, False),
    ("slow chunks", True, 200, True),
]


@pytest.mark.parametrize(("fault", "stream", "status", "broken"), UPSTREAM_FAULTS)
async def test_a_broken_upstream_costs_only_its_own_exchange(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    fault: str,
    stream: bool,
    status: int,
    broken: bool,
) -> None:
    if fault == "slow chunks":
        areal.control.chunk_delay_s = READ_TIMEOUT_S * 4  # silence mid-stream, past the read timeout
    else:
        areal.inject(fault, stall_s=STALL_S)  # type: ignore[arg-type]
    async with make_proxy(upstream=areal.url, layout="areal", read_timeout_s=READ_TIMEOUT_S) as proxy:
        session, _ = open_session(proxy, areal)
        async with bystander(proxy) as served, aiohttp.ClientSession() as http:
            async with http.post(
                session.host_base_url + "/chat/completions", json=CHAT | {"stream": stream}
            ) as r:
                assert r.status == status
                if broken:  # passed on as a broken transfer, not a clean (short) end
                    with pytest.raises(aiohttp.ClientPayloadError):
                        await r.read()
                body = b"" if broken else await r.read()
            await asyncio.sleep(0.3)  # the bystander gets answers after the break too
    if status >= 500:
        assert json.loads(body)["error"]["code"] == (
            "upstream_timeout" if status == 504 else "upstream_unreachable"
        )
    else:
        assert b"[DONE]" not in body  # the client sees the stream end early, as it did
    rows = assert_store_consistent(store_path, len(served) + 1)
    [row] = [r for r in rows if r["session_id"] == session.id]
    assert (row["status"], row["error_class"], row["labels"]) == (
        status,
        "upstream_error",
        {"task_id": "victim"},
    )
    if status == 200:
        assert row["streamed"] and not row["stream_complete"]


# -- many sessions ---------------------------------------------------------------------------------


async def test_thousands_of_sessions_are_all_served_and_recorded(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    """2,000 sessions open, 500 requests at once across them (chat and messages, streamed or not):
    each is answered, recorded once under its own session, and reaches AReaL with its own key."""
    async with make_proxy(upstream=areal.url, layout="areal") as proxy:
        pairs = [open_session(proxy, areal, f"t{i}") for i in range(SESSIONS)]
        assert len(proxy.sessions) == SESSIONS
        chosen = pairs[:: SESSIONS // CONCURRENT]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def one(index: int, session: Session) -> bytes:
                path, body = ("/v1/messages", MESSAGES) if index % 2 else ("/v1/chat/completions", CHAT)
                async with http.post(
                    session.host_base_url + path, json=body | {"stream": index % 4 < 2}
                ) as r:
                    assert r.status == 200, await r.text()
                    return await r.read()

            answers = await asyncio.gather(*(one(i, s) for i, (s, _) in enumerate(chosen)))
    assert len(answers) == CONCURRENT and all(answers)
    rows = assert_store_consistent(store_path, CONCURRENT)
    assert Counter(r["session_id"] for r in rows) == Counter(s.id for s, _ in chosen)
    assert all(r["status"] == 200 for r in rows)
    by_id = {s.id: s for s, _ in chosen}
    assert all(r["labels"] == by_id[r["session_id"]].labels for r in rows)
    assert sum(r["streamed"] for r in rows) == CONCURRENT // 2 and all(
        r["stream_complete"] is not False for r in rows
    )
    assert [len(upstream.interactions) for _, upstream in chosen] == [1] * CONCURRENT
