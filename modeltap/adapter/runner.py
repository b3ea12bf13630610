"""Plays one task: its agents in one sandbox, its checks, and the reward they add up to.

Owns: the order of a run (sandbox, helpers before, solver, answer, helpers after, checks), each
agent's environment (the solver gets the URL it is handed, every other agent its own endpoint), the
checks and judge calls, the score, and the failures a run can end in. Does not own: the proxy session
or the records (workflow.py), or how commands execute (sandbox.py).

    AdapterError                  a run that yields no reward; `reason`, the run's `logs`, the solver's
    │                             `exit_status` once it exited
    ├── RunFailed                 the run broke (sandbox, agent exit, judge down): leave it out
    │   └── RunTimedOut           the run (its solver, a helper or a check) went past its time limit
    ├── Unscored                  the run ended but its checks recorded no score: leave it out
    └── ModelFault                the model was at fault (context overflow, unparseable tool call):
                                  train on it as reward 0
"""

from __future__ import annotations

import asyncio
import json
import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from modeltap import dialects
from modeltap.adapter.bundle import Agent, Check, Helper, Judge, Mount, Task, Template
from modeltap.adapter.sandbox import ExecResult, Sandbox, SandboxError, SandboxProvider, SandboxSpec

# What an exception message carries of the run's log: the tail, where the failure is.
MAX_MESSAGE_LOG_CHARS = 6000
# A judge answers one short prompt; two minutes means it is down or overloaded.
JUDGE_TIMEOUT_S = 120.0
# The judge states its score as "SCORE: x" with 0 <= x <= 1; the last such line counts.
JUDGE_SCORE = re.compile(r"SCORE:\s*([01](?:\.\d+)?)\b", re.IGNORECASE)
JUDGE_PROMPT = string.Template(
    "You grade an AI agent's answer to a task.\n\nTask:\n${prompt}\n\nAnswer:\n${answer}\n\n"
    "Rubric:\n${rubric}\n\nEnd your reply with one line `SCORE: x`, where x is a number from 0 to 1."
)
JUDGE_MAX_TOKENS = 1024
# A judge's reply is one short completion. A body past this is something else (a file server at the
# judge's URL, a wrong port) and is not read further: memory towards every peer is bounded.
JUDGE_MAX_REPLY_BYTES = 4 * 1024 * 1024
# The environment variable a command check reads the solver's answer from.
ANSWER_VARIABLE = "MODELTAP_ANSWER"


