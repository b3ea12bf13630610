"""Chat requests of every shape an agent sends, for the engines tier and the counting tests: a
conversation (system or developer opening, users with text or text parts and a name, assistants with
text, null or parts beside tool calls whose arguments are JSON text in any spacing and key order, now
and then cut short, reasoning under either field, tool results as text or parts, notes
mid-conversation) cut after each message, so that a request may end on any role."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

SNIPPETS = ["<think>", "</think>", "<tool_call>", "\n\n", "  ", "e\u0301", "🤖", "```py\nx = 1\n```", "\r\n"]
texts = st.lists(
    st.one_of(st.text(st.characters(exclude_categories=("Cs",)), max_size=30), st.sampled_from(SNIPPETS)),
    max_size=4,
).map("".join)
names = st.from_regex(r"[a-z_]{1,10}", fullmatch=True)
parts = st.lists(texts.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3)
arguments = st.dictionaries(names, st.one_of(st.integers(), texts, st.booleans(), st.none()), max_size=3)
TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
tool_lists = st.sampled_from(
    [
        None,
        [TOOL],
        [{"function": {"parameters": TOOL["function"]["parameters"], "name": "bash"}, "type": "function"}],
        [
            TOOL,
            {
                "type": "function",
                "function": {"name": "read", "strict": True, "parameters": {"type": "object"}},
            },
        ],
    ]
)


@st.composite
def _arguments_text(draw: st.DrawFn) -> str:
    value = draw(arguments)
    keys = draw(st.permutations(list(value)))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    text = json.dumps({k: value[k] for k in keys}, ensure_ascii=draw(st.booleans()), separators=separators)
    # Now and then cut short, as a reply that hit its token limit leaves it: not JSON at all.
    return text[:-1] if draw(st.integers(0, 40)) == 0 else text


@st.composite
def _assistant(draw: st.DrawFn, call_ids: list[str]) -> list[dict[str, Any]]:
    """An assistant message, and the tool results that answer its calls."""
    message: dict[str, Any] = {"role": "assistant"}
    calls = draw(st.integers(0, 2))
    message["content"] = draw(st.one_of(texts, parts, st.none()) if calls else st.one_of(texts, parts))
    reasoning = draw(st.sampled_from([None, "reasoning_content", "reasoning"]))
    if reasoning:
        message[reasoning] = draw(texts)
    if draw(st.booleans()) and calls == 0:
        message["refusal"] = None
    results = []
    if calls:
        message["tool_calls"] = []
        for _ in range(calls):
            call_id = f"call_{len(call_ids)}"
            call_ids.append(call_id)
            message["tool_calls"].append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "bash", "arguments": draw(_arguments_text())},
                }
            )
            results.append(
                {"role": "tool", "tool_call_id": call_id, "content": draw(st.one_of(texts, parts))}
            )
    return [message, *results]


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools): a whole conversation; send each prefix that holds a user message."""
    messages: list[dict[str, Any]] = []
    opening = draw(st.sampled_from(["none", "system", "system parts", "developer"]))
    if opening == "system":
        messages.append({"role": "system", "content": draw(texts)})
    elif opening == "system parts":
        messages.append({"role": "system", "content": draw(parts)})
    elif opening == "developer":
        messages.append({"role": "developer", "content": draw(texts)})
    call_ids: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        user: dict[str, Any] = {"role": "user", "content": draw(st.one_of(texts, parts))}
        if draw(st.integers(0, 5)) == 0:
            user["name"] = draw(names)
        messages.append(user)
        for _ in range(draw(st.integers(0, 3))):
            messages.extend(draw(_assistant(call_ids)))
        if draw(st.integers(0, 7)) == 0:
            messages.append({"role": "system", "content": draw(texts)})
    return messages, draw(tool_lists)


def requests(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, model: str
) -> list[dict[str, Any]]:
    """A chat body for each prefix of `messages` that holds a user message, ending on any role."""
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    bodies = []
    for end in range(first_user + 1, len(messages) + 1):
        body: dict[str, Any] = {"model": model, "messages": messages[:end], "max_tokens": 1}
        if tools is not None:
            body["tools"] = tools
        bodies.append(body)
    return bodies
