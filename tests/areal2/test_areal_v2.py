"""modeltap.adapter.AgentWorkflow with its defaults under `rollout._version: v2`: AReaL's v2 controller
resolves it from its import path and wraps it in its own InferenceServiceWorkflow, which starts a group
of sessions at the real v2 gateway, runs the agent once per session with the gateway's address, sets each
reward and exports the group through the gateway, router and data proxy (areal/v2/inference_service/
controller/{controller,workflow}.py). The gateway serves chat only: opencode's chat reaches it as it is,
Claude Code's Messages and Codex's Responses translated through chat.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from areal.infra import workflow_context
from v2_services import V2Service

from modeltap.adapter import shutdown, task_rows
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_BUNDLE = REPO_ROOT / "examples" / "bundle.toml"
WORKFLOW = "modeltap.adapter.AgentWorkflow"
GROUP_SIZE = 2
# opencode, Claude Code and Codex each take 3-30 s a run on this machine kind (tests/agents.py).
EPISODE_TIMEOUT_S = 300.0
# What each solver speaks, and how many model calls it makes on the shell task (docs/agents.md §3-§6):
# opencode asks for a title too.
SOLVERS = {"opencode": ("chat", 3), "claude": ("messages", 2), "codex": ("responses", 2)}


@pytest.fixture(autouse=True)
def adapter_stopped_after_each_test() -> Any:
    yield
    shutdown()


@pytest.mark.parametrize("agent", sorted(SOLVERS))
def test_each_solver_trains_a_group_through_the_v2_gateway_with_the_workflows_defaults(
    controller: Any, store: Path, agent: str
) -> None:
    endpoint, calls = SOLVERS[agent]
    workflow = controller._resolve_workflow(
        WORKFLOW,
        {"bundle": str(EXAMPLE_BUNDLE), "agent": agent, "runner": "local", "proxy": {"store": str(store)}},
        group_size=GROUP_SIZE,
    )
    (row,) = task_rows(EXAMPLE_BUNDLE, ["shell-smoke"], agent=agent)

    async def episode() -> Any:
        workflow_context.set(workflow_context.WorkflowContext(task_id=7))
        return await asyncio.wait_for(workflow.arun_episode(None, row), EPISODE_TIMEOUT_S)

    trajectory = asyncio.run(episode())
    assert trajectory is not None, "AReaL abandoned the group"
    shutdown()  # flushes the records
    with StoreReader(store) as reader:
        records = reader.exchanges(bodies=False)
        sessions = reader.sessions()
    assert len(sessions) == GROUP_SIZE and {s["reward"] for s in sessions} == {1.0}
    assert [r["status"] for r in records] == [200] * len(records)
    assert {r["endpoint"] for r in records} == {endpoint}
    assert {r["translated"] for r in records} == ({None} if endpoint == "chat" else {"chat"})
    assert len(records) >= GROUP_SIZE * calls
    # every modeltap exchange is an interaction AReaL trains on, with the reward on each sample's last
    rewards = trajectory["rewards"].to_local().tolist()  # an RTensor: the v2 export's shape
    assert len(rewards) == len(records) and rewards.count(1.0) == GROUP_SIZE


def test_a_crashing_solver_costs_its_group_and_the_v2_workflow_rejects_it(
    controller: Any, store: Path, tmp_path: Path
) -> None:
    """AReaL's v2 workflow catches the run's exception, sets reward 0 and abandons the whole group."""
    bundle = tmp_path / "crash.toml"
    bundle.write_text(
        '[agents.crasher]\ncommand = ["sh", "-c", "exit 3"]\n\n'
        '[[tasks]]\nid = "crashes"\nprompt = "Anything."\nsolver = "crasher"\nchecks = [{ exact = "42" }]\n'
    )
    workflow = controller._resolve_workflow(
        WORKFLOW, {"bundle": str(bundle), "runner": "local", "proxy": {"store": str(store)}}, group_size=2
    )

    async def episode() -> Any:
        workflow_context.set(workflow_context.WorkflowContext(task_id=8))
        return await asyncio.wait_for(workflow.arun_episode(None, task_rows(bundle)[0]), EPISODE_TIMEOUT_S)

    assert asyncio.run(episode()) is None


async def test_behind_modeltap_the_gateways_models_answer_a_session_key(
    v2_service: V2Service, tmp_path: Path
) -> None:
    """The v2 gateway keeps /v1/models for its admin key; modeltap (layout auto, which finds the gateway
    by its /health) answers it, and sends chat on."""
    admin = {"Authorization": f"Bearer {v2_service.admin_key}"}
    async with httpx.AsyncClient(base_url=v2_service.gateway_url, timeout=30) as http:
        started = await http.post(
            "/rl/start_session", json={"task_id": "models", "group_size": 1}, headers=admin
        )
        started.raise_for_status()
        key = started.json()["sessions"][0]["session_api_key"]
        direct = await http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert direct.status_code == 403
    config = ProxyConfig(host="127.0.0.1", port=0, store=str(tmp_path / "r.db"), model="policy")
    async with Proxy(config) as proxy:
        session = proxy.sessions.open(upstream=v2_service.gateway_url, upstream_key=key)
        client = openai.AsyncOpenAI(
            base_url=session.host_base_url + "/v1", api_key=session.token, max_retries=0
        )
        models = await client.models.list()
        reply = await client.responses.create(model="policy", input="What is six times seven?")
        await client.close()
    assert [m.id for m in models.data] == ["policy"]
    assert reply.status == "completed" and reply.output_text.startswith("Echo: ")
