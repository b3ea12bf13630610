"""modeltap/compat/parsers/engine_calls.py: the engine's tool bookkeeping reads names, arguments and
the content around calls as vLLM 0.33.0's `ParserEngine` does, in the corners the golden cases do
not reach."""

from __future__ import annotations

from modeltap.compat.parsers.base import ParsedCall, ReplyContext, ToolSpec
from modeltap.compat.parsers.engine_calls import Calls
from modeltap.compat.parsers.markup import Machine, State
from modeltap.compat.parsers.qwen3_coder import qwen3_grammar

QWEN3 = qwen3_grammar(True)


def calls_of(text: str, tools: tuple[ToolSpec, ...] = ()) -> tuple[Calls, list[int]]:
    machine = Machine(QWEN3, state=State.CONTENT)
    calls = Calls(QWEN3, ReplyContext(tools=tools))
    ended = calls.take(machine.feed(text) + machine.finish())
    return calls, ended


def test_an_empty_function_name_is_found_in_the_arguments_text() -> None:
    # `_try_extract_name`: with no name, the first `"name": "..."` of the argument text names it.
    calls, ended = calls_of('<tool_call><function=>"name": "f"</function></tool_call>')
    assert ended == [0]
    assert calls.calls() == (ParsedCall("f", "{}"),)


def test_a_json_body_names_a_call_its_markup_left_unnamed() -> None:
    # `_extract_name_and_args`: the name regex finds nothing (the key is written with an escape), but
    # the body is JSON with a string name: its arguments are kept as written unless a schema types them.
    body = '{"\\u006eame": "f", "arguments": "{\\"n\\":1}"}'
    calls, _ = calls_of(f"<function=>{body}</function>")
    assert calls.calls() == (ParsedCall("f", '{"n":1}'),)
    typed = (ToolSpec("f", {"properties": {"n": {"type": "string"}}}),)
    assert calls_of(f"<function=>{body}</function>", typed)[0].calls() == (ParsedCall("f", '{"n": "1"}'),)
    # A name that is no string makes no call (vLLM fails building the message).
    assert calls_of('<function=>{"name": 5, "arguments": {}}</function>')[0].calls() == ()


def test_text_after_calls_is_kept_only_when_no_call_was_named() -> None:
    named, _ = calls_of("before <tool_call><function=f></function></tool_call> after")
    assert named.content(tools_called=True) == "before"
    unnamed, _ = calls_of("before <tool_call><function=   ></function></tool_call> after")
    assert unnamed.calls() == ()  # "   " was sent as a name, but strips to nothing
    assert unnamed.content(tools_called=False) == "before "
    nameless, _ = calls_of("before <tool_call><function=></function></tool_call> after")
    assert nameless.content(tools_called=False) == "before  after"


def test_whitespace_alone_is_no_content_once_a_call_began() -> None:
    calls, _ = calls_of("  \n<function=></function>")
    assert calls.content(tools_called=False) is None


def test_the_json_fallback_reads_parameters_or_the_other_keys() -> None:
    unnamed = '<function=>{"\\u006eame": "f", %s}</function>'
    assert calls_of(unnamed % '"parameters": {"a": 1}')[0].calls() == (ParsedCall("f", '{"a": 1}'),)
    assert calls_of(unnamed % '"a": 1, "b": [2]')[0].calls() == (ParsedCall("f", '{"a": 1, "b": [2]}'),)
    typed = (ToolSpec("f", {"properties": {"a": {"type": "string"}}}),)
    # An arguments string that is no JSON object is left as it is, whatever the schema.
    for raw in ('"arguments": "not json"', '"arguments": "[1]"'):
        assert calls_of(unnamed % raw, typed)[0].calls() == (ParsedCall("f", raw.split(": ", 1)[1][1:-1]),)
    # A body that is no JSON object names nothing.
    assert calls_of("<function=>[1, 2]</function>")[0].calls() == ()
    assert calls_of("<function=>{oops</function>")[0].calls() == ()
