"""modeltap/compat/parsers/reply.py: every golden case of vLLM 0.33.0 parses to exactly vLLM's answer
(content, reasoning, calls with their arguments byte for byte, finish reason), and the combination
rules of `DelegatingParser` hold where the golden cases do not reach."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers import ParsedCall, ParsedReply, ReplyContext, ToolSpec, reply_parser

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
)
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')


def test_the_golden_file_holds_every_vllm_case(vectors: list[dict[str, Any]]) -> None:
    # 126 cases of ten parser pairs (the harness ran these and only these); a truncated file fails.
    pairs = {
        (v["tool_parser"], v["reasoning_parser"], json.dumps(v["chat_template_kwargs"])) for v in vectors
    }
    assert len(vectors) == 126
    assert len(pairs) == 10


def test_a_golden_case_parses_to_vllms_answer(golden: Any) -> None:
    reply = golden.parser.parse(golden.text, golden.context)
    assert reply == golden.expected
    assert reply.called_tools is golden.tools_called
    assert reply.finish_reason("stop") == golden.finish_reason


@given(st.sampled_from(["hermes", "qwen3_coder", "glm45"]), st.text(st.characters(exclude_characters="<")))
def test_a_text_with_no_markup_is_all_content(tool_parser: str, text: str) -> None:
    for context in (ReplyContext(tools=(WEATHER,)), ReplyContext()):
        reply = reply_parser(tool_parser, None).parse(text, context)
        assert (reply.content or "", reply.reasoning, reply.tool_calls) == (text, None, ())


def test_a_length_cut_keeps_its_finish_reason_even_with_calls() -> None:
    reply = reply_parser("hermes", None).parse(HERMES_CALL, ReplyContext(tools=(WEATHER,)))
    assert reply.called_tools
    assert reply.finish_reason("length") == "length"
    assert reply.finish_reason(None) == "tool_calls"


def test_without_tools_no_call_is_returned_and_hermes_leaves_the_text_alone() -> None:
    # No tools: vLLM's default tool_choice is "none"; the legacy hermes parser is not even run.
    reply = reply_parser("hermes", None).parse("Sure. " + HERMES_CALL, ReplyContext())
    assert reply == ParsedReply("Sure. " + HERMES_CALL, None, ())


def test_without_tools_an_engine_tool_parser_still_removes_its_markup() -> None:
    # Engine-based parsers parse and drop the calls: the content is the parser's, stripped.
    reply = reply_parser("qwen3_coder", None).parse("Sure. " + XML_CALL + " done", ReplyContext())
    assert reply == ParsedReply("Sure.", None, ())


def test_tool_choice_none_with_tools_keeps_the_text_around_the_markup() -> None:
    # With tools and tool_choice "none" the engine ignores call markup: the text on both sides stays.
    context = ReplyContext(tools=(WEATHER,), tool_choice="none")
    reply = reply_parser("qwen3_coder", None).parse(" Sure. " + XML_CALL + " done", context)
    assert reply == ParsedReply(" Sure.  done", None, ())


def test_without_parallel_calls_only_the_first_is_kept() -> None:
    context = ReplyContext(tools=(WEATHER,), parallel_tool_calls=False)
    reply = reply_parser("hermes", None).parse(
        HERMES_CALL + "\n" + HERMES_CALL.replace("Paris", "Rome"), context
    )
    assert reply.tool_calls == (PARIS,)


def test_a_failed_xml_call_drops_its_markup_only_when_both_stages_run_on_the_engine() -> None:
    broken = "Checking." + "<tool_call>\n<function=>\n</function>"
    context = ReplyContext(tools=(WEATHER,))
    # qwen3 reasoning and qwen3_coder are both engine-based: the tool parser's content is the answer.
    engine = reply_parser("qwen3_coder", "qwen3").parse("plan</think>" + broken, context)
    assert engine == ParsedReply("Checking.", "plan", ())
    # deepseek_r1 is not: the content is the reasoning parser's, markup and all.
    mixed = reply_parser("qwen3_coder", "deepseek_r1").parse("plan</think>" + broken, context)
    assert mixed == ParsedReply(broken, "plan", ())


def test_a_prompt_that_closed_reasoning_starts_the_reply_in_content() -> None:
    parser = reply_parser("hermes", "qwen3")
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert parser.prompt_closes_reasoning(prompt)
    closed = ReplyContext(tools=(WEATHER,), prompt_closes_reasoning=True)
    assert parser.parse("Hello", closed) == ParsedReply("Hello", None, ())
    assert parser.parse("Hello", ReplyContext(tools=(WEATHER,))) == ParsedReply(None, "Hello", ())
    assert not reply_parser("hermes", None).prompt_closes_reasoning(prompt)


@pytest.mark.parametrize(("tool_parser", "content"), [("hermes", "a<|endoftext|>b"), ("qwen3_coder", "ab")])
def test_special_tokens_are_dropped_by_engine_parsers_only(tool_parser: str, content: str) -> None:
    context = ReplyContext(tools=(WEATHER,), special_tokens=frozenset({"<|endoftext|>"}))
    assert reply_parser(tool_parser, None).parse("a<|endoftext|>b", context) == ParsedReply(content, None, ())
    # The qwen3 reasoning stage runs on the engine: it drops them from reasoning and content alike.
    reply = reply_parser("hermes", "qwen3").parse("a<|endoftext|>b</think>c<|endoftext|>", context)
    assert reply == ParsedReply("c", "ab", ())


@pytest.mark.parametrize(
    ("tool_parser", "reasoning_parser", "context", "skips"),
    [
        ("hermes", None, ReplyContext(tools=(WEATHER,)), False),  # hermes parses calls: it needs <tool_call>
        ("hermes", None, ReplyContext(), True),  # no tools: vLLM does not adjust the request at all
        ("hermes", None, ReplyContext(tools=(WEATHER,), tool_choice="none"), True),
        ("hermes", "deepseek_r1", ReplyContext(tools=(WEATHER,), tool_choice="none"), True),
        ("qwen3_coder", None, ReplyContext(tools=(WEATHER,)), False),
        ("qwen3_coder", None, ReplyContext(), True),
        ("qwen3_coder", "deepseek_r1", ReplyContext(), False),  # the engine tool parser adjusts too
        (None, "qwen3", ReplyContext(), False),
        (None, "deepseek_r1", ReplyContext(), True),
    ],
)
def test_which_special_tokens_the_engine_would_have_kept(
    tool_parser: str | None, reasoning_parser: str | None, context: ReplyContext, skips: bool
) -> None:
    assert reply_parser(tool_parser, reasoning_parser).skip_special_tokens(context) is skips
