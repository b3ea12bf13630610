"""`modeltap serve --tokenizer DIR`: counts every request without transformers in the process, and
says what to install when the budget's libraries are missing.

The process is the real `modeltap serve`; an observer (`--observer`, loaded into it) reports which
modules it holds once an exchange has been counted and recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from modeltap.records.exchange import Exchange
from tests.integration.test_cli_serve import START_TIMEOUT_S, serve_port, start_serve
from tests.standins.areal import ArealStandIn

# What transformers would bring along: any of them in the process means the budget imported it.
HEAVY_MODULES = ("transformers", "torch", "huggingface_hub")


class ModulesProbe:
    """An observer writing, for each exchange, its budget decision and the heavy modules loaded."""

    def on_exchange(self, ex: Exchange) -> None:
        loaded = sorted(name for name in HEAVY_MODULES if name in sys.modules)
        budget = dataclasses.asdict(ex.budget) if ex.budget is not None else None
        line = {"budget": budget, "heavy_modules": loaded, "budget_modules": "tiktoken" in sys.modules}
        with open(os.environ["MODELTAP_PROBE"], "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


def test_serve_counts_with_the_budget_and_no_transformers_in_the_process(
    areal: ArealStandIn, qwen_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("MODELTAP_PROBE", str(probe))
    proc, lines = start_serve(
        [
            "--upstream", areal.url,
            "--tokenizer", qwen_dir,
            "--context-length", "4096",
            "--observer", "tests.integration.test_budget_serve:ModulesProbe",
        ],
        tmp_path / "records.db",
    )  # fmt: skip
    port = serve_port(lines)
    session = areal.open_session("counted")
    messages = [{"role": "user", "content": "hello"}]
    for turn in range(3):
        body = {"model": "policy", "messages": messages, "max_tokens": 100_000}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {session.api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = json.loads(reply.read())
        messages = [*messages, answer["choices"][0]["message"], {"role": "user", "content": f"again {turn}"}]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0, out
    reports = [json.loads(line) for line in probe.read_text().splitlines()]
    assert len(reports) == 3
    assert all(r["budget"]["action"] == "clamp" and r["budget"]["prompt_tokens"] > 0 for r in reports), (
        reports
    )
    assert all(r["budget_modules"] and r["heavy_modules"] == [] for r in reports), reports


def test_serve_without_the_budget_extra_says_what_to_install(qwen_dir: str, tmp_path: Path) -> None:
    # tiktoken made unimportable, as in an install without the extra.
    script = "import sys; sys.modules['tiktoken'] = None; from modeltap.cli import main; sys.exit(main())"
    flags = ["--port", "0", "--store", str(tmp_path / "r.db"), "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run(
        [sys.executable, "-c", script, "serve", *flags, "--tokenizer", qwen_dir, "--context-length", "4096"],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pip install 'modeltap[budget]'" in done.stderr
    assert "tiktoken is not installed" in done.stderr
