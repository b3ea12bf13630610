"""How an inference engine turns a chat request into what its chat template renders.

Owns: applying an engine release's preparation (compat/preparations.py: docs/engines.md §7) to one
message, a whole conversation and a tool list, and the openai SDK's typed view AReaL's proxy validates
chat bodies with (docs/areal.md §1.1.6). Does not own: the facts themselves (compat/preparations.py),
what a format's prompt is (modeltap.dialects), which engine an upstream is (compat/engines.py), or
rendering and counting (counting/counter.py).

Pure functions over dicts; imports nothing of modeltap.

    prep = preparations.preparation("vllm", "0.33.0")
    messages = prepare_conversation(prep, body["messages"], string_content=True, names_developer=False)
    tools = prepare_tools(prep, body.get("tools"))
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from modeltap.compat.preparations import Preparation


class PreparationError(ValueError):
    """The engine refuses the request before rendering it (it answers 400 or fails the request)."""


def prepare_conversation(
    prep: Preparation, messages: Sequence[Any], *, string_content: bool, names_developer: bool
) -> list[dict[str, Any]]:
    """`messages` as `prep`'s engine hands them to the template. Raises PreparationError where the
    engine refuses them."""
    prepared = [prepare_message(prep, m, string_content=string_content) for m in messages]
    if prep.whole(messages, names_developer):
        systems = [_as_system(m) if m["role"] == "developer" else m for m in prepared]
        prepared = _systems_merged(systems)
    return prepared


def prepare_message(prep: Preparation, message: Any, *, string_content: bool) -> dict[str, Any]:
    """One message as `prep`'s engine hands it to the template (without the conversation-wide steps
    `Preparation.whole` names). Raises PreparationError where the engine refuses it."""
    if not isinstance(message, dict):
        raise TypeError(f"a message must be an object, not {type(message).__name__}")
    role = message.get("role")
    if prep.lowercase_roles and isinstance(role, str):
        role = role.lower()
    source = _reasoned(prep, {**message, "role": role}) if role == "assistant" else {**message, "role": role}
    kept = source if prep.fields is None else _only(source, prep.fields.get(str(role), prep.fields["*"]))
    out = {k: v for k, v in kept.items() if v is not None or k in prep.keep_none}
    if prep.drop_none_deep:
        out = _without_none(out)
    if role == "developer" and prep.fields is not None and "tools" in prep.fields.get("developer", ()):
        out.setdefault("tools", None)
    if role == "tool" and prep.tool_separator is not None:
        out["content"] = _tool_text(out.get("content"), prep.tool_separator)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_parsed_call(prep, call) for call in out["tool_calls"]]
    if prep.drop_empty_tool_calls and "tool_calls" in out and not out["tool_calls"]:
        del out["tool_calls"]
    if not prep.content_with_tool_calls and out.get("tool_calls"):
        out["content"] = None
    if prep.billing_header and role == "system":
        out["content"] = _without_billing_header(out.get("content"))
    content = out.get("content")
    if content is None:
        if prep.missing_content is not None:
            out["content"] = prep.missing_content
    elif isinstance(content, list) and prep.text_separator is not None:
        out["content"] = _flattened(content, prep, string_content)
    return out


def prepare_tools(prep: Preparation, tools: Any) -> Any:
    """The tool list as `prep`'s engine renders it (None stays None)."""
    if not isinstance(tools, list) or prep.tools == "as_sent":
        return tools
    return [_TOOL_DUMPS[prep.tools](t) if _is_function_tool(t) else t for t in tools]


# --- messages ------------------------------------------------------------------------------------------


def _reasoned(prep: Preparation, message: dict[str, Any]) -> dict[str, Any]:
    if prep.reasoning == "as_sent":
        return message
    reasoning = message.get("reasoning")
    if reasoning is None and prep.reasoning == "either":
        reasoning = message.get("reasoning_content")
    rest = {k: v for k, v in message.items() if k not in ("reasoning", "reasoning_content")}
    return rest if reasoning is None else {**rest, "reasoning": reasoning, "reasoning_content": reasoning}


