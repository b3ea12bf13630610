"""modeltap/compat/prompts.py: each engine release's message preparation equals what that release's own
code made of 200 generated requests (tests/fixtures/engine_prep), and the openai SDK's typed view AReaL
validates chat bodies with."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from modeltap.compat import preparations
from modeltap.compat.prompts import (
    PreparationError,
    prepare_conversation,
    prepare_message,
    prepare_tools,
    typed_messages,
    typed_tools,
)

VECTORS = Path(__file__).parents[2] / "fixtures" / "engine_prep" / "vectors.json.gz"
RELEASES = preparations.RELEASES_READ


def vectors() -> list[dict[str, Any]]:
    with gzip.open(VECTORS, "rt", encoding="utf-8") as f:
        return list(json.load(f))


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_each_release_prepares_as_its_own_code_did(release: str) -> None:
    prep = RELEASES[release]
    checked = refused = 0
    for case in vectors():
        engine = case["engines"][release]
        if "error" in engine:
            with pytest.raises(PreparationError):
                prepare_conversation(prep, case["messages"], string_content=True, names_developer=False)
            refused += 1
            continue
        got = prepare_conversation(prep, case["messages"], string_content=True, names_developer=False)
        assert got == engine["messages"], case["case"]
        # Key order matters for tools: the template writes each one with `tojson`.
        assert json.dumps(prepare_tools(prep, case["tools"])) == json.dumps(engine["tools"]), case["case"]
        checked += 1
    assert checked + refused == 200 and checked >= 20


def test_the_releases_differ_where_the_vectors_say() -> None:
    """Not one preparation under six names: each pair of releases differs on some request."""
    cases = vectors()
    names = sorted(RELEASES)
    assert names == sorted(cases[0]["engines"]), "every release read has its vectors"
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert any(c["engines"][a] != c["engines"][b] for c in cases), (a, b)


def test_vllm_merges_a_developer_message_only_for_a_template_without_that_role() -> None:
    messages = [
        {"role": "system", "content": "one"},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": "two", "tools": None},
    ]
    merged = prepare_conversation(preparations.VLLM, messages, string_content=True, names_developer=False)
    assert merged == [{"role": "system", "content": "one\n\ntwo"}, {"role": "user", "content": "hi"}]
    kept = prepare_conversation(preparations.VLLM, messages, string_content=True, names_developer=True)
    assert [m["role"] for m in kept] == ["system", "user", "developer"]
    assert preparations.VLLM.whole(messages, False) and not preparations.VLLM.whole(messages, True)
    assert not preparations.SGLANG.whole(messages, False)


def test_claude_codes_billing_header_line_goes_from_system_text_parts_too() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1; cch=1f2e"
    parts = [{"type": "text", "text": header}, {"type": "text", "text": "You are Claude Code."}]
    message = {"role": "system", "content": parts}
    assert (
        prepare_message(preparations.VLLM, message, string_content=True)["content"] == "You are Claude Code."
    )
    assert prepare_message(preparations.VLLM_0_19, message, string_content=True)["content"].startswith(header)


def test_parts_become_placeholders_for_a_template_that_iterates_over_them() -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "input_text", "text": "here"},
    ]
    expected = [{"type": "text", "text": "look"}, {"type": "image"}, {"type": "text", "text": "here"}]
    assert (
        prepare_message(preparations.UNKNOWN, {"role": "user", "content": parts}, string_content=False)[
            "content"
        ]
        == expected
    )
    # transformers serve hands a language model text whatever its template takes.
    assert (
        prepare_message(preparations.TRANSFORMERS, {"role": "user", "content": parts}, string_content=False)[
            "content"
        ]
        == "look here"
    )


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"command": "ls"}', {"command": "ls"}),  # a JSON object string is parsed
        ("[1, 2]", "[1, 2]"),  # JSON that is no object stays text
        ("not json", "not json"),
        ({"already": "parsed"}, {"already": "parsed"}),
    ],
)
def test_an_unknown_engine_parses_only_json_object_arguments(arguments: object, expected: object) -> None:
    message = {
        "role": "assistant",
        "tool_calls": [{"id": "c", "function": {"name": "bash", "arguments": arguments}}],
    }
    prepared = prepare_message(preparations.UNKNOWN, message, string_content=True)
    assert prepared["tool_calls"][0]["function"]["arguments"] == expected
    assert prepared["content"] == ""


def test_a_message_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(TypeError, match="a message must be an object"):
        prepare_message(preparations.VLLM, "hi", string_content=True)


def test_typed_view_keeps_declared_fields_in_declaration_order() -> None:
    [assistant] = typed_messages(
        [
            {
                "tool_calls": [
                    {"type": "function", "function": {"name": "b", "arguments": "{}", "x": 1}, "id": "c"}
                ],
                "reasoning_content": "dropped: the SDK's types do not declare it",
                "content": "hi",
                "role": "assistant",
            }
        ]
    )
    assert list(assistant) == ["role", "content", "tool_calls"]
    assert assistant["tool_calls"] == [
        {"id": "c", "function": {"arguments": "{}", "name": "b"}, "type": "function"}
    ]
    assert typed_messages([{"role": "robot", "content": "x"}]) == [{"role": "robot", "content": "x"}]


def test_typed_tools_reorder_function_keys() -> None:
    tool = {"type": "function", "function": {"parameters": {}, "description": "d", "name": "n", "extra": 1}}
    [typed] = typed_tools([tool])
    assert list(typed) == ["function", "type"] and list(typed["function"]) == [
        "name",
        "description",
        "parameters",
    ]
    assert typed_tools(None) is None


def test_a_tools_defer_loading_reaches_its_function_as_the_engines_models_propagate_it() -> None:
    """vLLM 0.33 and SGLang 0.5.23 copy a tool's `defer_loading` into its function (their tool models'
    `_propagate_defer_loading`); the vectors' tools never set it."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}, "defer_loading": True}
    assert prepare_tools(preparations.VLLM, [tool]) == [
        {
            "type": "function",
            "function": {"name": "f", "description": None, "parameters": {}, "defer_loading": True},
            "defer_loading": True,
        }
    ]
    [sglang] = prepare_tools(preparations.SGLANG, [tool])
    assert list(sglang["function"]) == ["name", "parameters", "description", "defer_loading"]
    assert sglang["defer_loading"] is True and sglang["function"]["defer_loading"] is True


def test_tool_calls_of_odd_shapes_pass_as_each_engine_reads_them() -> None:
    odd = {"role": "assistant", "content": "", "tool_calls": ["not a call", {"id": "c", "type": "function"}]}
    assert prepare_message(preparations.VLLM, odd, string_content=True)["tool_calls"] == odd["tool_calls"]
    # transformers serve reads a call without `function` as the function itself, and wants arguments.
    flat = {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": '{"a": 1}'}]}
    prepared = prepare_message(preparations.TRANSFORMERS, flat, string_content=True)
    assert prepared["tool_calls"] == [{"name": "f", "arguments": {"a": 1}}]
    with pytest.raises(PreparationError, match="no arguments"):
        prepare_message(
            preparations.TRANSFORMERS,
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
            string_content=True,
        )
    parsed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}],
    }
    assert prepare_message(preparations.VLLM, parsed, string_content=True) == parsed


def test_system_parts_merge_with_a_developer_message_as_text() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "developer", "content": "c"},
    ]
    merged = prepare_conversation(preparations.VLLM, messages, string_content=False, names_developer=False)
    assert merged[0] == {"role": "system", "content": "a\nb\n\nc"}
    assert preparations.VLLM.describe() == "vllm 0.33.0" and preparations.UNKNOWN.describe() == "unknown"
