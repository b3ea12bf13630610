"""modeltap/records/continuity.py: the prefix rule, its one allowance, and the classification of breaks."""

from __future__ import annotations

import pytest

from modeltap.dialects.token_ids import common_prefix
from modeltap.records import continuity
from modeltap.records.continuity import (
    ContinuedTurn,
    classify,
    digest,
    message_digests,
    window,
)

PROMPT = [1, 10, 11, 12, 2, 3, 1, 20]
COMPLETION = [30, 31, 2]


def break_position(expected: list[int], prompt: list[int], **context: object) -> int | None:
    return continuity.break_position(common_prefix(expected, prompt), len(expected), len(prompt), **context)  # type: ignore[arg-type]


def test_a_prompt_that_extends_prompt_and_completion_is_continuous() -> None:
    expected = PROMPT + COMPLETION
    # The template's "\n" after the end-of-turn id, then the next message: new ids, no break.
    assert break_position(expected, [*expected, 3, 1, 40], finish_reason="stop", completion_length=3) is None


def test_the_first_differing_id_is_the_break() -> None:
    expected = PROMPT + COMPLETION
    assert break_position(expected, [*PROMPT, 30, 99, 2, 3], finish_reason="stop", completion_length=3) == 9
    # A prompt that stops short of the previous completion breaks where it stops.
    assert break_position(expected, PROMPT, finish_reason="stop", completion_length=3) == len(PROMPT)


def test_a_stop_token_rendered_as_another_end_token_is_allowed_only_as_the_last_id_of_a_stop() -> None:
    expected = [*PROMPT, 30, 31, 5]  # stopped on 5 (say <|endoftext|>); the template writes 2 (<|im_end|>)
    following = [*PROMPT, 30, 31, 2, 3, 1, 40]
    assert break_position(expected, following, finish_reason="stop", completion_length=3) is None
    assert break_position(expected, following, finish_reason="length", completion_length=3) == 10
    assert break_position(expected, [*PROMPT, 30, 9, 2], finish_reason="stop", completion_length=3) == 9


def test_window_keeps_ids_either_side() -> None:
    assert window(list(range(100)), 50) == (38, list(range(38, 62)))
    assert window([1, 2, 3], 1) == (0, [1, 2, 3])


SYSTEM = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}
REPLY = {"role": "assistant", "content": "42"}
TOOLS = digest([{"name": "bash"}])


def previous(history: list[dict], reply: dict = REPLY) -> ContinuedTurn:
    return ContinuedTurn(message_digests(history), TOOLS, reply)


def kind_of(before: ContinuedTurn, history: list[dict], tools: bytes = TOOLS, position: int = 20) -> tuple:
    return classify(before, history, message_digests(history), tools, position, 10)


def test_tools_changed_first() -> None:
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, REPLY], tools=digest([]))[0] == "tools_changed"


def test_an_earlier_message_edited_or_removed_names_its_index() -> None:
    edited = {"role": "user", "content": "u!"}
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, edited, REPLY], position=5) == (
        "message_edited",
        1,
        "user",
    )
    assert kind_of(previous([SYSTEM, USER, REPLY, USER]), [SYSTEM, REPLY, USER], position=5) == (
        "message_removed",
        1,
        "assistant",
    )


@pytest.mark.parametrize(
    ("echo", "kind"),
    [
        ({"role": "assistant", "content": "41"}, "assistant_text_changed"),
        (
            {
                "role": "assistant",
                "content": "42",
                "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}],
            },
            "tool_call_arguments_changed",
        ),
        ({"role": "user", "content": "next"}, "reply_missing"),
    ],
)
def test_how_the_echoed_reply_changed(echo: dict, kind: str) -> None:
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, echo]) == (kind, 2, echo["role"])


def test_tool_call_arguments_compare_as_json_not_as_text() -> None:
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "bash", "arguments": '{"a": 1, "b": 2}'}}],
    }
    echo = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "bash", "arguments": '{"b":2,"a":1}'}}],
    }
    assert kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, echo, USER]) == (
        "rerendered",
        2,
        "assistant",
    )


def test_reasoning_dropped_by_the_agent_or_by_the_template() -> None:
    thought = {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
    by_agent = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, REPLY, USER])
    assert by_agent == ("reasoning_dropped", 2, "assistant")
    by_template = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, thought, USER])
    assert by_template == ("reasoning_dropped", 2, "assistant")


def test_same_messages_other_ids_are_rerendered() -> None:
    # Nulls and empty fields of the reply are not what an agent echoes: they do not count.
    reply = {**REPLY, "refusal": None, "tool_calls": []}
    assert kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, REPLY, USER]) == (
        "rerendered",
        2,
        "assistant",
    )
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, REPLY, USER], position=4) == (
        "rerendered",
        None,
        None,
    )
