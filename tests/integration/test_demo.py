"""`modeltap demo`, the README's first command, as a new user runs it: a subprocess on its own store,
with the openai SDK and the real opencode the test tier installs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modeltap.records.reader import StoreReader

DEMO_RUN_S = 240


def test_the_demo_plays_an_sdk_and_an_opencode_session_and_records_both(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"
    run = subprocess.run(
        [sys.executable, "-m", "modeltap", "demo", "--store", str(store)],
        capture_output=True, text=True, timeout=DEMO_RUN_S, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "turn 1: the model calls bash" in out
    assert "turn 2 (streamed): the model answers" in out
    assert "(exit 0)" in out, "opencode did not finish cleanly through modeltap"
    assert f"modeltap sessions --store {store}" in out
    with StoreReader(str(store)) as reader:
        sessions = {s["labels"].get("agent"): s for s in reader.sessions()}
        assert set(sessions) >= {"openai-sdk", "opencode"}
        assert sessions["opencode"]["exchanges"] >= 1
        sdk = reader.exchanges(sessions["openai-sdk"]["id"])
    # models, a tool call, a streamed answer: the /v1 paths all reached the bare-path model (token masked).
    chat = "/s/…/v1/chat/completions"
    assert [e["path"] for e in sdk] == ["/s/…/v1/models", chat, chat]
    assert [e["status"] for e in sdk] == [200, 200, 200]
    assert sdk[-1]["streamed"] and sdk[-1]["response"]["choices"][0]["message"]["content"]
