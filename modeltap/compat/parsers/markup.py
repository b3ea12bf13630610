"""vLLM 0.33.0's declarative parser engine, on its non-streaming path: a grammar of literal
terminals and state transitions, run over the generated text, and the events it emits.

vLLM 0.33.0 runs its Qwen3 and GLM parsers (reasoning and tool calls alike) on one engine: an
incremental lexer cuts the text into literal terminals and plain text
(vllm/parser/engine/incremental_lexer.py:82-285), and a state machine maps (state, terminal) to the
next state and the events to emit (streaming_parser_engine.py:294-584), at
https://github.com/vllm-project/vllm/blob/v0.33.0/. This module reproduces them for a complete text,
and lets the same machine be fed a text as it grows (its state only moves forward and a tail that may
still become a terminal waits, so pieces give the events the whole gives). The lexer matches text
only: vLLM's non-streaming parse is given no token ids (parser_engine.py:565-572). The reasoning
pass's answer is `split_reasoning` (`ParserEngine.extract_reasoning`). Does not own: any grammar
(qwen3_coder.py, glm.py), the calls the events make (engine_calls.py) or how stages combine
(reply.py).

    machine = Machine(grammar, state=State.REASONING, skip_tools=True)
    events = machine.feed("plan</think>answer") + machine.finish()
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from functools import cached_property

# The whitespace `\s` matches in the `regex` module vLLM compiles its patterns with: Unicode
# White_Space, which leaves out the four separators U+001C..U+001F that Python's `re` also matches.
WHITESPACE = "[\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"

# The terminal name vLLM gives the tokenizer's special tokens it drops (token_id_scanner.py,
# streaming_parser_engine.py:39-86): any special token that is not one of the grammar's terminals.
DROP = "__DROP__"


class State(Enum):
    """The engine's parser states (parser_engine_config.py:32-39, less the unused header state)."""

    CONTENT = auto()
    REASONING = auto()
    TOOL_PREAMBLE = auto()
    TOOL_NAME = auto()
    TOOL_ARGS = auto()
    TOOL_BETWEEN = auto()


TOOL_STATES = frozenset({State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN})
_PLAIN_STATES = frozenset({State.CONTENT, State.REASONING})


class Event(Enum):
    """The engine's semantic events (vllm/parser/engine/events.py)."""

    TEXT = auto()
    REASONING = auto()
    REASONING_START = auto()
    REASONING_END = auto()
    CALL_START = auto()
    CALL_NAME = auto()
    CALL_ARGS = auto()
    CALL_END = auto()


_REASONING_EVENTS = frozenset({Event.REASONING_START, Event.REASONING_END})

# What plain text becomes in each state (`content_events`, parser_engine_config.py:70-77); text in
# the other tool states is dropped.
_TEXT_EVENTS = {
    State.CONTENT: Event.TEXT,
    State.REASONING: Event.REASONING,
    State.TOOL_NAME: Event.CALL_NAME,
    State.TOOL_ARGS: Event.CALL_ARGS,
}

# One event: its kind, its text, and the index of the tool call it belongs to.
Emitted = tuple[Event, str, int]


@dataclass(frozen=True, slots=True)
class Transition:
    """Where a terminal takes the machine from a state, and the events it emits on the way."""

    to: State
    events: tuple[Event, ...] = ()


@dataclass(frozen=True, eq=False)
class Grammar:
    """One model format, as a `ParserEngineConfig`: terminals (name -> literal), transitions, the
    start state, and the options of the final answer.

    - `convert_arguments`: a call's raw argument text to its (name, raw string value) pairs.
    - `strip_trailing_reasoning`: reasoning loses its trailing whitespace.
    - `validate_tool_names`: a call whose name is not among the request's tools is dropped.
    - `strip_names`: names are stripped as they are emitted (GLM's overrides).
    """

    name: str
    terminals: Mapping[str, str]
    transitions: Mapping[tuple[State, str], Transition]
    initial_state: State
    convert_arguments: Callable[[str], dict[str, str]]
    strip_trailing_reasoning: bool = True
    validate_tool_names: bool = False
    strip_names: bool = False

    @cached_property
    def tool_terminals(self) -> frozenset[str]:
        """Terminals of transitions into, out of or within the tool states."""
        return frozenset(
            terminal
            for (state, terminal), transition in self.transitions.items()
            if transition.to in TOOL_STATES or state in TOOL_STATES
        )

    @cached_property
    def exit_terminals(self) -> frozenset[str]:
        """Terminals that leave the tool states."""
        return frozenset(
            terminal
            for (state, terminal), transition in self.transitions.items()
            if state in TOOL_STATES and transition.to not in TOOL_STATES
        )

    @cached_property
    def reasoning_markup(self) -> frozenset[str]:
        """The reasoning-only terminals a tool parser running without a reasoning parser leaves as
        text: those whose every transition stays between content and reasoning and emits only
        reasoning events (none at all if one of them does more; streaming_parser_engine.py:382-406)."""
        markers = frozenset(
            terminal
            for (state, terminal), transition in self.transitions.items()
            if State.REASONING in (state, transition.to) and transition.to not in TOOL_STATES
        )
        for (state, terminal), transition in self.transitions.items():
            if terminal in markers and (
                state not in _PLAIN_STATES
                or transition.to not in _PLAIN_STATES
                or not _REASONING_EVENTS.issuperset(transition.events)
            ):
                return frozenset()
        return markers


