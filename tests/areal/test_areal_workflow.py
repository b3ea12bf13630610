"""modeltap.adapter.AgentWorkflow inside AReaL 1.0.4's real rollout machinery, on CPU.

The workflow goes through the path an AReaL rollout worker takes: `RemoteSGLangEngine.submit` with the
import-path string and `workflow_kwargs` (as in the experiment config) -> `RemoteInfEngine
._resolve_workflow`, which instantiates AgentWorkflow and wraps it in `OpenAIProxyWorkflow(mode="inline")`
-> `WorkflowExecutor` and its task runner -> `arun_episode` against AReaL's real proxy server
(docs/areal.md §3). The engine's only server is AReaL's proxy itself: inline
agent workflows generate through the proxy, so the engine needs nothing from its server but a healthy
`GET /health` at initialize.

The example bundle (examples/bundle.toml, opencode) plays the successful runs; a bundle written here
holds the runs that crash and hang.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from areal.api.cli_args import AgentConfig, InferenceEngineConfig
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal_server import AGENT_CLS_PATH, ArealProxyServer

from modeltap.adapter import shutdown, task_rows
from modeltap.adapter.docker_sandbox import LABEL_RUN
from modeltap.proxy.network import bridge_gateway
from modeltap.records.reader import StoreReader
from tests.docker.hostroot import ensure_image

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_BUNDLE = REPO_ROOT / "examples" / "bundle.toml"
WORKFLOW = "modeltap.adapter.AgentWorkflow"
# AReaL's rollout.agent.turn_discount: each earlier turn gets the next one's reward times this.
TURN_DISCOUNT = 0.5
# opencode's title request, its bash turn and its answer turn (docs/agents.md §3.5).
OPENCODE_MODEL_CALLS = 3
# One opencode run takes 3-20 s on this machine kind (tests/agents.py); a container adds a second or two.
EPISODE_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.2
# Runs that fail or are cancelled, and the sandbox that must go with them.
FAILING_BUNDLE = """
[agents.crasher]
command = ["sh", "-c", "exit 3"]

[agents.sleeper]
# Leaves its pid in the sandbox, so the test can see the run is under way and later that it is gone.
command = ["sh", "-c", "echo $$ > sleeper.pid; exec sleep 600"]

[[tasks]]
id = "solver-crashes"
prompt = "Anything."
solver = "crasher"
checks = [{ exact = "42" }]

[[tasks]]
id = "solver-hangs"
prompt = "Anything."
solver = "sleeper"
checks = [{ exact = "42" }]
"""

EngineFactory = Callable[[], RemoteSGLangEngine]


@pytest.fixture(autouse=True)
def adapter_stopped_after_each_test() -> Iterator[None]:
    """Each test starts the adapter's background loop (its proxies, its sandboxes); stop it here, as a
    rollout worker's exit would, so its records are flushed and nothing outlives the test."""
    yield
    shutdown()


@pytest.fixture
def rollout_engines(areal_server: ArealProxyServer, tokenizer_path: str) -> Iterator[EngineFactory]:
    """Makes rollout-worker engines pointed at AReaL's proxy; destroys those the test did not."""
    engines: list[RemoteSGLangEngine] = []

    def make() -> RemoteSGLangEngine:
        config = InferenceEngineConfig(
            experiment_name="modeltap",
            trial_name="areal-tier",
            tokenizer_path=tokenizer_path,
            consumer_batch_size=1,
            max_concurrent_rollouts=2,
            agent=AgentConfig(
                agent_cls_path=AGENT_CLS_PATH,
                admin_api_key=areal_server.admin_key,
                mode="inline",
                turn_discount=TURN_DISCOUNT,
            ),
        )
        engine = RemoteSGLangEngine(config)
        engine.initialize(addr=areal_server.base_url.removeprefix("http://"), train_data_parallel_size=1)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        if engine.initialized:
            engine.destroy()


def submit(
    engine: RemoteSGLangEngine, areal_server: ArealProxyServer, bundle: Path, task_id: str, **kwargs: Any
) -> int:
    """Submit one dataset row of `bundle`, as the trainer does with `workflow` and `workflow_kwargs`."""
    (row,) = task_rows(bundle, [task_id])
    return engine.submit(
        row,
        workflow=WORKFLOW,
        workflow_kwargs={"bundle": str(bundle), **kwargs},
        proxy_addr=areal_server.base_url,
    )


@pytest.fixture
def failing_bundle(tmp_path: Path) -> Path:
    bundle = tmp_path / "failing.toml"
    bundle.write_text(FAILING_BUNDLE)
    return bundle


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = EPISODE_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(POLL_INTERVAL_S)
    pytest.fail(f"timed out after {timeout_s} s waiting until {what}")


