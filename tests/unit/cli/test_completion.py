"""modeltap/cli/completion.py: the bash and zsh scripts, run in the real shells on what a user types."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

from modeltap.cli.commands import _parser
from modeltap.cli.completion import script
from modeltap.exporters.export import FORMATS
from tests.factories import assistant, recorded, rollout


def sessions_store(folder: Path) -> Path:
    """A store with three sessions, two of whose ids start alike."""
    records = [
        *rollout("s-3f2a", "t1", [assistant("a")], started=1.0),
        *rollout("s-3f9c", "t1", [assistant("b")], started=2.0),
        *rollout("s-7e01", "t2", [assistant("c")], started=3.0),
    ]
    return asyncio.run(recorded(folder / "nodes" / "records.db", *records))


# The shells find `modeltap` (which the scripts run to list session ids) where this Python's is.
PATH = f"{Path(sys.executable).parent}:{os.environ['PATH']}"


def bash_complete(tmp_path: Path, *words: str, parser: argparse.ArgumentParser | None = None) -> list[str]:
    """What bash offers for the last of `words`, as `modeltap WORDS<TAB>`."""
    path = tmp_path / "modeltap.bash"
    path.write_text(script(parser or _parser(), "bash"))
    array = " ".join(f"'{w}'" for w in ("modeltap", *words))
    run = subprocess.run(
        ["bash", "-c", f'source {path}; COMP_WORDS=({array}); COMP_CWORD={len(words)}; _modeltap; '
         'printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, check=True, cwd=tmp_path, env=os.environ | {"PATH": PATH},
    )  # fmt: skip
    return run.stdout.split()


def test_bash_completes_commands_flags_choices_and_positional_values(tmp_path: Path) -> None:
    assert bash_complete(tmp_path, "s") == ["serve", "sessions", "stats", "show"]
    assert bash_complete(tmp_path, "gr") == ["groups", "grep"]
    assert bash_complete(tmp_path, "grep", "x", "--ig") == ["--ignore-case"]
    assert bash_complete(tmp_path, "stats", "--outcome", "sc") == ["scored"]
    assert bash_complete(tmp_path, "-v", "ex") == ["export"]  # a top-level flag before the command
    assert bash_complete(tmp_path, "show", "--fu") == ["--full"]
    assert bash_complete(tmp_path, "mock", "--st") == ["--strict", "--store"]
    assert bash_complete(tmp_path, "export", "s-1", "--format", "") == sorted(FORMATS)
    assert bash_complete(tmp_path, "serve", "--budget", "c") == ["clamp"]
    assert bash_complete(tmp_path, "completion", "") == ["bash", "zsh"]
    (tmp_path / "records.db").write_text("")
    assert "records.db" in bash_complete(tmp_path, "sessions", "--store", "rec")


def test_bash_completes_the_session_ids_of_the_store_typed(tmp_path: Path) -> None:
    store = str(sessions_store(tmp_path))
    # Newest first, as `sessions` lists them.
    assert bash_complete(tmp_path, "show", "--store", store, "s-3f") == ["s-3f9c", "s-3f2a"]
    assert bash_complete(tmp_path, "diff", "--store", store, "s-3f2a", "s-7") == ["s-7e01"]
    listed = bash_complete(tmp_path, "tail", "--store", store, "--session", "s-")
    assert listed == ["s-7e01", "s-3f9c", "s-3f2a"]
    assert bash_complete(tmp_path, "export", "--store", store, "--format", "j") == ["jsonl"]
    assert bash_complete(tmp_path, "show", "s-") == []


def test_a_new_flag_completes_without_editing_a_script(tmp_path: Path) -> None:
    parser = _parser()
    [commands] = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    commands.choices["show"].add_argument("--fresh-flag", action="store_true")
    assert bash_complete(tmp_path, "show", "--fr", parser=parser) == ["--fresh-flag"]


ZSH_STUBS = """
compadd() { print -r -- "compadd ${(P)2}" }
_describe() { print -r -- "describe ${(P)2}" }
_arguments() { print -r -- "arguments $*" }
compdef() { print -r -- "compdef $*" }
"""


def zsh_complete(tmp_path: Path, *words: str) -> str:
    """What zsh's completion functions are asked for at `modeltap WORDS<TAB>` (stubs print their
    arguments: the test is of the script's dispatch and specs, compsys itself is zsh's)."""
    zsh = shutil.which("zsh")
    assert zsh, "zsh is installed by make setup"
    path = tmp_path / "_modeltap"
    path.write_text(script(_parser(), "zsh"))
    array = " ".join(f"'{w}'" for w in ("modeltap", *words))
    typed = f"words=({array})\nCURRENT={len(words) + 1}\n_modeltap"
    run = subprocess.run(
        [zsh, "-f", "-c", f"{ZSH_STUBS}\nsource {path}\n{typed}"],
        capture_output=True, text=True, check=True, env=os.environ | {"PATH": PATH},
    )  # fmt: skip
    return run.stdout


def test_zsh_describes_commands_and_gives_each_flag_its_help_and_choices(tmp_path: Path) -> None:
    top = zsh_complete(tmp_path, "")
    assert top.startswith("compdef _modeltap modeltap\ndescribe serve:run the recording proxy")
    assert "show:show a session turn by turn: what each turn added" in top
    export = zsh_complete(tmp_path, "export", "--format", "")
    assert f"--format[output format (default har)]:format:({' '.join(FORMATS)})" in export
    assert "(-o --output)-o[file to write (default stdout)]:output:_files" in export
    # A help text with a colon or a quote is escaped, not cut: it arrives whole.
    serve = zsh_complete(tmp_path, "serve", "--")
    assert "--host[address to listen on (default 0.0.0.0\\: all interfaces, so containers reach it)]" in serve
    layouts = "(areal areal-gateway openai chat-only auto)"
    assert f"--layout[the upstream's path layout (default auto)]:layout:{layouts}" in serve
    assert zsh_complete(tmp_path, "completion", "").rstrip().endswith("1:value:(bash zsh)")


def test_zsh_completes_session_ids_with_the_stores_typed(tmp_path: Path) -> None:
    show = zsh_complete(tmp_path, "show", "")
    assert "'*:session:_modeltap_sessions'" in show or "*:session:_modeltap_sessions" in show, show
    assert "--session[only this session (id, or its first characters)]:session:_modeltap_sessions" in (
        zsh_complete(tmp_path, "tail", "--session", "")
    )
    store = str(sessions_store(tmp_path))
    zsh = shutil.which("zsh")
    assert zsh
    path = tmp_path / "_modeltap"
    path.write_text(script(_parser(), "zsh"))
    listed = subprocess.run(
        [zsh, "-f", "-c", f"{ZSH_STUBS}\nsource {path}\nwords=(modeltap show --store {store} s-)\n"
         "_modeltap_sessions"],
        capture_output=True, text=True, check=True, env=os.environ | {"PATH": PATH},
    )  # fmt: skip
    assert listed.stdout.splitlines()[-1].split() == ["compadd", "s-7e01", "s-3f9c", "s-3f2a"]


ZSH_SESSION = """
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "autoload -U compinit; compinit -u; source {script}; PS1='ready> '"
zpty -r z out '*ready> *' || exit 3
zpty -w -n z $'modeltap export --format j\\t'
zpty -r z out '*jsonl*' || exit 4
zpty -w -n z $'\\x15modeltap completion \\t'
zpty -r z out '*bash*zsh*' || exit 5
zpty -d z
"""


def test_zsh_completes_through_compsys_in_an_interactive_shell(tmp_path: Path) -> None:
    """The real thing: an interactive zsh on a pseudo-terminal, compinit loaded, TAB pressed."""
    zsh = shutil.which("zsh")
    assert zsh, "zsh is installed by make setup"
    path = tmp_path / "_modeltap"
    path.write_text(script(_parser(), "zsh"))
    session = tmp_path / "session.zsh"
    session.write_text(ZSH_SESSION.format(script=path))
    run = subprocess.run([zsh, "-f", str(session)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 0, f"zsh never offered the expected words (step {run.returncode})"


ZSH_SESSION_IDS = """
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "autoload -U compinit; compinit -u; source {script}; PS1='ready> '"
zpty -r z out '*ready> *' || exit 3
zpty -w -n z $'modeltap show --store {store} s-7\\t'
zpty -r z out '*s-7e01*' || exit 4
zpty -d z
"""


def test_zsh_completes_a_session_id_through_compsys(tmp_path: Path) -> None:
    zsh = shutil.which("zsh")
    assert zsh, "zsh is installed by make setup"
    path = tmp_path / "_modeltap"
    path.write_text(script(_parser(), "zsh"))
    session = tmp_path / "session.zsh"
    session.write_text(ZSH_SESSION_IDS.format(script=path, store=sessions_store(tmp_path)))
    run = subprocess.run(
        [zsh, "-f", str(session)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env=os.environ | {"PATH": PATH},
    )  # fmt: skip
    assert run.returncode == 0, f"zsh never offered the session id (step {run.returncode})"
