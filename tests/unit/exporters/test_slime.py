"""modeltap/exporters/slime.py: a session's stretches as slime's Sample dicts: all the ids, the mask and
logprobs over the response, the weight versions the engine reported, the status its last finish
reason says."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from modeltap.exporters.export import write_export
from modeltap.records.reader import StoreReader
from tests.factories import recorded
from tests.standins import token_engine as te
from tests.token_sessions import TOOLS, served_turn, tool_session


def exported(store: Path) -> list[dict[str, Any]]:
    out = io.StringIO()
    with StoreReader(store) as reader:
        write_export(reader, "s", "slime", out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


async def test_a_sample_holds_every_id_and_the_response_mask(tmp_path: Path) -> None:
    histories, replies = tool_session()
    versions = ["v1", None, "v2"]
    turns = [
        served_turn(h, r, session_id="s", weight_version=v)
        for h, r, v in zip(histories, replies, versions, strict=True)
    ]
    [sample] = exported(await recorded(tmp_path / "r.db", *turns))
    prompt = te.render(histories[0], TOOLS)
    assert sample["response_length"] == len(sample["tokens"]) - len(prompt)
    assert len(sample["loss_mask"]) == sample["response_length"] and sample["loss_mask"][0] == 1
    assert sample["tokens"][: len(prompt)] == prompt
    # One per turn the engine reported a version for, in order, as slime appends them.
    assert sample["weight_versions"] == ["v1", "v2"]
    assert sample["status"] == "completed" and sample["session_id"] == "s"
    assert sample["rollout_log_probs"] is None and sample["metadata"]["turns"] == [1, 2, 3]


@pytest.mark.parametrize(
    ("finish", "status"), [("length", "truncated"), ("stop", "completed"), ("abort", "aborted")]
)
async def test_the_status_is_the_last_turns_finish(tmp_path: Path, finish: str, status: str) -> None:
    histories, replies = tool_session()
    turns = [served_turn(h, r, session_id="s") for h, r in zip(histories[:2], replies[:2], strict=True)]
    last = served_turn(histories[2], replies[2], session_id="s", finish_reason=finish)
    [sample] = exported(await recorded(tmp_path / "r.db", *turns, last))
    assert sample["status"] == status
