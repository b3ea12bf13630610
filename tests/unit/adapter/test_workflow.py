"""modeltap/adapter/workflow.py: AgentWorkflow driven as AReaL drives it (tests/adapter_harness.py),
with LocalSandboxes, a solver on the official openai SDK, the AReaL stand-in and the real proxy.
The same flow with opencode in Docker is tests/docker/test_adapter_docker.py."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from modeltap.adapter import (
    AgentWorkflow,
    BundleError,
    ModelFault,
    RunFailed,
    RunTimedOut,
    Unscored,
    should_reject_failed_sample,
    shutdown,
    task_rows,
)
from modeltap.adapter import workflow as workflow_module
from modeltap.adapter.loop import background
from modeltap.records.reader import StoreReader
from tests.adapter_harness import arithmetic, blocking_calls_probe, cancel_at_every_await, run_samples
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.script import Conversation, Reply
from tests.unit.adapter.test_sandbox import alive

AGENT = Path(__file__).with_name("sdk_agent.py")
WORKFLOW = "modeltap.adapter.AgentWorkflow"


def bundle_text(judge_url: str = "http://127.0.0.1:9/v1") -> str:
    return f"""
solver = "sdk"
timeout_s = 60

[agents.sdk]
command = ["{sys.executable}", "{AGENT}", "${{prompt}}"]
endpoint = {{base_url_vars = ["OPENAI_BASE_URL"], api_key_vars = ["OPENAI_API_KEY"]}}
env = {{AGENT_SLEEP_S = "0"}}

[agents.slow]
command = ["{sys.executable}", "{AGENT}", "${{prompt}}"]
endpoint = {{base_url_vars = ["OPENAI_BASE_URL"], api_key_vars = ["OPENAI_API_KEY"]}}
env = {{AGENT_SLEEP_S = "30"}}

[agents.reviewer]
command = ["{sys.executable}", "{AGENT}", "Review the answer to ${{task_id}}"]
env = {{AGENT_MODEL = "${{model}}"}}
[agents.reviewer.endpoint]
base_url_vars = ["OPENAI_BASE_URL"]
api_key_vars = ["OPENAI_API_KEY"]
base_url = "{judge_url}"
api_key = "sk-reviewer"
model = "standin-model"

[agents.broken]
command = ["sh", "-c", "echo the agent crashed >&2; exit 3"]

[judges.grader]
base_url = "{judge_url}"
model = "standin-model"
api_key = "sk-grader"

[[tasks]]
id = "add-2-3"
prompt = "What is 2 + 3? Reply with the number only."
checks = [{{exact = "5"}}]

[[tasks]]
id = "mul-7-8"
prompt = "What is 7 * 8? Reply with the number only."
checks = [{{exact = "56"}}]

[[tasks]]
id = "crash"
prompt = "anything"
solver = "broken"
checks = [{{exact = "x"}}]

[[tasks]]
id = "graded"
prompt = "What is 20 + 22?"
agents = [{{agent = "reviewer", prompt = "unused", stage = "after"}}]
checks = [{{judge = "grader", rubric = "The answer must be 42."}}]

