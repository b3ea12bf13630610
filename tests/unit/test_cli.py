"""modeltap/cli.py: every command is helped with an example and documented in the README (as
sqlite-utils' test_docs keeps its CLI from rotting)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from modeltap.cli import _parser, main

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def commands() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_commands_design_names_all_exist() -> None:
    expected = {
        "serve",
        "sessions",
        "show",
        "tail",
        "export",
        "replay",
        "mock",
        "ui",
        "doctor",
        "demo",
        "completion",
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
