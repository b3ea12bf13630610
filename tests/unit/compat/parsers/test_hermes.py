"""modeltap/compat/parsers/hermes.py: Qwen's JSON `<tool_call>` blocks read as vLLM 0.33.0's hermes
parser reads them (its golden cases, arguments re-serialised, all or nothing), and streamed with the
calls held to the end."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.base import ParsedCall, ReplyContext, ToolExtraction, ToolSpec
from modeltap.compat.parsers.hermes import HermesToolParser

VECTOR_PARSERS = {("hermes", None), ("hermes", "qwen3")}
CONTEXT = ReplyContext(tools=(ToolSpec("get_weather"),))
PARSER = HermesToolParser()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


def block(body: str, close: str = "\n</tool_call>") -> str:
    return f"<tool_call>\n{body}{close}"


def extract(text: str) -> ToolExtraction:
    return PARSER.extract(text, CONTEXT, with_reasoning=False)


def test_a_golden_case_parses_to_vllms_answer(golden: Any) -> None:
    assert golden.parser.parse(golden.text, golden.context) == golden.expected


@given(st.text(), st.dictionaries(st.text(), json_values, max_size=4))
def test_arguments_are_the_json_reserialised_with_unicode_kept(name: str, arguments: dict[str, Any]) -> None:
    # `<` escaped, so that no string of the JSON can spell a marker.
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")).replace("<", "\\u003c")
    text = block(body)
    assert extract(text) == ToolExtraction(
        True, (ParsedCall(name, json.dumps(arguments, ensure_ascii=False)),), None
    )


@given(st.text().filter(lambda t: "<tool_call>" not in t))
def test_text_before_the_first_block_is_the_content_unstripped(before: str) -> None:
    found = extract(before + block('{"name": "f", "arguments": {}}'))
    assert found.tools_called
    assert found.content == (before or None)


def test_one_bad_block_makes_the_whole_text_the_content() -> None:
    good = block('{"name": "f", "arguments": {}}')
    for bad in ('{"name": "f"}', '{"arguments": {}}', '{"name": 5, "arguments": {}}', "[1]", "", '{"a":'):
        text = "Sure.\n" + good + "\n" + block(bad)
        assert extract(text) == ToolExtraction(False, (), text), bad


def test_an_unclosed_last_block_runs_to_the_end() -> None:
    assert extract(block('{"name": "f", "arguments": {"a": 1}} ', close="")).tool_calls == (
        ParsedCall("f", '{"a": 1}'),
    )


def test_text_after_the_calls_is_dropped_and_names_are_not_checked() -> None:
    found = extract(block('{"name": "nowhere", "arguments": "as text"}') + "\nDone.")
    assert found == ToolExtraction(True, (ParsedCall("nowhere", '"as text"'),), None)


def feed_all(pieces: list[str]) -> list[tuple[str, tuple[ParsedCall, ...]]]:
    stream = PARSER.stream(CONTEXT, with_reasoning=False)
    return [stream.feed(piece) for piece in pieces]


def test_the_stream_sends_the_content_before_a_call_and_holds_the_calls() -> None:
    steps = feed_all(
        ["Let me ", "check.<tool", "_call>\n", '{"name": "f", "arguments": {}}', "\n</tool_call>"]
    )
    assert [content for content, _ in steps] == ["Let me ", "check.", "", "", ""]
    assert all(calls == () for _, calls in steps)


def test_the_stream_holds_whitespace_alone_and_a_partial_marker() -> None:
    # "  \n" before a call is no content at all; a "<tool_c" tail may still become a call.
    assert feed_all(["  \n", "<tool_c"]) == [("", ()), ("", ())]
    assert feed_all(["  \n", "<tool_cx", "y"]) == [("", ()), ("  \n<tool_cx", ()), ("y", ())]