class AdapterError(Exception):
    """A run that yields no reward. `reason` says why in one line; `logs` is what the run printed;
    `exit_status` the solver's exit code, once it has exited."""

    def __init__(self, reason: str, logs: Sequence[str] = (), exit_status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.logs = logs
        self.exit_status = exit_status

    def __str__(self) -> str:
        log = "\n".join(self.logs)
        if not log:
            return self.reason
        return f"{self.reason}\n--- run log (tail) ---\n{log[-MAX_MESSAGE_LOG_CHARS:]}"


class RunFailed(AdapterError):
    """The run broke: the sandbox failed, an agent exited non-zero or ran out of time, a judge was down."""


class RunTimedOut(RunFailed):
    """The run went past its time limit: its solver, a helper or a command check was still running."""


class Unscored(AdapterError):
    """The run ended, but its checks recorded no score: no answer to read, or a judge gave no score."""


class ModelFault(AdapterError):
    """The run failed because of what the model did (context overflow, a tool call that does not parse),
    so it is a valid, zero-reward sample rather than a broken one."""


@dataclass(frozen=True, slots=True)
class SolverEndpoint:
    """Where the solver's model traffic goes: the proxy session, as a host process and a container
    reach it, and the key to present."""

    host_url: str
    container_url: str | None
    api_key: str


@dataclass(frozen=True, slots=True)
class RunPlan:
    """Everything one run needs, resolved from the bundle before it starts."""

    run_id: str
    task: Task
    solver: Agent
    helpers: tuple[tuple[Helper, Agent], ...]
    judges: Mapping[str, Judge]
    endpoint: SolverEndpoint
    timeout_s: float
    judge_http: aiohttp.ClientSession | None = None
    """The process's one client for judge calls (a pool shared by every run), needed when a check asks
    a judge."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """A scored run: the reward, the answer it was read from, each check's score, the run's log and
    the solver's exit status (0: a solver that exits otherwise fails the run)."""

    reward: float
    answer: str | None
    scores: tuple[float, ...]
    logs: Sequence[str] = field(default=())
    exit_status: int = 0


async def play(plan: RunPlan, provider: SandboxProvider) -> RunResult:
    """Play `plan` in a fresh sandbox, removed before this returns or raises (cancellation included).

    Raises RunFailed or Unscored; never returns without a score.
    """
    spec = SandboxSpec(plan.run_id, plan.solver.image, plan.solver.workdir, _mounts(plan))
    try:
        sandbox = await provider.open(spec)
    except SandboxError as exc:
        raise RunFailed(f"task {plan.task.id!r}: no sandbox: {exc}") from exc
    async with sandbox:
        try:
            async with asyncio.timeout(plan.timeout_s):
                return await _play_in(sandbox, plan)
        except TimeoutError:
            raise RunTimedOut(
                f"task {plan.task.id!r} ran past its {plan.timeout_s:g} s limit", sandbox.logs
            ) from None
        except SandboxError as exc:
            raise RunFailed(f"task {plan.task.id!r}: {exc}", sandbox.logs) from exc
        except AdapterError as exc:
            exc.logs = sandbox.logs  # the same list: what closing the sandbox adds shows up too
            raise


async def _play_in(sandbox: Sandbox, plan: RunPlan) -> RunResult:
    task = plan.task
    for helper, agent in plan.helpers:
        if helper.stage == "before":
            await _run_helper(sandbox, plan, helper, agent)
    solver_url = _solver_url(sandbox, plan)
    result = await _run_agent(sandbox, plan, plan.solver, task.prompt, solver_url, plan.endpoint.api_key)
    if result.exit_code is None:
        raise RunTimedOut(f"task {task.id!r}: the solver {plan.solver.name!r} ran past {plan.timeout_s:g} s")
    if result.exit_code != 0:
        raise RunFailed(
            f"task {task.id!r}: the solver {plan.solver.name!r} exited {result.exit_code}",
            exit_status=result.exit_code,
        )
    try:
        return await _score_run(sandbox, plan, result)
    except AdapterError as exc:
        exc.exit_status = result.exit_code
        raise


async def _score_run(sandbox: Sandbox, plan: RunPlan, result: ExecResult) -> RunResult:
    """After the solver exited 0: its answer, the helpers that come after it, and the checks."""
    task = plan.task
    answer = await _read_answer(sandbox, plan.solver, result)
    for helper, agent in plan.helpers:
        if helper.stage == "after":
            await _run_helper(sandbox, plan, helper, agent)
    scores = tuple([await _score(sandbox, plan, check, answer) for check in task.checks])
    weights = [check.weight for check in task.checks]
    if task.score == "all":
        reward = min(scores)
    else:
        reward = sum(s * w for s, w in zip(scores, weights, strict=True)) / sum(weights)
    sandbox.logs.append(f"task {task.id!r}: scores {list(scores)} -> reward {reward:g}")
    return RunResult(float(reward), answer, scores, sandbox.logs)


def _mounts(plan: RunPlan) -> tuple[Mount, ...]:
    """The solver's mounts and the helpers', once each by target."""
    by_target = {mount.target: mount for _, agent in plan.helpers for mount in agent.mounts}
    by_target.update({mount.target: mount for mount in plan.solver.mounts})
    return tuple(by_target.values())


def _solver_url(sandbox: Sandbox, plan: RunPlan) -> str:
    if sandbox.endpoint_kind == "host":
        return plan.endpoint.host_url
    if plan.endpoint.container_url is None:
        raise RunFailed(
            "the proxy listens on loopback only, which a container cannot reach; give AgentWorkflow "
            "proxy={'host': '0.0.0.0'} (the default) or runner='local'"
        )
    return plan.endpoint.container_url


async def _run_helper(sandbox: Sandbox, plan: RunPlan, helper: Helper, agent: Agent) -> None:
    own = agent.endpoint
    prompt = Template(helper.prompt).substitute(_variables(sandbox, plan, agent, plan.task.prompt, "", ""))
    result = await _run_agent(sandbox, plan, agent, prompt, own.base_url or "", own.api_key or "")
    if result.timed_out:
        raise RunTimedOut(f"task {plan.task.id!r}: helper {agent.name!r} ran past {plan.timeout_s:g} s")
    if result.exit_code != 0:
        raise RunFailed(f"task {plan.task.id!r}: helper {agent.name!r} exited {result.exit_code}")


async def _run_agent(
    sandbox: Sandbox, plan: RunPlan, agent: Agent, prompt: str, base_url: str, api_key: str
) -> ExecResult:
    """Run one agent's command with its endpoint in its environment and the template filled in."""
    url = base_url + agent.endpoint.suffix
    variables = _variables(sandbox, plan, agent, prompt, url, api_key)
    argv = [Template(arg).substitute(variables) for arg in agent.command]
    env = {name: Template(value).substitute(variables) for name, value in agent.env.items()}
    env.update(dict.fromkeys(agent.endpoint.base_url_vars, url))
    env.update(dict.fromkeys(agent.endpoint.api_key_vars, api_key))
    sandbox.logs.append(f"== {agent.name} (run {plan.run_id}) ==")
    return await sandbox.exec(argv, env, plan.timeout_s)


def _variables(
    sandbox: Sandbox, plan: RunPlan, agent: Agent, prompt: str, url: str, key: str
) -> dict[str, str]:
    variables = {
        "prompt": prompt,
        "task_id": plan.task.id,
        "base_url": url,
        "api_key": key,
        "model": agent.endpoint.model or "default",
        "workdir": sandbox.workdir,
        "home": sandbox.home,
    }
    variables.update({f"mount_{mount.name}": sandbox.mount_path(mount) for mount in agent.mounts})
    return variables


async def _read_answer(sandbox: Sandbox, agent: Agent, result: ExecResult) -> str | None:
    """The solver's answer as its `answer` setting says to read it; None when there is none."""
    kind = agent.answer.kind
    if kind == "file":
        data = await sandbox.read_file(agent.answer.path or "")
        return None if data is None else data.decode("utf-8", errors="replace").strip()
    if kind == "opencode-json":
        return _opencode_answer(result.stdout)
    if kind in ("claude-json", "qwen-json"):
        return _result_answer(result.stdout)
    if kind == "codex-json":
        return _codex_answer(result.stdout)
    return result.stdout.strip()


def _result_answer(stdout: str) -> str | None:
    """The `result` of Claude Code's one JSON object, or of the `result` element that ends Qwen Code's
    JSON array (docs/agents.md §4.1, §7.3)."""
    try:
        doc = json.loads(stdout)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if isinstance(doc, list):
        doc = next((e for e in reversed(doc) if isinstance(e, dict) and e.get("type") == "result"), None)
    answer = doc.get("result") if isinstance(doc, dict) else None
    return answer.strip() if isinstance(answer, str) else None


def _codex_answer(stdout: str) -> str | None:
    """The last agent message of `codex exec --json` (one JSON event per line: docs/agents.md §6.3)."""
    answer = None
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            continue
        item = event.get("item") if isinstance(event, dict) else None
        if (
            event.get("type") == "item.completed"
            and isinstance(item, dict)
            and item.get("type") == "agent_message"
        ):
            answer = item.get("text")
    return answer.strip() if isinstance(answer, str) else None


def _opencode_answer(stdout: str) -> str | None:
    """The text of the final step of `opencode run --format json` (one JSON event per line:
    step_start, tool_use, text, step_finish; docs/agents.md §3.4)."""
    texts: list[str] = []
    for line in stdout.splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "step_start":
            texts = []
        part = event.get("part")
        if event.get("type") == "text" and isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "".join(texts).strip() if texts else None


async def _score(sandbox: Sandbox, plan: RunPlan, check: Check, answer: str | None) -> float:
    if check.kind == "command":
        result = await sandbox.exec(check.expected, {ANSWER_VARIABLE: answer or ""}, plan.timeout_s)
        if result.timed_out:
            raise RunTimedOut(f"task {plan.task.id!r}: a command check ran out of time")
        return 1.0 if result.exit_code == 0 else 0.0
    if answer is None:
        raise Unscored(
            f"task {plan.task.id!r}: the solver {plan.solver.name!r} left no answer "
            f"(read from {plan.solver.answer.kind}), so its {check.kind} check cannot score"
        )
    expected = str(check.expected)
    if check.kind == "contains":
        return 1.0 if expected in answer else 0.0
    if check.kind == "exact":
        return 1.0 if answer.strip() == expected.strip() else 0.0
    if check.kind == "regex":
        return 1.0 if re.search(expected, answer, re.MULTILINE) else 0.0
    judge = plan.judges[str(check.judge)]
    if plan.judge_http is None:
        raise RuntimeError(
            f"task {plan.task.id!r} asks judge {judge.name!r}, but the run has no judge client"
        )
    prompt = JUDGE_PROMPT.substitute(prompt=plan.task.prompt, answer=answer, rubric=expected)
    reply = await _ask_judge(plan.judge_http, judge, prompt)
    sandbox.logs.append(f"judge {judge.name}: {reply[-2000:]}")
    scores = JUDGE_SCORE.findall(reply)
    if not scores:
        raise Unscored(f"task {plan.task.id!r}: judge {judge.name!r} replied without a SCORE line")
    return min(float(scores[-1]), 1.0)


async def _bounded_text(response: aiohttp.ClientResponse, judge: Judge) -> str:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > JUDGE_MAX_REPLY_BYTES:
            raise RunFailed(
                f"judge {judge.name!r} answered more than {JUDGE_MAX_REPLY_BYTES} bytes, which no judge's "
                "reply is; check its base_url"
            )
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


# A judge's `api` -> (the format it speaks, what its base URL is joined with: OpenAI-style base URLs
# end in /v1 already, Anthropic-style ones do not).
_JUDGE_APIS = {"openai": ("chat", "/"), "anthropic": ("messages", "/v1/")}


async def _ask_judge(client: aiohttp.ClientSession, judge: Judge, prompt: str) -> str:
    """One judge call, straight to the judge's own endpoint (never through the proxy)."""
    name, join = _JUDGE_APIS[judge.api]
    dialect = dialects.named(name)
    url = judge.base_url.rstrip("/") + join + dialect.route
    messages = [{"role": "user", "content": prompt}]
    body: dict[str, object] = {"model": judge.model, "messages": messages, "max_tokens": JUDGE_MAX_TOKENS}
    headers = {"content-type": "application/json", **dialect.request_headers}
    if judge.api_key:
        headers.update(dialect.credential_headers(judge.api_key))
    timeout = aiohttp.ClientTimeout(total=JUDGE_TIMEOUT_S)
    try:
        async with client.post(url, json=body, headers=headers, timeout=timeout) as r:
            text = await _bounded_text(r, judge)
            if r.status != 200:
                raise RunFailed(f"judge {judge.name!r} answered {r.status}: {text[:500]}")
            doc = json.loads(text)
    except (aiohttp.ClientError, TimeoutError, ValueError, RecursionError) as exc:  # RecursionError: "[[[…"
        raise RunFailed(f"judge {judge.name!r} at {url} failed: {exc!r}") from exc
    reply = dialect.read(doc)[1] if isinstance(doc, dict) else None
    if reply is None:
        raise RunFailed(f"judge {judge.name!r} sent a reply of an unexpected shape: {str(doc)[:500]}")
    return reply
