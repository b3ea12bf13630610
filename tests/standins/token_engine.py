"""A toy tokenizer and ChatML-like template, so the vLLM and SGLang stand-ins can return token ids the
way the engines do (docs/engines.md §4.3): the prompt as the template renders the messages, the
completion as the ids the model sampled, ending with the end-of-turn token.

Owns: the ids of text (one per UTF-8 byte, so text re-encodes to the same ids whatever its history),
of a rendered conversation (`render`), of a reply (`completion`) and their decoding. Tool-call
arguments are rendered from their parsed JSON, as vLLM does before a template sees them, so an agent
that re-serialises arguments with other spacing renders the same ids. A history message with
`reasoning_content` is rendered with its think block; one without, without. `merged` text of a reply
is sampled as one id the encoder never produces, which is how re-tokenisation drifts.

    render([{"role": "user", "content": "hi"}])          # [1, ..., 1, 113, ...] (ends "assistant\\n")
    completion("hello")                                   # [120, ..., 2]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START, IM_END, END_OF_TEXT, TOOL_CALL, TOOL_CALL_END, THINK, THINK_END = range(1, 8)
SPECIAL = {
    IM_START: "<|im_start|>",
    IM_END: "<|im_end|>",
    END_OF_TEXT: "<|endoftext|>",
    TOOL_CALL: "<tool_call>",
    TOOL_CALL_END: "</tool_call>",
    THINK: "<think>",
    THINK_END: "</think>",
}
# Byte b is id TEXT_OFFSET + b; ids from MERGED_BASE up name whole strings the encoder never makes.
TEXT_OFFSET = 16
MERGED_BASE = TEXT_OFFSET + 256


def encode(text: str) -> list[int]:
    """One id per UTF-8 byte."""
    return [TEXT_OFFSET + byte for byte in text.encode()]


def decode_each(ids: Sequence[int]) -> list[str]:
    """Each id's text on its own (a byte of a multi-byte character decodes to U+FFFD)."""
    out = []
    for token in ids:
        if token in SPECIAL:
            out.append(SPECIAL[token])
        elif TEXT_OFFSET <= token < MERGED_BASE:
            out.append(bytes([token - TEXT_OFFSET]).decode(errors="replace"))
        else:
            out.append(f"<merged {token}>")
    return out


def render(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """The prompt ids of a chat request: each message as `<|im_start|>ROLE\\n…<|im_end|>\\n`, the tools
    (compact JSON) in the system block, then `<|im_start|>assistant\\n` when a reply is to follow."""
    messages = list(messages)
    ids: list[int] = []
    if tools:
        system = messages.pop(0) if messages and messages[0].get("role") == "system" else {}
        text = _text(system.get("content")) + "\n\n# Tools\n" + _compact(tools)
        ids += [IM_START, *encode("system\n" + text), IM_END, *encode("\n")]
    for message in messages:
        role = str(message.get("role"))
        ids += [IM_START, *encode(role + "\n"), *_body(message), IM_END, *encode("\n")]
    if add_generation_prompt:
        ids += [IM_START, *encode("assistant\n")]
    return ids


def completion(
    text: str = "",
    tool_calls: Sequence[tuple[str, Any]] = (),
    reasoning: str = "",
    merged: Mapping[str, int] | None = None,
) -> list[int]:
    """The ids the model samples for a reply: its think block, its text (a `merged` text as one id),
    its tool calls (name, arguments as parsed JSON), then the end-of-turn token."""
    body = _think(reasoning) + ([merged[text]] if merged and text in merged else encode(text))
    for name, arguments in tool_calls:
        body += _tool_call(name, arguments)
    return [*body, IM_END]


def _body(message: Mapping[str, Any]) -> list[int]:
    ids = _think(str(message.get("reasoning_content") or "")) + encode(_text(message.get("content")))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        parsed = json.loads(arguments) if isinstance(arguments, str) and arguments else arguments or {}
        ids += _tool_call(str(function.get("name")), parsed)
    return ids


def _think(reasoning: str) -> list[int]:
    return [THINK, *encode(reasoning), THINK_END] if reasoning else []


def _tool_call(name: str, arguments: Any) -> list[int]:
    return [TOOL_CALL, *encode(_compact({"name": name, "arguments": arguments})), TOOL_CALL_END]


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""
