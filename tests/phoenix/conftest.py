"""The Phoenix tier: a real Arize Phoenix, started once per run from .venv-phoenix (scripts/phoenix.sh,
installed by `make phoenix-venv`), offline on loopback with its own temporary working directory; and
`modeltap serve --otlp-endpoint` in front of the AReaL stand-in, sending it spans. A missing Phoenix
venv fails the tier with the command that installs it; nothing is skipped."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_serve import START_TIMEOUT_S, start_serve
from tests.standins.areal import ArealStandIn

REPO = Path(__file__).resolve().parents[2]
PHOENIX_SH = REPO / "scripts" / "phoenix.sh"
PHOENIX_VENV = Path(os.environ.get("PHOENIX_VENV", REPO / ".venv-phoenix"))
READER = Path(__file__).with_name("read_phoenix.py")
# Phoenix takes 9-22 s to start here (docs/otel.md §4); the script waits up to 120 s for /healthz.
PHOENIX_START_S = 180.0
ADMIN_KEY = "phoenix-tier-admin-key"


class Phoenix:
    """Phoenix at `url`, and a reader of its projects in Phoenix's venv (read_phoenix.py)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._ready = False
        self._reader = subprocess.Popen(
            [str(PHOENIX_VENV / "bin" / "python"), str(READER), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def read(self, project: str, spans: int) -> dict[str, Any]:
        """The project's spans (at least `spans` of them, once Phoenix has them) and its sessions, read
        with Phoenix's own client."""
        assert self._reader.stdin is not None and self._reader.stdout is not None
        if not self._ready:
            assert json.loads(self._reader.stdout.readline()) == {"ready": True}, "the reader did not start"
            self._ready = True
        self._reader.stdin.write(f"{project} {spans}\n")
        self._reader.stdin.flush()
        result: dict[str, Any] = json.loads(self._reader.stdout.readline())
        return result

    def close(self) -> None:
        self._reader.kill()
        self._reader.wait()


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not (PHOENIX_VENV / "bin" / "phoenix").exists():
        pytest.fail(f"no Phoenix in {PHOENIX_VENV}: run `make phoenix-venv` (scripts/phoenix.sh install)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tmp_path_factory.mktemp("phoenix")
    # The reader imports Phoenix's client while Phoenix starts.
    phoenix = Phoenix(f"http://127.0.0.1:{port}")
    started = subprocess.run(
        [str(PHOENIX_SH), "start", str(workdir), str(port)],
        capture_output=True,
        text=True,
        timeout=PHOENIX_START_S,
        env=os.environ | {"PHOENIX_VENV": str(PHOENIX_VENV)},
    )
    try:
        if started.returncode != 0:
            pytest.fail(f"Phoenix did not start: {started.stderr}")
        yield phoenix
    finally:
        phoenix.close()
        if started.returncode == 0:
            subprocess.run([str(PHOENIX_SH), "stop", started.stdout.strip()], timeout=60)


@dataclass
class Serving:
    """`modeltap serve` running: its port and its sessions' base URLs."""

    port: int
    project: str
    store: Path

    def open_session(self, areal: ArealStandIn, labels: dict[str, str]) -> dict[str, Any]:
        """A session through the admin API, over an AReaL session of its own: its id and `base_url`."""
        body = {"upstream_key": areal.open_session(labels.get("task_id", "task")).api_key, "labels": labels}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/_modeltap/sessions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as reply:
            session: dict[str, Any] = json.load(reply)
        return session


@contextmanager
def serving(
    areal: ArealStandIn,
    phoenix: Phoenix,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    content: bool = False,
) -> Iterator[Serving]:
    """`modeltap serve --otlp-endpoint PHOENIX [--otlp-content]` into a project of its own (the
    x-project-name header Phoenix routes by, set the OpenTelemetry way); stopped with SIGTERM, which
    flushes the spans."""
    project = f"modeltap-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-project-name={project}")
    store = tmp_path / "records.db"
    args = ["--upstream", areal.url, "--admin-key", ADMIN_KEY, "--otlp-endpoint", phoenix.url]
    proc, lines = start_serve([*args, "--otlp-content"] if content else args, store)
    report = "\n".join(lines)
    shown = "with" if content else "without"
    assert f"spans     {phoenix.url}/v1/traces ({shown} prompts and replies)" in report, report
    port = int(re.search(r"listening on 0\.0\.0\.0:(\d+)", report).group(1))  # type: ignore[union-attr]
    try:
        yield Serving(port, project, store)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0 and "otlp:" not in out, out  # nothing lost
