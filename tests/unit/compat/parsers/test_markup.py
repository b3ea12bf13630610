"""modeltap/compat/parsers/markup.py: the engine's lexer and state machine give the same events
whatever pieces the text comes in, tails that may become terminals wait, and the reasoning pass
splits as vLLM 0.33.0's `ParserEngine` does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.glm import glm_grammar
from modeltap.compat.parsers.markup import (
    Emitted,
    Event,
    Grammar,
    Machine,
    State,
    Transition,
    split_reasoning,
)
from modeltap.compat.parsers.qwen3_coder import qwen3_grammar

QWEN3 = qwen3_grammar(True)
SPECIAL = frozenset({"<|im_end|>", "<|endoftext|>"})
# Text built from the grammar's literals, pieces of them and plain characters.
PIECES = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    ">",
    "<",
    "</",
    "<tool",
    "<|im_end|>",
    "<|im_",
    "a",
    "\n",
    " ",
]
texts = st.lists(st.sampled_from(PIECES), max_size=16).map("".join)


def run(text_pieces: list[str], *, state: State = State.REASONING, **options: bool) -> list[Emitted]:
    machine = Machine(QWEN3, state=state, special_tokens=SPECIAL, **options)
    events: list[Emitted] = []
    for piece in text_pieces:
        events += machine.feed(piece)
    return events + machine.finish()


def merged(events: list[Emitted]) -> list[Emitted]:
    """Adjacent text events of one kind joined (the lexer may cut plain text anywhere)."""
    out: list[Emitted] = []
    for kind, value, index in events:
        if (
            out
            and out[-1][0] is kind
            and kind in (Event.TEXT, Event.REASONING, Event.CALL_ARGS, Event.CALL_NAME)
        ):
            out[-1] = (kind, out[-1][1] + value, index)
        else:
            out.append((kind, value, index))
    return out


@given(texts, st.data())
def test_pieces_give_the_events_of_the_whole(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for options in ({"skip_tools": True}, {"skip_reasoning": True}, {}):
        assert merged(run(pieces, **options)) == merged(run([text], **options))


def test_a_tail_that_may_become_a_terminal_waits_and_a_dead_one_is_text() -> None:
    machine = Machine(QWEN3, state=State.CONTENT, skip_tools=True)
    assert machine.feed("hi <tool_") == [(Event.TEXT, "hi ", -1)]
    assert machine.feed("call>x") == [
        (Event.REASONING_END, "<tool_call>", -1),
        (Event.TEXT, "<tool_call>", -1),
        (Event.TEXT, "x", -1),
    ]
    assert machine.feed("<tool") == []
    assert machine.finish() == [(Event.TEXT, "<tool", -1)]


def test_special_tokens_are_dropped_in_every_state() -> None:
    events = run(["a<|im_end|>b</think>c<|endoftext|><tool_call><function=f<|im_end|>>x<|endoftext|>"])
    assert (Event.REASONING, "a", -1) in events
    assert all("<|" not in value for _, value, _ in events)


def test_the_reasoning_pass_leaves_call_markup_as_text_and_ends_at_a_call() -> None:
    events = run(["plan<tool_call>\n<function=f>"], skip_tools=True)
    assert merged(events) == [
        (Event.REASONING, "plan", -1),
        (Event.REASONING_END, "<tool_call>", -1),
        (Event.TEXT, "<tool_call>\n<function=f>", -1),
    ]


def test_without_a_reasoning_parser_think_tags_are_text() -> None:
    events = run(["<think>x</think>"], state=State.CONTENT, skip_reasoning=True)
    assert merged(events) == [(Event.TEXT, "<think>x</think>", -1)]
    # With one, a stray </think> in content is dropped.
    assert merged(run(["a</think>b"], state=State.CONTENT)) == [(Event.TEXT, "ab", -1)]


def test_the_reasoning_only_terminals_of_each_grammar() -> None:
    assert QWEN3.reasoning_markup == {"THINK_START", "THINK_END"}
    assert glm_grammar(True).reasoning_markup == {"THINK_START", "THINK_END"}
    assert "TOOL_END" in QWEN3.exit_terminals and "THINK_END" not in QWEN3.tool_terminals


def test_the_longest_literal_wins_and_a_whole_one_that_may_grow_waits() -> None:
    machine = Machine(QWEN3, state=State.CONTENT, special_tokens=frozenset({"<|a|>", "<|a|>b|>"}))
    assert machine.feed("x<|a|>") == [(Event.TEXT, "x", -1)]
    assert machine.feed("b|>y<|a|>z") == [(Event.TEXT, "y", -1), (Event.TEXT, "z", -1)]


def test_the_reasoning_pass_keeps_or_strips_trailing_whitespace_by_grammar() -> None:
    text = "A \n</think>\n"
    qwen3 = Machine(QWEN3, state=State.REASONING, skip_tools=True)
    assert split_reasoning(qwen3.feed(text) + qwen3.finish(), QWEN3) == ("A \n", "\n")
    glm = Machine(glm_grammar(True), state=State.REASONING, skip_tools=True)
    assert split_reasoning(glm.feed(text) + glm.finish(), glm_grammar(True)) == ("A", "\n")
    empty = Machine(QWEN3, state=State.REASONING, skip_tools=True)
    assert split_reasoning(empty.feed("") + empty.finish(), QWEN3) == (None, None)


def test_a_literal_that_spans_the_start_of_another_wins_from_its_own_start() -> None:
    # "a<t" is leftmost in "xa<think>": it is the terminal (dropped), and "hink>" is text.
    machine = Machine(QWEN3, state=State.CONTENT, special_tokens=frozenset({"a<t"}))
    assert machine.feed("xa<t") + machine.feed("hink>") + machine.finish() == [
        (Event.TEXT, "x", -1),
        (Event.TEXT, "hink", -1),
        (Event.TEXT, ">", -1),
    ]


def toy_grammar(shared_closer: bool) -> Grammar:
    """A grammar whose `<e>` closes a call and also something outside one (as Inkling's closer does in
    vLLM): reasoning when `shared_closer`, else a content block whose closer is dropped."""
    transitions = {
        (State.CONTENT, "OPEN"): Transition(State.TOOL_ARGS, (Event.CALL_START,)),
        (State.TOOL_ARGS, "END"): Transition(State.CONTENT, (Event.CALL_END,)),
        (State.CONTENT, "END"): Transition(State.CONTENT),
    }
    if shared_closer:
        transitions[(State.REASONING, "END")] = Transition(State.CONTENT, (Event.REASONING_END,))
    return Grammar("toy", {"OPEN": "<o>", "END": "<e>"}, transitions, State.CONTENT, lambda raw: {})


def test_a_shared_closer_is_no_reasoning_markup_and_ends_a_skipped_call_first() -> None:
    assert toy_grammar(True).reasoning_markup == frozenset()
    # The reasoning pass leaves the call as text: the first <e> ends it (text too), a second one is
    # the content closer, applied (and dropped).
    machine = Machine(toy_grammar(False), state=State.CONTENT, skip_tools=True)
    assert merged(machine.feed("a<o>b<e>c<e>d") + machine.finish()) == [(Event.TEXT, "a<o>b<e>cd", -1)]
