"""How each backend turns a request body into the messages and tools its chat template renders.

Owns: the normalisation a server applies before rendering, copied so that modeltap counts the same
prompt: SGLang's for chat (content parts joined with a space, JSON-string tool-call arguments parsed,
None dropped: shared/reference/token-budgets.md §1.6), the openai SDK's typed view AReaL validates chat
bodies with (areal-proxy-protocol.md §1.1), the Responses API's `input` and `instructions`, and
Anthropic `/v1/messages` converted the way AReaL's proxy converts it (LiteLLM's AnthropicAdapter, then
list content joined with "\n": §1.1). Does not own: rendering or counting (proxy/tokens.py).

Pure functions over dicts; imports nothing of modeltap.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def normalise_message(message: Any, string_content: bool) -> dict[str, Any]:
    """One message as the backend hands it to the template (token-budgets.md §1.6, §5.2).

    None fields are dropped and missing content becomes "" (SGLang), list content is joined with a
    space for templates that expect a string (SGLang) or reduced to text and media placeholders,
    and tool-call arguments given as a JSON object string become that object (SGLang, vLLM and
    AReaL all parse them; text that is not a JSON object stays a string, as AReaL leaves it).
    """
    if not isinstance(message, dict):
        raise TypeError(f"a message must be an object, not {type(message).__name__}")
    out = {k: v for k, v in message.items() if v is not None}
    content = out.get("content", "")
    if isinstance(content, list):
        content = _joined_text(content) if string_content else [_content_part(p) for p in content]
    out["content"] = content
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_parsed_tool_call(call) for call in out["tool_calls"]]
    return out


def _joined_text(parts: list[Any]) -> str:
    return " ".join(
        p["text"] for p in parts if isinstance(p, dict) and p.get("type") in ("text", "input_text")
    )


def _content_part(part: Any) -> Any:
    """A content part for a template that iterates over parts: media become bare placeholders, as
    SGLang hands them over (their token count depends on the processor, so media are not counted)."""
    if isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"):
        return {"type": "image"}
    if isinstance(part, dict) and part.get("type") == "input_text":
        return {"type": "text", "text": part.get("text", "")}
    return part


def _parsed_tool_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return call
    if not isinstance(parsed, dict):
        return call
    return {**call, "function": {**function, "arguments": parsed}}  # type: ignore[dict-item]


# The fields of the openai SDK's chat TypedDicts (openai/types/chat/*_param.py, the same in openai 2.x
# and 3.x), in declaration order. AReaL's proxy validates /chat/completions bodies against them with
# pydantic, which keeps only these fields, in this order (areal-proxy-protocol.md §1.1; AReaL #1499).
_TYPED_MESSAGE_FIELDS = {
    "system": ("content", "role", "name"),
    "developer": ("content", "role", "name"),
    "user": ("content", "role", "name"),
    "assistant": ("role", "audio", "content", "function_call", "name", "refusal", "tool_calls"),
    "tool": ("content", "role", "tool_call_id"),
    "function": ("content", "name", "role"),
}
_TYPED_TOOL_CALL_FIELDS = ("id", "function", "type")
_TYPED_CALLED_FUNCTION_FIELDS = ("arguments", "name")
_TYPED_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def typed_messages(messages: Any) -> list[Any]:
    return [_typed_message(m) for m in messages]


def _typed_message(message: Any) -> Any:
    fields = _TYPED_MESSAGE_FIELDS.get(message.get("role", "")) if isinstance(message, dict) else None
    if fields is None:
        return message
    typed = _only(message, fields)
    if isinstance(typed.get("tool_calls"), list):
        typed["tool_calls"] = [_typed_tool_call(call) for call in typed["tool_calls"]]
    return typed


def _typed_tool_call(call: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    return {
        **_only(call, _TYPED_TOOL_CALL_FIELDS),
        "function": _only(call["function"], _TYPED_CALLED_FUNCTION_FIELDS),
    }


def typed_tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools
    return [
        {"function": _only(t["function"], _TYPED_FUNCTION_FIELDS), "type": "function"}
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict)
        else t
        for t in tools
    ]


def _only(mapping: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {k: mapping[k] for k in fields if k in mapping}


def responses_messages(body: dict[str, Any]) -> list[Any]:
    """Responses `instructions` and `input` as chat messages, the way AReaL's ArealOpenAI converts
    them (areal/experimental/openai/client.py `_build_messages_list`): every text part of an input
    item becomes its own message, a function_call_output a tool message, other items pass as they
    are."""
    messages: list[Any] = []
    if body.get("instructions") is not None:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items:
        item = _without_none(item)
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            messages.append({"role": item["role"], "content": content})
        elif isinstance(content, list) and any(p.get("type") == "input_image" for p in content):
            messages.append({"role": item["role"], "content": content})
        elif isinstance(content, list):
            messages.extend({"role": item["role"], "content": p["text"]} for p in content if "text" in p)
        elif isinstance(item, dict) and item.get("type") == "function_call_output":
            tool = {"role": "tool", "content": item["output"]}
            messages.append({**tool, "tool_call_id": item["call_id"]} if "call_id" in item else tool)
        else:
            messages.append(item)
    return messages


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


# --- Anthropic /v1/messages, converted the way AReaL's proxy converts it -------------------------
# AReaL translates the body with LiteLLM's AnthropicAdapter, then joins list content with "\n",
# keeping only text (areal-proxy-protocol.md §1.1; PRS `_flatten_content_lists`). The steps below
# follow LiteLLM 1.104.9, the newest LiteLLM AReaL can import (areal-tier.md §0), in
# litellm/llms/anthropic/experimental_pass_through/adapters/transformation.py.

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
# (agent-clients.md). A prefixed name the map does not list is counted as if it did.
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


def anthropic_prompt(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any] | None]:
    """Anthropic messages, system and tools as the chat messages and tools AReaL renders."""
    model = str(body.get("model") or "")
    keeps_cache_control = _consumes_cache_control(model)
    ordered = body["messages"]
    if model.rsplit("/", 1)[-1].rsplit("anthropic.", 1)[-1] not in _MID_CONVERSATION_SYSTEM_MODELS:
        ordered = _with_mid_conversation_systems_converted(ordered)
    messages: list[dict[str, Any]] = []
    for message in ordered:
        messages.extend(_anthropic_message(message, keeps_cache_control))
    system = _system_message(body.get("system"), keep_empty_blocks=True)
    if system is not None:
        messages.insert(0, system)
    flattened = [{**m, "content": _flattened(m["content"])} if "content" in m else m for m in messages]
    return flattened, _anthropic_tools(body.get("tools"), keeps_cache_control)


def _consumes_cache_control(model: str) -> bool:
    """LiteLLM keeps `cache_control` on what it converts only for these targets."""
    model = model.lower()
    return (
        "anthropic" in model
        or "claude" in model
        or "gemini" in model
        or ("arn:" in model and ":bedrock:" in model)
    )


def _flattened(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    texts = (b if isinstance(b, str) else b.get("text", "") for b in content if _is_text_block(b))
    return "\n".join(texts)


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


def _anthropic_message(message: dict[str, Any], keeps_cache_control: bool) -> list[dict[str, Any]]:
    """One Anthropic message as zero or more chat messages."""
    role, content = message["role"], message.get("content")
    if role == "system":
        return [m for m in [_system_message(content, keep_empty_blocks=False)] if m is not None]
    if role == "user":
        return _user_messages(content, keeps_cache_control)
    if role == "assistant":
        return [m for m in [_assistant_message(content, keeps_cache_control)] if m is not None]
    return []


def _system_message(content: Any, keep_empty_blocks: bool) -> dict[str, Any] | None:
    """The top-level `system` keeps empty text blocks; a system message in `messages` drops them."""
    if isinstance(content, str):
        return {"role": "system", "content": content} if content else None
    blocks = [b for b in content or [] if isinstance(b, dict) and b.get("type") == "text"]
    texts = [_text(b.get("text", "")) for b in blocks if keep_empty_blocks or b.get("text")]
    return {"role": "system", "content": texts} if texts else None


def _user_messages(content: Any, keeps_cache_control: bool) -> list[dict[str, Any]]:
    """Tool results first (as tool messages), then the rest of the turn as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}] if content else []
    tools: list[dict[str, Any]] = []
    parts: list[Any] = []
    for block in content or []:
        kind = block.get("type")
        if kind == "text":
            parts.append(_text(block.get("text", "")))
        elif kind in ("image", "document") and _media_url(block.get("source")):
            parts.append({"type": "image_url"})  # dropped by AReaL's flattening; only its presence counts
        elif kind == "tool_result":
            tool = {
                "role": "tool",
                "tool_call_id": block.get("tool_use_id", ""),
                "content": block.get("content"),
            }
            tool["content"] = _tool_result_text(tool["content"])
            if keeps_cache_control and block.get("cache_control"):
                tool["cache_control"] = block["cache_control"]
            tools.append(tool)
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _media_url(source: Any) -> bool:
    if not isinstance(source, dict):
        return False
    if source.get("type") == "base64":
        return bool(source.get("data"))
    return source.get("type") == "url"


