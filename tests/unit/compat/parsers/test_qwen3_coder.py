"""modeltap/compat/parsers/qwen3_coder.py: Qwen3's XML calls read as vLLM 0.33.0's `qwen3_coder`
parser reads them (its golden cases, the values' newline trim and schema typing, the tolerant
grammar), and streamed with each call sent when it ends."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.base import ParsedCall, ReplyContext, ToolExtraction, ToolSpec
from modeltap.compat.parsers.qwen3_coder import Qwen3CoderToolParser, parameters, qwen3_thinking

VECTOR_PARSERS = {("qwen3_coder", None), ("qwen3_coder", "qwen3")}
WRITE = ToolSpec(
    "write",
    {
        "type": "object",
        "properties": {"path": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    },
)
CONTEXT = ReplyContext(tools=(WRITE,))
PARSER = Qwen3CoderToolParser()


def call(name: str, **values: str) -> str:
    params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def extract(text: str, *, with_reasoning: bool = False) -> ToolExtraction:
    return PARSER.extract(text, CONTEXT, with_reasoning=with_reasoning)


def test_a_golden_case_parses_to_vllms_answer(golden: Any) -> None:
    assert golden.parser.parse(golden.text, golden.context) == golden.expected


@given(st.text().filter(lambda t: "<" not in t))
def test_a_value_loses_exactly_one_newline_on_each_side(value: str) -> None:
    raw = f"<parameter=path>\n{value}\n</parameter>"
    assert parameters(raw) == {"path": value}
    assert extract(call("write", path=value)).tool_calls == (
        ParsedCall("write", json.dumps({"path": value}, ensure_ascii=False)),
    )


def test_values_are_typed_by_the_schema_and_a_failure_stays_text() -> None:
    found = extract(call("write", n="42", ok="1", path="null"))
    assert found.tool_calls == (ParsedCall("write", '{"n": 42, "ok": true, "path": "null"}'),)
    assert extract(call("write", n="many")).tool_calls == (ParsedCall("write", '{"n": "many"}'),)
    # An unknown tool is kept, its values all strings.
    assert extract(call("other", n="42")).tool_calls == (ParsedCall("other", '{"n": "42"}'),)


def test_a_parameter_ends_at_the_next_one_and_an_open_last_one_is_dropped() -> None:
    assert parameters("<parameter=a>1<parameter=b>2</parameter>") == {"a": "1", "b": "2"}
    assert parameters("< parameter = a >1< / parameter >") == {"a ": "1"}
    assert extract("<tool_call>\n<function=write>\n<parameter=n>\n4").tool_calls == (
        ParsedCall("write", "{}"),
    )


def test_the_grammar_tolerates_missing_tags() -> None:
    # A function without <tool_call>, and a second call opening before the first closes.
    text = (
        "Checking.\n<function=write><parameter=n>1</parameter></function>"
        "<tool_call><function=other></function>"
    )
    found = extract(text)
    assert found == ToolExtraction(
        True, (ParsedCall("write", '{"n": 1}'), ParsedCall("other", "{}")), "Checking."
    )


def test_content_is_stripped_only_when_calls_are_made() -> None:
    assert extract("  Let me check.\n\n" + call("write")).content == "Let me check."
    assert extract("  plain  ").content == "  plain  "
    # A call that never gets a name: no call, and the markup is not content.
    assert extract("  plain  <tool_call><function=></function></tool_call>!") == ToolExtraction(
        False, (), "  plain  !"
    )


def test_think_tags_stay_content_without_a_reasoning_parser() -> None:
    text = "<think>\nhm\n</think>\n\n" + call("write")
    assert extract(text).content == "<think>\nhm\n</think>"
    assert extract(text, with_reasoning=True).content == "<think>\nhm"


def test_thinking_is_on_unless_the_request_turns_it_off() -> None:
    assert qwen3_thinking({})
    assert qwen3_thinking({"enable_thinking": True})
    assert not qwen3_thinking({"enable_thinking": False})


def test_the_stream_sends_a_call_when_its_function_closes() -> None:
    stream = PARSER.stream(CONTEXT, with_reasoning=False)
    pieces = [
        "Let me check.  ",
        "<tool_call>\n<function=write>\n<parameter=n>\n4",
        "2\n</parameter>\n</funct",
        "ion>",
    ]
    steps = [stream.feed(piece) for piece in pieces]
    assert steps == [
        ("Let me check.", ()),
        ("", ()),
        ("", ()),
        ("", (ParsedCall("write", '{"n": 42}'),)),
    ]


def test_the_stream_holds_content_that_begins_with_whitespace_until_a_call_is_made() -> None:
    stream = PARSER.stream(CONTEXT, with_reasoning=False)
    assert stream.feed("\n\nSure") == ("", ())
    assert stream.feed(call("write")) == ("Sure", (ParsedCall("write", "{}"),))
