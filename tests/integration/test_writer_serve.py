"""`modeltap serve` with its record writer process, as a user runs it: SIGTERM in the middle of a load
loses no exchange that was answered, and a writer killed while serve serves is restarted with nothing
lost. Behaviour only: what was answered is compared with what was recorded."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import aiohttp

from modeltap.records.reader import StoreReader
from tests.integration.test_cli_serve import START_TIMEOUT_S, post_chat, serve_port, start_serve
from tests.standins.areal import ArealStandIn

# Requests in flight when serve is told to stop, and how many are answered first.
IN_FLIGHT = 32
TOTAL = 400
BEFORE_SIGTERM = 100


def writer_pid(serve: subprocess.Popen[str]) -> int:
    """The record writer: the one child process of serve."""
    children = [
        int(child)
        for task in Path(f"/proc/{serve.pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    assert len(children) == 1, children
    return children[0]


async def _load(port: int, key: str, serve: subprocess.Popen[str]) -> set[str]:
    """TOTAL requests, IN_FLIGHT at a time; SIGTERM to serve once BEFORE_SIGTERM are answered. Returns
    the contents of the requests answered 200 in full."""
    answered: set[str] = set()
    todo = iter(range(TOTAL))

    async def worker(http: aiohttp.ClientSession) -> None:
        for i in todo:
            content = f"request {i}"
            body = {"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
            try:
                async with http.post(
                    f"http://127.0.0.1:{port}/chat/completions",
                    data=json.dumps(body),
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                ) as reply:
                    await reply.read()
                    if reply.status == 200:
                        answered.add(content)
            except aiohttp.ClientError:
                return  # serve has stopped listening
            if len(answered) == BEFORE_SIGTERM:
                serve.send_signal(signal.SIGTERM)

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await asyncio.gather(*(worker(http) for _ in range(IN_FLIGHT)))
    return answered


def recorded_contents(store: Path) -> list[str]:
    with StoreReader(store) as reader:
        return [row["request"]["messages"][-1]["content"] for row in reader.exchanges()]


def test_sigterm_during_a_load_loses_no_answered_exchange(areal: ArealStandIn, tmp_path: Path) -> None:
    store = tmp_path / "records.db"
    serve, lines = start_serve(["--upstream", areal.url, "--quiet"], store)
    answered = asyncio.run(_load(serve_port(lines), areal.open_session("load").api_key, serve))
    out, _ = serve.communicate(timeout=START_TIMEOUT_S * 3)
    assert serve.returncode == 0, out
    recorded = recorded_contents(store)
    assert len(answered) >= BEFORE_SIGTERM and answered <= set(recorded), out
    assert len(recorded) == len(set(recorded))  # each once


def test_a_writer_killed_while_serving_is_restarted_and_nothing_is_lost(
    areal: ArealStandIn, tmp_path: Path
) -> None:
    store = tmp_path / "records.db"
    serve, lines = start_serve(["--upstream", areal.url, "--quiet"], store)
    port, key = serve_port(lines), areal.open_session("kill").api_key
    for i in range(10):
        post_chat(port, key, f"before {i}")
    killed = writer_pid(serve)
    os.kill(killed, signal.SIGKILL)
    for i in range(10):
        post_chat(port, key, f"after {i}")  # served while the writer restarts
    serve.send_signal(signal.SIGTERM)
    out, _ = serve.communicate(timeout=START_TIMEOUT_S * 3)
    assert serve.returncode == 0, out
    assert f"the record writer (pid {killed}) died with signal 9; restarting it" in out
    assert sorted(recorded_contents(store)) == sorted(
        [f"before {i}" for i in range(10)] + [f"after {i}" for i in range(10)]
    )
