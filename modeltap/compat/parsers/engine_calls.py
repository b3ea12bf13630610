"""The tool-call stage of vLLM 0.33.0's parser engine, on its non-streaming path: the slots a grammar's
call events fill, the names and arguments they end with, the content around them, and the
`ToolParser` a grammar makes (vLLM's `ParserEngineToolAdapter`).

Reproduces `ParserEngine._events_to_delta`, its `_handle_*` helpers and `_build_extracted_result`
for one complete text (vllm/parser/engine/parser_engine.py:837-1243) and
`extract_tool_calls_from_content` (:628-651), at https://github.com/vllm-project/vllm/blob/v0.33.0/:
a call's name is sent with its first argument text (found in that text when the name is empty),
a call is made when its name strips to something the grammar accepts, text after the calls is
content only when no call was ever named. Does not own the grammar or the machine (markup.py).

    machine, calls = Machine(grammar, state=State.CONTENT), Calls(grammar, context)
    calls.take(machine.feed(text) + machine.finish())
    calls.calls(), calls.content(tools_called=True)
"""

from __future__ import annotations

import json
import re
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modeltap.compat.parsers import tool_schema
from modeltap.compat.parsers.base import (
    GrowingText,
    ParsedCall,
    ReplyContext,
    ToolExtraction,
    ToolParser,
    ToolSpec,
    ToolStream,
)
from modeltap.compat.parsers.markup import WHITESPACE, Emitted, Event, Grammar, Machine, State

# What `_try_extract_name` looks for in a call's argument text when its name is still empty
# (parser_engine.py:1143).
_NAME_IN_ARGS = re.compile(f'"name"{WHITESPACE}*:{WHITESPACE}*"([^"]*)"')


@dataclass
class _Slot:
    """One tool call as the engine gathers it (`ToolCallSlot`)."""

    name: str = ""
    args: list[str] = field(default_factory=list)
    named: bool = False  # its name was accepted and sent (`name_sent`)
    ended: bool = False


class Calls:
    """The tool pass's bookkeeping (`_events_to_delta` and `_build_extracted_result` for one
    complete text): text before and after the first call event, and one slot per call."""

    def __init__(self, grammar: Grammar, context: ReplyContext) -> None:
        self._grammar = grammar
        self._tools = context.tools
        self._tool_names = frozenset(tool.name for tool in context.tools)
        self._suppressed = context.calls_suppressed
        self._before: list[str] = []
        self._before_read = 0
        self._after: list[str] = []
        self._seen_call = False
        self._slots: list[_Slot] = []

    @property
    def any_named(self) -> bool:
        """Whether some call's name has been accepted (then text after the calls is dropped)."""
        return any(slot.named for slot in self._slots)

    def take(self, events: list[Emitted]) -> list[int]:
        """Gather `events`; return the indexes of the calls they ended (each once)."""
        ended = []
        for kind, value, index in events:
            if kind is Event.TEXT:
                (self._after if self._seen_call else self._before).append(value)
            elif kind in (Event.CALL_START, Event.CALL_NAME, Event.CALL_ARGS, Event.CALL_END):
                if self._suppressed:
                    continue
                self._seen_call = True
                if kind is Event.CALL_START:
                    self._slots.extend(_Slot() for _ in range(index + 1 - len(self._slots)))
                elif kind is Event.CALL_NAME:
                    self._slots[index].name += value
                elif kind is Event.CALL_ARGS:
                    self._on_args(self._slots[index], value)
                elif 0 <= index < len(self._slots) and self._on_end(self._slots[index]):
                    ended.append(index)
        return ended

    def _on_args(self, slot: _Slot, value: str) -> None:
        # `_handle_arg_chunk` (parser_engine.py:967-993): the name is sent with the first argument
        # text, found in that text when the name itself is empty.
        if value:
            slot.args.append(value)
        if not slot.named:
            if slot.name:
                self._send_name(slot, slot.name)
            elif value:
                self._send_name(slot, _name_in_args(slot))

    def _on_end(self, slot: _Slot) -> bool:
        # `_handle_tool_end` (parser_engine.py:995-1035; GLM strips the name first, glm47_moe.py:273-277).
        if self._grammar.strip_names:
            slot.name = slot.name.strip()
        if not slot.named:
            name = slot.name or _name_in_args(slot) or ""
            if self._accepts(name):
                slot.name, slot.named = name, True
        first = not slot.ended
        slot.ended = True
        return first

    def _send_name(self, slot: _Slot, name: str | None) -> None:
        if name is not None and self._grammar.strip_names:
            name = name.strip()
        if name is not None and self._accepts(name):
            slot.name, slot.named = name, True

    def _accepts(self, name: object) -> bool:
        # A name the JSON fallback found may be no string at all: vLLM then fails building the
        # message (an HTTP 500); here such a call is not made (docs/parsers.md §6).
        if not isinstance(name, str) or not name:
            return False
        return not (self._grammar.validate_tool_names and self._tools) or name in self._tool_names

    def call(self, index: int) -> ParsedCall | None:
        """Slot `index` as the answer's call, or None when the engine leaves it out
        (`_build_extracted_result`, parser_engine.py:1155-1206)."""
        slot = self._slots[index]
        raw = "".join(slot.args)
        if not slot.name and not raw:
            return None
        name: object = slot.name.strip()
        if not name and raw.strip():
            name, found = _name_and_args_from_json(raw)
            if self._accepts(name):
                assert isinstance(name, str)
                return ParsedCall(name, _typed_json(found, name, self._tools))
            return None
        if not self._accepts(name):
            return None
        assert isinstance(name, str)
        values = self._grammar.convert_arguments(raw) if raw.strip() else {}
        return ParsedCall(name, tool_schema.arguments(values, name, self._tools))

    def calls(self) -> tuple[ParsedCall, ...]:
        """Every call the answer carries, in order."""
        found = (self.call(index) for index in range(len(self._slots)))
        return tuple(call for call in found if call is not None)

    def content(self, tools_called: bool) -> str | None:
        """The content the answer carries: the text before the first call event, and the text after
        only if no call was ever named; whitespace alone is dropped once a call began, and the
        whole is stripped when calls were made (parser_engine.py:488-498, 885-911)."""
        parts = self._before + (self._after if not (self._seen_call and self.any_named) else [])
        content = "".join(parts)
        if self._slots and not content.strip():
            content = ""
        return (content.strip() if tools_called else content) or None

    def new_text_before(self) -> str:
        """The text before the first call event that came since the last time this was asked."""
        added = "".join(self._before[self._before_read :])
        self._before_read = len(self._before)
        return added


