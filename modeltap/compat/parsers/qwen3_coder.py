"""Qwen3's XML tool calls (`--tool-call-parser qwen3_coder`, alias `qwen3_xml`), and the Qwen3 grammar
the `qwen3` reasoning parser shares, as vLLM 0.33.0 parses them.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

vLLM 0.33.0 runs both names on its parser engine with one grammar for reasoning and calls
(vllm/tool_parsers/qwen3_engine_tool_parser.py, vllm/parser/qwen3.py:148-289 at
https://github.com/vllm-project/vllm/blob/v0.33.0/). What the answer carries:
- a parameter's value is the text between `<parameter=NAME>` and `</parameter>` (or the next
  `<parameter=`), less one leading and one trailing newline (qwen3.py:52-87); a parameter left open at
  the end is dropped; the values are then typed by the tool's schema (tool_schema.py);
- the content is the text before the first call, stripped when calls were made; text after the calls
  is dropped once a call was named; a name is any non-empty text (unknown tools are kept);
- a `<function=` without `<tool_call>`, an unclosed call, consecutive calls without `</tool_call>`
  all still parse (the grammar's tolerant transitions).
vLLM 0.19.1 and SGLang 0.5.23 differ (no content strip; `"null"` is null for any type, a boolean is
`== "true"`, `ast.literal_eval` fallback; an open last parameter kept): docs/parsers.md §4.

    parser = Qwen3CoderToolParser()
    parser.extract(text, ReplyContext(tools=tools), with_reasoning=False).tool_calls
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from modeltap.compat.parsers.engine_calls import EngineToolParser
from modeltap.compat.parsers.markup import WHITESPACE, Event, Grammar, State, Transition

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

# One parameter: `<parameter=NAME>` (spaces allowed inside the tag) to `</parameter>` or to the next
# opening tag (qwen3.py:52-57).
_PARAMETER = re.compile(
    f"<{WHITESPACE}*parameter{WHITESPACE}*={WHITESPACE}*([^>]*)>(.*?)"
    f"(?:<{WHITESPACE}*/{WHITESPACE}*parameter{WHITESPACE}*>|(?=<{WHITESPACE}*parameter{WHITESPACE}*=))",
    re.DOTALL,
)


def parameters(raw: str) -> dict[str, str]:
    """The parameters of a call's raw argument text, each value less one wrapping newline on either
    side (the template's), a repeated name keeping its first place and its last value."""
    found: dict[str, str] = {}
    for match in _PARAMETER.finditer(raw):
        value = match.group(2)
        value = value.removeprefix("\n")
        found[match.group(1)] = value.removesuffix("\n")
    return found


@cache
def qwen3_grammar(thinking: bool) -> Grammar:
    """`qwen3_config(thinking)`: the start state is reasoning when thinking is on."""
    reasoning, content = State.REASONING, State.CONTENT
    preamble, name, args, between = State.TOOL_PREAMBLE, State.TOOL_NAME, State.TOOL_ARGS, State.TOOL_BETWEEN
    end, start = Event.CALL_END, Event.CALL_START
    transitions = {
        (reasoning, "THINK_START"): Transition(reasoning),
        (reasoning, "THINK_END"): Transition(content, (Event.REASONING_END,)),
        # A second </think> after reasoning ended is dropped.
        (content, "THINK_END"): Transition(content),
        # <tool_call> ends reasoning by itself.
        (reasoning, "TOOL_START"): Transition(preamble, (Event.REASONING_END, start)),
        (content, "TOOL_START"): Transition(preamble, (Event.REASONING_END, start)),
        (content, "FUNC_PREFIX"): Transition(name, (start,)),
        (preamble, "TOOL_END"): Transition(content, (end,)),
        (preamble, "FUNC_PREFIX"): Transition(name),
        (name, "CLOSE_ANGLE"): Transition(args),
        (name, "FUNC_END"): Transition(between, (end,)),
        (name, "TOOL_END"): Transition(content, (end,)),
        (name, "TOOL_START"): Transition(preamble, (end, start)),
        (name, "FUNC_PREFIX"): Transition(name, (end, start)),
        (args, "FUNC_END"): Transition(between, (end,)),
        (args, "FUNC_PREFIX"): Transition(name, (end, start)),
        (args, "PARAM_START"): Transition(args, (Event.CALL_ARGS,)),
        (args, "PARAM_END"): Transition(args, (Event.CALL_ARGS,)),
        (between, "TOOL_END"): Transition(content),
        (between, "TOOL_START"): Transition(preamble, (start,)),
        (between, "FUNC_PREFIX"): Transition(name, (start,)),
    }
    return Grammar(
        name="qwen3",
        terminals={
            "THINK_START": THINK_START,
            "THINK_END": THINK_END,
            "TOOL_START": TOOL_CALL_START,
            "TOOL_END": TOOL_CALL_END,
            "FUNC_PREFIX": "<function=",
            "FUNC_END": "</function>",
            "PARAM_START": "<parameter=",
            "PARAM_END": "</parameter>",
            "CLOSE_ANGLE": ">",
        },
        transitions=transitions,
        initial_state=reasoning if thinking else content,
        convert_arguments=parameters,
        strip_trailing_reasoning=False,
    )


def qwen3_thinking(chat_template_kwargs: Mapping[str, Any]) -> bool:
    """Whether the Qwen3 parsers start in reasoning: `enable_thinking`, on unless the request says
    otherwise (vllm/parser/qwen3.py:317-318)."""
    return bool(chat_template_kwargs.get("enable_thinking", True))


class Qwen3CoderToolParser(EngineToolParser):
    """`qwen3_coder` / `qwen3_xml` tool calls."""

    name = "qwen3_coder"

    def grammar(self, chat_template_kwargs: Mapping[str, Any]) -> Grammar:
        return qwen3_grammar(qwen3_thinking(chat_template_kwargs))
