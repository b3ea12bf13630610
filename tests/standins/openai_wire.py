"""OpenAI wire pieces shared by the AReaL and vLLM/SGLang stand-ins.

Owns: the JSON of a chat completion, a legacy completion, a Responses API object and its SSE events,
the `data:` framing of SSE, and ids. Does not own: which chunks a backend streams for a reply (that
differs: areal.py, openai_like.py) or error bodies (each backend has its own shape).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from tests.standins.script import Reply
from tests.standins.wire import dumps, hex_id

SSE_DONE = b"data: [DONE]\n\n"
# What a `badsse` fault sends an OpenAI client instead of the stream: an event whose JSON is cut off.
BROKEN_SSE = b"data: {not json\n\n"


def sse_data(value: Any) -> bytes:
    """One OpenAI SSE event: a `data:` line and a blank line, no `event:` line."""
    return b"data: " + dumps(value) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Chat completions usage."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def finish_reason(reply: Reply) -> str:
    """`tool_calls` for a tool call, else `stop`."""
    return "tool_calls" if reply.tool_call else "stop"


def chat_message(reply: Reply, tool_call_id: str, tool_call_content: str | None) -> dict[str, Any]:
    """The assistant message of a non-streamed chat completion.

    `tool_call_content` is the `content` next to a tool call: AReaL sends "" (docs/areal.md §4.2, §10.6),
    vLLM and OpenAI send null (docs/agents.md §2.3).
    """
    call = reply.tool_call
    if call is None:
        return {"role": "assistant", "content": reply.text, "tool_calls": None}
    function = {"name": call.name, "arguments": call.arguments_json}
    tool_calls = [{"id": tool_call_id, "type": "function", "function": function}]
    return {"role": "assistant", "content": tool_call_content, "tool_calls": tool_calls}


def chat_completion(
    reply: Reply,
    *,
    completion_id: str,
    tool_call_id: str,
    tool_call_content: str | None,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A non-streamed chat completion."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": chat_message(reply, tool_call_id, tool_call_content),
                "logprobs": None,
                "finish_reason": finish_reason(reply),
            }
        ],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def text_completion(
    reply: Reply, *, model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A legacy `/completions` answer (text only: that endpoint has no tools)."""
    return {
        "id": hex_id("cmpl-", 32),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": reply.text, "logprobs": None, "finish_reason": "stop"}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def response_object(
    reply: Reply, *, request: Mapping[str, Any], model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A completed Responses API object: one message item, or one function_call item."""
    call = reply.tool_call
    if call is not None:
        item: dict[str, Any] = {
            "type": "function_call",
            "id": hex_id("fc_", 32),
            "call_id": hex_id("call_", 24),
            "name": call.name,
            "arguments": call.arguments_json,
            "status": "completed",
        }
    else:
        text = {"type": "output_text", "text": reply.text, "annotations": []}
        item = {
            "type": "message",
            "id": hex_id("msg_", 32),
            "role": "assistant",
            "status": "completed",
            "content": [text],
        }
    return {
        "id": hex_id("resp-", 32),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "model": model,
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def response_events(response: Mapping[str, Any]) -> Iterator[bytes]:
    """The Responses API SSE events that build `response`: `event:` + `data:` pairs with a sequence number."""
    item = response["output"][0]
    in_progress = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": in_progress}),
        ("response.in_progress", {"response": in_progress}),
    ]
    if item["type"] == "function_call":
        events += [
            (
                "response.output_item.added",
                {"output_index": 0, "item": {**item, "arguments": "", "status": "in_progress"}},
            ),
            (
                "response.function_call_arguments.delta",
                {"output_index": 0, "item_id": item["id"], "delta": item["arguments"]},
            ),
            (
                "response.function_call_arguments.done",
                {"output_index": 0, "item_id": item["id"], "arguments": item["arguments"]},
            ),
        ]
    else:
        part = item["content"][0]
        where = {"output_index": 0, "item_id": item["id"], "content_index": 0}
        events += [
            (
                "response.output_item.added",
                {"output_index": 0, "item": {**item, "content": [], "status": "in_progress"}},
            ),
            ("response.content_part.added", {**where, "part": {**part, "text": ""}}),
            ("response.output_text.delta", {**where, "delta": part["text"], "logprobs": []}),
            ("response.output_text.done", {**where, "text": part["text"], "logprobs": []}),
            ("response.content_part.done", {**where, "part": part}),
        ]
    events += [
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": response}),
    ]
    for number, (name, data) in enumerate(events):
        yield b"event: " + name.encode() + b"\n" + sse_data({"type": name, "sequence_number": number, **data})
