"""The adapter end to end in Docker: opencode in a container, its model traffic through
modeltap's proxy on the bridge to the AReaL stand-in, driven the way AReaL drives an inline agent."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.models.containers import Container

from modeltap.adapter import AgentWorkflow, RunFailed, shutdown, task_rows
from modeltap.adapter import workflow as workflow_module
from modeltap.adapter.docker_sandbox import LABEL_RUN
from modeltap.adapter.loop import background
from modeltap.records.reader import StoreReader
from tests.adapter_harness import blocking_calls_probe, cancel_at_every_await, run_samples
from tests.docker.conftest import ROOT
from tests.docker.test_docker_sandbox import until
from tests.standins.areal import ArealStandIn

EXAMPLE = ROOT / "examples" / "bundle.toml"
WORKFLOW = "modeltap.adapter.AgentWorkflow"
CRASHING_TASK = """
[agents.broken]
image = "modeltap-hostroot:local"
command = ["bash", "-c", "echo the agent crashed >&2; exit 3"]
mounts = {usr = {source = "/usr", target = "/usr"}}

[[tasks]]
id = "crash"
prompt = "anything"
solver = "broken"
checks = [{exact = "x"}]
"""


@pytest.fixture
def bundle(tmp_path: Path, node_modules: Path, hostroot_image: str) -> Path:
    """examples/bundle.toml, with its npm mount made absolute, plus a task whose agent crashes."""
    text = EXAMPLE.read_text().replace('"../.cache/npm/node_modules"', f'"{node_modules}"')
    text = text.replace('"../.venv-mini/', f'"{ROOT}/.venv-mini/')
    path = tmp_path / "bundle.toml"
    path.write_text(text + CRASHING_TASK)
    return path


@pytest.fixture
def kwargs(bundle: Path, tmp_path: Path, bridge_host: str) -> dict[str, Any]:
    """workflow_kwargs: Docker sandboxes and a proxy listening on the bridge gateway only."""
    return {
        "bundle": str(bundle),
        "runner": "docker",
        "proxy": {"host": bridge_host, "store": str(tmp_path / "r.db")},
        "on_failure": "raise",
    }


async def test_opencode_in_docker_scores_one_zero_and_a_crash_is_rejected_on_its_own(
    areal: ArealStandIn,
    bundle: Path,
    kwargs: dict[str, Any],
    tmp_path: Path,
    own_containers: Callable[[], list[Container]],
) -> None:
    rows = {row["task_id"]: row for row in task_rows(bundle)}
    smoke = rows["shell-smoke"]
    batch = [smoke, smoke, rows["mul-7-8"], rows["crash"]]  # the smoke group shares one data object
    before = copy.deepcopy(batch)
    with blocking_calls_probe() as blocking:
        samples = await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs, batch)

    outcomes = [(sample.reward, sample.rejected) for sample in samples]
    assert outcomes == [(1.0, False), (1.0, False), (0.0, False), (None, True)], [s.error for s in samples]
    assert isinstance(samples[3].error, RunFailed) and "the agent crashed" in str(samples[3].error)
    assert batch == before
    assert blocking == []  # no docker call, subprocess or sleep ever ran on the caller's loop
    # opencode made its title request and two turns per smoke run, all through the proxy to AReaL,
    # which recorded them under the sample's session and put the float reward on the last one.
    for sample in samples[:2]:
        assert len(sample.interactions) == 3
        assert list(sample.interactions.values())[-1]["reward"] == 1.0
    with StoreReader(tmp_path / "r.db") as reader:
        exchanges = reader.exchanges(bodies=False)
    # Every request AReaL got is recorded, once. opencode sends its title request beside the task and
    # may drop it when the task ends first (under load, the product task's one turn can win the race).
    assert len(exchanges) == len(areal.model_requests)
    per_session = sorted(Counter(row["session_id"] for row in exchanges).values())
    assert per_session[1:] == [3, 3] and per_session[0] in (1, 2), per_session
    assert {row["labels"]["agent"] for row in exchanges} == {"opencode"}
    assert {row["upstream_url"] for row in exchanges} == {f"{areal.url}/chat/completions"}
    assert all(row["status"] == 200 and row["streamed"] for row in exchanges)
    assert len({row["session_id"] for row in exchanges}) == 3
    assert own_containers() == []


async def test_cancelling_a_run_leaves_no_container_with_its_label(
    areal: ArealStandIn,
    kwargs: dict[str, Any],
    docker_client: docker.DockerClient,
    own_containers: Callable[[], list[Container]],
) -> None:
    workflow = AgentWorkflow(**kwargs)
    session = areal.open_session("shell-smoke")
    call = workflow.run({"task_id": "shell-smoke"}, base_url=areal.url, api_key=session.api_key)
    run = asyncio.ensure_future(call)

    await until(lambda: bool(own_containers()))
    (container,) = own_containers()
    run_label = container.labels[LABEL_RUN]
    await asyncio.sleep(1.0)  # opencode is starting up inside the container
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # At the moment run() re-raised: no container with the run's label, running or not.
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_label}"}) == []


SWEPT_TASK = """
timeout_s = 600
[agents.lingering]
image = "modeltap-hostroot:local"
command = ["bash", "-c", "sleep 600 & echo 5 > answer.txt"]
answer = {file = "answer.txt"}
mounts = {usr = {source = "/usr", target = "/usr"}}

