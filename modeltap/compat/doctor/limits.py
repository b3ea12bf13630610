"""Rules on the run's limits: AReaL's token cap against the backend's window (engine-max-tokens), the
micro-batches against the longest trajectory (micro-batches), and AReaL's wait against the longest
episode (request-timeout).

Owns: those three rules. Does not own: where the cap and the window are read from (`Context.engine`),
modeltap's own budget (proxy.py), reading the bundle (the caller's `bundle_tasks`).
"""

from __future__ import annotations

import math

from modeltap.compat.doctor.config import Unresolved
from modeltap.compat.doctor.context import (
    AREAL_HIDDEN_TOTAL_CAP,
    SGLANG_WINDOW_MARGIN,
    Context,
    Finding,
    Severity,
    Workflow,
    as_float,
    as_int,
    override,
)

# rollout.request_timeout's default (docs/areal.md §5.1).
DEFAULT_REQUEST_TIMEOUT_S = 3600.0
# What a rollout spends outside the task's own timeout: session start, container start, scoring,
# export. A margin, not a measurement.
REQUEST_TIMEOUT_MARGIN_S = 300.0
# How AReaL answers a prompt past its cap or the backend's window (docs/areal.md §4.1).
_REFUSAL = (
    'An over-long prompt then comes back to the agent as HTTP 500 ("max_new_tokens (X) is '
    'non-positive!" from the cap, or "Failed after N retries ... /generate" once the backend has '
    "refused it request_retries times), never as the 400 context_length_exceeded agents compact on."
)


def engine_max_tokens(ctx: Context) -> list[Finding]:
    """AReaL's engine_max_tokens against the backend's context window.

    It must stay below the window (docs/areal.md §4.1, §5.1–§5.2; docs/token-budgets.md §1.1, §7).
    AReaL never compares the two; unset, a hidden 32768 cap applies."""
    if not ctx.uses_agent_proxy:
        return []
    limits = ctx.engine
    path, limit, window_path, window = limits.path, limits.configured, limits.window_path, limits.window
    unset = f"engine_max_tokens is unset, so AReaL caps every request at a hidden {AREAL_HIDDEN_TOTAL_CAP}"
    if window is None:  # null: the backend takes the window from the model's config.json
        if limit is not None:
            return []
        why = f"{window_path} is null, so the window comes from the model's config.json. {_REFUSAL}"
        return [Finding("warning", path, unset, why, f"++{path}=CONTEXT_LENGTH_MINUS_{limits.margin}")]
    if limit is not None and limit == limits.target:
        return []
    fix = override(path, limits.target)
    if limit is None:
        why = (
            f"AReaL 2.0+ caps prompt + completion at {AREAL_HIDDEN_TOTAL_CAP} when engine_max_tokens is "
            f"unset (earlier versions do not cap at all); {window_path} is {window}. {_REFUSAL}"
        )
        return [Finding("error", path, unset, why, fix)]
    if limit >= window:
        title = f"engine_max_tokens ({limit}) is not below {window_path} ({window})"
        why = (
            f"AReaL passes prompts of up to engine_max_tokens - 1 tokens to the backend and never checks "
            f"them against {window_path}. {_REFUSAL}"
        )
        return [Finding("error", path, title, why, fix)]
    title = f"engine_max_tokens ({limit}) leaves no room for SGLang's scheduler margin"
    why = (
        f"SGLang's scheduler refuses a prompt of {window_path} - {SGLANG_WINDOW_MARGIN} tokens or more "
        f"(max_req_input_len = C - 1 - 5), yet AReaL passes prompts of up to {limit - 1} tokens."
    )
    return [Finding("warning", path, title, why, fix)]


def micro_batches(ctx: Context) -> list[Finding]:
    """The micro-batch size against the longest trajectory.

    A sequence of up to engine_max_tokens tokens has to fit one micro-batch (MicroBatchSpec in AReaL's
    areal/api/cli_args.py)."""
    if not ctx.uses_agent_proxy:
        return []
    longest = ctx.engine.longest
    findings = []
    for role in ("actor", "ref", "critic"):
        path = f"{role}.mb_spec.max_tokens_per_mb"
        per_mb = as_int(ctx.config.get(path), path)
        if per_mb is None or per_mb >= longest:
            continue
        why = (
            f"One trajectory can hold up to {longest} tokens (engine_max_tokens, prompt plus completion), "
            f"and AReaL packs whole sequences into micro-batches of at most max_tokens_per_mb = {per_mb} "
            "tokens: a longer one fits none, and the train step fails after its rollouts' GPU time is spent."
        )
        title = f"{role}'s micro-batches ({per_mb} tokens) are smaller than one trajectory ({longest})"
        findings.append(Finding("error", path, title, why, override(path, longest)))
    return findings


def request_timeout(ctx: Context) -> list[Finding]:
    """rollout.request_timeout against the longest episode.

    Past it AReaL's controller stops waiting and counts the sample rejected while the agent keeps
    running (docs/areal.md §4.3)."""
    limits = [limit for w in ctx.workflows if w.is_modeltap for limit in _run_limits(ctx, w)]
    if not limits:
        return []
    longest = max(limits)
    path = "rollout.request_timeout"
    timeout = as_float(ctx.config.get(path, DEFAULT_REQUEST_TIMEOUT_S), path)
    needed = longest[0] + REQUEST_TIMEOUT_MARGIN_S
    if timeout is None or timeout >= needed:
        return []
    why = (
        f"{longest[1]} may run {longest[0]:g} s, plus about {REQUEST_TIMEOUT_MARGIN_S:g} s of "
        f"session and container start, scoring and export; AReaL waits {timeout:g} s, then counts the "
        "sample rejected while the agent keeps running, so the episode's GPU time is spent for nothing."
    )
    severity: Severity = "error" if timeout < longest[0] else "warning"
    title = f"rollout.request_timeout ({timeout:g} s) is shorter than the longest episode"
    return [Finding(severity, path, title, why, override(path, math.ceil(needed)))]


def _run_limits(ctx: Context, workflow: Workflow) -> list[tuple[float, str]]:
    """How long each run of a modeltap workflow may last, and what it is: `timeout_s` replaces the
    tasks' own limits (AgentWorkflow); else each chosen task's. A bundle that cannot be read stops the
    rule (`Unresolved` at the bundle's path, where the workflow rule reports what is wrong with it)."""
    kwargs = workflow.kwargs_key
    timeout = as_float(ctx.config.get(f"{kwargs}.timeout_s"), f"{kwargs}.timeout_s")
    if timeout is not None:
        return [(timeout, f"Every run ({kwargs}.timeout_s)")]
    bundle = ctx.config.get(f"{kwargs}.bundle")
    if ctx.bundle_tasks is None or not isinstance(bundle, str) or not bundle:
        return []
    tasks = ctx.tasks(bundle)
    if not isinstance(tasks, dict):
        raise Unresolved(f"{kwargs}.bundle", f"the bundle {bundle} could not be read: {tasks}")
    chosen = ctx.config.get(f"{kwargs}.tasks") or list(tasks)
    return [(tasks[t], f"Task {t!r}") for t in chosen if t in tasks]
