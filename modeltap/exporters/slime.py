"""`modeltap export --format slime`: a session's stretches as slime's rollout `Sample`s.

Owns: one stretch as one JSON line in the shape of slime's `Sample.to_dict()` (`slime/utils/types.py`,
https://github.com/THUDM/slime): `tokens` (prompt and response ids), `response_length` (the ids after
the model's first), `loss_mask` and `rollout_log_probs` over the response only (0.0 where the engine
gave none), `reward`, `weight_versions` (one per turn the engine reported one for, as slime appends
them), `status` from the last turn's finish reason (`completed`, `truncated`, `aborted`), `session_id`
and `metadata` with where the line came from. `Sample.from_dict(line)` takes it. Does not own the
stretches (tokens.py).

    for stretch in stretches(reader, "s-3f2a", final_id):
        print(json.dumps(slime_line(stretch)))
"""

from __future__ import annotations

from typing import Any

from modeltap.exporters.tokens import Stretch

# slime's Sample.Status by the last turn's finish reason as the record keeps it, in the client's format
# (slime's `update_from_meta_info` reads SGLang's: stop -> completed, length -> truncated, abort ->
# aborted); a reply that called tools ended on its own too. Anything else is aborted.
_STATUS = {
    "stop": "completed",
    "tool_calls": "completed",
    "end_turn": "completed",
    "tool_use": "completed",
    "stop_sequence": "completed",
    "length": "truncated",
    "max_tokens": "truncated",
}


def slime_line(stretch: Stretch) -> dict[str, Any]:
    """One stretch as a slime `Sample`'s dict."""
    return {
        "tokens": stretch.input_ids,
        "response_length": len(stretch.response_ids),
        "loss_mask": stretch.response_mask,
        "rollout_log_probs": stretch.response_logprobs,
        "reward": stretch.reward,
        "weight_versions": [version for version in stretch.weight_versions if version is not None],
        "status": _STATUS.get(stretch.finish_reason or "", "aborted"),
        "session_id": stretch.session_id,
        "metadata": {
            "stretch": stretch.index,
            "turns": stretch.turns,
            "source": stretch.source,
            "labels": stretch.labels,
            "break_after": stretch.break_after,
        },
    }
