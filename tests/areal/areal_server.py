"""AReaL 1.0.4's real proxy rollout server as a test fixture: start, configure, drive, stop.

Owns: the proxy process (one per test session: starting it costs ~10 s of imports), its engine setup
through AReaL's own scheduler RPCs, and thin async helpers for the admin and session endpoints that the
workflow itself calls (grant_capacity, rl/start_session, rl/end_session, export_trajectories).

Does not own: the model (fake_engine.py) or modeltap (the tests start it in-process).

Every step follows docs/areal.md §10.3-§10.4: `--host 127.0.0.1` (with 0.0.0.0 the 1.0.4 wheel
binds gethostip() only), a fixed `--worker-index`, name-resolve files in a temporary folder, a
non-default admin key, `LITELLM_LOCAL_MODEL_COST_MAP` so litellm makes no outbound fetch, SIGINT to stop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from areal.api.cli_args import AgentConfig, InferenceEngineConfig
from areal.experimental.openai.proxy.server import deserialize_interactions
from areal.experimental.openai.types import InteractionWithTokenLogpReward
from areal.infra.rpc.serialization import serialize_value

from tests.areal.processes import free_loopback_port, log_tail, stop_servers, wait_healthy

HERE = Path(__file__).resolve().parent
FAKE_ENGINE_PATH = "fake_engine.FakeInferenceEngine"
ENGINE_NAME = "proxy/0"
# Measured: /health answers 7.5-8.9 s after start (docs/areal.md §10.8); allow for a loaded 2-core machine.
STARTUP_TIMEOUT_S = 120.0
# export_trajectories blocks until rl/end_session and completions are near-instant with the fake engine.
REQUEST_TIMEOUT_S = 60.0
# AReaL's own default AgentConfig.agent_cls_path (its __post_init__ refuses an empty one; the v1 proxy
# never reads it).
AGENT_CLS_PATH = "areal.experimental.openai.proxy.online_agent._OnlineAgent"


@dataclass(frozen=True)
class ArealSession:
    """One rl/start_session answer: AReaL's session id and the session key an agent is given."""

    session_id: str
    api_key: str


class ArealProxyServer:
    """A running `areal.experimental.openai.proxy.proxy_rollout_server` with the fake engine.

    server = ArealProxyServer.start(tmp_dir, tokenizer_path, admin_key="…", engine_max_tokens=32768)
    session = await server.open_session("t0")
    ...  # the agent talks to server.base_url with session.api_key
    interactions = await server.close_and_export(session)
    server.stop()
    """

    def __init__(self, process: subprocess.Popen[bytes], base_url: str, admin_key: str, log_path: Path):
        self.process = process
        self.base_url = base_url
        self.admin_key = admin_key
        self.log_path = log_path

    @classmethod
    def start(
        cls, workdir: Path, tokenizer_path: str, *, admin_key: str, engine_max_tokens: int
    ) -> ArealProxyServer:
        """Start the proxy on a free loopback port and create and initialize its engine."""
        port = free_loopback_port()
        log_path = workdir / "areal-proxy.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        command = [
            sys.executable, "-m", "areal.experimental.openai.proxy.proxy_rollout_server",
            "--host", "127.0.0.1", "--port", str(port),
            "--experiment-name", "modeltap", "--trial-name", "areal-tier",
            "--role", "proxy", "--worker-index", "0",
            "--name-resolve-type", "nfs", "--nfs-record-root", str(workdir / "name_resolve"),
        ]  # fmt: skip
        with log_path.open("wb") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        server = cls(process, f"http://127.0.0.1:{port}", admin_key, log_path)
        try:
            wait_healthy(process, server.base_url, "AReaL proxy", log_path, STARTUP_TIMEOUT_S)
            server._create_engine(tokenizer_path, engine_max_tokens)
        except BaseException:
            server.stop()
            raise
        return server

    def _create_engine(self, tokenizer_path: str, engine_max_tokens: int) -> None:
        # The same serialized dataclass that AReaL's RolloutController + LocalScheduler send.
        config = InferenceEngineConfig(
            experiment_name="modeltap",
            trial_name="areal-tier",
            tokenizer_path=tokenizer_path,
            agent=AgentConfig(
                agent_cls_path=AGENT_CLS_PATH,
                admin_api_key=self.admin_key,
                engine_max_tokens=engine_max_tokens,
                tool_call_parser="qwen25",
            ),
        )
        create = {
            "engine": FAKE_ENGINE_PATH,
            "engine_name": ENGINE_NAME,
            "init_args": [],
            "init_kwargs": serialize_value({"config": config}),
        }
        initialize = {"method": "initialize", "engine_name": ENGINE_NAME, "args": [], "kwargs": {}}
        for path, body in (("/create_engine", create), ("/call", initialize)):
            response = httpx.post(self.base_url + path, json=body, timeout=REQUEST_TIMEOUT_S)
            if response.status_code != 200:
                raise RuntimeError(
                    f"{path} -> {response.status_code} {response.text}\n{log_tail(self.log_path)}"
                )

    def stop(self) -> None:
        """SIGINT, as AReaL's scheduler does (the proxy logs "Engine destroyed successfully" and exits 0
        within a second), then kill if it hangs. Idempotent."""
        stop_servers([self.process])

    def admin_headers(self) -> dict[str, str]:
        """The Authorization header of AReaL's admin endpoints."""
        return {"Authorization": f"Bearer {self.admin_key}"}

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S) as client:
            return await client.post(path, json=body, headers=headers)

    async def open_session(self, task_id: str) -> ArealSession:
        """Grant one unit of capacity and start a session, as `OpenAIProxyWorkflow.arun_episode` does."""
        granted = await self._post("/grant_capacity", {}, self.admin_headers())
        granted.raise_for_status()
        started = await self._post("/rl/start_session", {"task_id": task_id}, self.admin_headers())
        started.raise_for_status()
        body = started.json()
        return ArealSession(session_id=body["session_id"], api_key=body["api_key"])

    async def set_last_reward(self, session: ArealSession, reward: float) -> None:
        """Put `reward` on the session's last interaction, as the workflow does with a float reward."""
        headers = {"Authorization": f"Bearer {session.api_key}"}
        response = await self._post("/rl/set_reward", {"interaction_id": None, "reward": reward}, headers)
        response.raise_for_status()

    async def close_and_export(
        self, session: ArealSession, discount: float = 1.0
    ) -> dict[str, InteractionWithTokenLogpReward]:
        """End the session and export what AReaL would train on, keyed by completion id, in order."""
        ended = await self._post("/rl/end_session", {}, {"Authorization": f"Bearer {session.api_key}"})
        ended.raise_for_status()
        body = {"session_id": session.session_id, "discount": discount, "style": "individual"}
        exported = await self._post("/export_trajectories", body, self.admin_headers())
        exported.raise_for_status()
        return deserialize_interactions(exported.json()["interactions"])
