"""Anthropic Messages wire pieces shared by the AReaL and Anthropic-like stand-ins.

Owns: the `event:`/`data:` framing, the content blocks of a reply, a non-streamed message, and the
typed error body. Does not own: which events a backend streams for a reply (areal.py streams what
LiteLLM's adapter emits, anthropic_like.py what the Anthropic API emits).
"""

from __future__ import annotations

from typing import Any

from tests.standins.script import Reply
from tests.standins.wire import dumps


def sse_event(data: dict[str, Any]) -> bytes:
    """One Anthropic SSE event, named after its `type`: `event: <type>\\ndata: <json>\\n\\n`."""
    return b"event: " + data["type"].encode() + b"\ndata: " + dumps(data) + b"\n\n"


def stop_reason(reply: Reply) -> str:
    """`tool_use` for a tool call, else `end_turn`."""
    return "tool_use" if reply.tool_call else "end_turn"


def content_blocks(reply: Reply, tool_use_id: str, *, text_before_tool: bool) -> list[dict[str, Any]]:
    """A reply as content blocks; `text_before_tool` adds an empty text block before a tool_use (AReaL)."""
    call = reply.tool_call
    if call is None:
        return [{"type": "text", "text": reply.text}]
    tool_use = {"type": "tool_use", "id": tool_use_id, "name": call.name, "input": dict(call.arguments)}
    return [{"type": "text", "text": ""}, tool_use] if text_before_tool else [tool_use]


def message(
    reply: Reply,
    *,
    message_id: str,
    tool_use_id: str,
    model: str,
    input_tokens: int,
    output_tokens: int,
    text_before_tool: bool,
) -> dict[str, Any]:
    """A non-streamed Messages answer."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(reply, tool_use_id, text_before_tool=text_before_tool),
        "stop_reason": stop_reason(reply),
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
    }


def error(error_type: str, message_text: str) -> dict[str, Any]:
    """The Anthropic error body: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": error_type, "message": message_text}}
