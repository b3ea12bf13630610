"""Token continuity: whether a turn's prompt ids extend the previous turn's prompt and completion, and
when they do not, where and why the history broke.

Owns: the rule (turn t+1's prompt must begin with turn t's prompt ids followed by its completion ids,
allowing only a stop id the model sampled that the template renders as another end-of-turn id:
docs/engines.md §4), the first differing position, which message of the conversation the
break falls in, and its classification; also the fast common-prefix length of two id sequences.
Does not own: which earlier turn a turn continues (records/token_store.py picks it by messages),
storing ids or breaks (token_store.py), or showing them (modeltap/readers: show, the viewer).

Messages are compared as OpenAI chat messages (each dialect's `conversation`), so a break is
classified the same way whatever the wire format. Pure functions, no I/O.

    expected = previous_prompt + previous_completion
    ends = frozenset({151645, 151643})            # Qwen's <|im_end|> and <|endoftext|>
    position = break_position(expected, prompt, common_prefix(expected, prompt),
                              completion_length=len(previous_completion), turn_ends=ends)
    if position is not None:
        found = classify(previous, history, digests, tools, position, len(previous_prompt))
        describe(found)   # 'the assistant's tool calls came back changed (message 3, assistant): ...'
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from modeltap.dialects.base import as_int, as_str

BreakKind = Literal[
    "tools_changed",
    "message_edited",
    "message_removed",
    "reply_missing",
    "assistant_text_changed",
    "tool_call_arguments_changed",
    "reasoning_dropped",
    "reply_reformatted",
    "rerendered",
]
# One line each, for `show` and the viewer.
BREAK_TEXT: dict[BreakKind, str] = {
    "tools_changed": "the tools changed",
    "message_edited": "an earlier message was edited",
    "message_removed": "an earlier message was removed",
    "reply_missing": "the previous reply was not sent back",
    "assistant_text_changed": "the assistant's text came back changed",
    "tool_call_arguments_changed": "the assistant's tool calls came back changed",
    "reasoning_dropped": "the reasoning of the previous reply was dropped",
    "reply_reformatted": "the previous reply came back with the same meaning, written otherwise",
    "rerendered": "the same messages were rendered or tokenized into other ids",
}
# How a field of the echoed reply differs from the model's: `edited` changes what it says;
# `whitespace`, `key order` and `spacing` only how it is written (which still changes the ids a
# template renders); `dropped` leaves it out; `added` puts in what the model did not say.
Cause = Literal["edited", "whitespace", "key order", "spacing", "dropped", "added"]
# Token ids around a break that a record keeps of each side, for showing them side by side.
WINDOW_IDS = 12
# A message's identity for aligning two conversations: 128 bits of BLAKE2b over its JSON.
DIGEST_BYTES = 16
# Where the reasoning of a reply sits in an OpenAI chat message (vLLM and SGLang's parsers; newer
# vLLM spells it `reasoning`: dialects/openai_chat.py TEXT_FIELDS).
_REASONING_FIELDS = ("reasoning_content", "reasoning")


@dataclass(frozen=True, slots=True)
class ContinuedTurn:
    """What classifying a break needs of the turn continued: its history's message digests (as
    `message_digests` makes them), its tools' digest, and its reply as a chat message."""

    digests: bytes
    tools: bytes
    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class IdWindow:
    """The ids around a break on one side (`start` is the first one's position), and their text when
    the served tokenizer decoded them."""

    start: int
    ids: list[int]
    text: list[str] | None = None

    @classmethod
    def from_json(cls, value: Any) -> IdWindow:
        value = value if isinstance(value, dict) else {}
        ids = [i for i in value.get("ids") or [] if isinstance(i, int)]
        text = value.get("text")
        return cls(as_int(value.get("start")) or 0, ids, text if isinstance(text, list) else None)


@dataclass(frozen=True, slots=True)
class EchoChange:
    """One field of an echoed reply that differs from the model's: the `field` (`content`,
    `reasoning`, `tool_calls`, `tool_calls[1].arguments`, ...), the `cause`, and both texts as sent."""

    field: str
    cause: Cause
    model: str | None
    echoed: str | None

    @classmethod
    def from_json(cls, value: Any) -> EchoChange | None:
        if not isinstance(value, dict) or not isinstance(value.get("field"), str):
            return None
        cause = value.get("cause")
        causes = ("edited", "whitespace", "key order", "spacing", "dropped", "added")
        return cls(
            value["field"],
            cause if cause in causes else "edited",
            as_str(value.get("model")),
            as_str(value.get("echoed")),
        )


