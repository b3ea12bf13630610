"""The OpenInference semantic conventions beside the GenAI ones: what Arize Phoenix and the other
OpenInference readers show of an exchange.

Phoenix lists a session by its first trace's `input.value` and its last trace's `output.value`, and
shows a span's conversation from `llm.input_messages.*` and `llm.output_messages.*`; without them its
Sessions tab shows an empty first input and a JSON stub as the last output. So a span also carries
(https://github.com/Arize-ai/openinference/blob/main/spec/semantic_conventions.md):

- always: `openinference.span.kind` (`LLM`), `llm.model_name`, `llm.token_count.prompt`,
  `llm.token_count.completion` and `llm.token_count.total`;
- with content (`--otlp-content`): `input.value`, the text of the newest message the request sent (the
  user's message on a conversation's first turn, a tool's result on a later one), and `output.value`,
  the reply's text (or its tool calls, one `name(arguments)` a line), both `text/plain` in
  `input.mime_type` / `output.mime_type`; and every message flattened, `llm.input_messages.{i}.message.
  role`, `.content`, `.name`, `.tool_call_id`, `.tool_calls.{j}.tool_call.id`, `.function.name`,
  `.function.arguments`, and the same for `llm.output_messages`.

Owns: those names and their values. Does not own: cutting a text to size or the GenAI attributes
(genai.py, which calls this with the exchange as OpenAI chat messages).

    attributes_of_call("qwen", 12, 3)                      # {"openinference.span.kind": "LLM", ...}
    content_attributes(request_messages, reply_messages, cut=lambda text: text[:8192], limit=256 * 1024)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from modeltap.dialects.base import as_dict, as_str, dicts_in, text_of

Value = str | bool | int | float
SPAN_KIND = "LLM"
TEXT = "text/plain"


def attributes_of_call(model: str | None, prompt: int | None, completion: int | None) -> dict[str, Value]:
    """The span kind, the model and the token counts, when known."""
    total = prompt + completion if prompt is not None and completion is not None else None
    values: dict[str, Value | None] = {
        "openinference.span.kind": SPAN_KIND,
        "llm.model_name": model,
        "llm.token_count.prompt": prompt,
        "llm.token_count.completion": completion,
        "llm.token_count.total": total,
    }
    return {key: value for key, value in values.items() if value is not None}


def content_attributes(
    asked: Sequence[dict[str, Any]],
    answered: Sequence[dict[str, Any]],
    *,
    cut: Callable[[str], str],
    limit: int,
) -> dict[str, Value]:
    """`input.value` / `output.value` and the flattened messages of an exchange whose request holds
    the OpenAI chat messages `asked` and whose reply added `answered`. Each text goes through `cut`;
    the input messages keep the newest that fit in `limit` characters (as the GenAI content does)."""
    out: dict[str, Value] = {}
    if asked:
        out |= {"input.value": cut(_text(asked[-1])), "input.mime_type": TEXT}
    said = "\n".join(filter(None, (_text(message) or _calls(message) for message in answered)))
    if said:
        out |= {"output.value": cut(said), "output.mime_type": TEXT}
    out |= _flattened("llm.input_messages", asked, cut, limit)
    out |= _flattened("llm.output_messages", answered, cut, limit)
    return out


def _flattened(
    prefix: str, messages: Sequence[dict[str, Any]], cut: Callable[[str], str], limit: int
) -> dict[str, Value]:
    """`{prefix}.{i}.message.…` for each message, numbered from 0 among the newest that fit `limit`."""
    each = [_message(message, cut) for message in messages]
    sizes = [sum(len(str(value)) for value in attrs.values()) for attrs in each]
    start, size = 0, sum(sizes)
    while size > limit and start < len(each):
        size -= sizes[start]
        start += 1
    return {
        f"{prefix}.{n}.{key}": value for n, attrs in enumerate(each[start:]) for key, value in attrs.items()
    }


def _message(message: dict[str, Any], cut: Callable[[str], str]) -> dict[str, Value]:
    out: dict[str, Value] = {"message.role": as_str(message.get("role")) or "user"}
    text = _text(message)
    if text:
        out["message.content"] = cut(text)
    for key in ("name", "tool_call_id"):
        if isinstance(message.get(key), str):
            out[f"message.{key}"] = message[key]
    for j, call in enumerate(dicts_in(message.get("tool_calls"))):
        function = as_dict(call.get("function"))
        at = f"message.tool_calls.{j}.tool_call"
        for key, value in (
            ("id", call.get("id")),
            ("function.name", function.get("name")),
            ("function.arguments", function.get("arguments")),
        ):
            if isinstance(value, str):
                out[f"{at}.{key}"] = cut(value)
    return out


def _text(message: dict[str, Any]) -> str:
    return text_of(message.get("content")) or ""


def _calls(message: dict[str, Any]) -> str:
    """A message's tool calls as text, one `name(arguments)` a line."""
    lines = []
    for call in dicts_in(message.get("tool_calls")):
        function = as_dict(call.get("function"))
        lines.append(f"{function.get('name')}({function.get('arguments') or ''})")
    return "\n".join(lines)
