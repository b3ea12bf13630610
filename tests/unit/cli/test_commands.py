"""modeltap/cli/commands.py: every command is helped with an example and documented in the README (as
sqlite-utils' test_docs keeps its CLI from rotting); the readers' filters and several stores; prune
and vacuum."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from modeltap.cli.commands import _parser, main
from modeltap.records.exchange import RolloutOutcome
from modeltap.records.stores import remember_store
from tests.factories import assistant, recorded, rollout

README = (Path(__file__).resolve().parents[3] / "README.md").read_text()


def commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_commands_design_names_all_exist() -> None:
    expected = {
        "serve",
        "sessions",
        "groups",
        "show",
        "diff",
        "tail",
        "export",
        "replay",
        "mock",
        "ui",
        "prune",
        "vacuum",
        "doctor",
        "demo",
        "completion",
        "grep",
        "stats",
    }
    assert expected <= set(commands())


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_has_help_with_an_example_and_a_readme_entry(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "example" in text.lower() and f"modeltap {name}" in text
    assert f"modeltap {name}" in README


def test_a_reader_on_a_missing_store_says_how_to_point_at_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sessions", "--store", str(tmp_path / "none.db")]) == 2
    assert "--store" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["show", "--fulll", "s-1"], "usage: modeltap show", "(did you mean --full?)"),
        (["serve", "--upstrem", "http://x"], "usage: modeltap serve", "(did you mean --upstream?)"),
        (["mock", "--sesion", "s-1"], "usage: modeltap mock", "(did you mean --session?)"),
        (["sessions", "stray"], "usage: modeltap sessions", "stray"),
    ],
)
def test_a_mistyped_flag_prints_the_subcommands_usage_and_the_closest_flag(
    argv: list[str], usage: str, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith(usage)
    assert f"modeltap {argv[0]}: error: unrecognized arguments: " in err and hint in err


async def _two_nodes(tmp_path: Path) -> tuple[Path, Path]:
    one = await recorded(
        tmp_path / "n1" / "records.db",
        *rollout(
            "s-pass", "fix-bug", [assistant("5")], outcome=RolloutOutcome("scored", 1.0), started=1000.0
        ),
        *rollout("s-fail", "fix-bug", [assistant("3")], outcome=RolloutOutcome("failed"), started=2000.0),
        *rollout("s-chat", "other", [assistant("hi")], started=time.time() - 60),
    )
    two = await recorded(
        tmp_path / "n2" / "records.db",
        *rollout(
            "s-pass", "fix-bug", [assistant("5")], outcome=RolloutOutcome("scored", 0.5), started=3000.0
        ),
    )
    return one, two


async def test_sessions_filters_combine_and_json_has_reward_and_outcome(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, _ = await _two_nodes(tmp_path)
    assert main(["sessions", "--store", str(one), "--label", "task_id=fix-bug", "--outcome", "failed"]) == 0
    out = capsys.readouterr().out
    assert "REWARD  OUTCOME" in out and "s-fail" in out and "s-pass" not in out and "STORE" not in out
    assert main(["sessions", "--store", str(one), "--json", "--since", "1h"]) == 0
    [chat] = json.loads(capsys.readouterr().out)
    assert (chat["id"], chat["reward"], chat["outcome"]) == ("s-chat", None, None)
    assert main(["sessions", "--store", str(one), "--limit", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:3]] == ["s-chat", "s-fail"] and "--all for more" in out[3]
    assert main(["sessions", "--store", str(one), "--since", "yesterday"]) == 2
    assert "not a time" in capsys.readouterr().err


async def test_readers_take_several_stores_by_flag_glob_or_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = await _two_nodes(tmp_path)
    monkeypatch.setenv("MODELTAP_STORE", os.pathsep.join([str(one), str(two)]))
    assert main(["sessions", "--label", "task_id=fix-bug"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("STORE")
    assert sorted((line.split()[0], line.split()[-1]) for line in out[1:]) == [
        ("s-fail", str(one)),
        ("s-pass", str(one)),
        ("s-pass", str(two)),
    ]
    assert main(["show", "s-pass"]) == 2
    assert "is in 2 stores" in capsys.readouterr().err
    assert main(["show", "s-pass", "--store", str(two)]) == 0
    assert "rollout: outcome scored  reward 0.5" in capsys.readouterr().out
    assert main(["groups", "--store", str(tmp_path / "n*" / "records.db")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "TASK_ID",
        "SESSIONS",
        "MEAN",
        "REWARD",
        "SCORED",
        "FAILED",
        "TURNS",
        "TOKENS",
    ]
    assert out.splitlines()[1].split()[:5] == ["fix-bug", "3", "0.75", "67%", "33%"]
    assert main(["export", "s-fail", "--format", "jsonl"]) == 0
    line = json.loads(capsys.readouterr().out.splitlines()[0])
    assert line["rollout"]["outcome"] == "failed" and line["rollout"]["reward"] is None


async def test_grep_prints_a_line_per_hit_and_exits_as_grep_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = await _two_nodes(tmp_path)
    assert main(["grep", "solve TASK", "-i", "--store", str(one), "--label", "task_id=fix-bug"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["s-fail #1 user: Solve task fix-bug.", "s-pass #1 user: Solve task fix-bug."]
    assert main(["grep", "solve TASK", "--store", str(one)]) == 1  # case matters without -i
    assert capsys.readouterr().out == ""
    assert (
        main(["grep", "^5$", "--store", str(one), "--store", str(two), "--outcome", "scored", "--json"]) == 0
    )
    found = json.loads(capsys.readouterr().out)
    assert sorted((h["store"], h["session"], h["role"]) for h in found) == [
        (str(one), "s-pass", "reply"),
        (str(two), "s-pass", "reply"),
    ]
    assert main(["grep", "Solve", "--store", str(one), "--limit", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("s-chat #1 user:") and "--all for more" in captured.err
    assert main(["grep", "(", "--store", str(one)]) == 2
    assert "not a regular expression" in capsys.readouterr().err


async def test_stats_groups_by_a_label_without_equals_and_filters_by_one_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = await _two_nodes(tmp_path)
    stores = ["--store", str(one), "--store", str(two)]
    assert main(["stats", *stores, "--label", "task_id"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in out] == [
        ["TASK_ID", "SESSIONS", "EXCHANGES"],
        ["fix-bug", "3", "3"],
        ["other", "1", "1"],
    ]
    assert main(["stats", *stores, "--label", "task_id", "--label", "task_id=other", "--json"]) == 0
    [other] = json.loads(capsys.readouterr().out)
    assert (other["value"], other["finish_reasons"], other["prompt_tokens"]["p50"]) == (
        "other",
        {"stop": 1},
        100,
    )
    assert main(["stats", *stores, "--label", "a", "--label", "b"]) == 2
    assert "one label" in capsys.readouterr().err


async def test_stats_says_which_sessions_its_row_covers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not "all" over the newest few: what it covered, of how many the filters select."""
    one, two = await _two_nodes(tmp_path)
    stores = ["--store", str(one), "--store", str(two)]
    assert main(["stats", *stores, "--limit", "2"]) == 0
    captured = capsys.readouterr()
    head, row = captured.out.splitlines()
    assert head.split()[:3] == ["OVER", "SESSIONS", "EXCHANGES"]
    assert row.startswith("the newest 2 of 4 sessions  2 ")
    assert "(over the newest 2 of 4 sessions; --limit N or --all for more)" in captured.err
    assert main(["stats", *stores, "--json"]) == 0
    [everything] = json.loads(capsys.readouterr().out)
    assert (everything["value"], everything["covers"], everything["sessions"]) == ("all 4 sessions",) * 2 + (
        4,
    )
    assert main(["stats", *stores, "--label", "task_id", "--limit", "3", "--json"]) == 0
    assert {group["covers"] for group in json.loads(capsys.readouterr().out)} == {
        "the newest 3 of 4 sessions"
    }


