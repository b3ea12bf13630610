"""Anthropic Messages: `POST /v1/messages`, the format Claude Code and the anthropic SDK speak.

Owns: the route (under `/v1` on AReaL too), the key in `x-api-key`, Anthropic's typed errors and its
"prompt is too long" refusal, `max_tokens` as the completion cap, the conversion to OpenAI chat (the
one AReaL's proxy applies, LiteLLM's AnthropicAdapter, used both to count a prompt and to export a
conversation), the typed event stream in both directions, the reply's text and tool uses, and what a
turn added (messages, and the `system` prompt when it changed).

The conversion follows LiteLLM 1.104.9, the newest LiteLLM AReaL can import (docs/areal.md §1.1.8, §10.0), in
litellm/llms/anthropic/experimental_pass_through/adapters/transformation.py; AReaL then joins list
content with "\\n", keeping only text (`flattened`).

Translation (an upstream that serves chat but not messages) sends that conversion, made for a chat
server rather than for AReaL's: no `cache_control`, system messages after the first turn as LiteLLM's
noted user messages (most chat templates refuse a late system message), failed tool results flagged,
thinking as `reasoning_content`, only custom tools (a hosted tool needs Anthropic's servers). The reply
comes back as Anthropic's event stream, written from the chat chunks as they arrive.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from modeltap.compat.areal import messages_body_for_areal
from modeltap.compat.layouts import ErrorInfo, is_context_overflow
from modeltap.dialects.base import (
    ApiError,
    ChatPrompt,
    Conversation,
    Prompt,
    Reading,
    as_dict,
    as_int,
    as_str,
    dicts_in,
    tool_call,
)
from modeltap.dialects.openai_chat import ChatDeltas, request_options
from modeltap.dialects.roles import AsChat, CountsPrompt, Dialect, ReturnsTokenIds, ThroughChat, TokenEndpoint
from modeltap.dialects.sse import Pieces, index_of, kind_of, list_of, named_event, typed_event

# The API version the anthropic SDK and Claude Code send (docs/agents.md §4.3, §5); requests need one.
ANTHROPIC_VERSION = "2023-06-01"
# LiteLLM's ANTHROPIC_HOSTED_TOOLS: tools whose type starts with one of these pass through unchanged.
_HOSTED_TOOL_TYPES = (
    "web_search",
    "bash",
    "text_editor",
    "code_execution",
    "web_fetch",
    "memory",
    "tool_search_tool",
)
# Tool keys LiteLLM maps itself; any other key is merged into the function's parameters.
_MAPPED_TOOL_KEYS = frozenset(
    {"name", "input_schema", "description", "cache_control", "strict", "type", "eager_input_streaming"}
)
_ANTHROPIC_TOOL_SCHEMA_KEYS = frozenset(
    {"name", "type", "input_schema", "description", "cache_control", "strict"}
)
# OpenAI's limit on tool names; LiteLLM truncates longer names to 55 characters, "_" and 8 hex digits.
_MAX_TOOL_NAME_CHARS = 64
_TRUNCATED_TOOL_NAME_CHARS = 55
# LiteLLM turns a system message after the first turn into a user message opened by this note
# (litellm_core_utils/prompt_templates/mid_conversation_system.py), unless its model map says the
# model takes system messages mid-conversation.
_CONVERTED_SYSTEM_NOTE = (
    "Operator note (not from the user): the following was originally a mid-conversation system-role reminder."
)
# The models LiteLLM 1.104.9's map flags `supports_mid_conversation_system`, without a provider or
# region prefix ("vertex_ai/", "us.anthropic."); Claude Code's default model is among them
# (docs/agents.md §4.3). A prefixed name the map does not list is counted as if it did.
_MID_CONVERSATION_SYSTEM_MODELS = frozenset(
    {
        "claude-fable-5",
        "claude-fable-5-1",
        "claude-haiku-5-5",
        "claude-mythos-5",
        "claude-mythos-5-1",
        "claude-opus-4-8",
        "claude-opus-5",
        "claude-opus-5-5",
        "claude-sonnet-5",
        "claude-sonnet-5-5",
    }
)


class _MessageEvents:
    """message_start, content blocks by index, message_delta, message_stop."""

    END: ClassVar[str] = "message_stop"
    # delta type -> (block field it extends, delta field holding the piece)
    _DELTAS: ClassVar[dict[str, tuple[str, str]]] = {
        "text_delta": ("text", "text"),
        "thinking_delta": ("thinking", "thinking"),
        "input_json_delta": ("input", "partial_json"),
    }

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._pieces = Pieces()

    def add(self, obj: dict[str, Any]) -> bool:
        kind = kind_of(obj)
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            self._message = dict(obj["message"])
        elif kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            self._blocks[index_of(obj.get("index"))] = dict(obj["content_block"])
        elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            self._delta(index_of(obj.get("index")), obj["delta"])
        elif kind == "message_delta":
            self._message_delta(obj)
        return kind == "message_stop"

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        kind = kind_of(delta)
        if kind in self._DELTAS:
            field, source = self._DELTAS[kind]
            self._pieces.add((index, field), delta.get(source))
            return
        block = self._blocks.setdefault(index, {})
        if kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            block["citations"] = [*list_of(block.get("citations")), delta.get("citation")]

    def _message_delta(self, obj: dict[str, Any]) -> None:
        message = self._message_or_new()
        if isinstance(obj.get("delta"), dict):
            message.update(obj["delta"])
        # Usage on message_delta is cumulative, so it overwrites; a count it leaves out keeps its
        # message_start value (the anthropic SDK's accumulate_event merges the same way).
        if isinstance(obj.get("usage"), dict):
            counts = {key: value for key, value in obj["usage"].items() if value is not None}
            usage = message.get("usage")
            message["usage"] = {**(usage if isinstance(usage, dict) else {}), **counts}

    def _message_or_new(self) -> dict[str, Any]:
        if self._message is None:
            self._message = {"type": "message", "role": "assistant", "content": [], "usage": {}}
        return self._message

    def whole(self) -> bool:
        """An Anthropic stream is whole only at its message_stop."""
        return False

    def body(self) -> dict[str, Any] | None:
        if self._message is None and not self._blocks and not self._pieces.keys():
            return None
        message = dict(self._message_or_new())
        indices = sorted(set(self._blocks) | {index for index, _ in self._pieces.keys()})
        if indices:
            message["content"] = [self._block(index) for index in indices]
        return message

    def _block(self, index: int) -> dict[str, Any]:
        block = dict(self._blocks.get(index, {}))
        for field in ("text", "thinking"):
            if self._pieces.has((index, field)):
                block[field] = str(block.get(field) or "") + self._pieces.get((index, field))
        arguments = self._pieces.get((index, "input"))
        if arguments:
            # The concatenated partial_json is the tool input. If it does not parse (a stream cut
            # short, or nested deeper than the parser goes: a policy at its token limit writing
            # `[[[[…`), the raw text is kept as the evidence.
            try:
                block["input"] = json.loads(arguments)
            except (ValueError, RecursionError):
                block["input"] = arguments
        return block


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """One content block as start, one delta (two for signed thinking), stop."""
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
    return [
        named_event("content_block_start", {"index": index, "content_block": start}),
        *(named_event("content_block_delta", {"index": index, "delta": d}) for d in delta),
        named_event("content_block_stop", {"index": index}),
    ]


class AnthropicShaped(Dialect):
    """What Anthropic's formats share (messages, count_tokens): keys as `x-api-key`, errors as
    `{"type": "error", ...}`, the "prompt is too long" refusal, and Anthropic's usage."""

    provider = "anthropic"
    request_headers: ClassVar[Mapping[str, str]] = {"anthropic-version": ANTHROPIC_VERSION}

    def credential_headers(self, key: str) -> dict[str, str]:
        """Anthropic's `x-api-key`, and Bearer for servers that read only that (AReaL, LiteLLM)."""
        return {"Authorization": f"Bearer {key}", "x-api-key": key}

    def error_body(self, error: ApiError) -> dict[str, Any]:
        """`{"type": "error", "error": {"type", "message"}}`, as the anthropic SDK and Claude Code
        parse it."""
        return {"type": "error", "error": {"type": error.anthropic_type, "message": error.message}}

    def context_overflow(
        self, prompt_tokens: int, completion_tokens: int, limit: int, max_prompt_tokens: int, note: str = ""
    ) -> ApiError:
        """Anthropic's refusal, on which Claude Code stops with "Prompt is too long" (docs/agents.md §4.4):
        the prompt against the most prompt tokens that leave room for the completion, then `note`."""
        return ApiError(
            f"prompt is too long: {prompt_tokens} tokens > {max_prompt_tokens} maximum. {note}".rstrip()
        )

    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        """Anthropic counts cached prompt tokens apart from `input_tokens`: they are added back to give
        the whole prompt."""
        usage = as_dict(reply.get("usage"))
        prompt = as_int(usage.get("input_tokens"))
        if prompt is not None:
            for cached in ("cache_creation_input_tokens", "cache_read_input_tokens"):
                prompt += as_int(usage.get(cached)) or 0
        return prompt, as_int(usage.get("output_tokens"))

    def cache_usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        usage = as_dict(reply.get("usage"))
        return as_int(usage.get("cache_read_input_tokens")), as_int(usage.get("cache_creation_input_tokens"))