def assert_trained_with_reward_one(trajectory: dict[str, Any] | None, store: Path) -> list[dict[str, Any]]:
    """One trainable row per opencode model call, reward 1.0 on the last (discounted before it), and
    modeltap's records of the run agree with each row's generated tokens. Returns the records."""
    assert trajectory is not None, "AReaL rejected the episode"
    rewards = trajectory["rewards"].tolist()
    assert rewards == [TURN_DISCOUNT**2, TURN_DISCOUNT, 1.0]
    with StoreReader(store) as reader:
        records = reader.exchanges(bodies=False)
    assert [record["status"] for record in records] == [200] * OPENCODE_MODEL_CALLS
    assert [record["labels"]["task_id"] for record in records] == ["shell-smoke"] * OPENCODE_MODEL_CALLS
    assert [record["completion_tokens"] for record in records] == trajectory["loss_mask"].sum(-1).tolist()
    return records


def train_shell_smoke(
    engine: RemoteSGLangEngine, areal_server: ArealProxyServer, runner: str, host: str, store: Path
) -> list[dict[str, Any]]:
    """The example bundle's shell-smoke task, submitted with `runner` sandboxes and modeltap listening on
    `host`; asserts it trained with reward one (assert_trained_with_reward_one) and returns the records."""
    task = submit(
        engine,
        areal_server,
        EXAMPLE_BUNDLE,
        "shell-smoke",
        runner=runner,
        proxy={"host": host, "store": str(store)},
    )
    return assert_trained_with_reward_one(engine.wait_for_task(task, timeout=EPISODE_TIMEOUT_S), store)


def test_agent_workflow_from_its_import_path_trains_reward_one_on_the_last_interaction(
    rollout_engines: EngineFactory, areal_server: ArealProxyServer, tmp_path: Path
) -> None:
    train_shell_smoke(rollout_engines(), areal_server, "local", "127.0.0.1", tmp_path / "records.db")


def test_a_failing_task_raises_so_areal_rejects_the_sample(
    rollout_engines: EngineFactory, areal_server: ArealProxyServer, failing_bundle: Path, tmp_path: Path
) -> None:
    engine = rollout_engines()
    staleness = engine.workflow_executor.staleness_manager
    proxy = {"host": "127.0.0.1", "store": str(tmp_path / "records.db")}
    submit(engine, areal_server, failing_bundle, "solver-crashes", runner="local", proxy=proxy)

    # A run that raised is counted rejected; a float reward, even 0.0, would have been accepted.
    stats = wait_until(
        lambda: (s := staleness.get_stats()).rejected and s, "AReaL counts the sample rejected"
    )
    assert (stats.accepted, stats.rejected) == (0, 1)


def test_a_cancelled_run_leaves_no_sandbox_behind(
    rollout_engines: EngineFactory, areal_server: ArealProxyServer, failing_bundle: Path, tmp_path: Path
) -> None:
    engine = rollout_engines()
    proxy = {"host": "127.0.0.1", "store": str(tmp_path / "records.db")}
    submit(engine, areal_server, failing_bundle, "solver-hangs", runner="local", proxy=proxy)
    # LocalSandbox runs in a fresh temporary folder named after the run, which starts with the task id.
    pid_files = lambda: list(Path(tempfile.gettempdir()).glob("modeltap-solver-hangs-*/work/sleeper.pid"))  # noqa: E731
    (pid_file,) = wait_until(pid_files, "the hanging solver has started")
    pid = int(wait_until(pid_file.read_text, "the solver wrote its pid"))

    # How AReaL cancels rollouts: shutting the engine down cancels its running tasks.
    engine.destroy()

    wait_until(lambda: not pid_file.parent.parent.exists(), "the sandbox folder is removed", timeout_s=60)
    wait_until(lambda: not _alive(pid), "the solver's process is gone", timeout_s=60)


def test_one_task_in_docker(
    rollout_engines: EngineFactory, areal_server: ArealProxyServer, tmp_path: Path
) -> None:
    client = docker.from_env()
    try:
        ensure_image(client)
        gateway = bridge_gateway()
        assert gateway is not None, "no docker0 bridge: dockerd is not running (make dockerd)"
        # Containers reach modeltap through the bridge gateway, so it listens there (and not on 0.0.0.0).
        records = train_shell_smoke(
            rollout_engines(), areal_server, "docker", gateway, tmp_path / "records.db"
        )
        # Only this run's container: the Docker tier's containers carry the same labels.
        run_label = f"{LABEL_RUN}={records[0]['labels']['run']}"
        assert client.containers.list(all=True, filters={"label": run_label}) == []
    finally:
        client.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