[[tasks]]
id = "swept"
prompt = "anything"
solver = "lingering"
checks = [{exact = "5"}, {command = 'test "$MODELTAP_ANSWER" = 5'}]
"""


async def test_cancelling_a_docker_run_at_any_await_returns_and_leaves_nothing(
    areal: ArealStandIn,
    tmp_path: Path,
    bridge_host: str,
    hostroot_image: str,
    own_containers: Callable[[], list[Container]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bundle = tmp_path / "swept.toml"
    bundle.write_text(SWEPT_TASK)
    workflow = AgentWorkflow(
        bundle, runner="docker", proxy={"host": bridge_host, "store": str(tmp_path / "r.db")}
    )

    def play() -> Awaitable[float]:
        session = areal.open_session("swept")
        return workflow.run({"task_id": "swept"}, base_url=areal.url, api_key=session.api_key)

    async def nothing_left(k: int) -> None:
        left = await asyncio.to_thread(own_containers)
        assert left == [], f"cut at await {k}: containers left: {[c.labels for c in left]}"
        tap = await background().run(workflow_module._tap(workflow.proxy_config), "proxy")
        assert len(tap.proxy.sessions) == 0, f"cut at await {k}: a proxy session is left open"
        await asyncio.to_thread(shutdown)  # the next cut starts from a fresh process state

    cuts = await cancel_at_every_await(play, nothing_left, monkeypatch)
    assert cuts >= 8  # preparing, the proxy, the container, each command and read, its removal


async def test_agent_override_plays_claude_code_through_the_anthropic_route(
    areal: ArealStandIn, kwargs: dict[str, Any], tmp_path: Path
) -> None:
    rows = [{"task_id": "shell-smoke"}, {"task_id": "add-2-3"}]
    samples = await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs | {"agent": "claude"}, rows)
    assert [s.reward for s in samples] == [1.0, 1.0], [s.error for s in samples]
    assert {i["endpoint"] for s in samples for i in s.interactions.values()} == {"messages"}
    with StoreReader(tmp_path / "r.db") as reader:
        exchanges = reader.exchanges(bodies=False)
    # Claude Code appends /v1/messages?beta=true to the session URL; AReaL serves it at /v1/messages.
    assert {(row["endpoint"], row["labels"]["agent"]) for row in exchanges} == {("messages", "claude")}
    assert {row["upstream_url"] for row in exchanges} == {f"{areal.url}/v1/messages?beta=true"}


@pytest.mark.parametrize(("agent", "endpoint"), [("codex", "responses"), ("qwen", "chat"), ("mini", "chat")])
async def test_agent_override_plays_each_agent_in_docker(
    areal: ArealStandIn, kwargs: dict[str, Any], tmp_path: Path, agent: str, endpoint: str
) -> None:
    rows = [{"task_id": "shell-smoke"}]
    samples = await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs | {"agent": agent}, rows)
    assert [s.reward for s in samples] == [1.0], [s.error for s in samples]
    with StoreReader(tmp_path / "r.db") as reader:
        exchanges = reader.exchanges(bodies=False)
    assert {(row["endpoint"], row["labels"]["agent"], row["status"]) for row in exchanges} == {
        (endpoint, agent, 200)
    }
    assert len(exchanges) == 2
    # AReaL 1.0's /responses answers JSON; Codex got the stream modeltap wrote from it.
    assert {row["synthesised"] for row in exchanges} == {agent == "codex"}


async def test_the_example_bundle_prepares_as_it_ships(hostroot_image: str, node_modules: Path) -> None:
    workflow = AgentWorkflow(EXAMPLE, runner="docker")
    prepared = await workflow.prepare()
    assert {"shell-smoke", "add-2-3", "write-sum"} <= prepared.task_ids
    assert [row["task_id"] for row in task_rows(EXAMPLE)][:2] == ["shell-smoke", "add-2-3"]