[[tasks]]
id = "eval-only"
prompt = "What is 1 + 1?"
train = false
checks = [{{exact = "2"}}]
"""


@pytest.fixture
def areal() -> Iterator[ArealStandIn]:
    with ArealStandIn(script=arithmetic) as upstream:
        yield upstream


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    path = tmp_path / "bundle.toml"
    path.write_text(bundle_text())
    return path


@pytest.fixture
def kwargs(bundle: Path, tmp_path: Path) -> dict[str, Any]:
    """workflow_kwargs for a loopback proxy with its own store and host-process sandboxes, raising on
    failure as for an AReaL that asks should_reject_failed_sample (the harness's default)."""
    return {
        "bundle": str(bundle),
        "runner": "local",
        "proxy": {"host": "127.0.0.1", "store": str(tmp_path / "r.db")},
        "on_failure": "raise",
    }


def rows_by_id(bundle: Path) -> dict[str, dict[str, Any]]:
    return {row["task_id"]: row for row in task_rows(bundle)}


async def test_a_batch_through_areal_scores_each_sample_and_rejects_only_the_failed_one(
    areal: ArealStandIn, bundle: Path, kwargs: dict[str, Any]
) -> None:
    rows = rows_by_id(bundle)
    add = rows["add-2-3"]
    crash = {"task_id": "crash", "messages": []}
    batch = [add, add, rows["mul-7-8"], crash]  # a group shares one data object: add appears twice
    before = copy.deepcopy(batch)
    samples = await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs, batch)
    assert [(s.reward, s.rejected) for s in samples] == [
        (1.0, False),
        (1.0, False),
        (0.0, False),
        (None, True),
    ]
    assert isinstance(samples[3].error, RunFailed) and "the agent crashed" in str(samples[3].error)
    assert batch == before, "run() changed the data a group shares"
    # AReaL recorded each solver call under its own session and exported the float reward on it.
    for sample in samples[:3]:
        (interaction,) = sample.interactions.values()
        assert interaction["reward"] == sample.reward and interaction["endpoint"] == "chat"
    assert len(areal.model_requests) == 3


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
@pytest.mark.parametrize("gateway", [False, True], ids=["v1-proxy", "v2-gateway"])
async def test_the_default_proxy_trains_every_client_format_behind_either_areal_server(
    tmp_path: Path, api: str, gateway: bool
) -> None:
    """No proxy settings: the session's upstream says on /health whether it is AReaL's v1 agent proxy
    or its v2 gateway, and a solver speaking any of the three formats completes its sample; the
    gateway serves chat only, so Messages and Responses reach it translated through chat."""
    path = tmp_path / "bundle.toml"
    path.write_text(
        bundle_text().replace('AGENT_SLEEP_S = "0"', f'AGENT_SLEEP_S = "0", AGENT_FORMAT = "{api}"')
    )
    store = tmp_path / "r.db"
    workflow = AgentWorkflow(path, runner="local", proxy={"host": "127.0.0.1", "store": str(store)})
    with ArealStandIn(script=arithmetic, gateway=gateway) as areal:
        session = areal.open_session("add-2-3")
        assert await workflow.run({"task_id": "add-2-3"}, base_url=areal.url, api_key=session.api_key) == 1.0
        served = [request.path for request in areal.model_requests]
    native = {"chat": "/chat/completions", "messages": "/v1/messages", "responses": "/responses"}[api]
    assert served == (["/v1/chat/completions"] if gateway else [native])
    shutdown()
    with StoreReader(str(store)) as reader:
        (row,) = reader.sessions()
        (exchange,) = reader.exchanges(row["id"])
    translated = gateway and api != "chat"
    assert exchange["translated"] == ("chat" if translated else None)


