"""`modeltap serve` as a user runs it: it prints where to point agents, and SIGTERM / Ctrl-C stop it with
every record flushed."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.standins.areal import ArealStandIn

START_TIMEOUT_S = 20.0
REQUESTS = 20


def serve_port(lines: list[str]) -> int:
    """The port a `serve` started by `start_serve` listens on, from its start-up report."""
    found = re.search(r"listening on 0\.0\.0\.0:(\d+)", "\n".join(lines))
    assert found is not None, lines
    return int(found.group(1))


def post_chat(port: int, key: str, content: str) -> None:
    """One chat request to that `serve` with a session's key, answered 200."""
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


def start_serve(
    args: list[str], store: Path, timeout_s: float = START_TIMEOUT_S
) -> tuple[subprocess.Popen[str], list[str]]:
    """Start `modeltap serve` and read its start-up report (up to the container URLs) within `timeout_s`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "modeltap", "serve", "--port", "0", "--store", str(store), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        if "Anthropic-style" in line and any("a Docker container" in seen for seen in lines):
            return proc, lines
    proc.kill()
    pytest.fail("modeltap serve did not print its start-up report:\n" + "\n".join(lines))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_prints_its_urls_and_flushes_every_record_on_a_signal(
    areal: ArealStandIn, tmp_path: Path, sig: signal.Signals
) -> None:
    store = tmp_path / "records.db"
    proc, lines = start_serve(["--upstream", areal.url, "--model", "policy"], store)
    report = "\n".join(lines)
    assert "layout    auto" in report and f"upstream  {areal.url}" in report
    port = serve_port(lines)
    assert f"http://127.0.0.1:{port}/v1" in report and f"http://172.17.0.1:{port}/v1" in report
    session = areal.open_session("cli")
    for i in range(REQUESTS):
        body = {"model": "policy", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0, out
    assert "flushing records" in out
    with StoreReader(store) as reader:
        assert len(reader.exchanges()) == REQUESTS


def test_serve_with_a_key_on_a_network_listener_prints_a_session_url(
    areal: ArealStandIn, tmp_path: Path
) -> None:
    proc, lines = start_serve(["--upstream", areal.url, "--upstream-key", "sk-secret"], tmp_path / "r.db")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=START_TIMEOUT_S)
    report = "\n".join(lines)
    assert "lent only through this session's URLs" in report
    assert re.search(r"http://127\.0\.0\.1:\d+/s/[A-Za-z0-9_-]{43}/v1", report)
    assert "sk-secret" not in report


async def test_health_answers_without_a_key_and_tells_nothing_of_sessions(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        proxy.sessions.open(labels={"task_id": "secret-task"})
        async with (
            aiohttp.ClientSession() as http,
            http.get(proxy.host_base_url + "/_modeltap/health") as reply,
        ):
            health = await reply.json()
    assert health == {
        "status": "ok",
        "worker": 0,
        "records_written": 0,
        "record_failures": 0,
        "observer_failures": 0,
    }


@pytest.mark.parametrize("quiet", [False, True])
def test_serve_prints_a_line_per_exchange_unless_quiet(
    areal: ArealStandIn, tmp_path: Path, quiet: bool
) -> None:
    store = tmp_path / "records.db"
    proc, lines = start_serve(["--upstream", areal.url, *(["--quiet"] if quiet else [])], store)
    report = "\n".join(lines)
    assert f"records   {store.resolve()}" in report and f"modeltap tail --store {store.resolve()}" in report
    post_chat(serve_port(lines), areal.open_session("lines").api_key, "hi")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    exchange_lines = [
        line for line in out.splitlines() if re.search(r"\d\d:\d\d:\d\d  \S+ #1  chat  200", line)
    ]
    assert len(exchange_lines) == (0 if quiet else 1), out


def test_serve_says_in_one_line_what_stops_it_from_starting(areal: ArealStandIn, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_serve(["--upstream", areal.url, "--port", str(port), "--store", str(tmp_path / "r.db")])
    unwritable = run_serve(["--upstream", areal.url, "--port", "0", "--store", "/proc/modeltap/r.db"])
    bad_url = run_serve(["--upstream", "localhost:8000", "--store", str(tmp_path / "r.db")])
    for result, words in [
        (busy, f"port {port} is in use: give another with --port N"),
        (unwritable, "cannot open the record store /proc/modeltap/r.db"),
        (bad_url, "upstream must be an http(s) URL"),
    ]:
        assert result.returncode == 2, result.stderr
        assert words in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def run_serve(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modeltap", "serve", *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