class Messages(AnthropicShaped, ThroughChat, AsChat, declines=(ReturnsTokenIds, CountsPrompt, TokenEndpoint)):
    name = "messages"
    route = "messages"
    areal_v1 = True
    history_field = "messages"
    context_fields = ("tools", "system")
    system_field = "system"
    operation = "chat"

    def areal_body(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The body AReaL can render, or None when it needs no change (compat.areal)."""
        return messages_body_for_areal(body)

    def completion_field(self, body: Any) -> str:
        return "max_tokens"

    def check(self, body: dict[str, Any]) -> None:
        """Beyond the history's objects: each message's role is text and its content text or a list
        of blocks (objects; an assistant's may be text, as LiteLLM reads them), `system` is text or a
        list, and `tools` a list of objects. Anthropic refuses the rest with a 400 too; a 500 would be
        retried by Claude Code and the SDK."""
        super().check(body)
        for index, message in enumerate(dicts_in(body.get("messages"))):
            where = f"messages[{index}]"
            if not isinstance(message.get("role"), str):
                raise ValueError(f"{where}.role must be text, not {_kind(message.get('role'))}")
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise ValueError(f"{where}.content must be text or a list of blocks, not {_kind(content)}")
            loose = str if message["role"] == "assistant" else dict
            for number, block in enumerate(content if isinstance(content, list) else []):
                if not isinstance(block, dict | loose):
                    raise ValueError(f"{where}.content[{number}] must be an object, not {_kind(block)}")
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise ValueError(f"system must be text or a list of blocks, not {_kind(system)}")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"tools must be a list of objects, not {_kind(tools)}")
        for number, tool in enumerate(tools or []):
            if not isinstance(tool, dict):
                raise ValueError(f"tools[{number}] must be an object, not {_kind(tool)}")

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        """The chat messages and tools AReaL renders: LiteLLM's conversion, list content flattened."""
        messages, tools = to_chat(body)
        return ChatPrompt([flattened(message) for message in messages], tools)

    def assembler(self) -> _MessageEvents:
        return _MessageEvents()

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        """`event: TYPE` and its data, as Anthropic streams."""
        return typed_event(event)

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """message_start, each content block, message_delta with the stop reason and output tokens,
        message_stop (Anthropic's event names, each with its `event:` line)."""
        usage = as_dict(body.get("usage"))
        opening = {
            **body,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 0},
        }
        events = [named_event("message_start", {"message": opening})]
        for index, block in enumerate(dicts_in(body.get("content"))):
            events += _block_events(index, block)
        stop = {"stop_reason": body.get("stop_reason"), "stop_sequence": body.get("stop_sequence")}
        output = {"output_tokens": usage.get("output_tokens", 0)}
        events.append(named_event("message_delta", {"delta": stop, "usage": output}))
        return [*events, named_event("message_stop", {})]

    def read(self, reply: dict[str, Any]) -> Reading:
        texts: list[str] = []
        calls = []
        for block in dicts_in(reply.get("content")):
            if block.get("type") == "text":
                texts.append(as_str(block.get("text")) or "")
            elif block.get("type") == "tool_use":
                calls.append(tool_call(block.get("id"), block.get("name"), block.get("input")))
        return as_str(reply.get("stop_reason")), "".join(texts) if texts else None, calls

    def conversation(
        self,
        request: dict[str, Any],
        response: dict[str, Any],
        session: Sequence[tuple[dict[str, Any], dict[str, Any]]] = (),
    ) -> Conversation:
        """Text blocks joined, `tool_use` as `tool_calls`, `tool_result` as `role: tool` messages placed
        first, `thinking` as `reasoning_content`; only function tools (server tools have no schema to
        train on)."""
        reply = {"role": "assistant", "content": response.get("content")}
        body = {**request, "messages": [*request.get("messages", []), reply]}
        messages, tools = to_chat(body, keep_cache_control=False, system_anywhere=True)
        chat = [{k: v for k, v in flattened(m).items() if k != "thinking_blocks"} for m in messages]
        functions = [t for t in tools or [] if t.get("type") == "function" and "function" in t]
        return Conversation(chat, functions)

    def chat_request(
        self, body: dict[str, Any], earlier: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The body as a chat request for a chat server (see the module docstring)."""
        messages, _ = to_chat(body, keep_cache_control=False, system_anywhere=False, flag_errors=True)
        chat: dict[str, Any] = {
            "model": body.get("model"),
            "messages": [_for_chat_server(m) for m in messages],
        }
        tools = [_chat_tool(tool) for tool in dicts_in(body.get("tools")) if _is_custom_tool(tool)]
        if tools:
            chat["tools"] = tools
            choice = as_dict(body.get("tool_choice"))
            if choice.get("type") in _TOOL_CHOICES:
                chat["tool_choice"] = _TOOL_CHOICES[choice["type"]]
            elif choice.get("type") == "tool":
                chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            if choice.get("disable_parallel_tool_use") is True:
                chat["parallel_tool_calls"] = False
        if body.get("stop_sequences"):
            chat["stop"] = body["stop_sequences"]
        return chat | request_options(body, "max_tokens", ("temperature", "top_p", "top_k"))

    def chat_translator(self, request: dict[str, Any]) -> _MessagesFromChat:
        return _MessagesFromChat(request)

    def upstream_error(self, status: int, error: ErrorInfo) -> tuple[int, ApiError]:
        """A context overflow whose message states no numbers still opens with "prompt is too long",
        the words Claude Code acts on (docs/agents.md §4.4)."""
        status, api = super().upstream_error(status, error)
        if is_context_overflow(error) and not api.message.startswith("prompt is too long"):
            api = ApiError(f"prompt is too long: {error.message}")
        return status, api

    def tool_call_parse_failure(self, response: Any) -> bool:
        """LiteLLM translates AReaL's unparsed tool call into stop_reason "tool_use" with no tool_use
        block (inferred from its mapping)."""
        reply = as_dict(response)
        blocks = dicts_in(reply.get("content"))
        return reply.get("stop_reason") == "tool_use" and not any(b.get("type") == "tool_use" for b in blocks)


# -- conversion to OpenAI chat ------------------------------------------------------------------------


def to_chat(
    body: dict[str, Any],
    *,
    keep_cache_control: bool | None = None,
    system_anywhere: bool | None = None,
    flag_errors: bool = False,
) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """A messages body as OpenAI chat messages and tools, the way LiteLLM converts it.

    `keep_cache_control` (LiteLLM: for Anthropic, Gemini and Bedrock targets) and `system_anywhere`
    (LiteLLM: for models its map says take system messages mid-conversation; others get them as noted
    user messages) default to what LiteLLM decides from the body's model. `flag_errors` opens the tool
    message of a failed `tool_result` (`is_error`) with TOOL_ERROR_PREFIX, which chat has no field for
    (LiteLLM drops the flag).
    """
    model = str(body.get("model") or "")
    if keep_cache_control is None:
        keep_cache_control = _consumes_cache_control(model)
    if system_anywhere is None:
        system_anywhere = (
            model.rsplit("/", 1)[-1].rsplit("anthropic.", 1)[-1] in _MID_CONVERSATION_SYSTEM_MODELS
        )
    ordered = body["messages"]
    if not system_anywhere:
        ordered = _with_mid_conversation_systems_converted(ordered)
    messages: list[dict[str, Any]] = []
    for message in ordered:
        messages.extend(_chat_messages(message, keep_cache_control, flag_errors))
    system = _system_message(body.get("system"), keep_empty_blocks=True)
    if system is not None:
        messages.insert(0, system)
    return messages, _tools(body.get("tools"), keep_cache_control)


def flattened(message: dict[str, Any]) -> dict[str, Any]:
    """A message with list content joined with "\\n", text only, as AReaL's proxy does
    (PRS `_flatten_content_lists`, docs/areal.md §1.1.8)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = (b if isinstance(b, str) else b.get("text", "") for b in content if _is_text_block(b))
    return {**message, "content": "\n".join(texts)}


def _consumes_cache_control(model: str) -> bool:
    """LiteLLM keeps `cache_control` on what it converts only for these targets."""
    model = model.lower()
    return (
        "anthropic" in model
        or "claude" in model
        or "gemini" in model
        or ("arn:" in model and ":bedrock:" in model)
    )


def _is_text_block(block: Any) -> bool:
    return isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")


def _with_mid_conversation_systems_converted(messages: list[Any]) -> list[Any]:
    """Leading system messages stay; later ones become noted user messages, each run of them moved
    after the tool results that open the message following it."""
    lead = next((i for i, m in enumerate(messages) if not _is_system(m)), len(messages))
    out, rest = list(messages[:lead]), messages[lead:]
    i = 0
    while i < len(rest):
        if not _is_system(rest[i]):
            out.append(rest[i])
            i += 1
            continue
        end = next((j for j in range(i, len(rest)) if not _is_system(rest[j])), len(rest))
        systems = [
            {"role": "user", "content": [_text(_CONVERTED_SYSTEM_NOTE), *_blocks(m.get("content"))]}
            for m in rest[i:end]
        ]
        if end < len(rest) and _opens_with_tool_result(rest[end]):
            out.append(rest[end])
            end += 1
        out.extend(systems)
        i = end
    return out


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "system"


def _opens_with_tool_result(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) and message.get("role") == "user" else None
    return (
        isinstance(content, list)
        and bool(content)
        and isinstance(content[0], dict)
        and content[0].get("type") == "tool_result"
    )


def _blocks(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [_text(content)]
    return list(content) if isinstance(content, list) else [content]


def _text(text: Any) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _chat_messages(
    message: dict[str, Any], keep_cache_control: bool, flag_errors: bool = False
) -> list[dict[str, Any]]:
    """One Anthropic message as zero or more chat messages."""
    role, content = message["role"], message.get("content")
    if role == "system":
        return [m for m in [_system_message(content, keep_empty_blocks=False)] if m is not None]
    if role == "user":
        return _user_messages(content, keep_cache_control, flag_errors)
    if role == "assistant":
        return [m for m in [_assistant_message(content, keep_cache_control)] if m is not None]
    return []


def _system_message(content: Any, keep_empty_blocks: bool) -> dict[str, Any] | None:
    """The top-level `system` keeps empty text blocks; a system message in `messages` drops them."""
    if isinstance(content, str):
        return {"role": "system", "content": content} if content else None
    blocks = [b for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
    texts = [_text(b.get("text", "")) for b in blocks if keep_empty_blocks or b.get("text")]
    return {"role": "system", "content": texts} if texts else None


def _user_messages(content: Any, keep_cache_control: bool, flag_errors: bool = False) -> list[dict[str, Any]]:
    """Tool results first (as tool messages), then the rest of the turn as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}] if content else []
    tools: list[dict[str, Any]] = []
    parts: list[Any] = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(_text(block.get("text", "")))
        elif kind in ("image", "document") and (url := _media_url(block.get("source"))):
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_result":
            text = _tool_result_text(block.get("content"))
            tool = {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id", ""),
                "content": TOOL_ERROR_PREFIX + text
                if flag_errors and block.get("is_error") is True
                else text,
            }
            if keep_cache_control and block.get("cache_control"):
                tool["cache_control"] = block["cache_control"]
            tools.append(tool)
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _media_url(source: Any) -> str | None:
    """A media block's source as a URL: its own, or a data URL of its base64 data."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64" and source.get("data"):
        return f"data:{source.get('media_type') or 'application/octet-stream'};base64,{source['data']}"
    if source.get("type") == "url":
        return str(source.get("url") or "") or None
    return None


def _tool_result_text(content: Any) -> str:
    """A tool_result's content after LiteLLM's conversion and AReaL's flattening: its text parts."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(
        p if isinstance(p, str) else str(p.get("text") or "") for p in parts if _is_text_block(p)
    )


def _assistant_message(content: Any, keep_cache_control: bool) -> dict[str, Any] | None:
    text: str | None = content if isinstance(content, str) else None
    texts: list[str] = []
    cached_text = False
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str):
            text = block
        elif block.get("type") == "text":
            texts.append(block.get("text", ""))
            cached_text = cached_text or bool(block.get("cache_control"))
        elif block.get("type") == "tool_use":
            arguments = json.dumps(block.get("input", {}))  # LiteLLM's, ASCII-escaped
            function = {"name": _tool_name(block.get("name", "")), "arguments": arguments}
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
        elif block.get("type") == "thinking":
            signed = {"thinking": block.get("thinking") or "", "signature": block.get("signature") or ""}
            thinking.append({"type": "thinking", **signed})
        elif block.get("type") == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "data": block.get("data") or ""})
    if text is None and not texts and not calls and not thinking:
        return None
    # LiteLLM keeps text blocks as a list only when one of them carries cache_control for a model that
    # consumes it; AReaL then joins that list with "\n". Text blocks are joined with "" otherwise.
    joiner = "\n" if keep_cache_control and cached_text else ""
    message: dict[str, Any] = {"role": "assistant", "content": joiner.join(texts) if texts else text}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
        reasoning = "\n".join(b["thinking"] for b in thinking if b.get("thinking"))
        if reasoning:
            message["reasoning_content"] = reasoning
    return message


def _tools(tools: Any, keep_cache_control: bool) -> list[Any] | None:
    converted = []
    for index, tool in enumerate(tools or []):
        kind = str(tool.get("type", ""))
        if kind.startswith("web_search") or (tool.get("name") == "web_search" and "input_schema" not in tool):
            continue  # LiteLLM turns web search into web_search_options, not a tool
        if (
            kind.startswith(_HOSTED_TOOL_TYPES)
            or (kind == "function" and "function" in tool)
            or _is_native(tool)
        ):
            converted.append(tool)
            continue
        name = tool.get("name")
        unnamed = name is None or not str(name).strip()
        function: dict[str, Any] = {
            "name": _tool_name(f"litellm_unnamed_tool_{index}" if unnamed else str(name))
        }
        if "input_schema" in tool:
            function["parameters"] = tool["input_schema"]
        if "description" in tool:
            function["description"] = tool["description"]
        if "strict" in tool:
            function["strict"] = bool(tool["strict"])
        extra = {k: v for k, v in tool.items() if k not in _MAPPED_TOOL_KEYS}
        if extra:
            function["parameters"] = {**function.get("parameters", {}), **extra}
        param: dict[str, Any] = {"type": "function", "function": function}
        if isinstance(tool.get("eager_input_streaming"), bool):
            param["eager_input_streaming"] = tool["eager_input_streaming"]
        if keep_cache_control and tool.get("cache_control"):
            param["cache_control"] = tool["cache_control"]
        converted.append(param)
    return converted or None


def _is_native(tool: dict[str, Any]) -> bool:
    """LiteLLM's provider-native tool: a single key naming a provider object."""
    if len(tool) != 1:
        return False
    key, value = next(iter(tool.items()))
    return key not in _ANTHROPIC_TOOL_SCHEMA_KEYS and isinstance(value, dict)


def _tool_name(name: str) -> str:
    if len(name) <= _MAX_TOOL_NAME_CHARS:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[:_TRUNCATED_TOOL_NAME_CHARS]}_{digest}"


# -- translation for a chat server ---------------------------------------------------------------------

# A failed tool result, flagged in the text of its tool message (chat has no field for it).
TOOL_ERROR_PREFIX = "Error: "
# Anthropic's tool_choice types that map to a chat tool_choice string (`tool` names one function).
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
# chat finish_reason -> Anthropic stop_reason, as LiteLLM maps it (content_filter to Anthropic's own
# "refusal"); anything else ends the turn.
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}
_REFUSAL = {"content_filter": "refusal"}


def _is_custom_tool(tool: dict[str, Any]) -> bool:
    """A client tool with a schema the model fills in (a hosted tool such as web_search runs on
    Anthropic's servers, which a chat server cannot stand in for)."""
    return isinstance(tool.get("name"), str) and tool.get("type") in (None, "custom")


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": tool["name"],
        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
    }
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _for_chat_server(message: dict[str, Any]) -> dict[str, Any]:
    """A converted message as a chat server takes it: all-text content joined as AReaL joins it (chat
    templates render text, not parts), parts kept when an image is among them; LiteLLM's
    `thinking_blocks` left out (its `reasoning_content` stays)."""
    out = {k: v for k, v in message.items() if k not in ("thinking_blocks", "cache_control")}
    content = out.get("content")
    if isinstance(content, list) and all(_is_text_block(part) for part in content):
        out = flattened(out)
    elif isinstance(content, list):
        out["content"] = [
            {k: v for k, v in part.items() if k != "cache_control"} for part in dicts_in(content)
        ]
    return out


def anthropic_usage(usage: Any) -> dict[str, int]:
    """Chat usage as Anthropic counts it: cached prompt tokens apart from `input_tokens`."""
    usage = as_dict(usage)
    prompt = as_int(usage.get("prompt_tokens")) or 0
    cached = as_int(as_dict(usage.get("prompt_tokens_details")).get("cached_tokens")) or 0
    out = {"input_tokens": prompt - cached, "output_tokens": as_int(usage.get("completion_tokens")) or 0}
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


class _MessagesFromChat:
    """Anthropic's event stream written from a chat chunk stream as it arrives: message_start at the
    first chunk, a thinking, text or tool_use block per run of reasoning, text or one tool call (each
    block stopped when the next starts), then message_delta with the stop reason and usage and
    message_stop once the chat stream has ended."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._model = request.get("model")
        self._deltas = ChatDeltas()
        self._started = False
        self._open: tuple[str, int] | None = None  # (block type, tool call number) of the open block
        self._blocks = 0
        self._call_blocks: dict[int, int] = {}

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._start(chunk)
        for kind, number, value in self._deltas.read(chunk):
            if kind == "reasoning":
                events += self._block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
                events.append(self._delta(self._blocks - 1, {"type": "thinking_delta", "thinking": value}))
            elif kind == "text":
                events += self._block("text", {"type": "text", "text": ""})
                events.append(self._delta(self._blocks - 1, {"type": "text_delta", "text": value}))
            elif kind == "call":
                use = {"type": "tool_use", "id": value["id"], "name": value["name"], "input": {}}
                events += self._block("tool_use", use, number)
                self._call_blocks[number] = self._blocks - 1
            elif kind == "arguments" and number in self._call_blocks:
                piece = {"type": "input_json_delta", "partial_json": value}
                events.append(self._delta(self._call_blocks[number], piece))
            elif kind == "error":
                events.append({"type": "error", "error": {"type": "api_error", "message": value}})
        return events

    def end(self) -> list[dict[str, Any]]:
        reason = self._deltas.finish_reason
        if reason is None:
            return []
        events = self._start({})
        if self._blocks == 0:
            events += self._block("text", {"type": "text", "text": ""})
        events += self._stop()
        stop = STOP_REASONS.get(reason) or _REFUSAL.get(reason) or "end_turn"
        usage = anthropic_usage(self._deltas.usage)
        events.append(
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage}
        )
        return [*events, {"type": "message_stop"}]

    def fail(self, message: str) -> list[dict[str, Any]]:
        """Anthropic's mid-stream error event (as it sends `overloaded_error`), which the anthropic SDK
        raises as an API error."""
        return [{"type": "error", "error": {"type": "api_error", "message": message}}]

    def _start(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {
            "id": chunk.get("id") or f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [{"type": "message_start", "message": message}]

    def _block(self, kind: str, start: dict[str, Any], number: int = 0) -> list[dict[str, Any]]:
        """Open a block of `kind` unless it is the one open (a tool call opens a block of its own)."""
        if self._open == (kind, number) and kind != "tool_use":
            return []
        events = self._stop()
        self._open = (kind, number)
        self._blocks += 1
        return [*events, {"type": "content_block_start", "index": self._blocks - 1, "content_block": start}]

    def _stop(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._blocks - 1}]

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": index, "delta": delta}


DIALECT = Messages()
