"""modeltap/compat/prompts.py: messages normalised as SGLang hands them to a template, and the openai
SDK's typed view AReaL validates chat bodies with."""

from __future__ import annotations

import pytest

from modeltap.compat.prompts import normalise_message, typed_messages, typed_tools


def test_none_fields_go_and_missing_content_is_empty() -> None:
    assert normalise_message({"role": "assistant", "content": None, "name": None}, True) == {
        "role": "assistant",
        "content": "",
    }


def test_parts_join_with_a_space_for_string_templates_and_become_placeholders_otherwise() -> None:
    parts = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:..."}},
        {"type": "input_text", "text": "here"},
    ]
    assert normalise_message({"role": "user", "content": parts}, True)["content"] == "look here"
    assert normalise_message({"role": "user", "content": parts}, False)["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image"},
        {"type": "text", "text": "here"},
    ]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"command": "ls"}', {"command": "ls"}),  # a JSON object string is parsed
        ("[1, 2]", "[1, 2]"),  # JSON that is no object stays text, as AReaL leaves it
        ("not json", "not json"),
        ({"already": "parsed"}, {"already": "parsed"}),
    ],
)
def test_tool_call_arguments(arguments: object, expected: object) -> None:
    message = {
        "role": "assistant",
        "tool_calls": [{"id": "c", "function": {"name": "bash", "arguments": arguments}}],
    }
    assert normalise_message(message, True)["tool_calls"][0]["function"]["arguments"] == expected


def test_a_message_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(TypeError, match="a message must be an object"):
        normalise_message("hi", True)


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
