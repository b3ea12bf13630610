"""Qwen2.5 / Qwen3 JSON tool calls (`--tool-call-parser hermes`, alias `qwen3_json`), as vLLM 0.33.0's
non-streaming parser reads them.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`Hermes2ProToolParser.extract_tool_calls` (vllm/tool_parsers/hermes_tool_parser.py:38-40, 70-120 at
https://github.com/vllm-project/vllm/blob/v0.33.0/), the same algorithm in vLLM 0.19.1:
- every `<tool_call>…</tool_call>` block, and an unclosed last one up to the end of the text, is read
  as JSON (surrounding whitespace allowed); the arguments are re-serialised with
  `json.dumps(..., ensure_ascii=False)`, so `{"a":1}` becomes `{"a": 1}` and an `"arguments"` that is
  a JSON string stays a (double-encoded) string; names are not checked against the tools;
- the content is the text before the first `<tool_call>`, not stripped (whitespace alone is none);
  text after the calls is dropped;
- all or nothing: one block that is not JSON, lacks `"name"` or `"arguments"`, or names no string,
  and the whole text is the content, with no calls (the finish reason stays the engine's).
SGLang's `qwen25` differs (the newlines belong to its markers, content stripped, bad blocks skipped
one by one, unknown tools dropped): docs/parsers.md §3.

    HermesToolParser().extract(text, ReplyContext(tools=tools), with_reasoning=False)
"""

from __future__ import annotations

import json
import re

from modeltap.compat.parsers.base import (
    GrowingText,
    ParsedCall,
    ReplyContext,
    ToolExtraction,
    ToolParser,
    ToolStream,
    partial_suffix,
)

TOOL_CALL_START = "<tool_call>"

# A closed block, or an unclosed last one running to the end (hermes_tool_parser.py:38-40).
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class HermesToolParser(ToolParser):
    """`hermes` / `qwen3_json` tool calls."""

    name = "hermes"
    engine_based = False

    def extract(self, content: str, context: ReplyContext, *, with_reasoning: bool) -> ToolExtraction:
        if TOOL_CALL_START not in content:
            return ToolExtraction(False, (), content)
        calls = []
        for closed, unclosed in _BLOCK.findall(content):
            call = _call(closed or unclosed)
            if call is None:
                return ToolExtraction(False, (), content)
            calls.append(call)
        return ToolExtraction(True, tuple(calls), content[: content.find(TOOL_CALL_START)] or None)

    def stream(self, context: ReplyContext, *, with_reasoning: bool) -> ToolStream:
        return _HermesStream()


def _call(body: str) -> ParsedCall | None:
    """One block's call, or None where vLLM's `except Exception` branch would take over."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    # `function_call["name"]` / `["arguments"]` on anything but an object with both keys raises, and
    # the message model accepts only a string name.
    if not isinstance(parsed, dict) or "arguments" not in parsed or not isinstance(parsed.get("name"), str):
        return None
    return ParsedCall(parsed["name"], json.dumps(parsed["arguments"], ensure_ascii=False))


class _HermesStream(ToolStream):
    """Before a `<tool_call>`, the text is the content whatever follows, once it is more than
    whitespace. After one, nothing more is certain until the end: a later block that fails to parse
    makes the whole text the content and drops every call, so the calls come at the end."""

    def __init__(self) -> None:
        self._content = GrowingText()
        self._held = ""
        self._found = False

    def feed(self, text: str) -> tuple[str, tuple[ParsedCall, ...]]:
        if not self._found:
            held = self._held + text
            before, found, _ = held.partition(TOOL_CALL_START)
            self._found = bool(found)
            keep = 0 if found else partial_suffix(held, TOOL_CALL_START)
            self._held = held[len(before) - keep :] if keep else ""
            self._content.add(before[: len(before) - keep])
        return self._content.take_unless_blank(), ()
