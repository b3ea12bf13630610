"""modeltap/readers/grep.py: a pattern found in messages, tool calls, replies and errors of every wire
format, each message once (in the turn that added it), across stores and through the session filters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from modeltap.readers.grep import compile_pattern, context, hit_line, search
from modeltap.records.exchange import Exchange, RolloutOutcome
from modeltap.records.query import SessionQuery
from modeltap.records.stores import Stores
from modeltap.testing import exchange
from tests.factories import ASK, assistant, function_call_item, recorded, response, rollout, tool_call


def bash(call_id: str, command: str) -> dict[str, Any]:
    return assistant(None, tool_call(call_id, "bash", f'{{"command": "{command}"}}'))


def anthropic(history: list[dict[str, Any]], **fields: Any) -> Exchange:
    body = {"model": "claude", "system": "You are Claude Code.", "messages": history}
    reply = {
        "type": "message",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "setup.py"}}],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }
    return exchange(body, reply, path="/v1/messages", endpoint="messages", **fields)


async def store(tmp_path: Path) -> Path:
    failed = rollout(
        "s-fail",
        "t1",
        [bash("call_1", "pytest -x"), assistant("The TESTS fail.")],
        outcome=RolloutOutcome("failed"),
    )
    passed = rollout(
        "s-pass", "t2", [bash("call_2", "ls"), assistant("all green")], outcome=RolloutOutcome("scored", 1.0)
    )
    responses = exchange(
        {"model": "gpt-x", "input": "grep the logs for pytest output"},
        response([function_call_item("c1", "shell", '{"cmd": "rg pytest"}')], usage={}),
        path="/v1/responses",
        endpoint="responses",
        session_id="s-resp",
        started=5.0,
    )
    broken = exchange(
        {"model": "m", "messages": [ASK]},
        None,
        status=502,
        error_class="upstream_unreachable",
        error_message="connect to 10.0.0.5:8000 refused",
        session_id="s-err",
        started=6.0,
    )
    return await recorded(
        tmp_path / "r.db",
        *failed,
        *passed,
        anthropic([ASK], session_id="s-claude", started=7.0),
        responses,
        broken,
    )


def hits(path: Path, pattern: str, query: SessionQuery | None = None, **options: Any) -> list[dict[str, Any]]:
    with Stores.open([str(path)]) as stores:
        return list(search(stores.selected(query or SessionQuery()), compile_pattern(pattern, **options)))


async def test_messages_tool_calls_replies_and_errors_of_every_format_are_searched(tmp_path: Path) -> None:
    path = await store(tmp_path)
    found = {(h["session"], h["turn"], h["role"]) for h in hits(path, "pytest")}
    assert found == {
        ("s-fail", 1, "tool call"),  # the call, with its arguments; not its echo in turn 2's history
        ("s-resp", 1, "user"),  # a Responses input string
        ("s-resp", 1, "tool call"),  # a Responses function call
    }
    [refused] = hits(path, "refused")
    assert (refused["session"], refused["role"]) == ("s-err", "error")
    assert refused["context"] == "upstream_unreachable: connect to 10.0.0.5:8000 refused"
    [read] = hits(path, r"Read\(.*setup")
    assert (read["session"], read["role"]) == ("s-claude", "tool call")
    [system] = hits(path, "Claude Code")
    assert system["role"] == "system"


async def test_case_regex_literal_text_and_the_filters(tmp_path: Path) -> None:
    path = await store(tmp_path)
    assert hits(path, "tests fail") == []
    [reply] = hits(path, "tests fail", ignore_case=True)
    assert (reply["session"], reply["turn"], reply["role"], reply["match"]) == (
        "s-fail",
        2,
        "reply",
        "TESTS fail",
    )
    assert hits(path, "$((", fixed=True) and hits(path, r"\$\(\(")
    with pytest.raises(ValueError, match="not a regular expression"):
        compile_pattern("$((")
    assert {h["session"] for h in hits(path, "pytest", SessionQuery(labels=(("task_id", "t2"),)))} == set()
    assert {h["session"] for h in hits(path, "Solve", SessionQuery(outcome="scored"))} == {"s-pass"}
    assert {h["session"] for h in hits(path, "Run", SessionQuery(errors=True))} == {"s-err"}


async def test_a_message_repeated_in_a_later_turn_is_a_hit_again(tmp_path: Path) -> None:
    """Only the echo of the previous reply is skipped: the same words said anew count."""
    go_on = rollout("s-1", "t1", [assistant("x"), assistant("y"), assistant("z")])
    path = await recorded(tmp_path / "r.db", *go_on)
    assert [h["turn"] for h in hits(path, "go on")] == [2, 3]


def test_a_hit_is_one_line_with_its_context_cut_at_both_ends() -> None:
    text = "a" * 100 + "\nneedle\n" + "b" * 100
    start = text.index("needle")
    line = context(text, start, start + 6, chars=5)
    assert line == "…aaaa needle bbbb…"
    assert context("needle", 0, 6) == "needle"
    hit = {"store": "x.db", "session": "s-1", "turn": 4, "role": "user", "context": "a needle", "matches": 3}
    assert hit_line(hit) == "s-1 #4 user: a needle  (+2 more)"
    assert hit_line(hit, with_store=True).startswith("[x.db] s-1 #4")
    assert hit_line(hit | {"match": "needle"}, highlight=True) == (
        "s-1 #4 user: a \x1b[1;31mneedle\x1b[0m  (+2 more)"
    )


async def test_several_stores_are_searched(tmp_path: Path) -> None:
    one = await store(tmp_path / "a")
    two = await recorded(tmp_path / "b" / "r.db", *rollout("s-b", "t1", [bash("call_9", "pytest -k b")]))
    with Stores.open([str(one), str(two)]) as stores:
        found = list(search(stores.selected(SessionQuery()), re.compile("pytest -k")))
    assert [(h["session"], h["store"]) for h in found] == [("s-b", str(two))]
