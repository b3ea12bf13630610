"""modeltap/records/message_text.py: messages, tool results and tools of every wire format as text."""

from __future__ import annotations

from modeltap.records.message_text import call_text, describe_message, tool_names, tool_results
from tests.unit.readers.test_show import ASK, RESULT


def test_tool_results_in_every_dialect() -> None:
    anthropic = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
            {"type": "text", "text": "go on"},
        ],
    }
    responses = {"type": "function_call_output", "call_id": "fc_1", "output": "42"}
    assert tool_results([RESULT, anthropic, responses, ASK]) == [
        {"id": "call_1", "content": "42\n", "is_error": False},
        {"id": "toolu_1", "content": "42", "is_error": False},
        {"id": "toolu_2", "content": "boom", "is_error": True},
        {"id": "fc_1", "content": "42", "is_error": False},
    ]


def test_messages_of_every_format_as_a_role_and_text() -> None:
    assert describe_message(RESULT) == ("tool", "⇐ call_1: 42\n")
    call = {"type": "function_call", "name": "shell", "arguments": '{"cmd": "ls"}'}
    assert describe_message(call) == ("assistant", '→ shell({"cmd": "ls"})')
    blocks = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm"},
            {"type": "tool_use", "name": "Read", "input": {"path": "a"}},
            {"type": "image"},
        ],
    }
    assert describe_message(blocks) == ("assistant", '(thinking) hmm → Read({"path": "a"}) [image]')
    assert describe_message("odd") == ("?", '"odd"')
    assert call_text({"name": "bash", "arguments": None}) == "→ bash()"


def test_tool_names_in_every_format() -> None:
    tools = [
        {"type": "function", "function": {"name": "bash"}},  # OpenAI chat
        {"type": "function", "name": "shell"},  # Responses
        {"name": "Read", "input_schema": {}},  # Anthropic
        {"type": "web_search"},  # a built-in tool
        "junk",
    ]
    assert tool_names(tools) == ["bash", "shell", "Read", "web_search"]
    assert tool_names(None) == [] and tool_names({"not": "a list"}) == []
