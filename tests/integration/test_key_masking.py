"""modeltap/proxy/keys.py through a live proxy: an upstream that quotes the key it was sent (gateways
and debugging proxies do, in a 401) has it masked in what reaches the client, the records, the log
and every export, wherever it puts the key (body, header, a stream with the key split across chunks),
whichever key it was (--upstream-key, a session's own, a key in the query). Fuzzed with hypothesis.
Also: a key in the query string is not recorded, is replaced by the upstream's key, and is not sent
on by replay; an upstream URL holding user:password is refused at start and by the admin API."""

from __future__ import annotations

import asyncio
import base64
import http.client
import io
import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeltap.exporters.export import write_export
from modeltap.proxy.admin import session_request
from modeltap.proxy.config import ProxyConfig
from modeltap.records.reader import StoreReader
from modeltap.replay.replay import without_session
from modeltap.testing import exchange
from tests.factories import ASK, recorded
from tests.integration.conftest import ThreadedProxy
from tests.standins import server
from tests.standins.server import Dialect, StandIn
from tests.standins.wire import fastapi_route_error

OPERATOR_KEY = "sk-operator-0123456789"
SESSION_KEY = "sk-session-abcdefghij"
QUERY_KEY = "AIzaSy-query-key-0987654321"
CHAT = {"model": "m", "messages": [ASK], "max_tokens": 8}
QUOTE_HEADER = "x-quote"
THROUGH_THE_PROXY = settings(
    max_examples=60, deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow]
)
filler = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=30)


def _key_sent(request: web.Request) -> str:
    authorization = request.headers.get("Authorization", "")
    return authorization.removeprefix("Bearer ") or request.query.get("key", "")


