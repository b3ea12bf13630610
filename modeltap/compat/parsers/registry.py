"""Which parsers a served model needs: by the names vLLM's flags use, or told from the model's chat
template.

Owns: the names (`--tool-parser hermes | qwen3_json | qwen3_coder | qwen3_xml | glm45 | glm47`,
`--reasoning-parser qwen3 | deepseek_r1 | glm45 | glm47`, spelt as vLLM 0.33.0 registers them in
vllm/tool_parsers/__init__.py:61-218 and vllm/reasoning/__init__.py; `none` for no parser), and the
family a chat template writes (docs/parsers.md §2):
- tool calls: `<arg_key>` → GLM; `<function=` with `<parameter=` → qwen3_coder; `<tool_call>` around
  JSON with a `"name"` → hermes; a template that takes no tools → none; one that takes tools in
  another form → an error naming `--tool-parser`;
- reasoning: GLM's with `<think>` → glm45; a template with `<think>` and an `enable_thinking` switch
  (Qwen3) → qwen3; one whose generation prompt opens `<think>` → qwen3 when it also renders
  `reasoning_content` (Qwen3 "Thinking-2507"), deepseek_r1 otherwise (QwQ); no `<think>` → none;
  `<think>` otherwise (it may only strip old reasoning) → an error naming `--reasoning-parser`.
Does not own the parsers themselves.

    choice = infer_parsers(chat_template)       # ParserChoice(tool_parser='hermes', reasoning_parser='qwen3')
    parser = reply_parser(choice.tool_parser, choice.reasoning_parser)
    parser.parse(text, ReplyContext(tools=ToolSpec.from_chat(body["tools"])))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from modeltap.compat.parsers.base import ReasoningParser, ToolParser
from modeltap.compat.parsers.glm import GlmToolParser
from modeltap.compat.parsers.hermes import HermesToolParser
from modeltap.compat.parsers.qwen3_coder import Qwen3CoderToolParser
from modeltap.compat.parsers.reasoning import DeepSeekR1Reasoning, GlmReasoning, Qwen3Reasoning
from modeltap.compat.parsers.reply import ReplyParser

NONE = "none"

_Stage = TypeVar("_Stage", ToolParser, ReasoningParser)

TOOL_PARSERS: Mapping[str, Callable[[], ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen3_json": HermesToolParser,
    "qwen3_coder": Qwen3CoderToolParser,
    "qwen3_xml": Qwen3CoderToolParser,
    "glm45": GlmToolParser,
    "glm47": GlmToolParser,
}
REASONING_PARSERS: Mapping[str, Callable[[], ReasoningParser]] = {
    "qwen3": Qwen3Reasoning,
    "deepseek_r1": DeepSeekR1Reasoning,
    "glm45": GlmReasoning,
    "glm47": GlmReasoning,
}

TOOL_FLAG = "--tool-parser"
REASONING_FLAG = "--reasoning-parser"

# GLM-4.7's compact call line, `'<tool_call>' + tc.name` with no newline (SGLang 0.5.23 tells the two
# GLM layouts apart the same way: sglang/srt/parser/template_detection.py:380-383). vLLM 0.33.0
# parses both layouts with either name; the name only says which one the template writes.
_GLM47_CALL = re.compile(r"\{\{[-\s]*['\"]<tool_call>['\"]\s*[+~]\s*tc\.name")
# A generation prompt that opens reasoning: `<|im_start|>assistant\n<think>`, the newline either
# written out or as the `\n` escape of a Jinja string.
_OPENS_THINKING = re.compile(r"assistant(?:\n|\\n)<think>")
# The template uses a `tools` variable at all.
_TAKES_TOOLS = re.compile(r"\btools\b")


class UnknownParserError(ValueError):
    """A parser name no family has, or a chat template whose family cannot be told; the message
    names the flag that settles it."""


@dataclass(frozen=True, slots=True)
class ParserChoice:
    """The parser names for one model (None: no parser of that kind)."""

    tool_parser: str | None
    reasoning_parser: str | None


def reply_parser(tool_parser: str | None, reasoning_parser: str | None) -> ReplyParser:
    """The combined parser for these names (None or `none`: no such stage)."""
    return ReplyParser(
        _named(tool_parser, TOOL_PARSERS, TOOL_FLAG)(),
        _named(reasoning_parser, REASONING_PARSERS, REASONING_FLAG)(),
    )


def _named(
    name: str | None, known: Mapping[str, Callable[[], _Stage]], flag: str
) -> Callable[[], _Stage | None]:
    if name is None or name == NONE:
        return lambda: None
    if name not in known:
        raise UnknownParserError(f"{flag} {name!r} is not one of: {', '.join([*known, NONE])}")
    return known[name]


def infer_parsers(chat_template: str) -> ParserChoice:
    """The parser names a chat template's family needs; UnknownParserError when it cannot be told."""
    return ParserChoice(_tool_family(chat_template), _reasoning_family(chat_template))


def _tool_family(template: str) -> str | None:
    if "<arg_key>" in template and "<arg_value>" in template:
        return "glm47" if _GLM47_CALL.search(template) else "glm45"
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template and ('"name"' in template or '\\"name\\"' in template):
        return "hermes"
    if _TAKES_TOOLS.search(template):
        raise UnknownParserError(
            f"the chat template takes tools in a form modeltap cannot tell; pass {TOOL_FLAG} "
            f"({', '.join(TOOL_PARSERS)}) or {TOOL_FLAG} {NONE}"
        )
    return None


def _reasoning_family(template: str) -> str | None:
    if "<think>" not in template:
        return None
    if "<arg_key>" in template:
        return "glm45"
    if "enable_thinking" in template:
        return "qwen3"
    if _OPENS_THINKING.search(template):
        # vLLM tests its qwen3 parser on Qwen3 Thinking-2507, whose template renders reasoning_content;
        # QwQ's (no reasoning_content) is served with deepseek_r1 (docs/parsers.md §2).
        return "qwen3" if "reasoning_content" in template else "deepseek_r1"
    raise UnknownParserError(
        f"the chat template mentions <think> but neither switches thinking on nor opens it in the "
        f"generation prompt; pass {REASONING_FLAG} ({', '.join(REASONING_PARSERS)}) or "
        f"{REASONING_FLAG} {NONE}"
    )
