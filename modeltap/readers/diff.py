"""Where two rollouts part ways: two sessions aligned turn by turn (`modeltap diff A B`).

Owns: deciding whether a turn's model traffic is the same in both sessions (its request, and its
response as the model gave it: status, error class, finish reason, reply, tool calls), the first
turn where it is not, and that turn shown side by side (new messages, tool calls, replies), with a
unified diff of its text and a structural diff of its tool calls. The ids that servers and clients
mint (`id` and `*_id` keys: tool call ids, message ids) differ in every run, so each session's are
renamed in order of appearance before comparing: two runs that differ only in those are the same.
Does not own: turns (records/turns.py), reading (records/reader.py), the rollout lines of the header
(sessions.py).

    with Stores.open(["records.db"]) as stores:
        result = compare(side(stores, "s-3f2a"), side(stores, "s-9c1e"))
    print(diff_text(result)); exit(1 if result["differs"] else 0)
"""

from __future__ import annotations

import difflib
import json
import shutil
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from modeltap.readers.sessions import rollout_lines
from modeltap.readers.text import short
from modeltap.records.message_text import call_text, describe_message
from modeltap.records.stores import Stores
from modeltap.records.turns import Turn, turns

# The side-by-side view splits the terminal in two; a narrower one still gets readable columns.
MIN_COLUMN_CHARS = 40
# Where the terminal's width is unknown (a pipe): two columns of 78.
DEFAULT_WIDTH_CHARS = 160
# Lines of context around each change in the unified diff of the turn's text.
CONTEXT_LINES = 2
# Tool call arguments nested deeper than this are compared and shown as their text: a degenerate
# policy at its token limit writes arguments of nothing but brackets, and showing a structural diff a
# thousand levels down would recurse as deep (printing JSON does) for no reader's benefit.
ARGUMENTS_DEPTH_MAX = 64
# How much of a changed value a tool call's change quotes.
VALUE_CHARS = 60


@dataclass(frozen=True, slots=True)
class Side:
    """One session to compare: its row, its store's name, and its turns with their bodies."""

    session: dict[str, Any]
    store: str
    turns: list[Turn]


def side(stores: Stores, prefix: str) -> Side:
    """The session `prefix` names, read with its turns."""
    reader, session_id = stores.resolve(prefix)
    row = reader.session(session_id) or {"id": session_id, "labels": {}, "reward": None, "outcome": None}
    return Side(row, str(reader.path), turns(reader.exchanges(session_id), full=True))


def compare(a: Side, b: Side) -> dict[str, Any]:
    """The comparison as JSON-ready data: each side's header, whether they differ, and the first
    turn that does (`in`: "request", "response" or "length", when one session ends first)."""
    canon_a, canon_b = _Canon(), _Canon()
    first: dict[str, Any] | None = None
    for number in range(1, max(len(a.turns), len(b.turns)) + 1):
        ta = a.turns[number - 1] if number <= len(a.turns) else None
        tb = b.turns[number - 1] if number <= len(b.turns) else None
        if ta is None or tb is None:
            where = "length"
        elif canon_a(ta.request) != canon_b(tb.request):
            where = "request"
        elif canon_a(_response(ta)) != canon_b(_response(tb)):
            where = "response"
        else:
            continue
        names = (f"A {a.session['id']} turn {number}", f"B {b.session['id']} turn {number}")
        first = _difference(number, where, ta, tb, names)
        break
    return {"a": _header(a), "b": _header(b), "differs": first is not None, "first_difference": first}


