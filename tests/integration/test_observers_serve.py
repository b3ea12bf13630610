"""`modeltap serve --observer MODULE:ATTR`: an observer that fails is logged once per exchange and
changes nothing else (every exchange is still in the store, the other observers still see it); the
README's example observer writes one JSON line per exchange."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange
from modeltap.records.reader import StoreReader
from tests.integration.test_cli_serve import START_TIMEOUT_S, start_serve
from tests.standins.areal import ArealStandIn

REQUESTS = 3
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class Broken:
    """An observer with a bug."""

    def on_exchange(self, ex: Exchange) -> None:
        raise KeyError("a bug in an observer")


def test_a_failing_observer_is_logged_per_exchange_and_every_exchange_is_recorded(
    areal: ArealStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, jsonl = tmp_path / "records.db", tmp_path / "exchanges.jsonl"
    # start_serve passes the environment on: the example observer is found on PYTHONPATH.
    monkeypatch.setenv("MODELTAP_JSONL", str(jsonl))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))
    )
    proc, lines = start_serve(
        [
            "--upstream", areal.url,
            "--observer", "tests.integration.test_observers_serve:Broken",
            "--observer", "observer:JsonLines",
        ],
        store,
    )  # fmt: skip
    port = int(re.search(r"listening on 0\.0\.0\.0:(\d+)", "\n".join(lines)).group(1))  # type: ignore[union-attr]
    session = areal.open_session("observed")
    for i in range(REQUESTS):
        body = {"model": "policy", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 8}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.status == 200
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0, out
    failures = [line for line in out.splitlines() if "observer " in line and " failed on exchange " in line]
    assert len(failures) == REQUESTS, out
    assert all("test_observers_serve.Broken" in line and "KeyError" in line for line in failures)
    with StoreReader(store) as reader:
        assert len(reader.exchanges()) == REQUESTS
    written = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(w["endpoint"], w["status"], w["error"]) for w in written] == [("chat", 200, None)] * REQUESTS
