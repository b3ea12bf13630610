"""`modeltap export --format verl`: a session's stretches as verl's agent loop hands trajectories to
its trainer.

Owns: one stretch as one JSON line in the fields of verl's `AgentLoopOutput`
(`verl/experimental/agent_loop/agent_loop.py`, https://github.com/volcengine/verl): `prompt_ids` (the
ids before the model's first), `response_ids` (everything after them: the model's ids and the tool
results and messages between its turns), `response_mask` (1 on the model's own ids, 0 on the rest),
`response_logprobs` (0.0 where the engine gave none, as verl pads them), `reward_score`, and
`extra_fields` with where the line came from. An `AgentLoopOutput(**line)` takes it once its
`metrics` are added. Does not own the stretches (tokens.py).

    for stretch in stretches(reader, "s-3f2a", final_id):
        print(json.dumps(verl_line(stretch)))
"""

from __future__ import annotations

from typing import Any

from modeltap.exporters.tokens import Stretch


def verl_line(stretch: Stretch) -> dict[str, Any]:
    """One stretch as a verl `AgentLoopOutput`'s fields."""
    return {
        "prompt_ids": stretch.input_ids[: stretch.prompt_length],
        "response_ids": stretch.response_ids,
        "response_mask": stretch.response_mask,
        "response_logprobs": stretch.response_logprobs,
        "reward_score": stretch.reward,
        "extra_fields": {
            "session_id": stretch.session_id,
            "stretch": stretch.index,
            "turns": stretch.turns,
            "source": stretch.source,
            "weight_versions": stretch.weight_versions,
            "labels": stretch.labels,
        },
    }
