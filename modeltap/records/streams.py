"""A recorded response as the stream that carried it, for the HAR export and the mock upstream.

Owns: `stream_events`: the raw SSE bytes when `serve --keep-raw-sse` kept them, else events
re-synthesised from the assembled body in the endpoint's own wire format (the shapes the clients
accept: shared/reference/agent-clients.md, "SSE shapes the clients accepted"). Re-synthesised streams
carry each text, each tool call's arguments and each block in one event: the original chunk
boundaries exist only in raw SSE. Does not own: assembling streams (proxy/sse.py) or the export
formats (export.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def stream_events(ex: dict[str, Any], raw: bytes | None, *, include_usage: bool | None = None) -> list[bytes]:
    """The recorded response of `ex` as SSE events, each ending in its blank line: `raw` split at event
    boundaries when it was kept, else re-synthesised from the assembled body. `include_usage`
    (default: what the recorded request asked for) says whether an OpenAI stream ends with a usage
    chunk. A stream that was cut short is re-synthesised without its final event, as it happened."""
    if raw is not None:
        return split_events(raw)
    request = ex.get("request")
    if not isinstance(request, dict):
        request = {}
    if include_usage is None:
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
    complete = ex.get("stream_complete") is not False
    return sse_events(
        ex["endpoint"] or "", ex.get("response") or {}, include_usage=include_usage, complete=complete
    )


def split_events(raw: bytes) -> list[bytes]:
    """SSE bytes split after each blank line, so each piece is one event (WHATWG line ends)."""
    events, start, i = [], 0, 0
    while i < len(raw):
        for end in (b"\r\n\r\n", b"\n\n", b"\r\r"):
            if raw.startswith(end, i):
                i += len(end)
                events.append(raw[start:i])
                start = i
                break
        else:
            i += 1
    if start < len(raw):
        events.append(raw[start:])
    return events


def sse_events(
    endpoint: str, body: dict[str, Any], *, include_usage: bool, complete: bool = True
) -> list[bytes]:
    """A final body of `endpoint` ("chat", "completions", "responses", "messages") as the SSE events
    that stream it, in the shapes the clients accept (agent-clients.md)."""
    synthesise = _SYNTHESISERS.get(endpoint)
    if synthesise is None:
        raise ValueError(f"no stream format for {endpoint!r}; expected one of {sorted(_SYNTHESISERS)}")
    events = synthesise(body, include_usage)
    return events if complete else events[:-1]


def _data(value: Any) -> bytes:
    return b"data: " + json.dumps(value, ensure_ascii=False).encode() + b"\n\n"


def _event(kind: str, value: dict[str, Any]) -> bytes:
    return f"event: {kind}\n".encode() + _data({"type": kind, **value})


def _chat_stream(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """Role, reasoning, content, one chunk per tool call, the finish chunk (with the choice's
    logprobs), an optional usage chunk with `choices: []`, then `[DONE]`."""
    stamp: dict[str, Any] = {
        k: body.get(k) for k in ("id", "created", "model", "system_fingerprint") if k in body
    }
    stamp["object"] = "chat.completion.chunk"
    events = []
    for choice in body.get("choices") or []:
        index, message = choice.get("index", 0), choice.get("message") or {}
        opening = {"role": message.get("role") or "assistant"}
        if message.get("content") is not None:
            opening["content"] = ""
        deltas = [opening]
        deltas += [{key: message[key]} for key in _CHAT_TEXT if message.get(key)]
        deltas += [
            {"tool_calls": [{"index": n, **call}]} for n, call in enumerate(message.get("tool_calls") or [])
        ]
        events += [_chat_chunk(stamp, index, delta) for delta in deltas]
        events.append(_chat_chunk(stamp, index, {}, choice.get("finish_reason"), choice.get("logprobs")))
    if include_usage and body.get("usage") is not None:
        events.append(_data({**stamp, "choices": [], "usage": body["usage"]}))
    return [*events, b"data: [DONE]\n\n"]


# Message fields that stream as text deltas: vLLM and SGLang send parsed reasoning as
# `reasoning_content` (newer vLLM as `reasoning`), as proxy/sse.py reads them back.
_CHAT_TEXT = ("reasoning_content", "reasoning", "content", "refusal")


def _chat_chunk(
    stamp: dict[str, Any], index: int, delta: dict[str, Any], finish: Any = None, logprobs: Any = None
) -> bytes:
    piece = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return _data({**stamp, "choices": [piece]})


def _completions_stream(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    stamp: dict[str, Any] = {k: body.get(k) for k in ("id", "created", "model") if k in body}
    stamp["object"] = "text_completion"
    events = [_data({**stamp, "choices": [choice]}) for choice in body.get("choices") or []]
    if include_usage and body.get("usage") is not None:
        events.append(_data({**stamp, "choices": [], "usage": body["usage"]}))
    return [*events, b"data: [DONE]\n\n"]


def _responses_stream(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """created, in_progress, each output item (text parts and function arguments as one delta each),
    then the final event its status calls for, carrying the whole response."""
    events: list[dict[str, Any]] = []
    opening = {**body, "status": "in_progress", "output": []}
    events += [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(body.get("output") or []):
        at = {"output_index": index, "item_id": item.get("id")}
        kind = item.get("type")
        shell = (
            {**item, "content": []}
            if kind == "message"
            else {**item, "arguments": ""}
            if kind == "function_call"
            else item
        )
        events.append({"type": "response.output_item.added", "output_index": index, "item": shell})
        for part_index, part in enumerate(item.get("content") or [] if kind == "message" else []):
            where = {**at, "content_index": part_index}
            events.append({"type": "response.content_part.added", **where, "part": {**part, "text": ""}})
            if part.get("type") == "output_text":
                events.append({"type": "response.output_text.delta", **where, "delta": part.get("text", "")})
                events.append({"type": "response.output_text.done", **where, "text": part.get("text", "")})
            events.append({"type": "response.content_part.done", **where, "part": part})
        if kind == "function_call":
            arguments = item.get("arguments", "")
            events.append({"type": "response.function_call_arguments.delta", **at, "delta": arguments})
            events.append({"type": "response.function_call_arguments.done", **at, "arguments": arguments})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(body.get("status") or "")
    events.append({"type": final or "response.completed", "response": body})
    return [_event(e.pop("type"), {**e, "sequence_number": n}) for n, e in enumerate(events)]


def _messages_stream(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """message_start, each content block as start / one delta / stop, message_delta with the stop
    reason and output tokens, message_stop (Anthropic's event names, each with its `event:` line)."""
    usage = dict(body.get("usage") or {})
    opening = {
        **body,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    events = [_event("message_start", {"message": opening})]
    for index, block in enumerate(body.get("content") or []):
        kind = block.get("type")
        delta: list[dict[str, Any]] = []
        if kind == "text":
            start, delta = {**block, "text": ""}, [{"type": "text_delta", "text": block.get("text", "")}]
        elif kind in ("tool_use", "server_tool_use"):
            partial = json.dumps(block.get("input") or {}, ensure_ascii=False)
            start, delta = {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": partial}]
        elif kind == "thinking":
            start = {**block, "thinking": "", "signature": ""}
            delta = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
            if block.get("signature"):
                delta.append({"type": "signature_delta", "signature": block["signature"]})
        else:
            start = block
        events.append(_event("content_block_start", {"index": index, "content_block": start}))
        events += [_event("content_block_delta", {"index": index, "delta": d}) for d in delta]
        events.append(_event("content_block_stop", {"index": index}))
    stop = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
    events.append(
        _event("message_delta", {"delta": stop, "usage": {"output_tokens": usage.get("output_tokens", 0)}})
    )
    return [*events, _event("message_stop", {})]


_SYNTHESISERS: dict[str, Callable[[dict[str, Any], bool], list[bytes]]] = {
    "chat": _chat_stream,
    "completions": _completions_stream,
    "responses": _responses_stream,
    "messages": _messages_stream,
}