@dataclass(frozen=True, slots=True)
class TokenDrift:
    """The first break in a session's token history, as the record keeps it: the turn (and exchange)
    whose prompt broke, the turn it continues, the first differing id `position`, the lengths on both
    sides, the break's `kind`, the message it falls in (index and role), one line of `text`, the ids'
    `source`, the ids around it on both sides, and, for an echoed reply, each field that differs
    (`changes`: which field, why, both texts)."""

    turn: int | None
    exchange_id: str | None
    continues_turn: int | None
    continues: str | None
    position: int
    expected_length: int | None
    prompt_length: int | None
    previous_prompt_length: int | None
    kind: str
    message: int | None
    role: str | None
    text: str
    source: str | None
    expected: IdWindow
    got: IdWindow
    changes: tuple[EchoChange, ...] = ()

    @classmethod
    def from_json(cls, value: Any) -> TokenDrift | None:
        """A break as a store holds it (its JSON object), or None; members of the wrong type are taken
        as absent (a store written by another release)."""
        if not isinstance(value, dict):
            return None
        return cls(
            turn=as_int(value.get("turn")),
            exchange_id=as_str(value.get("exchange_id")),
            continues_turn=as_int(value.get("continues_turn")),
            continues=as_str(value.get("continues")),
            position=as_int(value.get("position")) or 0,
            expected_length=as_int(value.get("expected_length")),
            prompt_length=as_int(value.get("prompt_length")),
            previous_prompt_length=as_int(value.get("previous_prompt_length")),
            kind=as_str(value.get("kind")) or "rerendered",
            message=as_int(value.get("message")),
            role=as_str(value.get("role")),
            text=as_str(value.get("text")) or "",
            source=as_str(value.get("source")),
            expected=IdWindow.from_json(value.get("expected")),
            got=IdWindow.from_json(value.get("got")),
            changes=tuple(c for c in map(EchoChange.from_json, value.get("changes") or []) if c is not None),
        )


def break_position(
    expected: Sequence[int],
    prompt: Sequence[int],
    shared: int,
    *,
    completion_length: int,
    turn_ends: frozenset[int] = frozenset(),
) -> int | None:
    """Where `prompt` stops following the previous turn's prompt + completion (`expected`), given the
    ids they `shared` (`common_prefix`), or None when it follows it whole. One difference is allowed:
    a completion that ended on one of the ids that end a turn (`turn_ends`: the tokenizer's
    end-of-turn and stop ids) may see that id rendered as another of them in the next prompt (Qwen
    stopping on `<|endoftext|>` where its template writes `<|im_end|>`). Any other id there is a break:
    a reply echoed with one character more is not the reply the model gave."""
    if shared == len(expected):
        return None
    last = len(expected) - 1
    if (
        shared == last
        and completion_length > 0
        and len(prompt) > last
        and expected[last] in turn_ends
        and prompt[last] in turn_ends
    ):
        return None
    return shared


@dataclass(frozen=True, slots=True)
class Break:
    """Why a prompt broke: its kind, the message it falls in (index in the request's history, and
    role; None when the messages agree), and for an echoed reply each field that differs."""

    kind: BreakKind
    message: int | None = None
    role: str | None = None
    changes: tuple[EchoChange, ...] = ()


def classify(
    previous: ContinuedTurn,
    history: Sequence[Any],
    digests: bytes,
    tools: bytes,
    position: int,
    previous_prompt_length: int,
) -> Break:
    """Why the prompt broke at token `position` between `previous` (the turn continued, whose prompt
    held `previous_prompt_length` ids) and the current turn, whose request holds `history` (chat
    messages, with their `digests`) and `tools`."""
    if tools != previous.tools:
        return Break("tools_changed")
    before, now = _split(previous.digests), _split(digests)
    index = _common(before, now)
    if index < len(before):
        removed = index >= len(now) or (index + 1 < len(before) and now[index] == before[index + 1])
        if index >= len(history):
            return Break("message_removed")
        return Break("message_removed" if removed else "message_edited", index, _role(history[index]))
    echo = history[index] if index < len(history) else None
    if echo is None or not isinstance(echo, dict) or echo.get("role") != "assistant":
        return Break("reply_missing", index if echo is not None else None, _role(echo))
    changes = echo_changes(previous.reply, echo)
    if not changes:
        # The reply came back as the model said it, and still rendered into other ids: the template
        # or the tokenizer made them. A template that drops old reasoning (Qwen3's, for replies
        # before the last user message) parts from the model's ids at the reply's first id, where
        # the model opened `<think>`; anywhere else the template wrote the reply otherwise (a tool
        # call's JSON spaced its own way, a merge across the turn end).
        if position < previous_prompt_length:
            return Break("rerendered")
        if position == previous_prompt_length and _reasoning(previous.reply):
            return Break("reasoning_dropped", index, "assistant")
        return Break("rerendered", index, "assistant")
    return Break(_kind(changes), index, "assistant", tuple(changes))