def outcomes(store: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each task's recorded rollouts, after the proxy flushed them: (outcome, reward, exit status,
    scores), and the log tails."""
    shutdown()
    found: dict[str, list[tuple[Any, ...]]] = {}
    with StoreReader(store) as reader:
        for row in reversed(reader.sessions()):
            rollout = row["rollout"] or {}
            found.setdefault(row["labels"]["task_id"], []).append(
                (row["outcome"], row["reward"], rollout.get("exit_status"), rollout.get("scores"))
            )
            found.setdefault("logs", []).append((rollout.get("log_tail"),))
            assert row["outcome"] is None or rollout["duration_s"] > 0
    return found


async def test_each_run_s_outcome_goes_to_its_session_in_the_records(
    areal: ArealStandIn, bundle: Path, kwargs: dict[str, Any]
) -> None:
    rows = rows_by_id(bundle)
    batch = [rows["add-2-3"], rows["mul-7-8"], {"task_id": "crash"}]
    await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs, batch)
    found = outcomes(kwargs["proxy"]["store"])
    assert found["add-2-3"] == [("scored", 1.0, 0, [1.0])]
    assert found["mul-7-8"] == [("scored", 0.0, 0, [0.0])]
    assert found["crash"] == [("failed", None, 3, [])]  # left out: no reward
    assert any("the agent crashed" in (tail or "") for (tail,) in found["logs"])


async def test_model_faults_and_zeroed_failures_record_the_zero_they_train_as(
    areal: ArealStandIn, kwargs: dict[str, Any]
) -> None:
    workflow = AgentWorkflow(**kwargs | {"on_failure": "zero"})
    assert (
        await workflow.run({"task_id": "crash"}, base_url=areal.url, api_key=areal.open_session("c").api_key)
        == 0.0
    )
    with ArealStandIn(script=arithmetic, engine_max_tokens=8) as tight:
        with pytest.raises(ModelFault):
            await AgentWorkflow(**kwargs).run(
                {"task_id": "add-2-3"}, base_url=tight.url, api_key=tight.open_session("a").api_key
            )
    found = outcomes(kwargs["proxy"]["store"])
    assert found["crash"] == [("failed", 0.0, 3, [])]
    assert found["add-2-3"] == [("model_fault", 0.0, 1, [])]


async def test_a_run_past_its_limit_is_timed_out_and_one_without_a_score_unscored(
    areal: ArealStandIn, tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    slow = AgentWorkflow(**kwargs | {"agent": "slow", "timeout_s": 0.5})
    with pytest.raises(RunTimedOut):
        await slow.run({"task_id": "add-2-3"}, base_url=areal.url, api_key=areal.open_session("s").api_key)
    with OpenAILikeStandIn(script=lambda conversation: Reply(text="no opinion")) as judge:
        graded = tmp_path / "graded.toml"
        graded.write_text(bundle_text(judge.v1_url))
        with pytest.raises(Unscored):
            await AgentWorkflow(**kwargs | {"bundle": str(graded)}).run(
                {"task_id": "graded"}, base_url=areal.url, api_key=areal.open_session("g").api_key
            )
    found = outcomes(kwargs["proxy"]["store"])
    assert found["add-2-3"] == [("timed_out", None, None, [])]
    assert found["graded"] == [("unscored", None, 0, [])]


async def test_only_the_solver_goes_through_the_proxy_helpers_and_judges_use_their_endpoints(
    areal: ArealStandIn, tmp_path: Path
) -> None:
    def grader(conversation: Conversation) -> Reply:
        return Reply(text="SCORE: 1" if "Answer:\n42" in conversation.last_user_text else "SCORE: 0")

    with OpenAILikeStandIn(script=grader) as judge:
        bundle = tmp_path / "graded.toml"
        bundle.write_text(bundle_text(judge.v1_url))
        store = tmp_path / "records.db"
        workflow = AgentWorkflow(bundle, runner="local", proxy={"host": "127.0.0.1", "store": str(store)})
        session = areal.open_session("graded")
        reward = await workflow.run({"task_id": "graded"}, base_url=areal.url, api_key=session.api_key)
        assert reward == 1.0
        # The same stand-in serves as the reviewer's model and as the judge: both called it directly.
        review, grading = judge.model_requests
        assert review.body["messages"][0]["content"] == "Review the answer to graded"
        assert review.headers["Authorization"] == "Bearer sk-reviewer"
        assert "Rubric:\nThe answer must be 42." in grading.body["messages"][0]["content"]
    with StoreReader(store) as reader:
        rows = reader.exchanges(bodies=True)
    assert len(rows) == 1  # the solver's one call; neither the reviewer's nor the judge's reached the proxy
    (row,) = rows
    assert row["labels"]["task_id"] == "graded" and row["labels"]["agent"] == "sdk"
    assert row["upstream_url"] == f"{areal.url}/chat/completions"
    assert "Answer:" not in json.dumps(row["request"])
    assert session.interactions[0].request["messages"][0]["content"] == "What is 20 + 22?"


async def test_rows_naming_no_task_of_the_workflow_are_refused_clearly(
    areal: ArealStandIn, bundle: Path, kwargs: dict[str, Any]
) -> None:
    workflow = AgentWorkflow(**kwargs)
    with pytest.raises(ValueError, match=r"no task 'nope'; the bundle has 'add-2-3'"):
        await workflow.run({"task_id": "nope"}, base_url=areal.url, api_key="k")
    with pytest.raises(ValueError, match="no task None"):
        await workflow.run({"messages": []}, base_url=areal.url, api_key="k")
    narrow = AgentWorkflow(**kwargs | {"tasks": ["add-2-3"]})
    with pytest.raises(ValueError, match=r"task 'mul-7-8' is not among this workflow's tasks \['add-2-3'\]"):
        await narrow.run({"task_id": "mul-7-8"}, base_url=areal.url, api_key="k")
    assert areal.model_requests == []


async def test_a_context_overflow_is_a_model_fault_that_trains_as_zero(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    with ArealStandIn(script=arithmetic, engine_max_tokens=8) as tight:
        samples = await run_samples(tight.url, tight.admin_key, WORKFLOW, kwargs, [{"task_id": "add-2-3"}])
    (sample,) = samples
    assert isinstance(sample.error, ModelFault)
    assert "context overflowed" in sample.error.reason and "exceeds max_total_tokens 8" in sample.error.reason
    assert (sample.reward, sample.rejected) == (0.0, False)
    assert should_reject_failed_sample(sample.error) is False


async def unparseable_tool_call(request: web.Request) -> web.Response:
    """AReaL's answer when the tool-call parser fails: finish_reason tool_calls, tool_calls null
    (docs/areal.md §4.2)."""
    message = {
        "role": "assistant",
        "content": '<tool_call>{"name": "bash", "arguments": {oops',
        "tool_calls": None,
    }
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "None",
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "logprobs": None}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
    )


async def test_an_unparseable_tool_call_is_a_model_fault(aiohttp_server: Any, kwargs: dict[str, Any]) -> None:
    app = web.Application()
    app.router.add_post("/chat/completions", unparseable_tool_call)
    upstream = await aiohttp_server(app)
    workflow = AgentWorkflow(**kwargs)
    with pytest.raises(ModelFault, match="tool call did not parse") as caught:
        await workflow.run(
            {"task_id": "add-2-3"}, base_url=str(upstream.make_url("")).rstrip("/"), api_key="k"
        )
    assert "announced tool calls and sent none" in str(caught.value)
    assert not workflow.should_reject_failed_sample(caught.value)


@pytest.mark.parametrize(
    ("policy", "task_id", "outcome"),
    [
        ("raise", "crash", RunFailed),
        ("zero", "crash", 0.0),
        ("zero-model-faults", "crash", RunFailed),
    ],
)
async def test_the_failure_policy_for_an_areal_without_the_hook(
    areal: ArealStandIn, kwargs: dict[str, Any], policy: str, task_id: str, outcome: Any
) -> None:
    workflow = AgentWorkflow(**kwargs | {"on_failure": policy})
    session = areal.open_session(task_id)
    call = workflow.run({"task_id": task_id}, base_url=areal.url, api_key=session.api_key)
    if isinstance(outcome, float):
        result = await call
        assert result == outcome and type(result) is float
    else:
        with pytest.raises(outcome):
            await call


async def test_zero_model_faults_returns_zero_for_an_overflow(kwargs: dict[str, Any]) -> None:
    with ArealStandIn(script=arithmetic, engine_max_tokens=8) as tight:
        session = tight.open_session("add-2-3")
        workflow = AgentWorkflow(**kwargs | {"on_failure": "zero-model-faults"})
        assert await workflow.run({"task_id": "add-2-3"}, base_url=tight.url, api_key=session.api_key) == 0.0


async def test_on_areal_2_0_zero_keeps_the_batch_that_raise_would_lose(
    areal: ArealStandIn, bundle: Path, kwargs: dict[str, Any]
) -> None:
    batch = [{"task_id": "add-2-3"}, {"task_id": "crash"}]
    with pytest.raises(RunFailed):
        await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs, batch, hook=False)
    samples = await run_samples(
        areal.url, areal.admin_key, WORKFLOW, kwargs | {"on_failure": "zero"}, batch, hook=False
    )
    assert [s.reward for s in samples] == [1.0, 0.0]


@pytest.mark.parametrize(("asks_the_hook", "overflow_reward"), [(False, 0.0), (True, None)])
async def test_auto_failure_policy_follows_the_installed_areal(
    kwargs: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    asks_the_hook: bool,
    overflow_reward: Any,
) -> None:
    """AReaL 2.0.0 and main (both "2.0.0") ask no should_reject_failed_sample, so a model fault returns
    0.0 rather than losing the group; an AReaL whose source asks the hook gets the raise. The source
    is read, never imported, and the version string decides nothing."""
    site = tmp_path / "site"
    info = site / "areal-2.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: areal\nVersion: 2.0.0\n")
    (site / "areal").mkdir()
    (site / "areal" / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    hook = "workflow.should_reject_failed_sample(exc)" if asks_the_hook else "should_accept_fn(traj)"
    (site / "areal" / "remote_inf_engine.py").write_text(f"def filter(workflow, exc, traj):\n    {hook}\n")
    monkeypatch.syspath_prepend(str(site))
    workflow = AgentWorkflow(**kwargs | {"on_failure": "auto"})
    with ArealStandIn(script=arithmetic, engine_max_tokens=8) as tight:
        session = tight.open_session("add-2-3")
        call = workflow.run({"task_id": "add-2-3"}, base_url=tight.url, api_key=session.api_key)
        if overflow_reward is None:
            with pytest.raises(ModelFault):
                await call
        else:
            assert await call == overflow_reward
    assert "areal" not in sys.modules


def test_should_reject_leaves_out_broken_runs_and_keeps_model_faults() -> None:
    assert should_reject_failed_sample(RunFailed("sandbox down")) is True
    assert should_reject_failed_sample(Unscored("no answer")) is True
    assert should_reject_failed_sample(ValueError("bad row")) is True
    assert should_reject_failed_sample(ModelFault("context overflow")) is False
    try:
        try:
            raise ModelFault("overflow")
        except ModelFault as inner:
            raise RuntimeError("wrapped by the caller") from inner
    except RuntimeError as wrapped:
        assert should_reject_failed_sample(wrapped) is False
    assert AgentWorkflow.should_reject_failed_sample(ModelFault("x")) is False


def test_importing_the_adapter_loads_no_areal_module(tmp_path: Path) -> None:
    # An importable `areal` (the main venv has none), so that even an optional import would show.
    (tmp_path / "areal").mkdir()
    (tmp_path / "areal" / "__init__.py").write_text("")
    probe = (
        "import sys, modeltap, modeltap.adapter, modeltap.adapter.workflow;"
        "loaded = [m for m in sys.modules if m == 'areal' or m.startswith('areal.')];"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60, env={"PYTHONPATH": str(tmp_path)})


async def test_a_thousand_constructions_prepare_the_bundle_once(
    areal: ArealStandIn, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    loads: list[str] = []
    real_load = workflow_module.load_bundle

    def counting_load(path: Any) -> Any:
        loads.append(str(path))
        return real_load(path)

    monkeypatch.setattr(workflow_module, "load_bundle", counting_load)
    workflows = [AgentWorkflow(**kwargs) for _ in range(1000)]  # AReaL builds one per submit
    prepared = await asyncio.gather(*(w.prepare() for w in workflows))
    assert len(loads) == 1 and len({id(p) for p in prepared}) == 1
    session = areal.open_session("add-2-3")
    assert await workflows[-1].run({"task_id": "add-2-3"}, base_url=areal.url, api_key=session.api_key) == 1.0
    AgentWorkflow(**kwargs | {"tasks": ["add-2-3"]})  # other arguments: prepared on their own first use
    assert len(loads) == 1


def test_the_blocking_calls_probe_sees_what_blocks() -> None:
    with blocking_calls_probe() as blocking:
        time.sleep(0)
        subprocess.run(["true"], check=True)
    assert "time.sleep" in blocking and any("subprocess.py" in call for call in blocking)
    with blocking_calls_probe() as blocking:
        process = subprocess.Popen(["true"])
    process.wait()
    with blocking_calls_probe() as finalised:
        del process  # the garbage collector's work on whatever thread it runs: polled, never blocking
        gc.collect()
    assert any("subprocess.py" in call for call in blocking) and finalised == []


async def test_the_caller_s_loop_runs_no_blocking_work_during_runs(
    areal: ArealStandIn, kwargs: dict[str, Any]
) -> None:
    batch = [{"task_id": "add-2-3"}, {"task_id": "crash"}] * 2
    with blocking_calls_probe() as blocking:
        samples = await run_samples(areal.url, areal.admin_key, WORKFLOW, kwargs, batch)
    assert [s.reward for s in samples] == [1.0, None, 1.0, None]
    assert blocking == []


async def test_cancelling_run_stops_the_agent_and_closes_the_session_before_it_returns(
    areal: ArealStandIn, kwargs: dict[str, Any]
) -> None:
    workflow = AgentWorkflow(**kwargs | {"agent": "slow"})
    session = areal.open_session("add-2-3")
    run = asyncio.ensure_future(
        workflow.run({"task_id": "add-2-3"}, base_url=areal.url, api_key=session.api_key)
    )
    agent_pid = None
    while agent_pid is None:
        await asyncio.sleep(0.05)
        agent_pid = _process_running(str(AGENT))
    proxy = (await background().run(workflow_module._tap(workflow.proxy_config), "proxy")).proxy
    (open_session,) = list(proxy.sessions)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # At the moment the cancel reached the caller: the agent is gone and the session is closed.
    assert not alive(agent_pid)
    assert len(proxy.sessions) == 0
    async with aiohttp.ClientSession() as http:
        url = f"{open_session.host_base_url}/chat/completions"
        async with http.post(url, json={"model": "m", "messages": []}) as response:
            assert response.status == 401
    assert outcomes(kwargs["proxy"]["store"])["add-2-3"] == [("cancelled", None, None, [])]


def sweep_bundle(path: Path, marker: str) -> Path:
    """A run with every kind of step: an agent that leaves a process behind (named by `marker`) and
    writes its answer to a file, a check reading it and a command check, under a 600 s limit."""
    lingering = f"{sys.executable} -c 'import time; time.sleep(600)' $0 & echo 5 > answer.txt"
    path.write_text(f"""
