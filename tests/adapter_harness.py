"""An AReaL-shaped driver for the adapter's tests: what OpenAIProxyWorkflow does around an inline agent.

Owns: the per-sample protocol of docs/areal.md §3.1-§3.4, spoken over HTTP to
an AReaL proxy (the stand-in in tests/standins/areal.py): resolve the workflow from its import-path
string with workflow_kwargs (a new instance per submit, §3.3), grant capacity, start a session, await
`run(data, base_url=…, api_key=…, http_client=…)`, check the reward is a float, set it on the last
interaction, end the session and export. Failures follow either an AReaL that asks the agent's
should_reject_failed_sample (`hook=True`: it decides per sample; a sample it keeps trains as reward 0;
no AReaL release does yet) or AReaL as it is, 1.0.4 to main (`hook=False`: gather without
return_exceptions, so one exception fails the whole batch).
Does not own: the AReaL server (tests/standins) or the scripted model's replies (`arithmetic` here).

    samples = await run_samples(areal.url, areal.admin_key, "modeltap.adapter.AgentWorkflow",
                                {"bundle": path, "runner": "local"}, [row, row, other_row])
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import re
import sys
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar

import aiohttp

from modeltap.adapter import AgentWorkflow
from tests.standins.script import Conversation, Reply, shell_arithmetic

T = TypeVar("T")
# AReaL's rollout client waits up to an hour for an episode (rollout.request_timeout, docs/areal.md §4.3).
REQUEST_TIMEOUT_S = 3600.0
# What the adapter must never run on the caller's thread (AReaL's event loop): each blocks it. Python
# functions by the file that holds them, C functions by module and name.
BLOCKING_FILES = (
    "site-packages/docker/",
    "site-packages/requests/",
    "site-packages/urllib3/",
    "/subprocess.py",
    "/modeltap/adapter/sandbox.py",
    "/modeltap/adapter/docker_sandbox.py",
    "/modeltap/adapter/local_sandbox.py",
)
BLOCKING_C_CALLS = {("time", "sleep"), ("posix", "waitpid"), ("posix", "read")}


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


# How long a cancelled run may take to return. Only a hang exceeds it (the swept runs' own limit is
# 600 s); what it takes is milliseconds for a local run, a container removal for a docker one.
CANCEL_SETTLES_WITHIN_S = 15.0


class CancelAt:
    """Cancels the caller of a run at the run's k-th suspension, deterministically.

    `drive(coro)` runs `coro` as its task would; when `coro` suspends for the k-th time, the caller's
    task is cancelled on the caller's loop and `coro` is held at that await until the cancellation
    has crossed back to the task; then what `coro` awaited is cancelled and CancelledError thrown in
    there, as the task would have done. So the cancel lands at await point k whatever the threads'
    timing; `reached` says whether the run had a k-th suspension at all.

        cut = CancelAt(k)
        monkeypatch.setattr(AgentWorkflow, "_play", cut.wrapping(AgentWorkflow._play))
        caller = cut.aim(asyncio.ensure_future(workflow.run(...)))
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.suspensions = 0
        self.reached = False
        self._caller: asyncio.Future[Any] | None = None
        self._caller_loop: asyncio.AbstractEventLoop | None = None

    def aim(self, caller: asyncio.Future[T]) -> asyncio.Future[T]:
        """The caller to cancel: a task on the running loop."""
        self._caller, self._caller_loop = caller, asyncio.get_running_loop()
        return caller

    def wrapping(self, method: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.drive(method(*args, **kwargs))

    @types.coroutine
    def drive(self, coro: Coroutine[Any, Any, Any]) -> Generator[Any, Any, Any]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                awaited = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                return stop.value
            self.suspensions += 1
            value, error = None, None
            if self.suspensions == self.k:
                self.reached = True
                assert self._caller is not None and self._caller_loop is not None, "aim() first"
                self._caller_loop.call_soon_threadsafe(self._caller.cancel)
                hold = asyncio.get_running_loop().create_future()
                try:
                    yield from hold  # only the caller's cancellation ends this
                except asyncio.CancelledError as exc:
                    if isinstance(awaited, asyncio.Future):
                        awaited.cancel()
                    error = exc
                    continue
                raise AssertionError("the held await resumed without a cancellation")
            try:
                value = yield awaited
            except BaseException as exc:  # handed to `coro`, as the task would
                error = exc


async def cancel_at_every_await(
    play: Callable[[], Awaitable[float]],
    nothing_left: Callable[[int], Awaitable[None]],
    monkeypatch: Any,
) -> int:
    """Cancel the caller of `play()` (a call of AgentWorkflow.run) at its run's first suspension, then
    its second, and so on until a run ends before it is cut; after each cut, check the caller got the
    CancelledError and `nothing_left(k)`. Returns how many await points were cut."""
    original = AgentWorkflow._play
    k = 0
    while True:
        k += 1
        cut = CancelAt(k)
        monkeypatch.setattr(AgentWorkflow, "_play", cut.wrapping(original))
        caller = cut.aim(asyncio.ensure_future(play()))
        done, _ = await asyncio.wait({caller}, timeout=CANCEL_SETTLES_WITHIN_S)
        monkeypatch.setattr(AgentWorkflow, "_play", original)
        assert done, f"cut at await {k}: the run had not returned {CANCEL_SETTLES_WITHIN_S} s after"
        if not cut.reached:
            assert caller.result() == 1.0
            return k - 1
        assert caller.cancelled(), f"cut at await {k}: {caller!r}"
        await nothing_left(k)


@contextlib.contextmanager
def blocking_calls_probe() -> Iterator[list[str]]:
    """Every blocking call made on this thread (the caller's event loop, AReaL's in the adapter's
    tests) while the block runs: docker and HTTP-client code, subprocesses, sleeps, SQLite. A
    per-thread profiler sees each call, so the check does not depend on how loaded the machine is."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and any(part in frame.f_code.co_filename for part in BLOCKING_FILES):
            if not _finalizing(frame):
                seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call":
            module, name = getattr(arg, "__module__", None) or "", getattr(arg, "__name__", "")
            if (module, name) in BLOCKING_C_CALLS or module.startswith("sqlite3") or "sqlite3" in repr(arg):
                seen.append(f"{module}.{name}")

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _finalizing(frame: FrameType | None) -> bool:
    """Whether `frame` runs under an object's finalizer: the garbage collector runs those on whichever
    thread it collects from, so a subprocess finished on the adapter's own loop may be finalised here
    (`Popen.__del__` only polls, without blocking). Not work the caller's loop was given."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


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
