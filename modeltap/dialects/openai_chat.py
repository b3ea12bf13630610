"""OpenAI chat completions: `POST /v1/chat/completions`, the format most agents and servers speak.

Owns: the route, which of `max_completion_tokens` / `max_tokens` caps the completion, the prompt
(messages and tools, in the openai SDK's typed view when the server validates with it), the
`chat.completion.chunk` stream in both directions, the reply's text and tool calls, the conversation
for export, and AReaL's sign of a tool call that did not parse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modeltap.compat.prompts import typed_messages, typed_tools
from modeltap.dialects.base import (
    ChatPrompt,
    Conversation,
    Dialect,
    Prompt,
    Reading,
    as_dict,
    as_str,
    dicts_in,
    first_choice,
    part_texts,
    tool_call,
)
from modeltap.dialects.openai_completions import ChoiceChunks, usage_event
from modeltap.dialects.sse import DONE_EVENT, data_event, index_of, list_of
from modeltap.dialects.token_ids import TokenIds, chat_logprobs, served_ids

# Message fields that arrive as text pieces. vLLM and SGLang stream their parsed reasoning as
# `reasoning_content` (newer vLLM as `reasoning`); AReaL leaves it inline in `content`
# (docs/areal.md §1.1.6).
TEXT_FIELDS = ("reasoning_content", "reasoning", "content", "refusal")


class _ChatChunks(ChoiceChunks):
    OBJECT = "chat.completion"

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        self._merge_logprobs(state, choice.get("logprobs"))
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return
        if delta.get("role"):
            state["role"] = delta["role"]
        for key in TEXT_FIELDS:
            if key in delta:
                self._pieces.add((index, key), delta[key])
        for position, call in enumerate(list_of(delta.get("tool_calls"))):
            if isinstance(call, dict):
                self._merge_call(index, state, call, position)

    def _merge_call(self, index: int, state: dict[str, Any], call: dict[str, Any], position: int) -> None:
        # A call's first chunk carries its id and name; later ones only add to the arguments. AReaL
        # 1.0.4 sends each call whole in one chunk, later AReaL in two (docs/areal.md §10.6, §1.1.7):
        # both land here. Servers that repeat the id or name on later chunks repeat the same value, so
        # the first one wins.
        number = index_of(call.get("index", position))  # OpenAI requires `index`; else its position
        entry = state.setdefault("calls", {}).setdefault(number, {"id": None, "type": None, "name": None})
        function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
        for key, source in (("id", call), ("type", call), ("name", function)):
            if source.get(key) and entry[key] is None:
                entry[key] = source[key]
        self._pieces.add((index, "call", number), function.get("arguments"))

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": state.get("role", "assistant"), "content": None}
        # `content` first, then the reasoning, as the servers order a message's fields.
        for key in ("content", *(k for k in TEXT_FIELDS if k != "content")):
            if self._pieces.has((index, key)):
                message[key] = self._pieces.get((index, key))
        calls = state.get("calls")
        if calls:
            message["tool_calls"] = [
                {
                    "id": entry["id"],
                    "type": entry["type"] or "function",
                    "function": {"name": entry["name"], "arguments": self._pieces.get((index, "call", call))},
                }
                for call, entry in sorted(calls.items())
            ]
        return {
            "index": index,
            "message": message,
            "logprobs": state.get("logprobs"),
            "finish_reason": state["finish_reason"],
        }


def _chunk(
    stamp: dict[str, Any], index: int, delta: dict[str, Any], finish: Any = None, logprobs: Any = None
) -> bytes:
    piece = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return data_event({**stamp, "choices": [piece]})


class Chat(Dialect):
    name = "chat"
    route = "chat/completions"
    streams = True
    history_field = "messages"
    context_fields = ("tools",)
    operation = "chat"

    def completion_field(self, body: Mapping[str, Any]) -> str:
        """`max_completion_tokens` wins when both are sent, as on OpenAI, vLLM, SGLang and AReaL
        (docs/token-budgets.md §4.1). When neither is sent, `max_completion_tokens` is the one to add:
        old AReaL read `max_tokens` as the prompt + completion total, newer AReaL refuses both fields
        together with a 500, and every backend accepts `max_completion_tokens` (§3, §7)."""
        if body.get("max_completion_tokens") is None and body.get("max_tokens") is not None:
            return "max_tokens"
        return "max_completion_tokens"

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        messages, tools = body["messages"], body.get("tools")
        if openai_typed:
            messages, tools = typed_messages(messages), typed_tools(tools)
        kwargs = body.get("chat_template_kwargs")
        return ChatPrompt(
            list(messages), list(tools) if tools else None, kwargs if isinstance(kwargs, dict) else {}
        )

    def assembler(self) -> _ChatChunks:
        return _ChatChunks()

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
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
            deltas += [{key: message[key]} for key in TEXT_FIELDS if message.get(key)]
            deltas += [
                {"tool_calls": [{"index": n, **call}]}
                for n, call in enumerate(message.get("tool_calls") or [])
            ]
            events += [_chunk(stamp, index, delta) for delta in deltas]
            events.append(_chunk(stamp, index, {}, choice.get("finish_reason"), choice.get("logprobs")))
        return [*events, *usage_event(stamp, body, include_usage), DONE_EVENT]

    def read(self, reply: dict[str, Any]) -> Reading:
        choice = first_choice(reply.get("choices"))
        message = as_dict(choice.get("message"))
        calls = []
        for call in dicts_in(message.get("tool_calls")):
            function = as_dict(call.get("function"))
            calls.append(tool_call(call.get("id"), function.get("name"), function.get("arguments")))
        content = message.get("content")
        text = "".join(part_texts(content, "text")) if isinstance(content, list) else as_str(content)
        return as_str(choice.get("finish_reason")), text, calls

    def token_ids(self, request: Any, response: Any) -> TokenIds | None:
        return served_ids(response, chat_logprobs)

    def conversation(
        self,
        request: dict[str, Any],
        response: dict[str, Any],
        session: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> Conversation:
        choices = response.get("choices") or [{}]
        reply = {k: v for k, v in (as_dict(choices[0]).get("message") or {}).items() if v is not None}
        messages = [*request.get("messages", []), {"role": "assistant", **reply}]
        return Conversation(messages, list(request.get("tools") or []))

    def tool_call_parse_failure(self, response: Any) -> bool:
        """finish_reason "tool_calls" with `tool_calls: null` (docs/areal.md §4.2)."""
        return any(
            choice.get("finish_reason") == "tool_calls"
            and not as_dict(choice.get("message")).get("tool_calls")
            for choice in dicts_in(as_dict(response).get("choices"))
        )


DIALECT = Chat()
