"""modeltap/readers/diff.py: two rollouts aligned turn by turn, where they part (request, response or
one ending first), minted ids not counted, with the differing turn side by side, a structural diff of
its tool calls and a unified diff of its text; `modeltap diff` exits as diff(1) does."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from modeltap.cli import main
from modeltap.readers.diff import compare, diff_text, side
from modeltap.records.exchange import RolloutOutcome
from modeltap.records.stores import Stores
from modeltap.testing import exchange
from tests.factories import assistant, chat_completion, recorded, rollout, tool_call, usage


def bash(call_id: str, command: str) -> dict[str, Any]:
    return assistant(None, tool_call(call_id, "bash", f'{{"command": "{command}", "timeout": 10}}'))


async def store(tmp_path: Path) -> Path:
    passed = RolloutOutcome("scored", 1.0, (1.0,), 12.5, 0, "all checks passed")
    failed = RolloutOutcome("failed", None, (), 30.0, 1, "Traceback...\nAssertionError: 3 != 5")
    return await recorded(
        tmp_path / "r.db",
        # The same traffic, with other tool call ids (every run mints its own) and other times.
        *rollout(
            "s-pass", "t1", [bash("call_a1", "ls"), bash("call_a2", "cat x"), assistant("5")], outcome=passed
        ),
        *rollout(
            "s-twin", "t1", [bash("call_b1", "ls"), bash("call_b2", "cat x"), assistant("5")], started=9e4
        ),
        # Parts way at turn 2: another command, then another answer.
        *rollout(
            "s-fail", "t1", [bash("call_c1", "ls"), bash("call_c2", "cat y"), assistant("3")], outcome=failed
        ),
        *rollout("s-short", "t1", [bash("call_d1", "ls"), bash("call_d2", "cat x")]),
        *rollout("s-other", "t2", [bash("call_e1", "ls")]),
    )


def compared(path: Path, a: str, b: str) -> dict[str, Any]:
    with Stores.open([str(path)]) as stores:
        return compare(side(stores, a), side(stores, b))


async def test_the_same_traffic_with_other_minted_ids_is_the_same(tmp_path: Path) -> None:
    result = compared(await store(tmp_path), "s-pass", "s-twin")
    assert result["differs"] is False and result["first_difference"] is None
    assert "same model traffic in all 3 turn(s)" in diff_text(result)


async def test_the_first_differing_response_side_by_side(tmp_path: Path) -> None:
    result = compared(await store(tmp_path), "s-fail", "s-pass")
    first = result["first_difference"]
    assert result["differs"] and (first["turn"], first["in"]) == (2, "response")
    assert first["tool_call_diff"] == [{"call": 1, "path": "arguments.command", "a": "cat y", "b": "cat x"}]
    assert '-tool call: → bash({"command": "cat y", "timeout": 10})' in first["text_diff"]
    assert '+tool call: → bash({"command": "cat x", "timeout": 10})' in first["text_diff"]
    assert [m["role"] for m in first["a"]["new_messages"]] == ["assistant", "tool"]
    assert (result["a"]["outcome"], result["a"]["reward"], result["b"]["outcome"], result["b"]["reward"]) == (
        "failed",
        None,
        "scored",
        1.0,
    )
    text = diff_text(result, width=160)
    lines = text.splitlines()
    assert lines[0].startswith("A  s-fail  3 turn(s)  task_id=t1")
    assert "rollout: outcome failed  reward -  30.0 s  exit status 1" in text
    assert "log │ AssertionError: 3 != 5" in text and "outcome scored  reward 1  scores 1" in text
    assert "same model traffic in turn 1; turn 2 differs in its response" in text
    assert "--- A s-fail turn 2" in text and "+++ B s-pass turn 2" in text
    assert any("← tool call → bash" in line and "│" in line for line in lines)
    assert '#1 arguments.command: "cat y" → "cat x"' in text and "── text" in text


async def test_a_request_that_differs_and_a_session_that_ends_first(tmp_path: Path) -> None:
    path = await store(tmp_path)
    result = compared(path, "s-pass", "s-other")
    assert (result["first_difference"]["turn"], result["first_difference"]["in"]) == (1, "request")
    result = compared(path, "s-pass", "s-short")
    first = result["first_difference"]
    assert (first["turn"], first["in"], first["b"]["turn"]) == (3, "length", None)
    assert "(no such turn: the session ended)" in diff_text(result)


async def test_modeltap_diff_exits_like_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(await store(tmp_path))
    assert main(["diff", "s-pass", "s-twin", "--store", path]) == 0
    assert main(["diff", "s-pass", "s-fail", "--store", path, "--json"]) == 1
    assert '"differs": true' in capsys.readouterr().out
    assert main(["diff", "s-pass", "s-nope", "--store", path]) == 2
    assert "no session 's-nope' in" in capsys.readouterr().err


@pytest.mark.parametrize("depth", [975])
async def test_sessions_nested_as_deep_as_json_parses_are_compared(tmp_path: Path, depth: int) -> None:
    """A degenerate policy's tool call (arguments of nothing but brackets) or a body as deep as the
    proxy's parser accepts: compared, and its difference shown, without a RecursionError."""

    def call(leaf: str) -> dict[str, Any]:
        arguments = '{"command": ' + "[" * depth + f'"{leaf}"' + "]" * depth + "}"
        return assistant(None, tool_call("call_1", "bash", arguments))

    path = await recorded(
        tmp_path / "r.db",
        *rollout("s-a", "t1", [call("ls"), assistant("5")]),
        *rollout("s-b", "t1", [call("pwd"), assistant("5")]),
    )
    with Stores.open([str(path)]) as stores:
        result = compare(side(stores, "s-a"), side(stores, "s-b"))
    assert result["differs"] and result["first_difference"]["in"] == "response"
    [change] = result["first_difference"]["tool_call_diff"]
    assert change["path"] == "arguments" and change["a"].endswith('"ls"' + "]" * depth + "}")
    assert '#1 arguments: "{\\"command\\": [[[' in diff_text(result, width=120)
    assert main(["diff", "s-a", "s-b", "--store", str(path)]) == 1
    assert main(["diff", "s-a", "s-b", "--store", str(path), "--json"]) == 1


def test_modeltap_diff_of_bodies_nested_975_deep_says_where_they_part(tmp_path: Path) -> None:
    """As the user runs it (its own process, whose stack is shallow): a request whose content nests as
    deep as the proxy's JSON parser accepts is read, compared and shown; the exit status is diff's."""

    def deep(leaf: str, depth: int = 975) -> tuple[dict[str, Any], bytes]:
        value: Any = leaf
        for _ in range(depth):
            value = [value]
        text = b'{"model": "m", "messages": [{"role": "user", "content": ' + b"[" * depth
        text += f'"{leaf}"'.encode() + b"]" * depth + b"}]}"
        return {"model": "m", "messages": [{"role": "user", "content": value}]}, text

    records = []
    for session, leaf in (("s-a", "one"), ("s-b", "two")):
        body, raw = deep(leaf)
        answer = chat_completion(assistant("ok"), usage=usage(1, 1))
        records.append(exchange(None, answer, request=raw, request_json=body, session_id=session))
    path = asyncio.run(recorded(tmp_path / "r.db", *records))
    for extra in ([], ["--json"]):
        run = subprocess.run(
            [sys.executable, "-m", "modeltap", "diff", "s-a", "s-b", "--store", str(path), *extra],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (run.returncode, run.stderr) == (1, ""), run.stderr[-2000:]
        assert "request" in run.stdout
