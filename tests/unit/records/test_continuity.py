"""modeltap/records/continuity.py: the prefix rule, its one allowance, the classification of breaks,
and each field of an echoed reply that differs from the model's."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.dialects.token_ids import common_prefix
from modeltap.records import continuity
from modeltap.records.continuity import (
    Break,
    ContinuedTurn,
    EchoChange,
    TokenDrift,
    classify,
    describe,
    digest,
    echo_changes,
    message_digests,
    window,
)

PROMPT = [1, 10, 11, 12, 2, 3, 1, 20]
COMPLETION = [30, 31, 2]
# Say 2 is <|im_end|> and 5 <|endoftext|>: the ids that end a generated turn.
TURN_ENDS = frozenset({2, 5})


def break_position(expected: list[int], prompt: list[int], completion_length: int = 3) -> int | None:
    return continuity.break_position(
        expected,
        prompt,
        common_prefix(expected, prompt),
        completion_length=completion_length,
        turn_ends=TURN_ENDS,
    )


def test_a_prompt_that_extends_prompt_and_completion_is_continuous() -> None:
    expected = PROMPT + COMPLETION
    # The template's "\n" after the end-of-turn id, then the next message: new ids, no break.
    assert break_position(expected, [*expected, 3, 1, 40]) is None


def test_the_first_differing_id_is_the_break() -> None:
    expected = PROMPT + COMPLETION
    assert break_position(expected, [*PROMPT, 30, 99, 2, 3]) == 9
    # A prompt that stops short of the previous completion breaks where it stops.
    assert break_position(expected, PROMPT) == len(PROMPT)


def test_a_stop_id_rendered_as_another_turn_end_is_the_one_allowance() -> None:
    stopped = [*PROMPT, 30, 31, 5]  # stopped on <|endoftext|>; the template writes <|im_end|>
    assert break_position(stopped, [*PROMPT, 30, 31, 2, 3, 1, 40]) is None
    # An id in the last place that is not a turn end on both sides breaks there: a reply echoed with
    # one character more renders that character where the model had stopped.
    assert break_position(stopped, [*PROMPT, 30, 31, 77, 2, 3]) == 10
    cut = [*PROMPT, 30, 31, 32]  # finished on length: its last id ends nothing
    assert break_position(cut, [*PROMPT, 30, 31, 2, 3]) == 10
    # Without the served tokenizer's turn ends there is no allowance at all.
    unknown = continuity.break_position(
        stopped, [*PROMPT, 30, 31, 2], 10, completion_length=3, turn_ends=frozenset()
    )
    assert unknown == 10
    # No completion, no allowance: the last id is the prompt's own.
    assert break_position([*PROMPT[:-1], 5], [*PROMPT[:-1], 2], completion_length=0) == 7


def test_window_keeps_ids_either_side() -> None:
    assert window(list(range(100)), 50) == (38, list(range(38, 62)))
    assert window([1, 2, 3], 1) == (0, [1, 2, 3])


SYSTEM = {"role": "system", "content": "s"}
USER = {"role": "user", "content": "u"}
REPLY = {"role": "assistant", "content": "42"}
TOOLS = digest([{"name": "bash"}])


def previous(history: list[dict], reply: dict = REPLY) -> ContinuedTurn:
    return ContinuedTurn(message_digests(history), TOOLS, reply)


def kind_of(before: ContinuedTurn, history: list[dict], tools: bytes = TOOLS, position: int = 20) -> Break:
    return classify(before, history, message_digests(history), tools, position, 10)


def call(arguments: str, name: str = "bash") -> dict:
    return {"function": {"name": name, "arguments": arguments}}


def test_tools_changed_first() -> None:
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, REPLY], tools=digest([])) == Break(
        "tools_changed"
    )


def test_an_earlier_message_edited_or_removed_names_its_index() -> None:
    edited = {"role": "user", "content": "u!"}
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, edited, REPLY], position=5) == Break(
        "message_edited", 1, "user"
    )
    assert kind_of(previous([SYSTEM, USER, REPLY, USER]), [SYSTEM, REPLY, USER], position=5) == Break(
        "message_removed", 1, "assistant"
    )


def test_a_missing_reply_is_named() -> None:
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, USER]) == Break("reply_missing", 2, "user")
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER]) == Break("reply_missing")


@pytest.mark.parametrize(
    ("echo", "kind", "changes"),
    [
        (
            {"role": "assistant", "content": "41"},
            "assistant_text_changed",
            (EchoChange("content", "edited", "42", "41"),),
        ),
        (
            {"role": "assistant", "content": "42 "},
            "reply_reformatted",
            (EchoChange("content", "whitespace", "42", "42 "),),
        ),
        (
            {"role": "assistant", "content": "42", "tool_calls": [call("{}")]},
            "tool_call_arguments_changed",
            (EchoChange("tool_calls", "edited", "", "bash"),),
        ),
    ],
)
def test_how_the_echoed_reply_changed(echo: dict, kind: str, changes: tuple[EchoChange, ...]) -> None:
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, echo]) == Break(kind, 2, "assistant", changes)  # type: ignore[arg-type]


def test_tool_call_arguments_written_otherwise_are_a_reformatted_reply() -> None:
    reply = {"role": "assistant", "content": None, "tool_calls": [call('{"a": 1, "b": 2}')]}
    reordered = {"role": "assistant", "content": "", "tool_calls": [call('{"b":2,"a":1}')]}
    found = kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, reordered, USER])
    assert found == Break(
        "reply_reformatted",
        2,
        "assistant",
        (EchoChange("tool_calls[0].arguments", "key order", '{"a": 1, "b": 2}', '{"b":2,"a":1}'),),
    )
    assert describe(found) == (
        "the previous reply came back with the same meaning, written otherwise "
        "(message 3, assistant): tool_calls[0].arguments: key order"
    )
    respaced = {"role": "assistant", "tool_calls": [call('{"a":1,"b":2}')]}
    assert kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, respaced]).changes[0].cause == "spacing"
    edited = {"role": "assistant", "tool_calls": [call('{"a": 1, "b": 3}')]}
    assert (
        kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, edited]).kind == "tool_call_arguments_changed"
    )


def test_reasoning_dropped_by_the_agent_or_by_the_template() -> None:
    thought = {"role": "assistant", "content": "42", "reasoning_content": "6 times 7"}
    by_agent = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, REPLY, USER])
    assert by_agent == Break(
        "reasoning_dropped", 2, "assistant", (EchoChange("reasoning", "dropped", "6 times 7", None),)
    )
    # The template left the reasoning out: the ids part at the reply's first, where `<think>` was.
    by_template = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, thought, USER], position=10)
    assert by_template == Break("reasoning_dropped", 2, "assistant")
    assert describe(by_template).endswith("(message 3, assistant): by the chat template")
    # Parting later in the reply, the reasoning came back and something else was written otherwise
    # (the call's JSON spaced another way): not a dropped reasoning.
    later = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, thought, USER], position=20)
    assert later == Break("rerendered", 2, "assistant")
    # An edit outranks a drop: what the reply says matters most to a trainer.
    both = kind_of(previous([SYSTEM, USER], thought), [SYSTEM, USER, {"role": "assistant", "content": "7"}])
    assert both.kind == "assistant_text_changed"
    assert [c.field for c in both.changes] == ["content", "reasoning"]


def test_same_messages_other_ids_are_rerendered() -> None:
    # Nulls and empty fields of the reply are not what an agent echoes: they do not count.
    reply = {**REPLY, "refusal": None, "tool_calls": []}
    assert kind_of(previous([SYSTEM, USER], reply), [SYSTEM, USER, REPLY, USER]) == Break(
        "rerendered", 2, "assistant"
    )
    # Before the previous prompt's end, no message is to blame.
    assert kind_of(previous([SYSTEM, USER]), [SYSTEM, USER, REPLY, USER], position=4) == Break("rerendered")


def test_a_drift_keeps_its_changes_through_json() -> None:
    changes = (EchoChange("content", "whitespace", "a", "a "),)
    stored = {
        "position": 3,
        "kind": "reply_reformatted",
        "text": "x",
        "changes": [
            {"field": c.field, "cause": c.cause, "model": c.model, "echoed": c.echoed} for c in changes
        ],
    }
    drift = TokenDrift.from_json(json.loads(json.dumps(stored)))
    assert drift is not None and drift.changes == changes
    # A store written by another release: a change of the wrong shape is left out, an unknown cause read
    # as an edit.
    odd = TokenDrift.from_json({**stored, "changes": [7, {"field": "content", "cause": "?"}]})
    assert odd is not None and odd.changes == (EchoChange("content", "edited", None, None),)


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
WHITESPACE = st.sampled_from([" ", "\n", "\t", "  ", "\n\n"])


@given(
    content=TEXT, reasoning=TEXT, pad=WHITESPACE, arguments=st.dictionaries(TEXT, st.integers(), max_size=4)
)
def test_each_echo_change_has_its_cause(content: str, reasoning: str, pad: str, arguments: dict) -> None:
    text = json.dumps(arguments)
    reply = {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [call(text)],
    }
    assert echo_changes(reply, dict(reply)) == []
    padded = echo_changes(reply, {**reply, "content": content + pad})
    assert padded == [EchoChange("content", "whitespace", content, content + pad)]
    edited = echo_changes(reply, {**reply, "content": content + "!"})
    assert edited == [EchoChange("content", "edited", content, content + "!")]
    dropped = echo_changes(reply, {**reply, "reasoning_content": None})
    assert dropped == ([EchoChange("reasoning", "dropped", reasoning, None)] if reasoning else [])
    compact = json.dumps(arguments, separators=(",", ":"))
    spaced = echo_changes(reply, {**reply, "tool_calls": [call(compact)]})
    assert spaced == (
        [] if compact == text else [EchoChange("tool_calls[0].arguments", "spacing", text, compact)]
    )
    if len(arguments) > 1:
        reordered = json.dumps(dict(reversed(list(arguments.items()))))
        assert echo_changes(reply, {**reply, "tool_calls": [call(reordered)]})[0].cause == "key order"
