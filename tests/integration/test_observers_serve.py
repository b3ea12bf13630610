"""`modeltap serve --observer MODULE:ATTR`: an observer that fails is logged once per exchange and
changes nothing else (every exchange is still in the store, the other observers still see it); the
README's example observer writes one JSON line per exchange."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange
from modeltap.records.reader import StoreReader
from tests.integration.test_cli_serve import START_TIMEOUT_S, post_chat, serve_port, start_serve
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
    port, session = serve_port(lines), areal.open_session("observed")
    for i in range(REQUESTS):
        post_chat(port, session.api_key, f"hi {i}")
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
