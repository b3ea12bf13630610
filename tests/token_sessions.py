"""Chat sessions recorded with token ids, as the vLLM stand-in serves them (tests/standins/token_engine.py):
the builders the record, export and view tests share.

Owns: one turn as an `Exchange` whose response carries vLLM's `prompt_token_ids` and `token_ids` for its
history and reply (`served_turn`), and the three turns of a tool-using session (`tool_session`). Does
not own: the toy tokenizer and template (token_engine.py) or any expected value.

    history, replies = tool_session()
    exchanges = [served_turn(h, r, session_id="s") for h, r in zip(history, replies)]
"""

from __future__ import annotations

import json
from typing import Any

from modeltap.records.exchange import Exchange
from modeltap.testing import exchange
from tests.factories import tool_call
from tests.standins import token_engine as te

SYSTEM = {"role": "system", "content": "You are a careful shell assistant."}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
ASK = {"role": "user", "content": "What is 6 * 7? Use the shell."}
CALL = tool_call("call-1", "bash", '{"command": "echo $((6 * 7))"}')


def served_turn(
    history: list[dict[str, Any]],
    reply: dict[str, Any],
    *,
    tools: list[dict[str, Any]] | None = None,
    completion: list[int] | None = None,
    finish_reason: str = "stop",
    logprobs: bool = False,
    weight_version: str | None = None,
    seed: int | None = None,
    **fields: Any,
) -> Exchange:
    """One chat exchange answered by the vLLM stand-in: the prompt is `history` rendered, the
    completion the ids of `reply` (or `completion`), with one logprob per id when `logprobs`, the
    completion's `weight_version` as vLLM 0.33 reports it, and the request's `seed`."""
    tools = TOOLS if tools is None else tools
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.get("tool_calls") or []
    ]
    ids = (
        completion
        if completion is not None
        else te.completion(reply.get("content") or "", calls, reply.get("reasoning_content") or "")
    )
    choice: dict[str, Any] = {"index": 0, "message": reply, "finish_reason": finish_reason, "token_ids": ids}
    if logprobs:
        choice["logprobs"] = {"content": [{"token": "t", "logprob": -i / 8} for i in range(len(ids))]}
    if weight_version is not None:
        choice["weight_versions"] = [{"version": weight_version, "start": 0, "end": len(ids)}]
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [choice],
        "prompt_token_ids": te.render(history, tools),
        "usage": {"prompt_tokens": 1, "completion_tokens": len(ids)},
    }
    body: dict[str, Any] = {"model": "m", "messages": history}
    if seed is not None:
        body["seed"] = seed
    if tools:
        body["tools"] = tools
    return exchange(body, response, **fields)


def tool_session() -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The histories and replies of three turns: a tool call, the answer, a follow-up question."""
    call = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    answer = {"role": "assistant", "content": "42"}
    first = [SYSTEM, ASK]
    second = [*first, call, {"role": "tool", "tool_call_id": "call-1", "content": "42\n"}]
    third = [*second, answer, {"role": "user", "content": "And 6 * 8?"}]
    return [first, second, third], [call, answer, {"role": "assistant", "content": "48"}]