def _flattened(parts: list[Any], prep: Preparation, string_content: bool) -> Any:
    """List content for the template: text joined for a template that takes strings, else parts with
    media as bare placeholders (their tokens depend on the processor, so media are not counted)."""
    if (string_content or prep.always_text) and prep.text_separator is not None:
        return prep.text_separator.join(_texts(parts, prep))
    return [_content_part(p) for p in parts]


def _texts(parts: list[Any], prep: Preparation) -> list[str]:
    kinds = _TEXT_PARTS[prep.engine]
    return [
        p if isinstance(p, str) else str(p.get("text", ""))
        for p in parts
        if (isinstance(p, str) and prep.engine == "vllm") or (isinstance(p, dict) and p.get("type") in kinds)
    ]


# The part types each engine takes text from (vLLM: TEXT_PART_TYPES in chat_message.py; SGLang:
# process_content_for_template_format; transformers serve: get_processor_inputs_from_messages).
_TEXT_PARTS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"text", "input_text", "output_text", "refusal", "thinking"}),
    "sglang": frozenset({"text", "input_text"}),
    "transformers": frozenset({"text", "input_text", "output_text"}),
    "areal": frozenset(),
    "unknown": frozenset({"text", "input_text"}),
}


def _tool_text(content: Any, separator: str) -> Any:
    """A tool result given as text parts, as one string (vLLM and SGLang flatten it whatever the
    template: vLLM joins with a newline, SGLang with a space); other lists stay as they are."""
    if not isinstance(content, list) or not all(
        isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in content
    ):
        return content
    return separator.join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)


def _content_part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"):
        return {"type": "image"}
    if isinstance(part, dict) and part.get("type") == "input_text":
        return {"type": "text", "text": part.get("text", "")}
    return part


def _without_billing_header(content: Any) -> Any:
    """vLLM >= 0.33 drops the first line of system text (of each text part) that opens with Claude
    Code's billing header, and a part left empty (`_strip_claude_code_billing_header`: its value
    changes every request and would defeat the prefix cache)."""
    if isinstance(content, str):
        return content.partition("\n")[2] if content.startswith(_BILLING_HEADER) else content
    if not isinstance(content, list):
        return content
    out = []
    for part in content:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        if not (isinstance(text, str) and text.startswith(_BILLING_HEADER)):
            out.append(part)
        elif rest := text.partition("\n")[2]:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


_BILLING_HEADER = "x-anthropic-billing-header"


def _as_system(message: dict[str, Any]) -> dict[str, Any]:
    """vLLM's `_convert_developer_to_system`: the role changed, the developer's tools dropped."""
    return {**{k: v for k, v in message.items() if k != "tools"}, "role": "system"}


