"""`modeltap serve --workers 2` as a user runs it: two processes on one port, any of them serves any
session, a session closed on one is refused by the other at once, and both record to one store.

Which worker a connection reached is what `/_modeltap/health` says on it; connections are opened
until each worker has been reached (the kernel spreads them by their ports, so a few do)."""

from __future__ import annotations

import asyncio
import re
import signal
from pathlib import Path

import aiohttp

from modeltap.records.reader import StoreReader
from tests.integration.test_cli_serve import START_TIMEOUT_S, serve_port, start_serve
from tests.standins.areal import ArealStandIn

# Connections opened at most to reach both workers: a worker missed by all of them would be a bug.
CONNECT_ATTEMPTS = 200


async def _worker_of(http: aiohttp.ClientSession, base: str) -> int:
    async with http.get(f"{base}/_modeltap/health") as reply:
        index: int = (await reply.json())["worker"]
        return index


async def _one_connection_per_worker(base: str) -> dict[int, aiohttp.ClientSession]:
    """A client holding one kept-alive connection to each worker, by its index."""
    found: dict[int, aiohttp.ClientSession] = {}
    for _ in range(CONNECT_ATTEMPTS):
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
        index = await _worker_of(http, base)
        if index in found:
            await http.close()
        else:
            found[index] = http
        if len(found) == 2:
            return found
    raise AssertionError(f"{CONNECT_ATTEMPTS} connections reached only workers {sorted(found)}")


async def _chat(http: aiohttp.ClientSession, base: str, token: str, content: str) -> int:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    async with http.post(f"{base}/s/{token}/v1/chat/completions", json=body) as reply:
        await reply.read()
        return reply.status


async def _drive(base: str, admin_key: str, upstream_key: str) -> None:
    workers = await _one_connection_per_worker(base)
    admin = {"Authorization": f"Bearer {admin_key}"}
    try:
        # Opened through worker 1, used through worker 0 (and 1) straight away.
        opening = {"upstream_key": upstream_key, "labels": {"task_id": "w"}}
        async with workers[1].post(f"{base}/_modeltap/sessions", json=opening, headers=admin) as reply:
            assert reply.status == 201
            session = await reply.json()
        for index, http in sorted(workers.items()):
            assert await _worker_of(http, base) == index  # still the same connection
            assert await _chat(http, base, session["token"], f"via worker {index}") == 200
        # Closed through worker 0: worker 1 refuses the token at once.
        async with workers[0].delete(f"{base}/_modeltap/sessions/{session['id']}", headers=admin) as reply:
            assert reply.status == 204
        assert await _chat(workers[1], base, session["token"], "after the close") == 401
        async with workers[1].get(f"{base}/_modeltap/sessions", headers=admin) as reply:
            assert (await reply.json())["sessions"] == []
    finally:
        for http in workers.values():
            await http.close()


def test_two_workers_share_the_port_the_sessions_and_the_store(areal: ArealStandIn, tmp_path: Path) -> None:
    store = tmp_path / "records.db"
    serve, lines = start_serve(["--upstream", areal.url, "--quiet", "--workers", "2"], store)
    report = "\n".join(lines)
    port = serve_port(lines)
    assert f"workers   2 processes serve port {port}" in report
    admin_key = re.search(r"with Authorization: Bearer (\S+)", report)
    assert admin_key is not None
    try:
        asyncio.run(_drive(f"http://127.0.0.1:{port}", admin_key.group(1), areal.open_session("w").api_key))
    finally:
        serve.send_signal(signal.SIGTERM)
        out, _ = serve.communicate(timeout=START_TIMEOUT_S * 3)
    assert serve.returncode == 0, out
    with StoreReader(store) as reader:
        [session] = reader.sessions()
        rows = reader.exchanges(session["id"])
    assert session["labels"] == {"task_id": "w"} and session["closed"] is not None
    assert sorted(row["request"]["messages"][-1]["content"] for row in rows if row["status"] == 200) == [
        "via worker 0",
        "via worker 1",
    ]
