"""One message, tool call or tool of any wire format as text: what `show`, `diff` and `grep` print
and search.

Owns: a message's role and text whatever its format (OpenAI chat and Responses items, Anthropic
content blocks: text, tool calls as `→ name(arguments)`, tool results as `⇐ id: output`, other parts
as `[type]`), the tool results among a turn's messages, and the names of the tools a request offers.
Does not own: turns (turns.py), the formats themselves (modeltap/dialects).

    describe_message({"role": "tool", "tool_call_id": "call_1", "content": "42"})   # ("tool", "⇐ call_1: 42")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def tool_results(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The tool results among `messages`, as `{"id", "content", "is_error"}`: OpenAI `role: tool`
    messages, Anthropic `tool_result` blocks, Responses `function_call_output` items."""
    out = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool":
            out.append(_result(message.get("tool_call_id"), message.get("content")))
        elif message.get("type") in ("function_call_output", "custom_tool_call_output"):
            out.append(_result(message.get("call_id"), message.get("output")))
        elif isinstance(message.get("content"), list):
            for block in message["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out.append(_result(block.get("tool_use_id"), block.get("content"), block.get("is_error")))
    return out


def describe_message(message: Any) -> tuple[str, str]:
    """(role, text) of one message in any dialect: text parts as they are, tool calls as
    `→ name(arguments)`, tool results as `⇐ id: output`, other parts as `[type]`."""
    if not isinstance(message, dict):
        return "?", json.dumps(message, ensure_ascii=False)
    kind = message.get("type")
    if kind in ("function_call", "custom_tool_call"):
        return "assistant", call_text(
            {"name": message.get("name"), "arguments": message.get("arguments", message.get("input"))}
        )
    if kind in ("function_call_output", "custom_tool_call_output"):
        return "tool", f"⇐ {message.get('call_id')}: {_content_text(message.get('output'))}"
    role = str(message.get("role") or kind or "?")
    pieces = [] if message.get("content") is None else [_content_text(message.get("content"))]
    if role == "tool":
        pieces.insert(0, f"⇐ {message.get('tool_call_id')}:")
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {} if isinstance(call, dict) else {}
        pieces.append(call_text({"name": function.get("name"), "arguments": function.get("arguments")}))
    return role, " ".join(piece for piece in pieces if piece)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return "" if content is None else json.dumps(content, ensure_ascii=False)
    pieces = []
    for block in content:
        if not isinstance(block, dict):
            pieces.append(str(block))
            continue
        kind = block.get("type")
        if isinstance(block.get("text"), str):
            pieces.append(block["text"])
        elif kind == "tool_use":
            pieces.append(call_text({"name": block.get("name"), "arguments": block.get("input")}))
        elif kind == "tool_result":
            error = " (error)" if block.get("is_error") else ""
            pieces.append(f"⇐ {block.get('tool_use_id')}{error}: {_result_text(block.get('content'))}")
        elif kind == "thinking":
            pieces.append(f"(thinking) {block.get('thinking', '')}")
        else:
            pieces.append(f"[{kind}]")
    return " ".join(pieces)


def _result_text(content: Any) -> str:
    """A tool result's content: text, or its blocks' texts. One level only: a tool result holds text
    and images, and a hostile one nesting results in results must not recurse without end."""
    if isinstance(content, str):
        return content
    texts = [b.get("text") for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    return " ".join(t for t in texts if isinstance(t, str)) or ("" if content is None else "[…]")


def _result(call_id: Any, content: Any, is_error: Any = None) -> dict[str, Any]:
    return {"id": call_id, "content": _content_text(content), "is_error": bool(is_error)}


def call_text(call: dict[str, Any]) -> str:
    arguments = call.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"→ {call.get('name')}({arguments or ''})"


def tool_names(tools: Any) -> list[str]:
    """The names of a request's tools, in every format: OpenAI chat `{"function": {"name"}}`,
    Responses and Anthropic `{"name"}`, a built-in tool by its `type`."""
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        names.append(str(name or tool.get("name") or tool.get("type") or "?"))
    return names
