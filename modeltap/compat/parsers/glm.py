"""GLM-4.5 / 4.6 / 4.7 tool calls (`--tool-call-parser glm45` or `glm47`) and the GLM grammar the
`glm45` / `glm47` reasoning parsers share, as vLLM 0.33.0 parses them.

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.5 writes a newline after the name and around each pair; GLM-4.7 writes them compactly
(`<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>`). vLLM
0.33.0 sends both parser names to one engine grammar that reads both layouts
(vllm/tool_parsers/__init__.py:61-68, vllm/parser/glm47_moe.py:55-232 at
https://github.com/vllm-project/vllm/blob/v0.33.0/). What the answer carries:
- the name is the text between `<tool_call>` and the first `<arg_key>`, stripped; a name that is not
  one of the request's tools drops the call (when the request has tools);
- each argument is a key (stripped) and its raw value (not trimmed), typed by the tool's schema
  (tool_schema.py); a call with no pairs has arguments `{}`; an unclosed call still parses;
- the content is the text before the first call, stripped when calls were made.
vLLM 0.19.1's `glm45` and SGLang's `glm45` / `glm47` each read only one layout: docs/parsers.md §4.

    GlmToolParser().extract(text, ReplyContext(tools=tools), with_reasoning=False).tool_calls
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

# One pair: the key, optional whitespace, the value (glm47_moe.py:55-59).
_PAIR = re.compile(f"<arg_key>(.*?)</arg_key>{WHITESPACE}*<arg_value>(.*?)</arg_value>", re.DOTALL)

_ARG_TAGS = ("ARG_KEY_START", "ARG_KEY_END", "ARG_VALUE_START", "ARG_VALUE_END")


def pairs(raw: str) -> dict[str, str]:
    """The key/value pairs of a call's raw argument text (a repeated key keeps its first place and
    its last value)."""
    return {match.group(1).strip(): match.group(2) for match in _PAIR.finditer(raw)}


@cache
def glm_grammar(thinking: bool) -> Grammar:
    """`glm47_moe_config(thinking)`: without thinking, `<think>` and `</think>` are plain text."""
    reasoning, content, name, args = State.REASONING, State.CONTENT, State.TOOL_NAME, State.TOOL_ARGS
    transitions = {(args, tag): Transition(args, (Event.CALL_ARGS,)) for tag in _ARG_TAGS}
    terminals = {
        "TOOL_START": "<tool_call>",
        "TOOL_END": "</tool_call>",
        "ARG_KEY_START": "<arg_key>",
        "ARG_KEY_END": "</arg_key>",
        "ARG_VALUE_START": "<arg_value>",
        "ARG_VALUE_END": "</arg_value>",
    }
    if thinking:
        terminals |= {"THINK_START": THINK_START, "THINK_END": THINK_END}
        transitions |= {
            (content, "THINK_START"): Transition(reasoning, (Event.REASONING_START,)),
            (reasoning, "THINK_END"): Transition(content, (Event.REASONING_END,)),
            (content, "THINK_END"): Transition(content),
        }
    transitions |= {
        (reasoning, "THINK_START"): Transition(reasoning),
        (reasoning, "TOOL_START"): Transition(name, (Event.REASONING_END, Event.CALL_START)),
        (content, "TOOL_START"): Transition(name, (Event.CALL_START,)),
        (name, "ARG_KEY_START"): Transition(args, (Event.CALL_ARGS,)),
        (name, "TOOL_END"): Transition(content, (Event.CALL_END,)),
        (args, "TOOL_END"): Transition(content, (Event.CALL_END,)),
    }
    return Grammar(
        name="glm47_moe",
        terminals=terminals,
        transitions=transitions,
        initial_state=reasoning if thinking else content,
        convert_arguments=pairs,
        validate_tool_names=True,
        strip_names=True,
    )


def glm_thinking(chat_template_kwargs: Mapping[str, Any]) -> bool:
    """Whether the GLM parsers read reasoning: on unless `thinking` or `enable_thinking` says
    otherwise (glm47_moe.py:244-261; GLM-5.3's always-thinking template, which ignores both, is not
    told apart here: docs/parsers.md §6)."""
    thinking = chat_template_kwargs.get("thinking")
    enable_thinking = chat_template_kwargs.get("enable_thinking")
    if thinking is None and enable_thinking is None:
        return True
    return bool(thinking) or bool(enable_thinking)


class GlmToolParser(EngineToolParser):
    """`glm45` / `glm47` tool calls."""

    name = "glm47"

    def grammar(self, chat_template_kwargs: Mapping[str, Any]) -> Grammar:
        return glm_grammar(glm_thinking(chat_template_kwargs))
