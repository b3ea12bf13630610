"""modeltap/compat/parsers/reasoning.py: `<think>` split as vLLM 0.33.0's `qwen3`, `glm45` and
`deepseek_r1` parsers split it (their golden cases: with and without the opening tag, never closed,
`enable_thinking` false, the implicit end at `<tool_call>`), whether a prompt closed reasoning, and
what each one's stream can send before the end."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.base import ReasoningSplit, ReplyContext
from modeltap.compat.parsers.reasoning import (
    GLM_TURN_BOUNDARIES,
    QWEN3_TURN_BOUNDARIES,
    DeepSeekR1Reasoning,
    GlmReasoning,
    Qwen3Reasoning,
    prompt_closes_reasoning,
)

VECTOR_PARSERS = {(None, "qwen3"), (None, "deepseek_r1")}
QWEN3, GLM, R1 = Qwen3Reasoning(), GlmReasoning(), DeepSeekR1Reasoning()
NO_THINKING = ReplyContext(chat_template_kwargs={"enable_thinking": False})
plain = st.text(st.characters(exclude_characters="<"))


def test_a_golden_case_parses_to_vllms_answer(golden: Any) -> None:
    assert golden.parser.parse(golden.text, golden.context) == golden.expected


@given(plain)
def test_text_without_markers_is_all_reasoning_while_thinking(text: str) -> None:
    for parser in (QWEN3, GLM, R1):
        split = parser.split(text, ReplyContext())
        assert (split.reasoning or "", split.content) == ((text.rstrip() if parser is GLM else text), None)


@given(st.text())
def test_with_thinking_off_the_text_is_all_content(text: str) -> None:
    assert QWEN3.split(text, NO_THINKING) == ReasoningSplit(None, text)
    assert GLM.split(text, NO_THINKING) == ReasoningSplit(None, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>\nA\n</think>\n\nB", ReasoningSplit("\nA\n", "\n\nB")),  # nothing stripped
        ("A</think>B</think>C", ReasoningSplit("A", "BC")),  # a second </think> is dropped
        ("A<tool_call>x", ReasoningSplit("A", "<tool_call>x")),  # a call ends reasoning
        ("<think></think><think>B", ReasoningSplit(None, "<think>B")),
        ("", ReasoningSplit(None, None)),
    ],
)
def test_qwen3(text: str, expected: ReasoningSplit) -> None:
    assert QWEN3.split(text, ReplyContext()) == expected


def test_glm_reopens_reasoning_and_strips_its_end() -> None:
    assert GLM.split("A \n</think>B<think>C\n</think>D", ReplyContext()) == ReasoningSplit("A \nC", "BD")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lost<think>A</think>B", ReasoningSplit("A", "B")),  # what precedes <think> is discarded
        ("<think></think>", ReasoningSplit("", None)),
        ("A<tool_call>x", ReasoningSplit("A<tool_call>x", None)),  # no implicit end
        ("A</think>B</think>C", ReasoningSplit("A", "B</think>C")),
    ],
)
def test_deepseek_r1(text: str, expected: ReasoningSplit) -> None:
    assert R1.split(text, ReplyContext()) == expected


def test_a_prompt_closed_reasoning_when_its_last_turn_ends_it() -> None:
    assert prompt_closes_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", QWEN3_TURN_BOUNDARIES)
    assert not prompt_closes_reasoning("<|im_start|>assistant\n", QWEN3_TURN_BOUNDARIES)
    assert not prompt_closes_reasoning("<|im_start|>assistant\n<think>\n", QWEN3_TURN_BOUNDARIES)
    # An earlier turn's markers do not count; a call in this turn does.
    earlier = "<|im_start|>assistant\n</think>x<|im_end|>\n<|im_start|>assistant\n"
    assert not prompt_closes_reasoning(earlier, QWEN3_TURN_BOUNDARIES)
    assert prompt_closes_reasoning("<|assistant|>a<tool_call>", GLM_TURN_BOUNDARIES)
    assert QWEN3.prompt_closes("<|im_start|>assistant\n</think>")
    assert not R1.prompt_closes("<|im_start|>assistant\n</think>")


def test_a_closed_prompt_starts_in_content() -> None:
    closed = ReplyContext(prompt_closes_reasoning=True)
    assert QWEN3.split("A</think>B", closed) == ReasoningSplit(None, "AB")


def streamed(parser: Any, pieces: list[str], context: ReplyContext | None = None) -> list[tuple[str, str]]:
    stream = parser.stream(context or ReplyContext())
    return [stream.feed(piece) for piece in pieces]


def test_the_qwen3_stream_sends_reasoning_and_content_as_they_come() -> None:
    assert streamed(QWEN3, ["<think>\nA", "</thi", "nk>B"]) == [("\nA", ""), ("", ""), ("", "B")]
    assert streamed(QWEN3, ["A</think>"], NO_THINKING) == [("", "A</think>")]


def test_the_glm_stream_holds_trailing_whitespace_of_reasoning() -> None:
    assert streamed(GLM, ["A \n", "B", "  </think>C"]) == [("A", ""), (" \nB", ""), ("", "C")]


def test_the_deepseek_r1_stream_waits_for_an_opening_tag() -> None:
    # Before <think>, a later one would discard the text: nothing is sent.
    assert streamed(R1, ["A", "</think>B"]) == [("", ""), ("", "")]
    assert streamed(R1, ["x<thi", "nk>A</th", "ink>B", "C"]) == [("", ""), ("A", ""), ("", "B"), ("", "C")]
