"""What one recorded exchange said, in a dialect-free shape, for `modeltap show` and the adapter.

Owns: reading a request and its final response body in any of the four generating dialects (OpenAI
chat, legacy completions, Responses, Anthropic Messages) into a `Summary` (finish reason, reply
text, tool calls, token counts, model); the messages a turn added against the session's previous
turn; and spotting AReaL's failed tool-call parse. Does not own: rebuilding a streamed body (the
proxy's sse.py does that before the exchange is recorded, so a streamed and a non-streamed reply
summarise alike), storage (store.py) or display (cli.py).

Stdlib only, no I/O, and nothing here raises on an odd body: stored bodies come from any upstream,
error bodies included, and a field that is missing or of the wrong type reads as absent.

    summary = summarize("chat", request, response)
    summary.finish_reason, summary.text, summary.tool_calls, summary.prompt_tokens
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# AReaL answers `"model": "None"` (shared/reference/areal-proxy-protocol.md §1.1): that names no
# model, so the request's model is shown instead.
_NO_MODEL = frozenset({"", "None"})


@dataclass(frozen=True, slots=True)
class Summary:
    """One exchange at a glance. `tool_calls` holds `{"id", "name", "arguments"}` dicts, arguments
    as a JSON string in every dialect; token counts are None when the body carries no usage."""

    finish_reason: str | None = None
    text: str | None = None
    tool_calls: list[dict[str, str | None]] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None


def summarize(endpoint: str, request: dict[str, Any] | None, response: dict[str, Any] | None) -> Summary:
    """Summarise one exchange. `endpoint` is an `Endpoint.value` ("chat", "completions", "responses",
    "messages", ...); endpoints that generate nothing summarise to their model and usage only.

    >>> reply = {"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}], "model": "None",
    ...          "usage": {"prompt_tokens": 9}}
    >>> summary = summarize("chat", {"model": "m"}, reply)
    >>> summary.text, summary.finish_reason, summary.prompt_tokens, summary.model
    ('42', 'stop', 9, 'm')
    """
    reply = _dict(response)
    reader = _READERS.get(endpoint)
    finish_reason, text, tool_calls = reader(reply) if reader else (None, None, [])
    prompt_tokens, completion_tokens = _tokens(reply.get("usage"))
    return Summary(finish_reason, text, tool_calls, prompt_tokens, completion_tokens, _model(request, reply))


def new_messages(
    endpoint: str, request: dict[str, Any] | None, previous_request: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The messages this request added against the previous request of the same session.

    That is everything after the longest common prefix of the two histories (OpenAI `messages`,
    Anthropic `messages`, Responses `input`), so a turn shows the previous reply as the agent echoed
    it back plus the tool results or user message that follow; a history the agent rewrote
    (compaction, a side request such as opencode's title call) shows from the first changed message.
    A system prompt kept outside the history (Anthropic `system`, Responses `instructions`) comes
    first as a `{"role": "system"}` message when it is new or changed. A Responses request chained by
    `previous_response_id` sends only new input, so all of it is new. A legacy completions prompt
    gives one `{"role": "prompt"}` message holding what was appended to the previous prompt.
    """
    current, previous = _dict(request), _dict(previous_request)
    if endpoint == "completions":
        return _new_prompt(current.get("prompt"), previous.get("prompt"))
    history_key, system_key = _HISTORY.get(endpoint, (None, None))
    if history_key is None:
        return []
    history = _history(current.get(history_key))
    earlier = [] if current.get("previous_response_id") else _history(previous.get(history_key))
    start = 0
    while start < min(len(history), len(earlier)) and _same(history[start], earlier[start]):
        start += 1
    added = history[start:]
    if system_key is not None:
        system = current.get(system_key)
        if system and (previous_request is None or not _same(system, previous.get(system_key))):
            added.insert(0, {"role": "system", "content": system})
    return added


def tool_call_parse_failure(endpoint: str, response: dict[str, Any] | None) -> bool:
    """Whether the reply says "tool call" but carries none: AReaL's sign that the model's tool-call
    output failed to parse (finish_reason "tool_calls" with `tool_calls: null`,
    shared/reference/areal-proxy-protocol.md §4.2, seen in areal-tier.md §6). On /v1/messages LiteLLM
    translates that into stop_reason "tool_use" with no tool_use block (inferred from the mapping).
    Other endpoints cannot show it and say False."""
    reply = _dict(response)
    if endpoint == "chat":
        return any(
            choice.get("finish_reason") == "tool_calls" and not _dict(choice.get("message")).get("tool_calls")
            for choice in _dicts(reply.get("choices"))
        )
    if endpoint == "messages":
        blocks = _dicts(reply.get("content"))
        return reply.get("stop_reason") == "tool_use" and not any(b.get("type") == "tool_use" for b in blocks)
    return False


_Reading = tuple[str | None, str | None, list[dict[str, str | None]]]


