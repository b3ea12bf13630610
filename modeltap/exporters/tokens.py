"""`modeltap export --format tokens`: a session as the token sequences a trainer trains on.

Owns: cutting a session's main conversation into continuous stretches (a new one starts where the
token history breaks) as `Stretch`es, which every token format reads (verl.py, slime.py), and
modeltap's own line of one: `input_ids` (the stretch's last prompt and completion), `loss_mask` (1
exactly on the model's own completion ids), `logprobs` (aligned, null elsewhere), the turns it covers
with their weight versions and seeds, the session's labels, reward and outcome. docs/token-ids.md §5
has the format beside AReaL's, verl's and slime's. Does not own: storing ids or finding breaks
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
from dataclasses import dataclass
from typing import Any

from modeltap.records.reader import StoreReader

FORMAT = "modeltap.tokens"
# Each line says which format it is in; a reader checks it before trusting the fields. 2: a rendered
# turn's mask covers only what its reply's text encodes to, and each turn's weight version and seed.
FORMAT_VERSION = 2


@dataclass(frozen=True, slots=True)
class Stretch:
    """One continuous stretch of a session's main conversation, as every token format reads it: the
    ids of its last prompt and completion, the mask (1 exactly on the model's own ids) and logprobs
    aligned with them, where the model's first id is (`prompt_length`: what the first turn's prompt
    holds), per turn its number, exchange, ids' source, weight version and seed, the last turn's
    finish reason, the session's labels, reward and outcome, and the break that ends it."""

    session_id: str
    index: int
    turns: list[int]
    exchange_ids: list[str]
    sources: list[str]
    weight_versions: list[str | None]
    seeds: list[int | None]
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None] | None
    prompt_length: int
    finish_reason: str | None
    labels: dict[str, str]
    reward: float | None
    outcome: str | None
    break_after: dict[str, Any] | None

    @property
    def response_ids(self) -> list[int]:
        """The ids from the model's first on: its own, and what came between its turns."""
        return self.input_ids[self.prompt_length :]

    @property
    def response_mask(self) -> list[int]:
        """`loss_mask` over `response_ids`."""
        return self.loss_mask[self.prompt_length :]

    @property
    def response_logprobs(self) -> list[float] | None:
        """`logprobs` over `response_ids`, 0.0 where there is none (as trainers pad them), or None."""
        if self.logprobs is None:
            return None
        return [value if value is not None else 0.0 for value in self.logprobs[self.prompt_length :]]

    @property
    def source(self) -> str:
        """ "served", "built" or "rendered" when every turn's ids are of one kind, else "mixed"."""
        kinds = set(self.sources)
        return kinds.pop() if len(kinds) == 1 else "mixed"


def stretches(reader: StoreReader, session_id: str, final_exchange_id: str) -> Iterator[Stretch]:
    """The stretches of session `session_id` whose main conversation ends at exchange
    `final_exchange_id`, oldest first. Raises ValueError when that exchange has no token ids."""
    turns = {turn["exchange_id"]: turn for turn in reader.token_turns(session_id) if turn["source"]}
    if final_exchange_id not in turns:
        raise ValueError(
            f"session {session_id} has no token ids for its final exchange: record with `serve --token-ids`"
        )
    session = reader.session(session_id) or {}
    chain = _stretches(turns, final_exchange_id)
    for index, stretch in enumerate(chain):
        following = chain[index + 1][0]["drift"] if index + 1 < len(chain) else None
        yield _stretch(reader, session_id, session, index, stretch, following)


def token_lines(reader: StoreReader, session_id: str, final_exchange_id: str) -> Iterator[dict[str, Any]]:
    """The session's stretches as modeltap's own lines (docs/token-ids.md §5)."""
    for stretch in stretches(reader, session_id, final_exchange_id):
        yield line(stretch)


def line(stretch: Stretch) -> dict[str, Any]:
    """One stretch as a `modeltap.tokens` line."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "session_id": stretch.session_id,
        "stretch": stretch.index,
        "turns": stretch.turns,
        "exchange_ids": stretch.exchange_ids,
        "source": stretch.source,
        "rendered_turns": [
            t for t, source in zip(stretch.turns, stretch.sources, strict=True) if source == "rendered"
        ],
        "input_ids": stretch.input_ids,
        "loss_mask": stretch.loss_mask,
        "logprobs": stretch.logprobs,
        "weight_versions": stretch.weight_versions,
        "seeds": stretch.seeds,
        "labels": stretch.labels,
        "reward": stretch.reward,
        "outcome": stretch.outcome,
        "break_after": stretch.break_after,
    }


def _stretches(turns: dict[str, dict[str, Any]], final: str) -> list[list[dict[str, Any]]]:
    """The chain of turns ending at `final`, cut where a turn's prompt does not extend the one before."""
    chain = [turns[final]]
    while chain[-1]["continues"] in turns:
        chain.append(turns[chain[-1]["continues"]])
    chain.reverse()
    cut: list[list[dict[str, Any]]] = []
    for turn in chain:
        if not cut or turn["drift"] is not None or turn["continues"] is None:
            cut.append([])
        cut[-1].append(turn)
    return cut


def _stretch(
    reader: StoreReader,
    session_id: str,
    session: dict[str, Any],
    index: int,
    stretch: list[dict[str, Any]],
    following: dict[str, Any] | None,
) -> Stretch:
    input_ids = reader.token_sequence(stretch[-1]["sequence_node"])
    loss_mask = [0] * len(input_ids)
    logprobs: list[float | None] = [None] * len(input_ids)
    for turn in stretch:
        start, completion = turn["prompt_length"], reader.token_completion(turn)
        # The model's own ids: an end-of-turn token the next prompt renders otherwise stays as sampled.
        input_ids[start : start + len(completion)] = completion
        # Rendered ids are the model's only where its reply's text encodes (counting/ids.py `mask`).
        mask = turn["mask"] if turn["mask"] is not None else [1] * len(completion)
        loss_mask[start : start + len(completion)] = mask
        sampled = reader.token_logprobs(turn)
        if sampled is not None:
            logprobs[start : start + len(sampled)] = sampled
    reward = session.get("reward")
    outcome = session.get("outcome")
    return Stretch(
        session_id=session_id,
        index=index,
        turns=[turn["turn"] for turn in stretch],
        exchange_ids=[turn["exchange_id"] for turn in stretch],
        sources=[turn["source"] for turn in stretch],
        weight_versions=[turn["weight_version"] for turn in stretch],
        seeds=[turn["seed"] for turn in stretch],
        input_ids=input_ids,
        loss_mask=loss_mask,
        logprobs=logprobs if any(value is not None for value in logprobs) else None,
        prompt_length=stretch[0]["prompt_length"],
        finish_reason=stretch[-1]["finish_reason"],
        labels=session.get("labels") or {},
        reward=reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
        outcome=outcome if isinstance(outcome, str) else None,
        break_after=following,
    )
