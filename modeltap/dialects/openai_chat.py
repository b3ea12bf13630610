"""OpenAI chat completions: `POST /v1/chat/completions`, the format most agents and servers speak.

Owns: the route, which of `max_completion_tokens` / `max_tokens` caps the completion, the prompt
(messages and tools, in the openai SDK's typed view when the server validates with it), the
`chat.completion.chunk` stream in both directions, the reply's text and tool calls, the conversation
for export, and AReaL's sign of a tool call that did not parse. For translation (the formats an
upstream lacks go to it as chat): `chunks`, a completion as its chunks, and `ChatDeltas`, which reads
a chunk stream as the pieces another format's stream is written from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modeltap.compat.areal import chat_body_for_areal
from modeltap.compat.prompts import typed_messages, typed_tools
from modeltap.dialects.base import (
    ChatPrompt,
    Conversation,
    Prompt,
    Reading,
    as_dict,
    as_str,
    dicts_in,
    first_choice,
    part_texts,
    tool_call,
)
from modeltap.dialects.openai_completions import ChoiceChunks
from modeltap.dialects.roles import (
    AsChat,
    CountsPrompt,
    OpenAIShaped,
    ReturnsTokenIds,
    Streams,
    ThroughChat,
    TokenEndpoint,
)
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
) -> dict[str, Any]:
    piece = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return {**stamp, "choices": [piece]}


def is_completion(body: dict[str, Any]) -> bool:
    """Whether a chat JSON answer is a completion: its first choice holds a message object. A server
    answering 200 with another object (a gateway's status page, `{}`) gave no answer to translate.

    >>> is_completion({"choices": [{"message": {"content": "4"}}]}), is_completion({"detail": "ok"})
    (True, False)
    """
    return isinstance(first_choice(body.get("choices")).get("message"), dict)


def chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A chat completion as the `chat.completion.chunk` objects that stream it (without `[DONE]`): per
    choice its role, reasoning, content, one chunk per tool call and the finish chunk, then a usage
    chunk with `choices: []` when `include_usage` and the body has usage."""
    stamp: dict[str, Any] = {
        k: body.get(k) for k in ("id", "created", "model", "system_fingerprint") if k in body
    }
    stamp["object"] = "chat.completion.chunk"
    out = []
    for choice in dicts_in(body.get("choices")):
        index, message = choice.get("index", 0), as_dict(choice.get("message"))
        opening = {"role": message.get("role") or "assistant"}
        if message.get("content") is not None:
            opening["content"] = ""
        deltas = [opening]
        deltas += [{key: message[key]} for key in TEXT_FIELDS if message.get(key)]
        deltas += [
            {"tool_calls": [{"index": n, **call}]}
            for n, call in enumerate(dicts_in(message.get("tool_calls")))
        ]
        out += [_chunk(stamp, index, delta) for delta in deltas]
        out.append(_chunk(stamp, index, {}, choice.get("finish_reason"), choice.get("logprobs")))
    if include_usage and body.get("usage") is not None:
        out.append({**stamp, "choices": [], "usage": body["usage"]})
    return out


def request_options(body: Mapping[str, Any], cap_field: str, sampling: tuple[str, ...]) -> dict[str, Any]:
    """A chat request's options taken from another format's `body`: its completion cap (`cap_field`)
    as `max_completion_tokens` (the field every chat server reads: see `Chat.completion_field`), the
    `sampling` fields it sets, and a stream with usage when it asked for a stream (usage closes a
    translated stream).

    >>> request_options({"max_tokens": 9, "stream": True}, "max_tokens", ("temperature",))
    {'max_completion_tokens': 9, 'stream': True, 'stream_options': {'include_usage': True}}
    """
    options: dict[str, Any] = {}
    if body.get(cap_field) is not None:
        options["max_completion_tokens"] = body[cap_field]
    options.update({field: body[field] for field in sampling if body.get(field) is not None})
    if body.get("stream") is True:
        options |= {"stream": True, "stream_options": {"include_usage": True}}
    return options


Delta = tuple[str, int, Any]
"""One piece of a chat stream (`ChatDeltas.read`): (kind, tool call number, value)."""


class ChatDeltas:
    """Reads a chat chunk stream, chunk by chunk, as the pieces another format's stream is written
    from, in their order: ("reasoning", 0, text), ("text", 0, text), ("call", n, {"id", "name"}) when
    tool call n starts, ("arguments", n, text), ("error", 0, message) for an error event. Only the
    first choice counts (a translated request asks for one). The finish reason and usage are kept as
    they arrive.

    >>> deltas = ChatDeltas()
    >>> deltas.read({"id": "c1", "choices": [{"index": 0, "delta": {"content": "4"}}]})
    [('text', 0, '4')]
    >>> deltas.read({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}), deltas.finish_reason
    ([], 'stop')
    """

    __slots__ = ("_calls", "finish_reason", "usage")

    def __init__(self) -> None:
        self._calls: set[int] = set()
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    def read(self, chunk: dict[str, Any]) -> list[Delta]:
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if chunk.get("error") is not None:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            return [("error", 0, str(message))]
        choice = first_choice(chunk.get("choices"))
        if choice.get("index", 0) != 0:
            return []
        if isinstance(choice.get("finish_reason"), str):
            self.finish_reason = choice["finish_reason"]
        delta = as_dict(choice.get("delta"))
        out: list[Delta] = []
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str) and delta[key]:
                out.append(("reasoning", 0, delta[key]))
        if isinstance(delta.get("content"), str) and delta["content"]:
            out.append(("text", 0, delta["content"]))
        for position, call in enumerate(dicts_in(delta.get("tool_calls"))):
            number = index_of(call.get("index", position))
            function = as_dict(call.get("function"))
            if number not in self._calls:
                self._calls.add(number)
                out.append(("call", number, {"id": call.get("id"), "name": function.get("name")}))
            if isinstance(function.get("arguments"), str) and function["arguments"]:
                out.append(("arguments", number, function["arguments"]))
        return out


class Chat(
    OpenAIShaped, Streams, AsChat, ReturnsTokenIds, declines=(ThroughChat, CountsPrompt, TokenEndpoint)
):
    """The format translation goes through: nothing to translate it to."""

    name = "chat"
    route = "chat/completions"
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

    def areal_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """See compat.areal.chat_body_for_areal."""
        return chat_body_for_areal(body)

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        return data_event(event)

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """Role, reasoning, content, one chunk per tool call, the finish chunk (with the choice's
        logprobs), an optional usage chunk with `choices: []`, then `[DONE]`."""
        return [*(data_event(chunk) for chunk in chunks(body, include_usage)), DONE_EVENT]

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
