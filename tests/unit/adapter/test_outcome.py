"""modeltap/adapter/outcome.py: how a run ended, named for its session's record."""

from __future__ import annotations

import asyncio

import pytest

from modeltap.adapter.outcome import ended, scored
from modeltap.adapter.runner import ModelFault, RunFailed, RunResult, RunTimedOut, Unscored
from modeltap.records.exchange import LOG_TAIL_MAX_CHARS


def test_a_scored_run_keeps_its_reward_scores_exit_status_and_log() -> None:
    result = RunResult(0.5, "42", (1.0, 0.0), ["== sdk ==", "scores [1.0, 0.0] -> reward 0.5"])
    outcome = scored(result, duration_s=12.5)
    assert (outcome.outcome, outcome.reward, outcome.scores, outcome.exit_status) == (
        "scored",
        0.5,
        (1.0, 0.0),
        0,
    )
    assert outcome.duration_s == 12.5 and outcome.log_tail == "== sdk ==\nscores [1.0, 0.0] -> reward 0.5"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (RunFailed("the solver exited 3", ["boom"], exit_status=3), "failed"),
        (RunTimedOut("ran past its 60 s limit", ["slow"]), "timed_out"),
        (Unscored("no SCORE line", exit_status=0), "unscored"),
        (ModelFault("context overflowed", exit_status=1), "model_fault"),
        (asyncio.CancelledError(), "cancelled"),
        (OSError("disk full"), "failed"),
    ],
)
def test_each_way_a_run_ends_has_its_outcome(exc: BaseException, kind: str) -> None:
    outcome = ended(exc, duration_s=3.0, reward=None)
    assert outcome.outcome == kind and outcome.reward is None and outcome.duration_s == 3.0
    assert outcome.exit_status == getattr(exc, "exit_status", None)
    if isinstance(exc, OSError):
        assert outcome.log_tail == "OSError: disk full"


def test_the_log_keeps_its_end() -> None:
    logs = [f"line {n}" for n in range(2000)]
    outcome = ended(RunFailed("x", logs), duration_s=1.0, reward=None)
    assert len(outcome.log_tail) == LOG_TAIL_MAX_CHARS and outcome.log_tail.endswith("line 1999")
