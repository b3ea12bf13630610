"""Headers in the records (schema step 7): a request's headers as the client sent them and those of
the answer it got, each credential redacted (Authorization keeps its scheme) and session tokens masked,
shown by `show --full` and carried by the HAR export; a store of schema 6 gains the columns on its
first write, its old exchanges read with no headers."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from modeltap.exporters.export import write_export
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.readers.show import turn_text
from modeltap.records.reader import StoreReader
from modeltap.records.schema import SCHEMA_VERSION, connect, migrate
from modeltap.records.store import RecordStore
from modeltap.records.turns import turns
from modeltap.testing import exchange
from tests.factories import ASK
from tests.integration.test_key_masking import _standin

CLIENT_KEY = "sk-client-0123456789"
COOKIE = "session=cookie-secret-42"
CHAT = {"model": "m", "messages": [ASK], "max_tokens": 8}


async def _answer(request: web.Request) -> web.Response:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]
    }
    return web.json_response(
        body, headers={"Set-Cookie": "upstream=set-cookie-secret", "x-request-id": "r-7"}
    )


async def test_headers_are_recorded_redacted_shown_in_full_and_exported(store_path: Path) -> None:
    with _standin(_answer) as upstream:
        config = ProxyConfig(
            upstream=upstream.url, host="127.0.0.1", port=0, store=str(store_path), sync=True
        )
        async with Proxy(config) as proxy, aiohttp.ClientSession() as http:
            session = proxy.sessions.open(labels={"t": "1"})
            headers = {
                "Authorization": f"Bearer {session.token}",
                "x-api-key": CLIENT_KEY,
                "Cookie": COOKIE,
                "X-Note": f"token {session.token} in a header",
                "User-Agent": "opencode/1.0",
            }
            url = proxy.host_base_url + "/v1/chat/completions"
            async with http.post(url, json=CHAT, headers=headers) as reply:
                assert reply.status == 200
    with StoreReader(store_path) as reader:
        [row] = reader.exchanges()
        har = io.StringIO()
        write_export(reader, row["session_id"], "har", har)
    sent = dict(row["request_headers"])
    assert sent["Authorization"] == "Bearer [redacted]" and sent["x-api-key"] == "[redacted]"
    assert sent["Cookie"] == "[redacted]" and sent["User-Agent"] == "opencode/1.0"
    assert sent["X-Note"] == "token … in a header"
    got = CIMultiDict(row["response_headers"])
    assert got["x-request-id"] == "r-7" and got["Set-Cookie"] == "[redacted]"
    assert got["Content-Type"].startswith("application/json")
    [turn] = turns([row], full=True)
    shown = turn_text(turn)
    assert "── request headers\n" in shown and "User-Agent: opencode/1.0" in shown
    assert "── response headers\n" in shown and "X-Request-ID: r-7" in shown
    entry = json.loads(har.getvalue())["log"]["entries"][0]
    assert {"name": "X-Note", "value": "token … in a header"} in entry["request"]["headers"]
    assert {"name": "X-Request-ID", "value": "r-7"} in entry["response"]["headers"]
    everything = json.dumps(row, default=str) + shown + har.getvalue()
    for secret in (session.token, CLIENT_KEY, "cookie-secret-42", "set-cookie-secret"):
        assert secret not in everything


async def test_a_store_of_schema_6_gains_the_header_columns(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    conn = connect(path)
    try:
        migrate(conn)
        conn.execute("ALTER TABLE exchanges DROP COLUMN request_headers")
        conn.execute("ALTER TABLE exchanges DROP COLUMN response_headers")
        conn.execute("PRAGMA user_version = 6")
    finally:
        conn.close()
    store = RecordStore(path)
    store.start()
    await store.submit(exchange(CHAT, session_id="s-1", request_headers=(("User-Agent", "sdk/2"),)))
    await store.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
    with StoreReader(path) as reader:
        [row] = reader.exchanges("s-1")
    assert row["request_headers"] == [("User-Agent", "sdk/2")] and row["response_headers"] == []