class _Lexer:
    """Cuts text into literal terminals and plain text, as vLLM's incremental lexer does: at each
    position the longest literal that matches is a terminal; a tail that may still grow into a
    literal is held until more text comes, or until the end."""

    def __init__(self, literals: Mapping[str, str]) -> None:
        self._names = literals
        ordered = sorted(literals, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, ordered)))
        self._prefixes = frozenset(literal[:i] for literal in literals for i in range(1, len(literal)))
        self._longest = max(map(len, literals))
        self._pending = ""

    def feed(self, text: str, *, final: bool = False) -> list[tuple[str | None, str]]:
        """The (terminal name, or None for text; value) pieces now certain."""
        buffer = self._pending + text
        pieces: list[tuple[str | None, str]] = []
        position = 0
        hold = len(buffer) if final else self._hold(buffer, position)
        while position < hold:
            match = self._pattern.search(buffer, position, hold + self._longest)
            if match is None or match.start() >= hold:
                pieces.append((None, buffer[position:hold]))
                position = hold
                break
            if match.start() > position:
                pieces.append((None, buffer[position : match.start()]))
            pieces.append((self._names[match.group()], match.group()))
            position = match.end()
            if not final and position > hold:
                hold = self._hold(buffer, position)
        self._pending = buffer[position:]
        return pieces

    def _hold(self, buffer: str, start: int) -> int:
        """Where the tail that may still become a literal begins (the end when none may)."""
        for i in range(max(start, len(buffer) - self._longest + 1), len(buffer)):
            if buffer[i:] in self._prefixes:
                return i
        return len(buffer)


class Machine:
    """The engine's state machine over one text, fed in pieces (`feed`, then `finish` once).

    `skip_tools`: the reasoning pass, which leaves call markup as text (a call still ends reasoning
    where the grammar says so). `skip_reasoning`: a tool pass with no reasoning parser configured,
    which leaves reasoning markup as text. `special_tokens`: dropped wherever they appear."""

    def __init__(
        self,
        grammar: Grammar,
        *,
        state: State,
        skip_tools: bool = False,
        skip_reasoning: bool = False,
        special_tokens: frozenset[str] = frozenset(),
    ) -> None:
        literals = {literal: name for name, literal in grammar.terminals.items()}
        literals.update({token: DROP for token in special_tokens if token and token not in literals})
        self._lexer = _Lexer(literals)
        self._grammar = grammar
        self.state = state
        self._skip_tools = skip_tools
        self._skip_reasoning = skip_reasoning
        self._in_skipped_call = False
        self._call_index = -1

    def feed(self, text: str) -> list[Emitted]:
        """The events of the next piece of text (a terminal cut by the piece's end waits)."""
        return self._run(self._lexer.feed(text))

    def finish(self) -> list[Emitted]:
        """The events of the held tail and of the end: an open call ends, open reasoning ends."""
        events = self._run(self._lexer.feed("", final=True))
        if self.state in TOOL_STATES:
            if self._call_index >= 0:
                events.append((Event.CALL_END, "", self._call_index))
        elif self.state is State.REASONING:
            events.append((Event.REASONING_END, "", self._call_index))
        self.state = State.CONTENT
        return events

    def _run(self, pieces: list[tuple[str | None, str]]) -> list[Emitted]:
        events: list[Emitted] = []
        for terminal, value in pieces:
            events.extend(self._text(value) if terminal is None else self._terminal(terminal, value))
        return events

    def _text(self, value: str) -> list[Emitted]:
        kind = _TEXT_EVENTS.get(self.state)
        return [(kind, value, self._call_index)] if kind else []

    def _terminal(self, terminal: str, value: str) -> list[Emitted]:
        # streaming_parser_engine.py:408-481, in its order.
        grammar = self._grammar
        transition = grammar.transitions.get((self.state, terminal))
        if transition is None:
            if terminal == DROP:
                return []
            if self._skip_tools and terminal in grammar.exit_terminals:
                self._in_skipped_call = False
            return self._text(value)
        if self._skip_reasoning and terminal in grammar.reasoning_markup:
            return self._text(value)
        if self._skip_tools and terminal in grammar.tool_terminals:
            opens = transition.to in TOOL_STATES
            leaves = terminal in grammar.exit_terminals
            if not (leaves and not opens and not self._in_skipped_call):
                if opens:
                    self._in_skipped_call = True
                elif leaves:
                    self._in_skipped_call = False
                if Event.REASONING_END in transition.events:
                    self.state = State.CONTENT
                    return [
                        (Event.REASONING_END, value, self._call_index),
                        (Event.TEXT, value, self._call_index),
                    ]
                return self._text(value)
        self.state = transition.to
        events: list[Emitted] = []
        for kind in transition.events:
            if kind is Event.CALL_START:
                self._call_index += 1
            events.append((kind, value, self._call_index))
        return events


def split_reasoning(events: list[Emitted], grammar: Grammar) -> tuple[str | None, str | None]:
    """Reasoning and content of a reasoning pass (`ParserEngine.extract_reasoning`,
    parser_engine.py:565-590)."""
    reasoning = "".join(value for kind, value, _ in events if kind is Event.REASONING)
    if grammar.strip_trailing_reasoning:
        reasoning = reasoning.rstrip()
    content = "".join(value for kind, value, _ in events if kind is Event.TEXT)
    return reasoning or None, content or None
