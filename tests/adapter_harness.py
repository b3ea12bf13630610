"""An AReaL-shaped driver for the adapter's tests: what OpenAIProxyWorkflow does around an inline agent.

Owns: the per-sample protocol of docs/areal.md §3.1-§3.4, spoken over HTTP to
an AReaL proxy (the stand-in in tests/standins/areal.py): resolve the workflow from its import-path
string with workflow_kwargs (a new instance per submit, §3.3), grant capacity, start a session, await
`run(data, base_url=…, api_key=…, http_client=…)`, check the reward is a float, set it on the last
interaction, end the session and export. Failures follow AReaL after 2.1.0 (`hook=True`: the agent's
should_reject_failed_sample decides per sample; a sample it keeps trains as reward 0) or AReaL 2.1.0
(`hook=False`: gather without return_exceptions, so one exception fails the whole batch).
Does not own: the AReaL server (tests/standins) or the scripted model's replies (`arithmetic` here).

    samples = await run_samples(areal.url, areal.admin_key, "modeltap.adapter.AgentWorkflow",
                                {"bundle": path, "runner": "local"}, [row, row, other_row])
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.standins.script import Conversation, Reply, shell_arithmetic

# AReaL's rollout client waits up to an hour for an episode (rollout.request_timeout, docs/areal.md §4.3).
REQUEST_TIMEOUT_S = 3600.0
# How often the lag probe wakes up.
PROBE_INTERVAL_S = 0.01
# No step of the caller's loop may hold it longer than this during a run.
MAX_LOOP_BLOCK_S = 0.050
# A timer on the caller's loop may fire later than that: its thread shares the GIL with the adapter's
# threads and, on the 2-core CI machine shared with other jobs, waits for a CPU (up to 54 ms measured
# at load 9 with no slow step at all). A blocking docker call or a long C call holding the GIL would
# still show here as hundreds of milliseconds.
MAX_LOOP_DELAY_S = 0.250
_SLOW_STEP = re.compile(r"took (\d+\.\d+) seconds")


@dataclass
class Sample:
    """One sample's outcome: its reward (None when rejected), the run's exception if it raised, and the
    interactions AReaL exported with their discounted rewards."""

    index: int
    reward: float | None
    rejected: bool
    error: BaseException | None = None
    interactions: Mapping[str, Any] = field(default_factory=dict)


def resolve_workflow(workflow: str, workflow_kwargs: Mapping[str, Any]) -> Any:
    """`_resolve_workflow` for an agent-like import path (docs/areal.md §3.3): a class is instantiated
    with the kwargs, an instance is used as it is."""
    module, _, name = workflow.rpartition(".")
    try:
        imported = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"Failed to import workflow from string {workflow}") from exc
    if not asyncio.iscoroutinefunction(getattr(imported, "run", None)):
        raise TypeError(f"{workflow}.run must be an async def (WF:102-112)")
    return imported(**workflow_kwargs) if isinstance(imported, type) else imported


async def run_samples(
    areal_url: str,
    admin_key: str,
    workflow: str,
    workflow_kwargs: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    hook: bool = True,
) -> list[Sample]:
    """Play `rows` concurrently through one agent instance, as one submit's group does (a true group
    passes the same row object several times)."""
    agent = resolve_workflow(workflow, workflow_kwargs)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        client = _ArealClient(http, areal_url, admin_key)
        episodes = [_episode(client, agent, row, index, hook) for index, row in enumerate(rows)]
        return list(await asyncio.gather(*episodes))


class _ArealClient:
    """The control calls of OpenAIProxyClient (CS), with the admin key or a session key as Bearer."""

    def __init__(self, http: aiohttp.ClientSession, url: str, admin_key: str) -> None:
        self.http, self.url, self.admin_key = http, url, admin_key

    async def post(self, path: str, key: str, body: Any = None, allowed: tuple[int, ...] = (200,)) -> Any:
        headers = {"Authorization": f"Bearer {key}"}
        async with self.http.post(f"{self.url}/{path}", json=body or {}, headers=headers) as response:
            payload = await response.json(content_type=None)
            if response.status not in allowed:
                raise RuntimeError(f"AReaL /{path} answered {response.status}: {payload}")
            return payload


async def _episode(
    client: _ArealClient, agent: Any, data: Mapping[str, Any], index: int, hook: bool
) -> Sample:
    """arun_episode in inline mode (WF:165-269)."""
    await client.post("grant_capacity", client.admin_key)
    started = await client.post(
        "rl/start_session", client.admin_key, {"task_id": f"{data['task_id']}:{index}"}
    )
    session_id, key = started["session_id"], started["api_key"]
    error: BaseException | None = None
    try:
        try:
            reward = await agent.run(data, base_url=client.url, api_key=key, http_client=client.http)
        except Exception as exc:  # AReaL logs "This trajectory will be rejected" and asks the hook
            if not hook:
                raise
            error = exc
            if agent.should_reject_failed_sample(exc):
                return Sample(index, None, True, exc)
            reward = 0.0
        if not isinstance(reward, float):
            raise ValueError(f"Invalid reward type: {type(reward).__name__}")
        # _set_reward swallows 400 ("No interactions in session"): the reward is then lost (CS:297-313).
        await client.post(
            "rl/set_reward", key, {"interaction_id": None, "reward": reward}, allowed=(200, 400)
        )
    finally:
        await client.post("rl/end_session", key)
    exported = await client.post(
        "export_trajectories",
        client.admin_key,
        {"session_id": session_id, "discount": 1.0, "style": "individual"},
    )
    return Sample(index, reward, False, error, exported["interactions"])


@dataclass
class LoopLag:
    """What the probe saw on the caller's loop: the longest single step that held the loop (asyncio's
    debug-mode slow-callback check) and the longest delay of a timer (which also counts time the
    thread waited for the GIL or for a CPU)."""

    longest_step_s: float = 0.0
    longest_delay_s: float = 0.0
    wakeups: int = 0

    def within_limits(self) -> bool:
        """No step held the loop past MAX_LOOP_BLOCK_S, no timer was late past MAX_LOOP_DELAY_S, and
        the probe woke often enough to have seen the run."""
        return (
            self.wakeups > 50
            and self.longest_step_s <= MAX_LOOP_BLOCK_S
            and self.longest_delay_s <= MAX_LOOP_DELAY_S
        )


class _SlowSteps(logging.Handler):
    def __init__(self, lag: LoopLag) -> None:
        super().__init__(logging.WARNING)
        self.lag = lag

    def emit(self, record: logging.LogRecord) -> None:
        match = _SLOW_STEP.search(record.getMessage())
        if match:
            self.lag.longest_step_s = max(self.lag.longest_step_s, float(match.group(1)))


@contextlib.asynccontextmanager
async def loop_lag_probe(step_threshold_s: float = MAX_LOOP_BLOCK_S) -> AsyncIterator[LoopLag]:
    """Measure how long the running loop is held or delayed while the block runs (AReaL's loop, in
    the adapter's tests: nothing the adapter does may block it)."""
    loop = asyncio.get_running_loop()
    lag = LoopLag()
    handler = _SlowSteps(lag)
    asyncio_log = logging.getLogger("asyncio")
    debug, threshold = loop.get_debug(), loop.slow_callback_duration
    loop.set_debug(True)
    loop.slow_callback_duration = step_threshold_s
    asyncio_log.addHandler(handler)

    async def wake() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(PROBE_INTERVAL_S)
            lag.longest_delay_s = max(lag.longest_delay_s, time.monotonic() - before - PROBE_INTERVAL_S)
            lag.wakeups += 1

    prober = asyncio.ensure_future(wake())
    try:
        yield lag
    finally:
        prober.cancel()
        asyncio_log.removeHandler(handler)
        loop.set_debug(debug)
        loop.slow_callback_duration = threshold


_SUM = re.compile(r"What is (\d+) \+ (\d+)\?")


def arithmetic(conversation: Conversation) -> Reply:
    """The scripted policy of the adapter tests: it adds correctly, cannot multiply (so a product task
    scores 0.0), and otherwise plays the shell-arithmetic script the agent CLIs were measured with."""
    match = _SUM.search(conversation.last_user_text)
    if match:
        return Reply(text=str(int(match.group(1)) + int(match.group(2))))
    if "*" in conversation.last_user_text and "echo" not in conversation.last_user_text:
        return Reply(text="I cannot multiply.")
    return shell_arithmetic(conversation)
