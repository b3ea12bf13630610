"""What a rollout came to, for its session's record: one run's end as a RolloutOutcome (outcome,
reward, check scores, duration, the solver's exit status and the tail of the run's log).

Owns: naming how a run ended: scored (a RunResult), failed (RunFailed, or anything unexpected),
timed_out (RunTimedOut), unscored (Unscored), model_fault (ModelFault), cancelled (the caller gave up
on it). Does not own: the failure policy or the reward a failure yields (workflow.py), nor storing
the outcome (the proxy's observers; the record store keeps it in the session's row).

    proxy.report_outcome(session.id, scored(result, duration_s=12.5))
    proxy.report_outcome(session.id, ended(exc, duration_s=3.0, reward=None))
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from modeltap.adapter.runner import AdapterError, ModelFault, RunResult, RunTimedOut, Unscored
from modeltap.records.exchange import Outcome, RolloutOutcome


def scored(result: RunResult, duration_s: float) -> RolloutOutcome:
    """A run whose checks gave it a reward."""
    return RolloutOutcome(
        "scored", result.reward, result.scores, duration_s, result.exit_status, _tail(result.logs)
    )


def ended(exc: BaseException, duration_s: float, reward: float | None) -> RolloutOutcome:
    """A run that ended in `exc`; `reward` is what the trainer got for it (0.0 when it trains as a
    zero, None when the sample was left out)."""
    if isinstance(exc, AdapterError):
        return RolloutOutcome(_kind(exc), reward, (), duration_s, exc.exit_status, _tail(exc.logs))
    kind: Outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
    return RolloutOutcome(kind, reward, (), duration_s, None, f"{type(exc).__name__}: {exc}")


def _kind(exc: AdapterError) -> Outcome:
    if isinstance(exc, ModelFault):
        return "model_fault"
    if isinstance(exc, RunTimedOut):
        return "timed_out"
    if isinstance(exc, Unscored):
        return "unscored"
    return "failed"


def _tail(logs: Sequence[str]) -> str:
    """The run's log as one text; RolloutOutcome keeps its end."""
    return "\n".join(logs)