def _name_in_args(slot: _Slot) -> str | None:
    found = _NAME_IN_ARGS.search("".join(slot.args))
    return (found.group(1) or None) if found else None


def _name_and_args_from_json(raw: str) -> tuple[object, str]:
    """`_extract_name_and_args` (parser_engine.py:1208-1237): a call body that is a JSON object with
    a name, for a call whose name markup was empty."""
    body = raw.strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        return "", body
    if not isinstance(parsed, dict):
        return "", body
    name = parsed.get("name", "")
    for key in ("arguments", "parameters"):
        if key in parsed:
            value = parsed[key]
            return name, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return name, json.dumps({k: v for k, v in parsed.items() if k != "name"}, ensure_ascii=False)


def _typed_json(arguments: str, name: str, tools: tuple[ToolSpec, ...]) -> str:
    """`_fix_arg_types` on an arguments string that is already JSON: typed when it is an object and
    a value changes, left exactly as it was otherwise."""
    if not tools:
        return arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    properties = tool_schema.properties_of(tools, name)
    if not isinstance(parsed, dict) or not properties:
        return arguments
    return (
        json.dumps(parsed, ensure_ascii=False) if tool_schema.coerce_object(parsed, properties) else arguments
    )


class EngineToolParser(ToolParser):
    """A tool stage on the engine (vLLM's `ParserEngineToolAdapter`): the grammar run from content
    over the reasoning stage's content, with reasoning markup left as text when no reasoning parser
    is configured (adapters.py:165-244)."""

    engine_based = True

    @abstractmethod
    def grammar(self, chat_template_kwargs: Mapping[str, Any]) -> Grammar:
        """The grammar for a request with these template arguments."""

    def _machine(self, context: ReplyContext, with_reasoning: bool) -> tuple[Machine, Calls]:
        grammar = self.grammar(context.chat_template_kwargs)
        machine = Machine(
            grammar,
            state=State.CONTENT,
            skip_reasoning=not with_reasoning,
            special_tokens=context.special_tokens,
        )
        return machine, Calls(grammar, context)

    def extract(self, content: str, context: ReplyContext, *, with_reasoning: bool) -> ToolExtraction:
        machine, calls = self._machine(context, with_reasoning)
        calls.take(machine.feed(content) + machine.finish())
        found = calls.calls()
        return ToolExtraction(bool(found), found, calls.content(bool(found)))

    def stream(self, context: ReplyContext, *, with_reasoning: bool) -> ToolStream:
        machine, calls = self._machine(context, with_reasoning)
        return _EngineToolStream(machine, calls, context)


class _EngineToolStream(ToolStream):
    """What is certain of an engine tool stage's answer as its input grows.

    A call is final when it ends: its slot never changes after. The content is the text before the
    first call, stripped if calls are made and whole otherwise, so before that is known only text
    that both readings begin with is certain: the text up to its last non-whitespace character, when
    it does not begin with whitespace (nothing, when it does). Text after the calls waits for the end
    (it is kept only if no call is ever named)."""

    def __init__(self, machine: Machine, calls: Calls, context: ReplyContext) -> None:
        self._machine = machine
        self._calls = calls
        self._keep_calls = context.calls_kept
        self._first_only = not context.parallel_tool_calls
        self._suppressed = context.calls_suppressed
        self._called = False
        self._kept = 0
        self._before = GrowingText()

    def feed(self, text: str) -> tuple[str, tuple[ParsedCall, ...]]:
        ended = self._calls.take(self._machine.feed(text))
        self._before.add(self._calls.new_text_before())
        new_calls = []
        for index in ended:
            call = self._calls.call(index)
            if call is None:
                continue
            self._called = True
            if self._keep_calls and not (self._first_only and self._kept):
                new_calls.append(call)
                self._kept += 1
        if self._suppressed:
            content = self._before.take_all()
        elif self._called and self._calls.any_named:
            content = self._before.take_stripped()
        else:
            content = self._before.take_trimmed()
        return content, tuple(new_calls)
