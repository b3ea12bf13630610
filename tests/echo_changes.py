"""Generated sessions in which an agent echoes the model's reply back with one kind of change, on the
real Qwen3 tokenizer: what the model wrote (reasoning, maybe text, a tool call in its own JSON
spacing), the reply the engine answered for it (parsed by vLLM's qwen3 and hermes parsers, as
modeltap's compat/parsers reproduce them), and the next request's history with the change.

Both modes are held to these sessions: `--tokens exact` keeps the model's ids when the meaning is
unchanged and renders from the edit otherwise (tests/unit/counting/test_continuation.py), `--tokens
observe` names the change as the cause of the break (tests/unit/records/test_token_store.py).

    case = data.draw(echo_cases())
    case.first_history, case.completion_text, case.reply, case.second_history
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from modeltap.compat.parsers import ReplyContext, ToolSpec, reply_parser

EchoKind = Literal[
    "unchanged",
    "whitespace",
    "key_order",
    "reserialised",
    "reasoning_dropped",
    "content_edited",
    "arguments_edited",
    "message_removed",
]
ECHO_KINDS: tuple[EchoKind, ...] = (
    "unchanged",
    "whitespace",
    "key_order",
    "reserialised",
    "reasoning_dropped",
    "content_edited",
    "arguments_edited",
    "message_removed",
)
# The changes after which the reply still says what the model said (counting/continuation.py
# same_reply): exact mode keeps the model's ids for it.
MEANING_KEPT = frozenset({"unchanged", "whitespace", "key_order", "reserialised", "reasoning_dropped"})
# The break observe mode reports for each change, and the (field, cause) of each echo change it names.
EXPECTED_BREAK: dict[EchoKind, tuple[str, list[tuple[str, str]]]] = {
    "whitespace": ("reply_reformatted", [("content", "whitespace")]),
    "key_order": ("reply_reformatted", [("tool_calls[0].arguments", "key order")]),
    "reserialised": ("reply_reformatted", [("tool_calls[0].arguments", "spacing")]),
    "reasoning_dropped": ("reasoning_dropped", [("reasoning", "dropped")]),
    "content_edited": ("assistant_text_changed", [("content", "edited")]),
    "arguments_edited": ("tool_call_arguments_changed", [("tool_calls[0].arguments", "edited")]),
    "message_removed": ("message_removed", []),
}

SYSTEM = {"role": "system", "content": "You are a coding agent."}
NOTE = {"role": "user", "content": "The repository is in /work."}
TASK = {"role": "user", "content": "Count the files, then tell me."}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            },
        },
    }
]
PARSER = reply_parser("hermes", "qwen3")

_WORD = st.text(alphabet="abcdefghij XYZ.-_/", min_size=1, max_size=12).filter(str.strip)
_ARGUMENTS = st.fixed_dictionaries({"command": _WORD}, optional={"timeout": st.integers(0, 999)})
_STYLES = st.sampled_from(["spaced", "compact", "reversed"])


@dataclass(frozen=True)
class EchoCase:
    """One session of two turns: `first_history` answered by `completion_text` (the model's text,
    before its `<|im_end|>`), which the engine answered as `reply`; `second_history` is the next
    request, whose echo of the reply carries the change `kind`."""

    kind: EchoKind
    first_history: list[dict[str, Any]]
    completion_text: str
    reply: dict[str, Any]
    second_history: list[dict[str, Any]]

    @property
    def meaning_kept(self) -> bool:
        return self.kind in MEANING_KEPT


def _written(arguments: dict[str, Any], style: str) -> str:
    """A tool call as the model writes it: the template's own spacing, compact, or keys reversed."""
    call = {"name": "bash", "arguments": arguments}
    if style == "compact":
        return json.dumps(call, separators=(",", ":"))
    if style == "reversed":
        return json.dumps({"name": "bash", "arguments": dict(reversed(list(arguments.items())))})
    return json.dumps(call)


def _parsed_reply(text: str) -> dict[str, Any]:
    """The reply vLLM answers for `text`, as a chat message."""
    parsed = PARSER.parse(text, ReplyContext(tools=ToolSpec.from_chat(TOOLS)))
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    message["tool_calls"] = [
        {"id": f"call_{n}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for n, c in enumerate(parsed.tool_calls)
    ]
    return message


def _changed(reply: dict[str, Any], kind: EchoKind) -> dict[str, Any]:
    echo = json.loads(json.dumps(reply))
    [call] = echo["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    if kind == "whitespace":
        echo["content"] = (echo.get("content") or "") + " \n"
    elif kind == "key_order":
        call["function"]["arguments"] = json.dumps(dict(reversed(list(arguments.items()))))
    elif kind == "reserialised":
        call["function"]["arguments"] = json.dumps(arguments, separators=(",", ":"))
    elif kind == "reasoning_dropped":
        echo.pop("reasoning_content", None)
    elif kind == "content_edited":
        echo["content"] = (echo.get("content") or "") + "Done."
    elif kind == "arguments_edited":
        call["function"]["arguments"] = json.dumps({**arguments, "command": arguments["command"] + " -l"})
    return echo


@st.composite
def echo_cases(draw: st.DrawFn, kinds: tuple[EchoKind, ...] = ECHO_KINDS) -> EchoCase:
    """A session with one echo change of `kinds`."""
    kind = draw(st.sampled_from(kinds))
    arguments = draw(_ARGUMENTS)
    if kind == "key_order" and len(arguments) < 2:
        arguments["timeout"] = draw(st.integers(0, 999))
    thought = draw(_WORD)
    preface = draw(st.sampled_from(["", "Let me look.", "Let me look.\n"]))
    written = _written(arguments, draw(_STYLES))
    text = f"<think>\n{thought}\n</think>\n\n{preface}" + ("\n" if preface else "")
    text += f"<tool_call>\n{written}\n</tool_call>"
    reply = _parsed_reply(text)
    echo = _changed(reply, kind)
    first = [SYSTEM, NOTE, TASK]
    result = {"role": "tool", "tool_call_id": "call_0", "content": draw(_WORD)}
    # A removed message is one in the middle: without its first message a history is another
    # conversation (records/token_store.py continues none).
    second = [SYSTEM, TASK, echo, result] if kind == "message_removed" else [*first, echo, result]
    return EchoCase(kind, first, text, reply, second)