def diff_text(result: dict[str, Any], width: int | None = None) -> str:
    """The comparison for a terminal: both headers, the verdict, then the differing turn side by side,
    its tool calls' differences and the unified diff of its text."""
    lines = [*_header_lines("A", result["a"]), *_header_lines("B", result["b"])]
    first = result["first_difference"]
    if first is None:
        lines.append(f"same model traffic in all {result['a']['turns']} turn(s)")
        return "\n".join(lines)
    number = first["turn"]
    same = {1: "", 2: "same model traffic in turn 1; "}.get(
        number, f"same model traffic in turns 1-{number - 1}; "
    )
    lines.append(f"{same}turn {number} differs in its {first['in']}")
    total = width or shutil.get_terminal_size((DEFAULT_WIDTH_CHARS, 24)).columns
    column = max((total - 3) // 2, MIN_COLUMN_CHARS)
    lines.append(f"── turn {number} " + "─" * max(2 * column - 6, 0))
    left, right = _turn_lines(first["a"], column), _turn_lines(first["b"], column)
    lines.append(f"{'A ' + result['a']['session']:<{column}} │ B {result['b']['session']}")
    for n in range(max(len(left), len(right))):
        cell = left[n] if n < len(left) else ""
        lines.append(f"{cell:<{column}} │ {right[n] if n < len(right) else ''}".rstrip())
    if first["tool_call_diff"]:
        lines.append("── tool calls")
        lines += [f"  {_change_text(change)}" for change in first["tool_call_diff"]]
    if first["text_diff"]:
        lines.append("── text")
        lines += first["text_diff"]
    return "\n".join(lines)


class _Canon:
    """One session's values made comparable: flattened, depth first, into a tuple of tokens (so two
    bodies nested as deep as JSON parses compare without recursing), dict keys in sorted order, and
    ids renamed in order of first appearance: `#1`, `#2`, … A minted id is the string value of an `id`
    key or of a key ending in `_id`."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def __call__(self, value: Any) -> tuple[Any, ...]:
        out: list[Any] = []
        stack: list[tuple[str | None, Any]] = [(None, value)]
        while stack:
            key, item = stack.pop()
            if key is not None:
                out.append(("key", key))
                if _is_id(key, item):
                    out.append(("id", self._id(item)))
                    continue
            if isinstance(item, dict):
                out.append(("dict", len(item)))
                stack.extend(sorted(item.items(), key=lambda pair: str(pair[0]), reverse=True))
            elif isinstance(item, list):
                out.append(("list", len(item)))
                stack.extend((None, element) for element in reversed(item))
            else:
                out.append(("value", type(item).__name__, item))
        return tuple(out)

    def _id(self, minted: str) -> str:
        return self._names.setdefault(minted, f"#{len(self._names) + 1}")


def _is_id(key: str, value: Any) -> bool:
    return isinstance(value, str) and (key == "id" or key.endswith("_id"))


def _response(turn: Turn) -> dict[str, Any]:
    """What the model answered, without what differs in every run (times, usage, response ids)."""
    return {
        "status": turn.status,
        "error": turn.error.error_class if turn.error else None,
        "finish_reason": turn.finish_reason,
        "reply": turn.reply,
        "tool_calls": [{**call, "arguments": _arguments(call["arguments"])} for call in turn.tool_calls],
    }


def _arguments(text: Any) -> Any:
    """Tool call arguments parsed when they are JSON (so key order and spacing do not count) nested at
    most ARGUMENTS_DEPTH_MAX deep; else their text, compared and shown as it is."""
    if not isinstance(text, str):
        return text
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return text
    return parsed if _depth(parsed) <= ARGUMENTS_DEPTH_MAX else text


def _depth(value: Any) -> int:
    """How deep lists and objects nest in `value` (0 for a scalar), counted without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _difference(
    number: int, where: str, a: Turn | None, b: Turn | None, names: tuple[str, str]
) -> dict[str, Any]:
    sa, sb = _side_turn(a), _side_turn(b)
    return {
        "turn": number,
        "in": where,
        "a": sa,
        "b": sb,
        "tool_call_diff": list(_tool_call_changes(sa["tool_calls"], sb["tool_calls"])),
        "text_diff": list(
            difflib.unified_diff(_text_lines(sa), _text_lines(sb), *names, n=CONTEXT_LINES, lineterm="")
        ),
    }


def _side_turn(turn: Turn | None) -> dict[str, Any]:
    """What one side of the differing turn shows: its new messages, tool calls and reply."""
    if turn is None:
        return {"turn": None, "endpoint": None, "new_messages": [], "tool_calls": [], "reply": None,
                "finish_reason": None, "status": None, "error": None}  # fmt: skip
    messages = [dict(zip(("role", "text"), describe_message(m), strict=True)) for m in turn.new_messages]
    calls = [{"name": c["name"], "arguments": _arguments(c["arguments"])} for c in turn.tool_calls]
    return {
        "turn": turn.number,
        "endpoint": turn.endpoint or turn.path,
        "new_messages": messages,
        "tool_calls": calls,
        "reply": turn.reply,
        "finish_reason": turn.finish_reason,
        "status": turn.status,
        "error": turn.error.as_json() if turn.error else None,
    }


def _text_lines(turn: dict[str, Any]) -> list[str]:
    lines = [f"{m['role']}: {line}" for m in turn["new_messages"] for line in m["text"].splitlines() or [""]]
    lines += [f"tool call: {call_text(c)}" for c in turn["tool_calls"]]
    lines += [f"reply: {line}" for line in (turn["reply"] or "").splitlines()]
    return lines


def _tool_call_changes(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The tool calls' differences, call by call in order: a call only one side made, a changed
    name, and each argument path whose value differs or that only one side has."""
    for index in range(max(len(a), len(b))):
        ca = a[index] if index < len(a) else None
        cb = b[index] if index < len(b) else None
        if ca is None or cb is None:
            yield {"call": index + 1, "path": None, "a": ca, "b": cb}
            continue
        if ca["name"] != cb["name"]:
            yield {"call": index + 1, "path": "name", "a": ca["name"], "b": cb["name"]}
        for path, va, vb in _json_changes(ca["arguments"], cb["arguments"], "arguments"):
            yield {"call": index + 1, "path": path, "a": va, "b": vb}


_MISSING: Any = object()


def _json_changes(a: Any, b: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, a's value, b's value) for each place two JSON values differ, in document order;
    `_MISSING` is reported as None with a path that only one side has."""
    stack = [(a, b, path)]
    while stack:
        va, vb, where = stack.pop()
        if isinstance(va, dict) and isinstance(vb, dict):
            keys = [*va, *(k for k in vb if k not in va)]
            stack.extend((va.get(k, _MISSING), vb.get(k, _MISSING), f"{where}.{k}") for k in reversed(keys))
        elif isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb):
            pairs = list(enumerate(zip(va, vb, strict=True)))
            stack.extend((xa, xb, f"{where}[{i}]") for i, (xa, xb) in reversed(pairs))
        elif va != vb:
            yield where, None if va is _MISSING else va, None if vb is _MISSING else vb


def _change_text(change: dict[str, Any]) -> str:
    if change["path"] is None:
        only, call = ("A", change["a"]) if change["a"] is not None else ("B", change["b"])
        return f"#{change['call']} only in {only}: {call_text(call)}"
    return f"#{change['call']} {change['path']}: {_value(change['a'])} → {_value(change['b'])}"


def _value(value: Any) -> str:
    return "(none)" if value is None else short(json.dumps(value, ensure_ascii=False), VALUE_CHARS)


def _header(s: Side) -> dict[str, Any]:
    row = s.session
    return {
        "session": row["id"],
        "store": s.store,
        "turns": len(s.turns),
        "reward": row.get("reward"),
        "outcome": row.get("outcome"),
        "rollout": row.get("rollout"),
        "labels": row.get("labels", {}),
    }


def _header_lines(name: str, header: dict[str, Any]) -> list[str]:
    labels = " ".join(f"{k}={v}" for k, v in header["labels"].items())
    head = f"{name}  {header['session']}  {header['turns']} turn(s)  {labels}".rstrip()
    return [head, *(f"   {line}" for line in rollout_lines(header))]


def _turn_lines(turn: dict[str, Any], width: int) -> list[str]:
    """One side of the differing turn, wrapped to its column."""
    if turn["turn"] is None:
        return ["(no such turn: the session ended)"]
    lines = [f"{turn['endpoint']}  status {turn['status'] or '-'}  finish {turn['finish_reason'] or '-'}"]
    for message in turn["new_messages"]:
        lines += _wrap(f"+ {message['role']}: ", message["text"], width)
    for call in turn["tool_calls"]:
        lines += _wrap("← tool call ", call_text(call), width)
    if turn["reply"]:
        lines += _wrap("← reply ", turn["reply"], width)
    if turn["error"]:
        lines += _wrap("! ", f"{turn['error']['class']}: {turn['error']['message'] or ''}", width)
    return lines


def _wrap(prefix: str, text: str, width: int) -> list[str]:
    wrapped = textwrap.wrap(
        " ".join(text.split()), width, initial_indent=prefix, subsequent_indent="    ", max_lines=12
    )
    return wrapped or [prefix]
