"""Token continuity: whether a turn's prompt ids extend the previous turn's prompt and completion, and
when they do not, where and why the history broke.

Owns: the rule (turn t+1's prompt must begin with turn t's prompt ids followed by its completion ids,
allowing the one end-of-turn token a template renders differently from the stop token the model
sampled: docs/engines.md §4), the first differing position, which message of the conversation the
break falls in, and its classification; also the fast common-prefix length of two id sequences.
Does not own: which earlier turn a turn continues (records/token_store.py picks it by messages),
storing ids or breaks (token_store.py), or showing them (modeltap/readers: show, the viewer).

Messages are compared as OpenAI chat messages (each dialect's `conversation`), so a break is
classified the same way whatever the wire format. Pure functions, no I/O.

    expected = previous_prompt + previous_completion
    position = break_position(common_prefix(expected, prompt), len(expected), len(prompt),
                              finish_reason="stop", completion_length=len(previous_completion))
    if position is not None:
        kind, message, role = classify(previous, history, digests, tools, position, len(previous_prompt))
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
    "rerendered": "the same messages were rendered or tokenized into other ids",
}
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
class TokenDrift:
    """The first break in a session's token history, as the record keeps it: the turn (and exchange)
    whose prompt broke, the turn it continues, the first differing id `position`, the lengths on both
    sides, the break's `kind`, the message it falls in (index and role), one line of `text`, the ids'
    `source`, and the ids around it on both sides."""

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
        )


def break_position(
    shared: int,
    expected_length: int,
    prompt_length: int,
    *,
    finish_reason: str | None,
    completion_length: int,
) -> int | None:
    """Where a prompt stops following the previous turn's prompt + completion (`expected_length` ids),
    given the ids they `shared` (`common_prefix`), or None when it follows it whole. A completion that
    stopped on its own ("stop") may see its last id rendered as another end-of-turn token in the next
    prompt (Qwen stopping on `<|endoftext|>` where its template writes `<|im_end|>`): that one
    difference is allowed."""
    if shared == expected_length:
        return None
    last = expected_length - 1
    if shared == last and completion_length > 0 and finish_reason == "stop" and prompt_length > last:
        return None
    return shared


def classify(
    previous: ContinuedTurn,
    history: Sequence[Any],
    digests: bytes,
    tools: bytes,
    position: int,
    previous_prompt_length: int,
) -> tuple[BreakKind, int | None, str | None]:
    """(kind, index of the message the break falls in, its role) for a break at token `position`
    between `previous` (the turn continued, whose prompt held `previous_prompt_length` ids) and the
    current turn, whose request holds `history` (chat messages, with their `digests`) and `tools`. The
    index counts `history`; None when the messages agree and ids differ before the reply."""
    if tools != previous.tools:
        return "tools_changed", None, None
    before, now = _split(previous.digests), _split(digests)
    index = _common(before, now)
    if index < len(before):
        removed = index >= len(now) or (index + 1 < len(before) and now[index] == before[index + 1])
        if index >= len(history):
            return "message_removed", None, None
        return ("message_removed" if removed else "message_edited"), index, _role(history[index])
    echo = history[index] if index < len(history) else None
    kind = _reply_change(previous.reply, echo)
    if kind is None:
        in_reply = position >= previous_prompt_length
        kind = "reasoning_dropped" if in_reply and _reasoning(previous.reply) else "rerendered"
        if not in_reply:
            return kind, None, None
    return kind, (index if echo is not None else None), (_role(echo) if echo is not None else None)


def describe(kind: BreakKind, message: int | None, role: str | None) -> str:
    """One line for a break: what changed, and in which message."""
    where = f" (message {message + 1}, {role})" if message is not None and role else ""
    return BREAK_TEXT[kind] + where


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


def _reply_change(reply: dict[str, Any], echo: dict[str, Any] | None) -> BreakKind | None:
    """How the echoed message differs from the reply it echoes, in the order a trainer cares about."""
    if echo is None or echo.get("role") != "assistant":
        return "reply_missing"
    if _calls(echo) != _calls(reply):
        return "tool_call_arguments_changed"
    if _reasoning(reply) and _reasoning(reply) != _reasoning(echo):
        return "reasoning_dropped"
    if _text(echo) != _text(reply):
        return "assistant_text_changed"
    return None


def _calls(message: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(name, arguments) of each tool call, arguments parsed where they are JSON: agents re-serialise
    the arguments they echo (other spacing, other key order), and servers render them parsed."""
    calls = message.get("tool_calls")
    out = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            out.append((function.get("name"), _parsed(function.get("arguments"))))
    return out


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
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _trimmed(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    return {k: v for k, v in message.items() if v is not None and v != "" and v != []}