def _chat(reply: dict[str, Any]) -> _Reading:
    choice = _first(reply.get("choices"))
    message = _dict(choice.get("message"))
    calls = []
    for call in _dicts(message.get("tool_calls")):
        function = _dict(call.get("function"))
        calls.append(_call(call.get("id"), function.get("name"), function.get("arguments")))
    return _str(choice.get("finish_reason")), _text(message.get("content")), calls


def _completions(reply: dict[str, Any]) -> _Reading:
    choice = _first(reply.get("choices"))
    return _str(choice.get("finish_reason")), _str(choice.get("text")), []


def _responses(reply: dict[str, Any]) -> _Reading:
    # Responses has no finish reason: the status says it ("completed", "failed"), and an incomplete
    # response says why ("max_output_tokens", "content_filter").
    status = _str(reply.get("status"))
    reason = _str(_dict(reply.get("incomplete_details")).get("reason"))
    texts: list[str] = []
    calls = []
    for item in _dicts(reply.get("output")):
        kind = item.get("type")
        if kind == "message":
            texts += _part_texts(item.get("content"), "output_text")
        elif kind == "function_call":
            calls.append(_call(item.get("call_id"), item.get("name"), item.get("arguments")))
        elif kind == "custom_tool_call":
            calls.append(_call(item.get("call_id"), item.get("name"), item.get("input")))
    return reason if status == "incomplete" and reason else status, "".join(texts) if texts else None, calls


def _messages(reply: dict[str, Any]) -> _Reading:
    texts: list[str] = []
    calls = []
    for block in _dicts(reply.get("content")):
        if block.get("type") == "text":
            texts.append(_str(block.get("text")) or "")
        elif block.get("type") == "tool_use":
            calls.append(_call(block.get("id"), block.get("name"), block.get("input")))
    return _str(reply.get("stop_reason")), "".join(texts) if texts else None, calls


_READERS: dict[str, Callable[[dict[str, Any]], _Reading]] = {
    "chat": _chat,
    "completions": _completions,
    "responses": _responses,
    "messages": _messages,
}
# endpoint -> (request key holding the conversation, request key holding a separate system prompt)
_HISTORY: dict[str, tuple[str, str | None]] = {
    "chat": ("messages", None),
    "messages": ("messages", "system"),
    "responses": ("input", "instructions"),
}


def _call(call_id: Any, name: Any, arguments: Any) -> dict[str, str | None]:
    """One tool call; arguments that arrived as an object (Anthropic `input`) become JSON text."""
    if arguments is not None and not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": _str(call_id), "name": _str(name), "arguments": arguments}


def _tokens(usage: Any) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens from OpenAI `prompt_tokens`/`completion_tokens` or Anthropic and
    Responses `input_tokens`/`output_tokens`. Anthropic counts cached prompt tokens apart from
    `input_tokens`, so they are added back to give the whole prompt; Responses has no such fields."""
    usage = _dict(usage)
    if "prompt_tokens" in usage or "completion_tokens" in usage:
        return _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
    prompt = _int(usage.get("input_tokens"))
    if prompt is not None:
        for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
            prompt += _int(usage.get(cached)) or 0
    return prompt, _int(usage.get("output_tokens"))


def _model(request: dict[str, Any] | None, reply: dict[str, Any]) -> str | None:
    model = _str(reply.get("model"))
    return model if model not in _NO_MODEL and model is not None else _str(_dict(request).get("model"))


def _new_prompt(prompt: Any, previous: Any) -> list[dict[str, Any]]:
    if not isinstance(prompt, str):
        return [] if prompt is None or prompt == previous else [{"role": "prompt", "content": prompt}]
    if isinstance(previous, str) and prompt.startswith(previous):
        prompt = prompt[len(previous) :]
    return [{"role": "prompt", "content": prompt}] if prompt else []


def _history(value: Any) -> list[Any]:
    """A conversation as a list; a bare Responses `input` string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def _same(a: Any, b: Any) -> bool:
    # Claude Code moves its `cache_control` marker to the newest message each turn
    # (shared/reference/agent-clients.md), so an old message that lost it is still the same message.
    return bool(a == b or _without_cache_control(a) == _without_cache_control(b))


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_cache_control(item) for key, item in value.items() if key != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(item) for item in value]
    return value


def _text(content: Any) -> str | None:
    """Message content as text: a string as it is, a list of parts as its text parts joined."""
    if isinstance(content, list):
        return "".join(_part_texts(content, "text"))
    return _str(content)


def _part_texts(parts: Any, kind: str) -> list[str]:
    return [_str(part.get("text")) or "" for part in _dicts(parts) if part.get("type") == kind]


def _first(choices: Any) -> dict[str, Any]:
    listed = _dicts(choices)
    return next((choice for choice in listed if choice.get("index", 0) == 0), listed[0] if listed else {})


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