async def _quoting(request: web.Request) -> web.StreamResponse:
    """The upstream: quotes the key it got where the test's x-quote header says."""
    quote = json.loads(base64.b64decode(request.headers[QUOTE_HEADER]))
    key, before, after = _key_sent(request), quote["before"], quote["after"]
    where = quote["where"]
    if where == "stream":
        text = f"{before}{key}{after}"
        event = json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        data = f"data: {event}\n\ndata: [DONE]\n\n".encode()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        cuts = sorted({c % (len(data) + 1) for c in quote["cuts"]})
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            if data[a:b]:
                await response.write(data[a:b])
                await asyncio.sleep(0)
        await response.write_eof()
        return response
    headers = {"WWW-Authenticate": f'Bearer error="invalid_token", key="{key}"'} if where == "header" else {}
    message = f"{before}Incorrect API key provided: {key}{after}"
    body = {"error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}}
    return web.json_response(body, status=401, headers=headers)


def _standin(handler: Any) -> StandIn:
    """An upstream answering every path with `handler`, served from its own thread."""
    dialect = Dialect(
        name="quoting",
        model_paths=frozenset({"/v1/chat/completions"}),
        route_error=fastapi_route_error,
        fault_error=lambda kind, body: (500, body),
        broken_sse=b"",
    )
    return StandIn(server.build_app(dialect, [web.route("*", "/{tail:.*}", handler)]))


def _send(port: int, path: str, headers: dict[str, str]) -> tuple[bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(
            "POST", path, body=json.dumps(CHAT), headers={"Content-Type": "application/json", **headers}
        )
        response = conn.getresponse()
        return response.read(), json.dumps(response.getheaders())
    finally:
        conn.close()


def _everything_recorded(store: Path) -> str:
    with StoreReader(store) as reader:
        rows = reader.exchanges()
        out = io.StringIO()
        for session in {r["session_id"] for r in rows if r["session_id"]}:
            for fmt in ("har", "jsonl", "messages"):
                try:
                    write_export(reader, session, fmt, out)
                except ValueError:  # a session of refusals only has no conversation to export
                    assert fmt == "messages"
    return json.dumps(rows, default=str) + out.getvalue()


def test_a_key_the_upstream_quotes_reaches_no_client_record_log_or_export(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = tmp_path / "records.db"
    sent = 0
    with _standin(_quoting) as upstream:
        config = _config(upstream.url, store)
        threaded = ThreadedProxy(config)
        with threaded as proxy:
            session = threaded.call(_open(proxy))
            assert proxy.port is not None
            port = proxy.port

            @THROUGH_THE_PROXY
            @given(
                where=st.sampled_from(["body", "header", "stream"]),
                whose=st.sampled_from(["operator", "session"]),
                before=filler,
                after=filler,
                cuts=st.lists(st.integers(0, 400), max_size=6),
            )
            def one(where: str, whose: str, before: str, after: str, cuts: list[int]) -> None:
                nonlocal sent
                path = f"/s/{session}/v1/chat/completions" if whose == "session" else "/v1/chat/completions"
                body, answered = _send(port, path, _quote(where, before, after, cuts))
                sent += 1
                for key in (OPERATOR_KEY, SESSION_KEY):
                    assert key.encode() not in body and key not in answered, (where, whose, body)

            one()
            # A client's own key in the query, passed through where modeltap has no key of its own.
            proxy.config.upstream_key = None
            body, _ = _send(port, f"/v1/chat/completions?alt=sse&key={QUERY_KEY}", _quote("body", "", "", []))
            assert QUERY_KEY.encode() not in body and b"[masked key]" in body
    recorded = _everything_recorded(store)
    assert recorded.count('"status"') >= sent
    for key in (OPERATOR_KEY, SESSION_KEY, QUERY_KEY):
        assert key not in recorded and key not in caplog.text
    assert "key=[redacted]" in recorded


def _quote(where: str, before: str, after: str, cuts: list[int]) -> dict[str, str]:
    """The x-quote header that tells the upstream where to quote the key."""
    quote = {"where": where, "before": before, "after": after, "cuts": cuts}
    return {QUOTE_HEADER: base64.b64encode(json.dumps(quote).encode()).decode()}


def _config(upstream: str, store: Path) -> ProxyConfig:
    """A loopback proxy lending the operator's key, recording in this process's writer thread."""
    return ProxyConfig(
        upstream=upstream,
        upstream_key=OPERATOR_KEY,
        host="127.0.0.1",
        port=0,
        store=str(store),
        record_writer="thread",
    )


async def _open(proxy: Any) -> str:
    return str(proxy.sessions.open(upstream_key=SESSION_KEY).token)


def test_a_query_key_is_replaced_by_the_upstream_s_and_not_sent_on_by_replay(tmp_path: Path) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no", "type": "x", "code": None}}, status=400)

    store = tmp_path / "records.db"
    with _standin(refuse) as upstream:
        config = _config(upstream.url, store)
        with ThreadedProxy(config) as proxy:
            assert proxy.port is not None
            _send(proxy.port, f"/v1/chat/completions?alt=sse&api-key={QUERY_KEY}", {})
        assert [r.path_qs for r in upstream.requests] == ["/v1/chat/completions?alt=sse"]
    with StoreReader(store) as reader:
        [row] = reader.exchanges()
    assert row["path"] == "/v1/chat/completions?alt=sse&api-key=[redacted]"
    assert QUERY_KEY not in json.dumps(row, default=str)
    assert without_session(row["path"]) == "/v1/chat/completions?alt=sse"
    assert without_session(f"/s/…/v1/models?key={QUERY_KEY}&x=1") == "/v1/models?x=1"


@pytest.mark.parametrize(
    "url", ["http://me:hunter2@gpu:8000/v1", "https://hunter2@gpu/v1", "http://a:b@[::1]:8"]
)
def test_an_upstream_with_a_password_is_refused_without_printing_it(url: str) -> None:
    with pytest.raises(ValueError) as refused:
        ProxyConfig(upstream=url)
    assert "hunter2" not in str(refused.value) and "b@" not in str(refused.value)
    with pytest.raises(ValueError) as refused:
        session_request({"upstream": url})
    assert "hunter2" not in str(refused.value)


@pytest.mark.parametrize("url", ["http://gpu:8000/v1?key=AIza-hunter2", "http://gpu:8000/v1#hunter2"])
def test_an_upstream_with_a_query_is_refused_without_printing_it(url: str) -> None:
    with pytest.raises(ValueError, match="takes no query string") as refused:
        ProxyConfig(upstream=url)
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ValueError, match="takes no query string"):
        session_request({"upstream": url})


async def test_a_key_in_a_record_from_before_is_redacted_when_read(tmp_path: Path) -> None:
    store = await recorded(
        tmp_path / "records.db",
        exchange(
            {"model": "m", "messages": [ASK]},
            session_id="s-old",
            path=f"/v1/chat/completions?key={QUERY_KEY}",
            upstream_url=f"http://gpu:8000/v1/chat/completions?key={QUERY_KEY}",
        ),
    )
    with StoreReader(store) as reader:
        [row] = reader.exchanges("s-old")
        out = io.StringIO()
        write_export(reader, "s-old", "har", out)
    assert row["path"] == "/v1/chat/completions?key=[redacted]"
    assert QUERY_KEY not in json.dumps(row, default=str) + out.getvalue()