def echo_changes(reply: dict[str, Any], echo: dict[str, Any]) -> list[EchoChange]:
    """Each field in which `echo` (the agent's copy of a reply) differs from `reply` (the model's), with
    its cause and both texts: the content, the reasoning, and each tool call's name and arguments."""
    changes = []
    said, echoed = _text(reply), _text(echo)
    if said != echoed:
        cause: Cause = "whitespace" if said.split() == echoed.split() else "edited"
        changes.append(EchoChange("content", cause, said, echoed))
    thought, echoed_thought = _reasoning(reply), _reasoning(echo)
    if thought and not echoed_thought:
        changes.append(EchoChange("reasoning", "dropped", thought, None))
    elif thought != echoed_thought:
        cause = (
            "added"
            if not thought
            else "whitespace"
            if thought.split() == echoed_thought.split()
            else "edited"
        )
        changes.append(EchoChange("reasoning", cause, thought or None, echoed_thought))
    calls, echoed_calls = _raw_calls(reply), _raw_calls(echo)
    if [name for name, _ in calls] != [name for name, _ in echoed_calls]:
        changes.append(EchoChange("tool_calls", "edited", _names(calls), _names(echoed_calls)))
        return changes
    for number, ((_, arguments), (_, echoed_arguments)) in enumerate(zip(calls, echoed_calls, strict=True)):
        if arguments != echoed_arguments:
            changes.append(
                EchoChange(
                    f"tool_calls[{number}].arguments",
                    _arguments_cause(arguments, echoed_arguments),
                    arguments,
                    echoed_arguments,
                )
            )
    return changes


def _kind(changes: Sequence[EchoChange]) -> BreakKind:
    """The break's kind from the echo's changes, the one a trainer cares about most first: what the
    reply says, then what it leaves out, then how it is written."""
    edited = [c for c in changes if c.cause == "edited"]
    if any(c.field.startswith("tool_calls") for c in edited):
        return "tool_call_arguments_changed"
    if edited:
        return "assistant_text_changed"
    if any(c.cause == "dropped" for c in changes):
        return "reasoning_dropped"
    return "reply_reformatted"


def _arguments_cause(model: str | None, echoed: str | None) -> Cause:
    parsed, echoed_parsed = _parsed(model), _parsed(echoed)
    if parsed != echoed_parsed or not isinstance(parsed, dict | list):
        return "edited"
    if isinstance(parsed, dict) and isinstance(echoed_parsed, dict) and list(parsed) != list(echoed_parsed):
        return "key order"
    return "spacing"


def _raw_calls(message: dict[str, Any]) -> list[tuple[Any, str | None]]:
    """(name, arguments as the JSON text sent) of each tool call."""
    out = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            out.append((function.get("name"), arguments))
    return out


def _names(calls: Sequence[tuple[Any, Any]]) -> str:
    return ", ".join(str(name) for name, _ in calls)


def describe(found: Break) -> str:
    """One line for a break: what changed, in which message, and each field of an echoed reply that
    differs with its cause."""
    where = (
        f" (message {found.message + 1}, {found.role})" if found.message is not None and found.role else ""
    )
    fields = "; ".join(f"{change.field}: {change.cause}" for change in found.changes)
    if found.kind == "reasoning_dropped" and not found.changes:
        fields = "by the chat template"
    return BREAK_TEXT[found.kind] + where + (f": {fields}" if fields else "")


def message_digests(messages: Sequence[Any]) -> bytes:
    """Each message's digest, concatenated, ignoring members that are null or empty (a reply says
    `"refusal": null`, `"tool_calls": []` where the agent echoing it says nothing)."""
    return b"".join(digest(_trimmed(message)) for message in messages)


def digest(value: Any) -> bytes:
    """The DIGEST_BYTES-byte BLAKE2b of `value`'s compact JSON (keys in their order)."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


def shared_messages(a: bytes, b: bytes) -> int:
    """How many leading messages two `message_digests` share."""
    return _common(_split(a), _split(b))


def window(ids: Sequence[int], position: int) -> tuple[int, list[int]]:
    """(start, ids) of the WINDOW_IDS ids either side of `position`."""
    start = max(position - WINDOW_IDS, 0)
    return start, list(ids[start : position + WINDOW_IDS])


def _split(digests: bytes) -> list[bytes]:
    return [digests[i : i + DIGEST_BYTES] for i in range(0, len(digests), DIGEST_BYTES)]


def _common(a: list[bytes], b: list[bytes]) -> int:
    count = 0
    while count < min(len(a), len(b)) and a[count] == b[count]:
        count += 1
    return count


def _role(message: Any) -> str | None:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else None


def _parsed(arguments: Any) -> Any:
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _reasoning(message: dict[str, Any]) -> str:
    return next((str(message[key]) for key in _REASONING_FIELDS if message.get(key)), "")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return content if isinstance(content, str) else ""


def _trimmed(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    return {k: v for k, v in message.items() if v is not None and v != "" and v != []}
