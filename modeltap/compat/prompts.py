"""How a backend turns chat messages into what its chat template renders.

Owns: the normalisation a server applies before rendering, copied so that modeltap counts the same
prompt: SGLang's (content parts joined with a space, JSON-string tool-call arguments parsed, None
dropped: docs/token-budgets.md §1.6), and the openai SDK's typed view AReaL validates chat bodies with
(docs/areal.md §1.1.6). Does not own: what a format's prompt is (modeltap.dialects) or rendering and
counting (counting/counter.py).

Pure functions over dicts; imports nothing of modeltap.
"""

from __future__ import annotations

import json
from typing import Any


def normalise_message(message: Any, string_content: bool) -> dict[str, Any]:
    """One message as the backend hands it to the template (docs/token-budgets.md §1.6, §5.2).

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
# pydantic, which keeps only these fields, in this order (docs/areal.md §1.1.6; AReaL #1499).
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
