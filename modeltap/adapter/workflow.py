"""AgentWorkflow: the inline agent AReaL's OpenAIProxyWorkflow runs for each sample; task_rows, the
dataset it plays; should_reject_failed_sample, which failures leave a sample out.

Owns: turning one AReaL call (`data`, `base_url`, `api_key`) into one run: the per-process prepared
bundle, the proxy session whose upstream is AReaL, the reward as a float, the failure policy
(telling a model fault from a broken run by what the proxy's fault watch saw, faults.py), and
reporting the run's outcome on its session through the proxy's observers before it closes. Does
not own: playing the task (runner.py), naming the outcome (outcome.py), sandboxes (sandbox.py) or
the background loop (loop.py). Imports no AReaL.

In an AReaL experiment config (examples/areal.yaml):

    workflow: modeltap.adapter.AgentWorkflow
    workflow_kwargs: {bundle: /abs/path/bundle.toml, runner: docker, proxy: {store: /abs/records.db}}
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from modeltap.adapter import outcome
from modeltap.adapter.bundle import Bundle, BundleError, Task, load_bundle
from modeltap.adapter.faults import FaultWatch
from modeltap.adapter.loop import background
from modeltap.adapter.runner import (
    AdapterError,
    ModelFault,
    RunFailed,
    RunPlan,
    RunResult,
    SolverEndpoint,
    Unscored,
    play,
)
from modeltap.adapter.sandbox import SandboxProvider, provider_for
from modeltap.compat.areal import ArealCapabilities, installed_capabilities
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy

log = logging.getLogger(__name__)

FailurePolicy = Literal["auto", "raise", "zero-model-faults", "zero"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = ("auto", "raise", "zero-model-faults", "zero")
# The adapter's proxy, unless proxy={...} says otherwise:
# - every interface, so containers reach it through the bridge gateway (docs/areal.md §6);
# - `auto`: each session's upstream says on /health whether it is AReaL's v1 agent proxy or its v2
#   gateway (`rollout._version: v2`), which serves chat only: Anthropic and Responses calls are then
#   translated through chat (docs/areal.md §2, §9);
# - sync: each exchange is committed before its response ends, so a run's records are all in the
#   store when its reward is returned.
PROXY_DEFAULTS: Mapping[str, Any] = {"host": "0.0.0.0", "port": 0, "layout": "auto", "sync": True}


@dataclass(frozen=True, slots=True)
class Prepared:
    """A bundle ready to play: loaded, its selection checked, its images present."""

    bundle: Bundle
    task_ids: frozenset[str]
    agent: str | None


class AgentWorkflow:
    """An AReaL inline agent that plays one bundle task per sample, the solver's model traffic
    going through modeltap to AReaL.

    >>> workflow = AgentWorkflow("examples/bundle.toml", tasks=["add-2-3"])
    >>> reward = await workflow.run({"task_id": "add-2-3"}, base_url=areal_url, api_key=session_key)

    - `bundle`: the bundle file; `tasks`: the task ids it may play (default: all); `agent`: an agent
      of the bundle that replaces every task's solver.
    - `runner`: "docker" (a container per run) or "local" (host processes, no isolation).
    - `proxy`: ProxyConfig fields for the process's proxy (default PROXY_DEFAULTS; e.g. `store`).
    - `timeout_s`: limit on one run, in place of the tasks' own.
    - `on_failure`, what a failed run does:
      - "raise": raise RunFailed, Unscored or ModelFault. An AReaL that asks
        should_reject_failed_sample would then leave a broken sample out alone and train a model
        fault as reward 0; no AReaL does yet (2.0.0, main at cbff54d): there an exception costs the
        sample's whole group (docs/areal.md §3.4).
      - "zero-model-faults": return 0.0 for a ModelFault and raise the rest: model faults train as 0
        as the hook would have them, and only a broken run costs its group.
      - "zero": return 0.0 for every failure. No group is ever lost, but a run broken by the
        sandbox or a judge then teaches the policy that its answer was wrong, which biases
        training wherever such failures are common.
      - "auto" (default): "raise" where the installed AReaL's source asks should_reject_failed_sample,
        else "zero-model-faults" (modeltap.compat.areal reads its files; AReaL is not imported).

    Construction does no I/O: AReaL builds a new instance on every submit, and the bundle is
    prepared once per process per argument set, on first use.
    """

    def __init__(
        self,
        bundle: str | os.PathLike[str],
        tasks: Iterable[str] | None = None,
        agent: str | None = None,
        runner: str = "docker",
        proxy: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        on_failure: FailurePolicy = "auto",
    ) -> None:
        if runner not in ("docker", "local"):
            raise ValueError(f'runner={runner!r}: use "docker" or "local"')
        if on_failure not in FAILURE_POLICIES:
            raise ValueError(f"on_failure={on_failure!r}: use one of {', '.join(FAILURE_POLICIES)}")
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s!r}: give a positive number of seconds")
        if isinstance(tasks, str):
            raise ValueError(f"tasks={tasks!r}: give a list of task ids, e.g. tasks=[{tasks!r}]")
        self.bundle = os.fspath(bundle)
        self.tasks = None if tasks is None else tuple(tasks)
        self.agent = agent
        self.runner = runner
        try:
            self.proxy_config = ProxyConfig(**{**PROXY_DEFAULTS, **(proxy or {})})
        except TypeError as exc:  # an unknown field name, from a hand-written workflow_kwargs
            fields = ", ".join(ProxyConfig.__dataclass_fields__)
            raise ValueError(
                f"proxy={dict(proxy or {})!r}: {exc}; ProxyConfig's fields are {fields}"
            ) from exc
        self.timeout_s = timeout_s
        self.on_failure = on_failure
        # What makes two workflows play the same thing: AReaL's per-submit rebuilds share one preparation.
        self._key = ("bundle", os.path.abspath(self.bundle), self.tasks, agent, runner)

    async def run(self, data: Mapping[str, Any], *, base_url: str, api_key: str, **_: Any) -> float:
        """Play the task `data["task_id"]` and return its reward as a float.

        AReaL passes `base_url` and `api_key` (its session key) and an `http_client` this ignores.
        `data` is read, never changed: a group's samples share it.
        """
        task_id = data.get("task_id")
        return await background().run(self._play(task_id, base_url, api_key), f"run:{task_id}")

    async def prepare(self) -> Prepared:
        """Load and check the bundle and its images, once per process for these arguments; run() does
        this itself on first use."""
        return await background().run(self._prepared(), "prepare")

    @staticmethod
    def should_reject_failed_sample(exc: BaseException) -> bool:
        """See `should_reject_failed_sample`."""
        return should_reject_failed_sample(exc)

    async def _prepared(self) -> Prepared:
        return await background().shared(self._key, self._prepare)

    async def _prepare(self) -> Prepared:
        bundle = await asyncio.to_thread(load_bundle, self.bundle)
        tasks = (
            [bundle.task(task_id) for task_id in self.tasks] if self.tasks else list(bundle.tasks.values())
        )
        images = {_sandbox_image(bundle, task, self.agent) for task in tasks}
        # A SandboxError here (no daemon, no image) is not one run's failure, so it is not an
        # AdapterError: no on_failure policy turns it into a reward.
        await (await _provider(self.runner)).prepare(image for image in images if image)
        return Prepared(bundle, frozenset(task.id for task in tasks), self.agent)

    async def _failed(self, task_id: str, exc: AdapterError) -> float | None:
        """The failure policy: 0.0 when a failed run counts as a zero, None when it raises."""
        policy = await self._failure_policy()
        if policy == "zero" or (policy == "zero-model-faults" and isinstance(exc, ModelFault)):
            log.warning("task %s: %s; reward 0.0 (on_failure=%s)", task_id, exc.reason, policy)
            return 0.0
        return None

    async def _failure_policy(self) -> FailurePolicy:
        """`on_failure`, with "auto" resolved by the installed AReaL's source (read once per process)."""
        if self.on_failure != "auto":
            return self.on_failure
        areal = await background().shared(("areal-capabilities",), _installed_areal)
        return "raise" if areal.honours_should_reject_failed_sample else "zero-model-faults"

    async def _play(self, task_id: object, base_url: str, api_key: str) -> float:
        """One run on the background loop: its session, the failure policy, and its outcome."""
        prepared = await self._prepared()
        task = prepared.bundle.task(task_id)
        if task.id not in prepared.task_ids:
            raise BundleError(
                f"{prepared.bundle.path}: task {task.id!r} is not among this workflow's tasks "
                f"{sorted(prepared.task_ids)}; add it to workflow_kwargs.tasks or drop it from the dataset"
            )
        solver = prepared.bundle.solver_for(task, self.agent)
        tap = await _tap(self.proxy_config)
        provider = await _provider(self.runner)
        run_id = f"{_label_safe(task.id)}-{secrets.token_hex(6)}"
        labels = {
            "task_id": task.id,
            "agent": solver.name,
            "run": run_id,
            "areal_session": _fingerprint(api_key),
        }
        session = tap.proxy.sessions.open(upstream=base_url, upstream_key=api_key, labels=labels)
        tap.faults.watch(session.id)
        started = time.monotonic()
        try:
            plan = RunPlan(
                run_id=run_id,
                task=task,
                solver=solver,
                helpers=tuple(prepared.bundle.helper_agents(task)),
                judges=prepared.bundle.judges,
                endpoint=SolverEndpoint(session.host_base_url, session.container_base_url, session.token),
                timeout_s=self.timeout_s or task.timeout_s,
                judge_http=await _judge_http(),
            )
            return await self._reported(tap, session.id, plan, provider, started)
        finally:
            tap.faults.release(session.id)
            tap.proxy.sessions.close(session.id)

    async def _reported(
        self, tap: _Tap, session_id: str, plan: RunPlan, provider: SandboxProvider, started: float
    ) -> float:
        """Play `plan` with the failure policy applied, and report how it ended on its session (with
        the reward the trainer got: None for a sample left out)."""
        try:
            result = await _attempt(plan, provider, tap.faults, session_id)
        except AdapterError as exc:
            reward = await self._failed(plan.task.id, exc)
            trained = 0.0 if reward is not None or not should_reject_failed_sample(exc) else None
            tap.proxy.report_outcome(session_id, outcome.ended(exc, time.monotonic() - started, trained))
            if reward is None:
                raise
            return reward
        except BaseException as exc:  # cancelled, or a bug: recorded as what it is, and re-raised
            tap.proxy.report_outcome(session_id, outcome.ended(exc, time.monotonic() - started, None))
            raise
        tap.proxy.report_outcome(session_id, outcome.scored(result, time.monotonic() - started))
        return float(result.reward)