async def test_an_export_that_fails_leaves_no_file_and_keeps_an_earlier_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, _ = await _two_nodes(tmp_path)
    out = tmp_path / "train.jsonl"
    assert main(["export", "s-chat", "--store", str(one), "--format", "tokens", "-o", str(out)]) == 2
    assert "token" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["n1", "n2"]  # no file, not even a partial one
    out.write_text("kept\n")
    assert main(["export", "s-chat", "--store", str(one), "--format", "tokens", "-o", str(out)]) == 2
    assert out.read_text() == "kept\n"
    assert main(["export", "s-chat", "--store", str(one), "--format", "jsonl", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["session_id"] == "s-chat"


async def test_readers_given_no_store_read_the_one_serve_last_wrote_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, _ = await _two_nodes(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MODELTAP_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["sessions"]) == 2  # no serve has noted a store: the default, which is not here
    assert "no records database at .modeltap/records.db" in capsys.readouterr().err
    remember_store(one, os.environ)
    assert main(["show", "s-fail"]) == 0
    captured = capsys.readouterr()
    assert captured.err == f"reading {one.resolve()} (the store the last modeltap serve wrote)\n"
    assert captured.out.startswith("session s-fail")
    assert main(["prune", "--before", "1970-01-02"]) == 2  # prune changes only a store it is given
    assert "no records database" in capsys.readouterr().err


async def test_prune_and_vacuum_report_what_they_freed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = await _two_nodes(tmp_path)
    assert main(["prune", "--store", str(one), "--before", "1970-01-02", "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{one}: would prune 2 session(s)") and out[1:] == ["  s-fail", "  s-pass"]
    assert main(["prune", "--store", str(tmp_path / "n*" / "records.db"), "--before", "1970-01-02"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{one}: pruned 2 session(s)") and out[1].startswith(
        f"{two}: pruned 1 session(s)"
    )
    assert main(["prune", "--store", str(one), "--keep-last", "0", "--label", "task_id=other"]) == 0
    assert "pruned 1 session(s)" in capsys.readouterr().out
    assert main(["vacuum", "--store", str(one)]) == 0
    assert "vacuumed in small steps" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["prune", "--store", str(one)])  # --before or --keep-last is required


def test_serve_runs_on_uvloop_when_installed_else_on_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    from modeltap.cli import commands as cli

    assert cli._loop_factory("asyncio") is None
    assert cli._loop_factory("auto") is uvloop.new_event_loop
    real = cli.importlib.import_module

    def without_uvloop(name: str) -> Any:
        if name == "uvloop":
            raise ImportError(name)
        return real(name)

    monkeypatch.setattr(cli.importlib, "import_module", without_uvloop)
    assert cli._loop_factory("auto") is None
    with pytest.raises(ValueError, match=r"pip install 'modeltap\[fast\]'"):
        cli._loop_factory("uvloop")