timeout_s = 600
[agents.lingering]
command = ["sh", "-c", "{lingering}", "{marker}"]
answer = {{file = "answer.txt"}}
[[tasks]]
id = "swept"
prompt = "anything"
solver = "lingering"
checks = [{{exact = "5"}}, {{command = 'test "$MODELTAP_ANSWER" = 5'}}]
""")
    return path


async def test_cancelling_a_local_run_at_any_await_returns_and_leaves_nothing(
    areal: ArealStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = f"modeltap-sweep-{uuid.uuid4().hex}"
    # The runs' directories go to a temp dir of this test's own (short: the store's writer puts a
    # unix socket there too, and removes it at shutdown).
    temp = Path(tempfile.mkdtemp(prefix="mt-sweep-"))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    workflow = AgentWorkflow(
        sweep_bundle(tmp_path / "sweep.toml", marker),
        runner="local",
        proxy={"host": "127.0.0.1", "store": str(tmp_path / "r.db")},
        on_failure="raise",
    )

    def play() -> Awaitable[float]:
        session = areal.open_session("swept")
        return workflow.run({"task_id": "swept"}, base_url=areal.url, api_key=session.api_key)

    async def nothing_left(k: int) -> None:
        tap = await background().run(workflow_module._tap(workflow.proxy_config), "proxy")
        assert len(tap.proxy.sessions) == 0, f"cut at await {k}: a proxy session is left open"
        assert _process_running(marker) is None, f"cut at await {k}: the agent's process is left"
        await asyncio.to_thread(shutdown)  # the next cut starts from a fresh process state
        left = await asyncio.to_thread(os.listdir, temp)
        assert left == [], f"cut at await {k}: left in the temp dir: {left}"

    try:
        cuts = await cancel_at_every_await(play, nothing_left, monkeypatch)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert cuts >= 8  # preparing, the proxy, the sandbox, each command and read, removing its directory


def _process_running(marker: str) -> int | None:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker in cmdline.read_bytes().decode(errors="replace"):
                return int(cmdline.parent.name)
        except OSError:
            continue
    return None


def test_task_rows_list_trainable_tasks_with_their_first_prompt(bundle: Path) -> None:
    rows = task_rows(bundle)
    assert [row["task_id"] for row in rows] == ["add-2-3", "mul-7-8", "crash", "graded"]
    assert rows[0]["messages"] == [{"role": "user", "content": "What is 2 + 3? Reply with the number only."}]
    assert task_rows(bundle, tasks=["mul-7-8"], agent="slow") == [rows[1]]
    with pytest.raises(BundleError, match="task 'eval-only' is not trainable"):
        task_rows(bundle, tasks=["eval-only"])
    with pytest.raises(BundleError, match="'ghost', which is not one of"):
        task_rows(bundle, agent="ghost")


def test_bad_arguments_fail_at_construction_without_touching_the_bundle(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    AgentWorkflow(missing)  # no I/O: the bundle is read on first use
    with pytest.raises(ValueError, match='runner=\'podman\': use "docker" or "local"'):
        AgentWorkflow(missing, runner="podman")
    with pytest.raises(ValueError, match="on_failure='ignore'"):
        AgentWorkflow(missing, on_failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="layout must be one of"):
        AgentWorkflow(missing, proxy={"layout": "v2"})
    with pytest.raises(ValueError, match=r"proxy=\{'stor': 'x'\}: .*'stor'.*fields are upstream, host"):
        AgentWorkflow(missing, proxy={"stor": "x"})
    with pytest.raises(ValueError, match=r"give a list of task ids, e\.g\. tasks=\['add-2-3'\]"):
        AgentWorkflow(missing, tasks="add-2-3")
