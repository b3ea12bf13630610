"""Listings for a terminal: sessions one per line, label groups one per line, and a rollout's outcome.

Owns: the text of `modeltap sessions` (with REWARD and OUTCOME, and STORE when several stores are
read), of `modeltap groups` (sessions, mean reward, each outcome's share, mean turns and tokens) and
the rollout lines `show` and `diff` print at the top. Does not own: which rows (records/query.py,
records/stores.py) or a session's turns (show.py).

    print(sessions_table(stores.sessions(SessionQuery(limit=50)), with_store=stores.several))
    print(groups_table(stores.groups("task_id")))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modeltap.readers.text import columns, num, short, when
from modeltap.records.exchange import OUTCOMES

# Lines of a run's log that `show` prints under its outcome; the whole tail is in `sessions --json`.
LOG_LINES_SHOWN = 5


def sessions_table(sessions: Sequence[dict[str, Any]], *, with_store: bool = False) -> str:
    """One line per session: id, when it started, turns, tokens, errors, the turn where its token
    history first breaks, reward, outcome, labels (the pseudo-session of exchanges without one: what it
    holds), and the store it is in, with `with_store`."""
    head = (
        "SESSION",
        "STARTED",
        "TURNS",
        "PROMPT",
        "COMPLETION",
        "ERRORS",
        "DRIFT",
        "REWARD",
        "OUTCOME",
        "LABELS",
    )
    rows = [head + (("STORE",) if with_store else ())]
    for s in sessions:
        row = (
            s["id"],
            when(s["first"] or s["created"]),
            str(s["exchanges"]),
            num(s["prompt_tokens"]),
            num(s["completion_tokens"]),
            str(s["errors"] or 0),
            f"#{s['token_drift']['turn']}" if s.get("token_drift") else "-",
            reward_text(s["reward"]),
            s["outcome"] or "-",
            s.get("note") or " ".join(f"{k}={v}" for k, v in s["labels"].items()),
        )
        rows.append(row + ((s["store"],) if with_store else ()))
    return columns(rows)


def groups_table(groups: Sequence[dict[str, Any]]) -> str:
    """One line per group (query.merge_groups): its value, sessions, mean reward, the share of each
    outcome that occurs, mean turns and tokens."""
    if not groups:
        return "no session carries this label"
    seen = {outcome for group in groups for outcome in group["shares"]}
    outcomes = [o for o in OUTCOMES if o in seen] + sorted(seen.difference(OUTCOMES))
    rows = [
        (
            groups[0]["label"].upper(),
            "SESSIONS",
            "MEAN REWARD",
            *(o.upper() for o in outcomes),
            "TURNS",
            "TOKENS",
        )
    ]
    for group in groups:
        shares = [f"{100 * group['shares'][o]:.0f}%" if o in group["shares"] else "-" for o in outcomes]
        rows.append(
            (
                group["value"],
                str(group["sessions"]),
                reward_text(group["mean_reward"]),
                *shares,
                f"{group['mean_turns']:.1f}",
                f"{group['mean_tokens']:.0f}",
            )
        )
    return columns(rows)


def rollout_lines(session: dict[str, Any]) -> list[str]:
    """A rollout's outcome, reward, check scores, duration, exit status and the end of its log; nothing
    for a session that is not a rollout."""
    if session.get("outcome") is None:
        return []
    rollout = session.get("rollout") or {}
    facts = [f"outcome {session['outcome']}", f"reward {reward_text(session['reward'])}"]
    if rollout.get("scores"):
        facts.append("scores " + " ".join(f"{s:g}" for s in rollout["scores"]))
    if rollout.get("duration_s") is not None:
        facts.append(f"{rollout['duration_s']:.1f} s")
    if rollout.get("exit_status") is not None:
        facts.append(f"exit status {rollout['exit_status']}")
    lines = ["rollout: " + "  ".join(facts)]
    log = (rollout.get("log_tail") or "").splitlines()[-LOG_LINES_SHOWN:]
    lines += [f"    log │ {short(line, 100)}" for line in log]
    return lines


def reward_text(reward: float | None) -> str:
    return "-" if reward is None else f"{reward:.3g}"
