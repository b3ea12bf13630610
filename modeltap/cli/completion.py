"""`modeltap completion bash|zsh`: shell completion scripts written from the CLI's own parser, so a
flag added to a command completes without anyone editing a script.

Owns: reading the subcommands, their flags and the flags' choices off an argparse parser, and the
two scripts. An argument whose metavar is SESSION (`show SESSION`, `diff SESSION SESSION`, `tail
--session SESSION`) completes the recorded session ids: the script asks `PROG sessions --ids` at TAB,
with the `--store` flags already typed, so it offers what the reader would find. Does not own: the
commands (cli.py).

    eval "$(modeltap completion bash)"      # in ~/.bashrc
    eval "$(modeltap completion zsh)"       # in ~/.zshrc, after compinit
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

SHELLS = ("bash", "zsh")
# The metavar of an argument that takes a session id.
SESSION_METAVAR = "SESSION"
# The newest sessions TAB offers: a prefix narrows them, and more than a screenful helps nobody.
COMPLETED_SESSIONS = 1000


@dataclass(frozen=True, slots=True)
class _Flag:
    spellings: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]
    sessions: bool = False


@dataclass(frozen=True, slots=True)
class _Command:
    name: str
    help: str
    flags: tuple[_Flag, ...]
    # The choices of its positional arguments (`completion bash|zsh`).
    values: tuple[str, ...]
    # Whether its positional arguments are session ids.
    sessions: bool = False


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` ("bash" or "zsh") of the program `parser` parses."""
    commands = _commands(parser)
    prog = parser.prog
    return _bash(prog, commands) if shell == "bash" else _zsh(prog, commands)


def _commands(parser: argparse.ArgumentParser) -> list[_Command]:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    return [
        _Command(name, helps.get(name, ""), tuple(_flags(sub)), _values(sub), _takes_sessions(sub))
        for name, sub in subparsers.choices.items()
    ]


def _takes_sessions(parser: argparse.ArgumentParser) -> bool:
    return any(a.metavar == SESSION_METAVAR for a in parser._actions if not a.option_strings)


def _values(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    positionals = (action for action in parser._actions if not action.option_strings)
    return tuple(str(choice) for action in positionals for choice in action.choices or ())


def _flags(parser: argparse.ArgumentParser) -> list[_Flag]:
    return [
        _Flag(
            tuple(action.option_strings),
            (action.help or "").replace("%%", "%"),
            action.nargs != 0,
            tuple(str(choice) for choice in action.choices or ()),
            action.metavar == SESSION_METAVAR,
        )
        for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS
    ]


def _bash(prog: str, commands: list[_Command]) -> str:
    function = "_" + prog.replace("-", "_")
    names = " ".join(command.name for command in commands)
    flag_cases, choice_cases = [], []
    for command in commands:
        words = " ".join(s for flag in command.flags for s in flag.spellings)
        values = shlex.quote(" ".join(command.values))
        ids = " ids=1" if command.sessions else ""
        flag_cases.append(f"        {command.name}) flags={shlex.quote(words)} values={values}{ids} ;;")
        for flag in command.flags:
            pattern = "|".join(f"{command.name},{s}" for s in flag.spellings)
            if flag.choices:
                choice_cases.append(f"        {pattern}) choices={shlex.quote(' '.join(flag.choices))} ;;")
            elif flag.sessions:
                choice_cases.append(f"        {pattern}) choices=$({function}_sessions) ;;")
    return f"""# {prog} completion for bash: eval "$({prog} completion bash)"
# The recorded session ids, newest first, from the stores the line names with --store.
{function}_sessions() {{
    local stores=() i
    for ((i = 1; i < COMP_CWORD - 1; i++)); do
        [[ ${{COMP_WORDS[i]}} == --store ]] && stores+=(--store "${{COMP_WORDS[i+1]}}")
    done
    {prog} sessions --ids --limit {COMPLETED_SESSIONS} "${{stores[@]}}" 2>/dev/null
}}
{function}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local command="" flags="" values="" choices="" ids=""
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${{COMP_WORDS[i]}} in -*) ;; *) command=${{COMP_WORDS[i]}}; break ;; esac
    done
    if [[ -z $command ]]; then
        COMPREPLY=($(compgen -W "{names} --help --version --verbose" -- "$cur"))
        return
    fi
    case $command,$prev in
{chr(10).join(choice_cases)}
    esac
    if [[ -n $choices ]]; then
        COMPREPLY=($(compgen -W "$choices" -- "$cur"))
        return
    fi
    case $command in
{chr(10).join(flag_cases)}
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$flags" -- "$cur"))
    elif [[ -n $values ]]; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
    elif [[ -n $ids ]]; then
        COMPREPLY=($(compgen -W "$({function}_sessions)" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F {function} {prog}
"""


def _zsh(prog: str, commands: list[_Command]) -> str:
    function = "_" + prog.replace("-", "_")
    described = "\n".join(f"        {_zsh_quote(f'{c.name}:{c.help}')}" for c in commands)
    cases = []
    for command in commands:
        specs = " ".join(_zsh_spec(flag, function) for flag in command.flags)
        if command.values:
            rest = f"'1:value:({' '.join(command.values)})'"
        elif command.sessions:
            rest = f"'*:session:{function}_sessions'"
        else:
            rest = "'*:file:_files'"
        cases.append(f"        {command.name}) _arguments {specs} {rest} ;;")
    return f"""#compdef {prog}
# {prog} completion for zsh: eval "$({prog} completion zsh)" after compinit
# The recorded session ids, newest first, from the stores the line names with --store.
{function}_sessions() {{
    local -a stores ids
    local i
    for ((i = 1; i < $#words; i++)); do
        [[ $words[i] == --store ]] && stores+=(--store $words[i+1])
    done
    ids=(${{(f)"$({prog} sessions --ids --limit {COMPLETED_SESSIONS} $stores 2>/dev/null)"}})
    compadd -a ids
}}
{function}() {{
    local -a commands
    commands=(
{described}
    )
    if (( CURRENT == 2 )); then
        _describe command commands
        return
    fi
    local command=$words[2]
    shift words
    (( CURRENT-- ))
    case $command in
{chr(10).join(cases)}
    esac
}}
compdef {function} {prog}
"""


def _zsh_spec(flag: _Flag, function: str) -> str:
    """One `_arguments` spec: `'(--a -a)'{--a,-a}'[help]:value:(choices)'`, or one spelling plainly."""
    text = flag.help.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")
    value = ""
    if flag.takes_value:
        choices = f"({' '.join(flag.choices)})" if flag.choices else "_files"
        if flag.sessions:
            choices = f"{function}_sessions"
        value = f":{flag.spellings[-1].lstrip('-')}:{choices}"
    if len(flag.spellings) == 1:
        return _zsh_quote(f"{flag.spellings[0]}[{text}]{value}")
    exclusive = "(" + " ".join(flag.spellings) + ")"
    return _zsh_quote(exclusive) + "{" + ",".join(flag.spellings) + "}" + _zsh_quote(f"[{text}]{value}")


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