def _tool_result_text(content: Any) -> str:
    """A tool_result's content after LiteLLM's conversion and AReaL's flattening: its text parts."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "\n".join(
        p if isinstance(p, str) else str(p.get("text") or "") for p in parts if _is_text_block(p)
    )


def _assistant_message(content: Any, keeps_cache_control: bool) -> dict[str, Any] | None:
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
            function = {
                "name": _tool_name(block.get("name", "")),
                "arguments": json.dumps(block.get("input", {})),
            }
            calls.append({"id": block.get("id", ""), "type": "function", "function": function})
        elif block.get("type") == "thinking":
            thinking.append(
                {
                    "type": "thinking",
                    "thinking": block.get("thinking") or "",
                    "signature": block.get("signature") or "",
                }
            )
        elif block.get("type") == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "data": block.get("data") or ""})
    if text is None and not texts and not calls and not thinking:
        return None
    # LiteLLM keeps text blocks as a list only when one of them carries cache_control for a model that
    # consumes it; AReaL then joins that list with "\n". Text blocks are joined with "" otherwise.
    joiner = "\n" if keeps_cache_control and cached_text else ""
    message: dict[str, Any] = {"role": "assistant", "content": joiner.join(texts) if texts else text}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
        reasoning = "\n".join(b["thinking"] for b in thinking if b.get("thinking"))
        if reasoning:
            message["reasoning_content"] = reasoning
    return message


def _anthropic_tools(tools: Any, keeps_cache_control: bool) -> list[Any] | None:
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
        function: dict[str, Any] = {
            "name": _tool_name(
                str(name) if name is not None and str(name).strip() else f"litellm_unnamed_tool_{index}"
            )
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
        if keeps_cache_control and tool.get("cache_control"):
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
