"""modeltap/compat/parsers/glm.py: GLM's `<arg_key>` calls read as vLLM 0.33.0's `glm45` / `glm47`
parser reads them (its golden cases, both layouts, names checked against the tools, raw values typed
by the schema), and streamed with each call sent when `</tool_call>` arrives."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.base import ParsedCall, ReplyContext, ToolExtraction, ToolSpec
from modeltap.compat.parsers.glm import GlmToolParser, glm_thinking, pairs

VECTOR_PARSERS = {("glm45", None), ("glm47", None), ("glm45", "glm45")}
WEATHER = ToolSpec("get_weather", {"properties": {"city": {"type": "string"}, "days": {"type": "integer"}}})
CONTEXT = ReplyContext(tools=(WEATHER,))
PARSER = GlmToolParser()
keys = st.text("abc_", min_size=1, max_size=5)
values = st.text(st.characters(exclude_characters="<"), max_size=8)


def extract(text: str, context: ReplyContext = CONTEXT) -> ToolExtraction:
    return PARSER.extract(text, context, with_reasoning=False)


def glm45(name: str, arguments: dict[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in arguments.items())
    return f"<tool_call>{name}\n{body}</tool_call>"


def glm47(name: str, arguments: dict[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in arguments.items())
    return f"<tool_call>{name}{body}</tool_call>"


def test_a_golden_case_parses_to_vllms_answer(golden: Any) -> None:
    assert golden.parser.parse(golden.text, golden.context) == golden.expected


@given(st.dictionaries(keys, values, max_size=3))
def test_both_layouts_give_the_same_call(arguments: dict[str, str]) -> None:
    compact = extract(glm47("get_weather", arguments))
    assert compact == extract(glm45("get_weather", arguments))
    assert compact.tools_called
    assert pairs(glm47("f", arguments)) == arguments


def test_keys_are_stripped_values_kept_and_typed() -> None:
    text = (
        "<tool_call> get_weather \n<arg_key> city </arg_key> \n <arg_value> Paris\n</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value>"
    )
    assert extract(text).tool_calls == (ParsedCall("get_weather", '{"city": " Paris\\n", "days": 3}'),)


def test_a_name_outside_the_tools_drops_the_call_unless_there_are_none() -> None:
    text = "Sure." + glm47("book_flight", {"to": "Rome"})
    assert extract(text) == ToolExtraction(False, (), "Sure.")
    assert extract(text, ReplyContext()).tool_calls == (ParsedCall("book_flight", '{"to": "Rome"}'),)


def test_a_call_without_arguments_has_an_empty_object() -> None:
    assert extract("<tool_call>get_weather</tool_call>").tool_calls == (ParsedCall("get_weather", "{}"),)


def test_thinking_follows_either_switch() -> None:
    assert glm_thinking({})
    assert not glm_thinking({"enable_thinking": False})
    assert not glm_thinking({"thinking": False})
    assert glm_thinking({"thinking": False, "enable_thinking": True})
    # Without thinking, think tags are no terminals at all: plain content.
    off = ReplyContext(tools=(WEATHER,), chat_template_kwargs={"enable_thinking": False})
    assert PARSER.extract("<think>x</think>", off, with_reasoning=True).content == "<think>x</think>"


def test_the_stream_sends_a_call_when_it_closes() -> None:
    stream = PARSER.stream(CONTEXT, with_reasoning=False)
    assert stream.feed("Checking.\n<tool_call>get_weather<arg_key>city</arg_key>") == ("Checking.", ())
    assert stream.feed("<arg_value>Paris</arg_value></tool_") == ("", ())
    assert stream.feed("call>\n") == ("", (ParsedCall("get_weather", '{"city": "Paris"}'),))
