"""modeltap/readers/stats.py: finish reasons, error classes and token percentiles per value of a label,
read from the exchanges' summary columns only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modeltap.readers.stats import percentile, stats, stats_table
from modeltap.records.query import SessionQuery
from modeltap.records.reader import StoreReader
from modeltap.records.stores import Stores
from modeltap.testing import exchange
from tests.factories import ASK, assistant, recorded, rollout, tool_call


def bash(call_id: str) -> dict[str, Any]:
    return assistant(None, tool_call(call_id, "bash", '{"command": "ls"}'))


async def store(tmp_path: Path) -> Path:
    timeout = exchange(
        {"model": "m", "messages": [ASK]},
        None,
        status=504,
        error_class="upstream_timeout",
        error_message="no byte for 300 s",
        session_id="s-a2",
        labels={"task_id": "a"},
        started=50.0,
    )
    return await recorded(
        tmp_path / "r.db",
        # rollout() answers turn k with usage (100 + 10k prompt, 5 completion)
        *rollout("s-a1", "a", [bash("c1"), bash("c2"), assistant("done")], started=10.0),
        *rollout("s-a2", "a", [assistant("done")], started=20.0),
        timeout,
        *rollout("s-b1", "b", [assistant("done")], started=30.0, labels={"agent": "codex"}),
        exchange({"model": "m", "messages": [ASK]}, None, session_id="s-x", started=40.0),
    )


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50, 90, 99, 100]
    assert percentile([7], 99) == 7 and percentile([], 50) is None
    assert percentile([1, 2, 3], 50) == 2


async def test_per_label_value_finish_reasons_errors_and_token_percentiles(tmp_path: Path) -> None:
    path = await store(tmp_path)
    with Stores.open([str(path)]) as stores:
        by_task = stats(stores.selected(SessionQuery()), "task_id")
        one = stats(stores.selected(SessionQuery()))
        by_agent = stats(stores.selected(SessionQuery(labels=(("task_id", "b"),))), "agent")
    assert [g["value"] for g in by_task] == ["a", "b", "-"]  # those without the label last
    a = by_task[0]
    assert (a["sessions"], a["exchanges"]) == (2, 5)
    assert list(a["finish_reasons"].items()) == [("stop", 2), ("tool_calls", 2), ("none", 1)]
    assert a["errors"] == {"upstream_timeout": 1}
    # prompt tokens of a's exchanges: 100, 110, 120 (s-a1) and 100 (s-a2); the timeout reported none
    assert a["prompt_tokens"] == {"p50": 100, "p90": 120, "p99": 120, "count": 4}
    assert a["completion_tokens"] == {"p50": 5, "p90": 5, "p99": 5, "count": 4}
    [everything] = one
    assert (everything["value"], everything["sessions"], everything["exchanges"]) == ("all", 4, 7)
    assert [(g["value"], g["sessions"]) for g in by_agent] == [("codex", 1)]
    text = stats_table(by_task).splitlines()
    assert text[0].split()[:3] == ["TASK_ID", "SESSIONS", "EXCHANGES"]
    assert text[1].split()[:5] == ["a", "2", "5", "100/120/120", "5/5/5"]
    assert text[1].endswith("stop 2, tool_calls 2, none 1  upstream_timeout 1")
    assert stats_table([]) == "no exchanges recorded in the sessions chosen"


async def test_no_body_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At a million exchanges the bodies are most of the bytes: stats reads the summary columns only."""
    path = await store(tmp_path)
    asked: list[bool] = []
    exchanges = StoreReader.exchanges

    def spy(self: StoreReader, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        asked.append(kwargs.get("bodies", True))
        return exchanges(self, *args, **kwargs)

    monkeypatch.setattr(StoreReader, "exchanges", spy)
    monkeypatch.setattr(StoreReader, "_blob", lambda *_: pytest.fail("a blob was read"))
    with Stores.open([str(path)]) as stores:
        assert stats(stores.selected(SessionQuery()))[0]["exchanges"] == 7
    assert asked and not any(asked)
