"""`modeltap export --format tokens`: a session as the token sequences a trainer trains on.

Owns: cutting a session's main conversation into continuous stretches (a new one starts where the
token history breaks), and writing each as one JSON line: `input_ids` (the stretch's last prompt and
completion), `loss_mask` (1 exactly on the model's own completion ids), `logprobs` (aligned, null
elsewhere), the turns it covers, the session's labels, reward and outcome. docs/token-ids.md §5 has
the format beside AReaL's and Agent Lightning's. Does not own: storing ids or finding breaks
(records/token_store.py, records/continuity.py), choosing the session's final conversation
(messages.py's rule, shared with `--format messages`).

The main conversation is the chain of turns that the final exchange continues, back to its first
turn: side requests (an agent's title request, a compaction) are other chains and are left out, as
`--format messages` leaves them out.

    for line in token_lines(reader, "s-3f2a"):
        print(json.dumps(line))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from modeltap.records.reader import StoreReader

FORMAT = "modeltap.tokens"
# Each line says which format it is in; a reader checks it before trusting the fields.
FORMAT_VERSION = 1
# Session columns a rollout adds (its reward and outcome), carried when the store has them.
_ROLLOUT_FIELDS = ("reward", "outcome")


def token_lines(reader: StoreReader, session_id: str, final_exchange_id: str) -> Iterator[dict[str, Any]]:
    """The lines of session `session_id` whose main conversation ends at exchange `final_exchange_id`,
    oldest stretch first. Raises ValueError when that exchange has no token ids."""
    turns = {turn["exchange_id"]: turn for turn in reader.token_turns(session_id) if turn["source"]}
    if final_exchange_id not in turns:
        raise ValueError(
            f"session {session_id} has no token ids for its final exchange: record with `serve --token-ids`"
        )
    session = reader.session(session_id) or {}
    stretches = _stretches(turns, final_exchange_id)
    for index, stretch in enumerate(stretches):
        following = stretches[index + 1][0]["drift"] if index + 1 < len(stretches) else None
        yield _line(reader, session, index, stretch, following)


def _stretches(turns: dict[str, dict[str, Any]], final: str) -> list[list[dict[str, Any]]]:
    """The chain of turns ending at `final`, cut where a turn's prompt does not extend the one before."""
    chain = [turns[final]]
    while chain[-1]["continues"] in turns:
        chain.append(turns[chain[-1]["continues"]])
    chain.reverse()
    stretches: list[list[dict[str, Any]]] = []
    for turn in chain:
        if not stretches or turn["drift"] is not None or turn["continues"] is None:
            stretches.append([])
        stretches[-1].append(turn)
    return stretches


def _line(
    reader: StoreReader,
    session: dict[str, Any],
    index: int,
    stretch: list[dict[str, Any]],
    following: dict[str, Any] | None,
) -> dict[str, Any]:
    input_ids = reader.token_sequence(stretch[-1]["sequence_node"])
    loss_mask = [0] * len(input_ids)
    logprobs: list[float | None] = [None] * len(input_ids)
    for turn in stretch:
        start, completion = turn["prompt_length"], reader.token_completion(turn)
        # The model's own ids: an end-of-turn token the next prompt renders otherwise stays as sampled.
        input_ids[start : start + len(completion)] = completion
        loss_mask[start : start + len(completion)] = [1] * len(completion)
        sampled = reader.token_logprobs(turn)
        if sampled is not None:
            logprobs[start : start + len(sampled)] = sampled
    sources = sorted({turn["source"] for turn in stretch})
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "session_id": session.get("id"),
        "stretch": index,
        "turns": [turn["turn"] for turn in stretch],
        "exchange_ids": [turn["exchange_id"] for turn in stretch],
        "source": sources[0] if len(sources) == 1 else "mixed",
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "logprobs": logprobs if any(value is not None for value in logprobs) else None,
        "labels": session.get("labels") or {},
        **{field: session.get(field) for field in _ROLLOUT_FIELDS},
        "break_after": following,
    }