async def _attempt(
    plan: RunPlan, provider: SandboxProvider, faults: FaultWatch, session_id: str
) -> RunResult:
    """Play the plan; a failed run in which the model was at fault is a ModelFault."""
    try:
        return await play(plan, provider)
    except (RunFailed, Unscored) as exc:
        fault = faults.release(session_id)
        if fault is not None:
            raise ModelFault(
                f"task {plan.task.id!r}: {fault} ({exc.reason})", exc.logs, exc.exit_status
            ) from exc
        raise


def should_reject_failed_sample(exc: BaseException) -> bool:
    """Whether AReaL should leave out the sample whose run raised `exc`.

    False when the model was at fault (ModelFault anywhere in the exception's chain): that run is a
    valid sample, trained as reward 0. True for everything else: a broken run says nothing about
    the policy.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ModelFault):
            return False
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return True


def task_rows(
    bundle: str | os.PathLike[str], tasks: Sequence[str] | None = None, agent: str | None = None
) -> list[dict[str, Any]]:
    """The dataset for a bundle: one row per trainable task, `{"task_id", "messages"}`, in file order.

    A task is trainable unless it says `train = false`, and only if it has a solver (its own, the
    bundle's, or `agent`). Naming an untrainable task in `tasks` is an error, not a silent drop.
    Reads the file: call it while building the dataset, not on an event loop.
    """
    loaded = load_bundle(bundle)
    selected = [loaded.task(task_id) for task_id in tasks] if tasks else list(loaded.tasks.values())
    rows = []
    for task in selected:
        has_solver = (agent or task.solver or loaded.solver) is not None
        if has_solver:
            loaded.solver_for(task, agent)  # raises if `agent` is not an agent of the bundle
        if task.train and has_solver:
            rows.append({"task_id": task.id, "messages": [{"role": "user", "content": task.prompt}]})
        elif tasks:
            raise BundleError(
                f"{loaded.path}: task {task.id!r} is not trainable (train = false, or no solver)"
            )
    return rows


def _sandbox_image(bundle: Bundle, task: Task, agent: str | None) -> str | None:
    """The image a task's sandbox is made from: the solver's. Helpers run in the same sandbox, so
    an image of their own would be silently ignored; that is an error instead."""
    solver = bundle.solver_for(task, agent)
    for _, helper in bundle.helper_agents(task):
        if helper.image not in (None, solver.image):
            raise BundleError(
                f"{bundle.path}: helper {helper.name!r} of task {task.id!r} names image "
                f"{helper.image!r}, but helpers run in the solver's sandbox ({solver.image!r}); "
                "drop its image or make them match"
            )
    return solver.image


async def _installed_areal() -> ArealCapabilities:
    # importlib.metadata scans every sys.path entry: file-system work, kept off the loop.
    return await asyncio.to_thread(installed_capabilities)


@dataclass(frozen=True, slots=True)
class _Tap:
    """The process's proxy for one configuration, and the fault watch among its observers."""

    proxy: Proxy
    faults: FaultWatch


async def _tap(config: ProxyConfig) -> _Tap:
    """The process's proxy for `config`, started on first use (AReaL's runs all share one)."""
    key = ("proxy", json.dumps(_public_fields(config), sort_keys=True, default=str))

    async def start() -> _Tap:
        faults = FaultWatch()
        return _Tap(await Proxy(config, observers=[faults]).start(), faults)

    async def stop(tap: _Tap) -> None:
        await tap.proxy.stop()

    return await background().shared(key, start, stop)


async def _judge_http() -> aiohttp.ClientSession:
    """The process's one pool of connections for judge calls, shared by every run."""

    async def make() -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    async def close(client: aiohttp.ClientSession) -> None:
        await client.close()

    return await background().shared(("judge-http",), make, close)


async def _provider(runner: str) -> SandboxProvider:
    async def make() -> SandboxProvider:
        return provider_for(runner)

    async def close(provider: SandboxProvider) -> None:
        await provider.close()

    return await background().shared(("sandboxes", runner), make, close)


def _public_fields(config: ProxyConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def _fingerprint(api_key: str) -> str:
    """A stable, non-secret name for AReaL's session key, to group records by AReaL session."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:12]


def _label_safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:48]
