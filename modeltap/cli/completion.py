"""`modeltap completion bash|zsh`: shell completion scripts written from the CLI's own parser, so a
flag added to a command completes without anyone editing a script.

Owns: reading the subcommands, their flags and the flags' choices off an argparse parser, and the
two scripts. Does not own: the commands (cli.py).

    eval "$(modeltap completion bash)"      # in ~/.bashrc
    eval "$(modeltap completion zsh)"       # in ~/.zshrc, after compinit
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass

SHELLS = ("bash", "zsh")


@dataclass(frozen=True, slots=True)
class _Flag:
    spellings: tuple[str, ...]
    help: str
    takes_value: bool
    choices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Command:
    name: str
    help: str
    flags: tuple[_Flag, ...]
    # The choices of its positional arguments (`completion bash|zsh`).
    values: tuple[str, ...]


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` ("bash" or "zsh") of the program `parser` parses."""
    commands = _commands(parser)
    prog = parser.prog
    return _bash(prog, commands) if shell == "bash" else _zsh(prog, commands)


def _commands(parser: argparse.ArgumentParser) -> list[_Command]:
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    return [
        _Command(name, helps.get(name, ""), tuple(_flags(sub)), _values(sub))
        for name, sub in subparsers.choices.items()
    ]


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
        flag_cases.append(f"        {command.name}) flags={shlex.quote(words)} values={values} ;;")
        for flag in command.flags:
            if flag.choices:
                pattern = "|".join(f"{command.name},{s}" for s in flag.spellings)
                choice_cases.append(f"        {pattern}) choices={shlex.quote(' '.join(flag.choices))} ;;")
    return f"""# {prog} completion for bash: eval "$({prog} completion bash)"
{function}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local command="" flags="" values="" choices=""
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
        specs = " ".join(_zsh_spec(flag) for flag in command.flags)
        rest = f"'1:value:({' '.join(command.values)})'" if command.values else "'*:file:_files'"
        cases.append(f"        {command.name}) _arguments {specs} {rest} ;;")
    return f"""#compdef {prog}
# {prog} completion for zsh: eval "$({prog} completion zsh)" after compinit
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


def _zsh_spec(flag: _Flag) -> str:
    """One `_arguments` spec: `'(--a -a)'{--a,-a}'[help]:value:(choices)'`, or one spelling plainly."""
    text = flag.help.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")
    value = ""
    if flag.takes_value:
        choices = f"({' '.join(flag.choices)})" if flag.choices else "_files"
        value = f":{flag.spellings[-1].lstrip('-')}:{choices}"
    if len(flag.spellings) == 1:
        return _zsh_quote(f"{flag.spellings[0]}[{text}]{value}")
    exclusive = "(" + " ".join(flag.spellings) + ")"
    return _zsh_quote(exclusive) + "{" + ",".join(flag.spellings) + "}" + _zsh_quote(f"[{text}]{value}")


def _zsh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
