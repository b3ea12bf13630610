"""modeltap/exporters/verl.py: a session's stretches as verl's AgentLoopOutput fields, the same ids and
mask as modeltap's own line, split where the model's first id is."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from modeltap.exporters.export import write_export
from modeltap.records.exchange import RolloutOutcome
from modeltap.records.reader import StoreReader
from modeltap.testing import session_event
from tests.factories import recorded
from tests.standins import token_engine as te
from tests.token_sessions import TOOLS, served_turn, tool_session


async def session_store(tmp_path: Path, **first: Any) -> Path:
    histories, replies = tool_session()
    turns = [
        served_turn(h, r, session_id="s", logprobs=True, **(first if n == 0 else {}))
        for n, (h, r) in enumerate(zip(histories, replies, strict=True))
    ]
    outcome = session_event("outcome", "s", outcome=RolloutOutcome("scored", reward=0.75))
    return await recorded(tmp_path / "r.db", *turns, outcome)


def exported(store: Path, fmt: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with StoreReader(store) as reader:
        write_export(reader, "s", fmt, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_a_stretch_is_prompt_then_response_with_the_models_ids_masked(tmp_path: Path) -> None:
    store = await session_store(tmp_path)
    [ours] = exported(store, "tokens")
    [line] = exported(store, "verl")
    first_prompt = te.render(tool_session()[0][0], TOOLS)
    assert line["prompt_ids"] == first_prompt
    assert line["prompt_ids"] + line["response_ids"] == ours["input_ids"]
    assert line["response_mask"] == ours["loss_mask"][len(first_prompt) :]
    assert line["response_mask"][0] == 1 and set(line["response_mask"]) == {0, 1}
    # verl pads logprobs with 0.0 where the model sampled nothing (tool results, the template's text).
    assert len(line["response_logprobs"]) == len(line["response_ids"])
    for mask, logprob, ours_logprob in zip(
        line["response_mask"], line["response_logprobs"], ours["logprobs"][len(first_prompt) :], strict=True
    ):
        assert logprob == (ours_logprob if mask else 0.0)
    assert line["reward_score"] == 0.75
    assert line["extra_fields"]["turns"] == [1, 2, 3] and line["extra_fields"]["source"] == "served"


async def test_without_logprobs_there_are_none(tmp_path: Path) -> None:
    histories, replies = tool_session()
    store = await recorded(
        tmp_path / "r.db",
        *(served_turn(h, r, session_id="s") for h, r in zip(histories, replies, strict=True)),
    )
    [line] = exported(store, "verl")
    assert line["response_logprobs"] is None and line["reward_score"] is None