def _systems_merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's `_consolidate_system_messages` (vllm/renderers/hf.py): every system message's text,
    joined by a blank line, as one system message at the start, when any is not first or there are
    several."""
    systems = [i for i, m in enumerate(messages) if m["role"] == "system"]
    if not systems or systems == [0]:
        return messages
    texts = [_system_text(messages[i].get("content", "")) for i in systems]
    merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
    return [merged, *(m for m in messages if m["role"] != "system")]


def _system_text(content: Any) -> str:
    if not isinstance(content, list):
        return str(content)
    return "\n".join(
        p["text"] if isinstance(p, dict) else p
        for p in content
        if isinstance(p, str) or (isinstance(p, dict) and "text" in p)
    )


# --- tool calls ----------------------------------------------------------------------------------------


def _parsed_call(prep: Preparation, call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    if prep.engine == "sglang":
        call = _sglang_call(call)
    function = call.get("function")
    if not isinstance(function, dict):
        if prep.engine != "transformers":  # which reads a call without `function` as the function
            return call
        function = call
    arguments = _ARGUMENTS[prep.arguments](function)
    if arguments is _UNCHANGED:
        return call
    if function is call:
        return {**call, "arguments": arguments}
    return {**call, "function": {**function, "arguments": arguments}}


def _sglang_call(call: dict[str, Any]) -> dict[str, Any]:
    """SGLang's ToolCall model dump: id, index, type, function {name, arguments}, None kept inside."""
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    return {
        "id": call.get("id"),
        "index": call.get("index"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": function.get("arguments")},
    }


_UNCHANGED: Any = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PreparationError(f"tool call arguments are not valid JSON: {exc}") from exc


def _object_or_empty(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if not arguments:
        return {}
    if isinstance(arguments, dict):
        return _UNCHANGED
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _json_or_empty(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if not arguments:
        return {}
    return _loads(arguments) if not isinstance(arguments, (dict, list)) else _UNCHANGED


def _json(function: dict[str, Any]) -> Any:
    if "arguments" not in function:
        raise PreparationError("a tool call has no arguments")
    arguments = function["arguments"]
    return _loads(arguments) if isinstance(arguments, str) else _UNCHANGED


def _object(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return _UNCHANGED
    parsed = _loads(arguments)
    if not isinstance(parsed, dict):
        raise PreparationError("Assistant tool call function.arguments must be a JSON object.")
    return parsed


def _json_or_text(function: dict[str, Any]) -> Any:
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return _UNCHANGED
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return _UNCHANGED


def _object_or_text(function: dict[str, Any]) -> Any:
    parsed = _json_or_text(function)
    return parsed if isinstance(parsed, dict) else _UNCHANGED


_ARGUMENTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "object_or_empty": _object_or_empty,
    "json_or_empty": _json_or_empty,
    "json": _json,
    "object": _object,
    "json_or_text": _json_or_text,
    "object_or_text": _object_or_text,
    "text": lambda function: _UNCHANGED,
}


# --- tools ---------------------------------------------------------------------------------------------


def _is_function_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("function"), dict)


def _vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """vLLM 0.33's ChatCompletionToolsParam dump: {type, function {name, description, parameters,
    strict and defer_loading when set}, defer_loading when set}; other keys dropped."""
    function = tool["function"]
    out = {k: function.get(k) for k in ("name", "description", "parameters")}
    out |= {k: function[k] for k in ("strict", "defer_loading") if function.get(k) is not None}
    if tool.get("defer_loading") is not None and out.get("defer_loading") is None:
        out["defer_loading"] = tool["defer_loading"]
    dumped: dict[str, Any] = {"type": "function", "function": out}
    if tool.get("defer_loading") is not None:
        dumped["defer_loading"] = tool["defer_loading"]
    return dumped


def _vllm_extra_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """vLLM 0.19's dump: declared fields first (name, description, parameters), then the client's other
    keys in its order (extra="allow"), at both levels."""
    function = tool["function"]
    out = {k: function.get(k) for k in ("name", "description", "parameters")}
    out |= {k: v for k, v in function.items() if k not in out}
    return {
        "type": "function",
        "function": out,
        **{k: v for k, v in tool.items() if k not in ("type", "function")},
    }


def _sglang_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """SGLang 0.5.23's Tool dump: the function's declared keys in the client's order (strict and
    defer_loading only when set), the missing ones after as None, and `defer_loading` on the tool."""
    function = tool["function"]
    declared = ("description", "name", "parameters", "strict", "defer_loading")
    values = {k: function.get(k) for k in declared}
    if tool.get("defer_loading") is not None and values["defer_loading"] is None:
        values["defer_loading"] = tool["defer_loading"]
    values = {k: v for k, v in values.items() if v is not None or k not in ("strict", "defer_loading")}
    order = [k for k in function if k in values] + [k for k in values if k not in function]
    return {
        "type": tool.get("type", "function"),
        "function": {k: values[k] for k in order},
        "defer_loading": tool.get("defer_loading"),
    }


def _sglang_strict_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """SGLang 0.5.10's: {type, function {description, name, parameters, strict (false unless set)}}."""
    function = tool["function"]
    out = {k: function.get(k) for k in ("description", "name", "parameters")}
    out["strict"] = bool(function.get("strict") or False)
    return {"type": tool.get("type", "function"), "function": out}


_TOOL_DUMPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "vllm": _vllm_tool,
    "vllm_extra": _vllm_extra_tool,
    "sglang": _sglang_tool,
    "sglang_strict": _sglang_strict_tool,
}


def _without_none(value: Any) -> Any:
    """AReaL's `_ensure_message_dict_list`: None-valued keys dropped at every depth."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


# --- AReaL's typed view ---------------------------------------------------------------------------------

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
    """`messages` as AReaL's proxy validates them: only the openai SDK's declared fields, in order."""
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
    """`tools` as AReaL's proxy validates them: each function's declared keys, in the SDK's order."""
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
