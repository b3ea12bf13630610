"""modeltap/compat/parsers/registry.py: parsers chosen by vLLM's flag names (aliases included), and
the family told from a chat template, with an error naming the flag when it cannot be told."""

from __future__ import annotations

import json
import os

import pytest

from modeltap.compat.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParserChoice,
    UnknownParserError,
    infer_parsers,
    reply_parser,
)
from modeltap.compat.parsers.glm import GlmToolParser
from modeltap.compat.parsers.hermes import HermesToolParser
from modeltap.compat.parsers.qwen3_coder import Qwen3CoderToolParser
from modeltap.compat.parsers.reasoning import DeepSeekR1Reasoning, GlmReasoning, Qwen3Reasoning

# Short templates written for these tests in each family's manner (the call markup each writes for an
# assistant message, the generation prompt); not the models' own files.
QWEN3_CODER = (
    "{%- for tool_call in message.tool_calls %}"
    "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
    "{%- for k, v in tool_call.arguments.items() %}"
    "{{- '<parameter=' + k + '>\\n' + v + '\\n</parameter>\\n' }}"
    "{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
)
GLM45 = (
    "[gMASK]<sop>{%- for tc in m.tool_calls %}{{ '\\n<tool_call>' + tc.name }}\n"
    "{% for k, v in tc.arguments.items() %}"
    "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}</tool_call>{% endfor %}"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
)
GLM47 = (
    "{%- for tc in m.tool_calls %}{{- '<tool_call>' + tc.name -}}"
    "<arg_key>{{ k }}</arg_key><arg_value>{% endfor %}"
)
QWQ = (
    "{%- if tools %}"
    '{{- \'<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>\' }}'
    "{%- endif %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)
THINKING_2507 = QWQ + "{%- if message.reasoning_content is string %}{%- endif %}"
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_every_vllm_name_and_alias_chooses_its_family() -> None:
    assert {name: type(make()) for name, make in TOOL_PARSERS.items()} == {
        "hermes": HermesToolParser,
        "qwen3_json": HermesToolParser,
        "qwen3_coder": Qwen3CoderToolParser,
        "qwen3_xml": Qwen3CoderToolParser,
        "glm45": GlmToolParser,
        "glm47": GlmToolParser,
    }
    assert {name: type(make()) for name, make in REASONING_PARSERS.items()} == {
        "qwen3": Qwen3Reasoning,
        "deepseek_r1": DeepSeekR1Reasoning,
        "glm45": GlmReasoning,
        "glm47": GlmReasoning,
    }


def test_none_or_no_name_is_no_stage() -> None:
    parser = reply_parser("none", None)
    assert parser.tool_parser is None and parser.reasoning_parser is None


@pytest.mark.parametrize(
    ("tool", "reasoning", "flag"),
    [("llama3_json", None, "--tool-parser"), (None, "r1", "--reasoning-parser")],
)
def test_an_unknown_name_is_refused_naming_its_flag(
    tool: str | None, reasoning: str | None, flag: str
) -> None:
    with pytest.raises(UnknownParserError, match=f"{flag} '.*' is not one of: .*none"):
        reply_parser(tool, reasoning)


def test_qwen3s_own_template_is_hermes_with_qwen3_reasoning(qwen_dir: str) -> None:
    with open(os.path.join(qwen_dir, "tokenizer_config.json")) as fh:
        template = json.load(fh)["chat_template"]
    assert infer_parsers(template) == ParserChoice("hermes", "qwen3")


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN3_CODER, ParserChoice("qwen3_coder", None)),
        (GLM45, ParserChoice("glm45", "glm45")),
        (GLM47, ParserChoice("glm47", None)),
        (QWQ, ParserChoice("hermes", "deepseek_r1")),
        (THINKING_2507, ParserChoice("hermes", "qwen3")),
        (CHATML, ParserChoice(None, None)),
    ],
)
def test_a_family_is_told_from_its_markup(template: str, expected: ParserChoice) -> None:
    assert infer_parsers(template) == expected


def test_a_template_that_takes_tools_in_an_unknown_form_names_the_tool_flag() -> None:
    with pytest.raises(UnknownParserError, match="pass --tool-parser"):
        infer_parsers("{% if tools %}{{ tools | tojson }}[TOOL_CALLS]{% endif %}")


def test_a_template_that_only_mentions_think_names_the_reasoning_flag() -> None:
    # Stripping old reasoning from history says nothing of whether the model thinks now.
    with pytest.raises(UnknownParserError, match="pass --reasoning-parser"):
        infer_parsers("{%- set content = message.content.split('</think>')[-1] %}<think>")
