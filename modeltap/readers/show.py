"""`modeltap show`: a recorded session for a person, turn by turn, and one turn in full.

Owns: the text of a session's turns (one line per message, a system prompt or tools list shown once
then named), of one turn in full with its bodies, and of one turn on one line (`tail_line`, which
`tail` and serve's line per exchange print). Does not own: building turns from the store
(records/turns.py), reading the store (records/reader.py), listings of sessions (sessions.py), or
paging and colour (terminal.py).

    with StoreReader(path) as reader:
        print(session_turns("s-3f2a", reader.exchanges("s-3f2a"), reader.session("s-3f2a")))
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from modeltap.readers.sessions import rollout_lines
from modeltap.readers.text import num as _num
from modeltap.readers.text import printable
from modeltap.readers.text import short as _short
from modeltap.readers.text import when as _when
from modeltap.records.continuity import IdWindow
from modeltap.records.exchange import BudgetRecord
from modeltap.records.jsontext import pretty
from modeltap.records.message_text import call_text, describe_message, tool_names
from modeltap.records.turns import Turn, TurnTokenIds, turns

# One message or reply per line in the session view; the full text is one `show SESSION TURN` away.
LINE_CHARS = 110
_ROLE_WIDTH = 10
# A tools list an earlier turn showed is named by its first few tools.
TOOLS_NAMED = 3
# The roles a system prompt comes in (OpenAI's newer models call it developer).
SYSTEM_ROLES = ("system", "developer")


def session_turns(
    session_id: str,
    exchanges: Sequence[dict[str, Any]],
    session: dict[str, Any] | None = None,
    *,
    tokens: Sequence[dict[str, Any]] = (),
) -> str:
    """A session turn by turn, each with what it added, one line per message (`modeltap show S`);
    with its row (`StoreReader.session`), a rollout's reward and outcome come first."""
    listed = turns(exchanges, tokens=tokens)
    labels = listed[0].labels if listed else {}
    title = f"session {session_id}: {len(listed)} turn(s)"
    if labels:
        title += "  " + " ".join(f"{k}={v}" for k, v in labels.items())
    head = [title, *(rollout_lines(session) if session is not None else [])]
    seen = _Seen()
    lines = [
        line
        for turn, ex in zip(listed, exchanges, strict=True)
        for line in _turn_lines(turn, LINE_CHARS, tools=ex.get("request"), seen=seen)
    ]
    return "\n".join([*head, *lines])


class _Seen:
    """What a session view already showed in full: system prompts and tools lists, each with the turn
    that first showed it, so a long session repeats neither."""

    def __init__(self) -> None:
        self.systems: dict[str, int] = {}
        self.tools: dict[str, int] = {}

    def system(self, text: str, turn: int) -> int | None:
        """The turn that showed this system prompt before, else None (and remember this one)."""
        earlier = self.systems.get(text)
        self.systems.setdefault(text, turn)
        return earlier

    def tools_list(self, tools: list[Any], turn: int) -> int | None:
        """The turn that showed these tools before, else None (and remember this one)."""
        key = json.dumps(tools, sort_keys=True, ensure_ascii=False)
        earlier = self.tools.get(key)
        self.tools.setdefault(key, turn)
        return earlier


def _tools_lines(request: Any, turn: int, indent: str, width: int | None, seen: _Seen | None) -> list[str]:
    """The tools a request offers, by name; in a session view, once, then `as in turn N`."""
    tools = request.get("tools") if isinstance(request, dict) else None
    names = tool_names(tools)
    if not names:
        return []
    offered = f"{indent}tools: {len(names)} offered"
    earlier = seen.tools_list(tools, turn) if seen is not None and isinstance(tools, list) else None
    if earlier is not None:
        shown = ", ".join(names[:TOOLS_NAMED]) + (", …" if len(names) > TOOLS_NAMED else "")
        return [f"{offered} ({shown}), as in turn {earlier}"]
    return list(_wrapped(offered + " ", "(" + ", ".join(names) + ")", width))


def _chars(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


def turn_text(turn: Turn, request: Any = None) -> str:
    """One turn in full (`modeltap show S TURN`); with its bodies when the turn carries them. The tools
    its `request` (or its own `request`) offers are named."""
    lines = _turn_lines(turn, None, tools=request if request is not None else turn.request)
    if turn.bodies is not None:
        bodies = turn.bodies
        shown = (
            ("request headers", _headers_text(bodies.request_headers)),
            ("request", bodies.request),
            (f"sent upstream ({turn.sent_because})" if turn.sent_because else "sent upstream", bodies.sent),
            ("response headers", _headers_text(bodies.response_headers)),
            ("response", bodies.response),
        )
        lines += [
            line
            for title, body in shown
            if body is not None
            for line in (f"── {title}", body if isinstance(body, str) else pretty(body))
        ]
    return "\n".join(lines)


def _headers_text(headers: Sequence[tuple[str, str]]) -> str | None:
    """Headers as `Name: value` lines (credentials were redacted when recorded), control characters
    escaped; None when none were recorded (a record from before modeltap kept them)."""
    if not headers:
        return None
    return "\n".join(printable(f"{name}: {value}", lines=False) for name, value in headers)


def tail_line(turn: Turn) -> str:
    """One exchange on one line, as `modeltap tail` and serve's line per exchange print it, its
    control characters escaped (text.printable)."""
    number = f"#{turn.number}" if turn.number is not None else ""
    line = f"{_when(turn.started)}  {turn.session_id or '-'} {number}  " + _headline(turn)
    return printable(line, lines=False)


def _turn_lines(turn: Turn, width: int | None, *, tools: Any = None, seen: _Seen | None = None) -> list[str]:
    """A turn's lines: one per message cut to `width`, or in full (None). `tools` is its request (for
    the tools it offers); with `seen`, a system prompt or tools list an earlier turn of the session
    showed collapses to one line naming that turn."""
    number = turn.number or 0  # a session's turns are numbered; only serve's line may not know its number
    lines = [f"#{turn.number}  {_when(turn.started)}  {_headline(turn)}"]
    indent = "    "
    if width is None:
        client = f"  client {turn.user_agent}" if turn.user_agent else ""
        retry = f"  SDK retry {turn.retry_count}" if turn.retry_count else ""
        lines.append(f"{indent}{turn.method} {turn.path}  model {turn.model or '-'}{client}{retry}")
    if turn.continues is not None and turn.continues != number - 1:
        lines.append(f"{indent}(continues #{turn.continues})")
    lines += _tools_lines(tools, number, indent, width, seen)
    if turn.translated:
        lines += _translation_lines(turn, indent)
    elif turn.synthesised:
        lines.append(f"{indent}the upstream answered JSON; modeltap wrote the {turn.endpoint} stream from it")
    for message in turn.new_messages:
        role, text = describe_message(message)
        earlier = seen.system(text, number) if seen is not None and role in SYSTEM_ROLES else None
        if earlier is not None:
            said = f"system prompt, {_chars(len(text))} chars, as in turn {earlier}"
            lines.append(f"{indent}+ {role:<{_ROLE_WIDTH}} {said}")
            continue
        lines += _wrapped(f"{indent}+ {role:<{_ROLE_WIDTH}} ", text, width)
    for call in turn.tool_calls:
        lines += _wrapped(f"{indent}← {'tool call':<{_ROLE_WIDTH}} ", call_text(call), width)
    if turn.reply:
        lines += _wrapped(f"{indent}← {'reply':<{_ROLE_WIDTH}} ", turn.reply, width)
    if turn.tool_call_parse_failure:
        lines.append(f"{indent}! finish_reason says tool call but none parsed (the model's tool-call output)")
    if turn.budget is not None and (turn.budget.action != "pass" or width is None):
        lines.append(f"{indent}budget {_budget_text(turn.budget)}")
    if turn.error:
        lines += _wrapped(
            f"{indent}! {turn.error.error_class:<{_ROLE_WIDTH}} ", turn.error.message or "", width
        )
    return lines + _token_lines(turn, indent, width)


def _token_lines(turn: Turn, indent: str, width: int | None) -> list[str]:
    """The break in the turn's token history, and in full its ids' summary and the two sides."""
    ids, drift = turn.token_ids, turn.token_drift
    lines: list[str] = []
    if drift:
        where = f"at id {drift.position} of the prompt continuing #{drift.continues_turn}"
        lines += _wrapped(f"{indent}! {'token drift':<{_ROLE_WIDTH}} ", f"{where}: {drift.text}", width)
    if width is None and ids:
        lines.append(f"{indent}token ids {_ids_text(ids)}")
    if width is None and drift:
        for side, title in ((drift.expected, "expected"), (drift.got, "got")):
            lines.append(f"{indent}  {title:<9}{_window_text(side, drift.position)}")
    return lines


def _ids_text(ids: TurnTokenIds) -> str:
    if ids.source is None:
        return (
            "none: they could not be rendered"
            if ids.ask == "rendered"
            else f"none came back (asked {ids.ask})"
        )
    text = f"{ids.source}: prompt {ids.prompt_length}, completion {ids.completion_length}"
    if ids.continues is not None:
        text += f", continues #{ids.continues} sharing {ids.shared}"
    return text


def _window_text(side: IdWindow, position: int) -> str:
    """The ids around a break, decoded when the record has their text, the first differing one marked."""
    pieces = side.text or [str(token) for token in side.ids]
    shown = [json.dumps(piece, ensure_ascii=False) if side.text else piece for piece in pieces]
    mark = position - side.start
    if 0 <= mark < len(shown):
        shown[mark] = f"[{shown[mark]}]"
    return " ".join(shown)


def _translation_lines(turn: Turn, indent: str) -> list[str]:
    """How a translated turn went: the format it went upstream as, and what the upstream said in it."""
    how = "streamed" if turn.streamed and not turn.synthesised else "whole"
    lines = [f"{indent}translated: sent upstream as {turn.translated}, answered {how} as {turn.endpoint}"]
    reply = turn.upstream_reply
    if reply is not None:
        said = ", ".join(call_text(call) for call in reply.tool_calls) or repr(_short(reply.reply or ""))
        lines.append(f"{indent}upstream {turn.translated} reply: {reply.finish_reason or '-'}  {said}")
    return lines


def _headline(turn: Turn) -> str:
    """Endpoint, status, timing, tokens and finish reason of a turn; its tool calls or error on tail."""
    timing = _duration(turn.latency_ms)
    if turn.streamed:
        timing += f" (first byte {_duration(turn.ttfb_ms)})"
    via = f" via {turn.translated}" if turn.translated else ""
    parts = [
        (turn.endpoint or turn.path) + via + (" (stream)" if turn.streamed else ""),
        str(turn.status or "-"),
        timing,
    ]
    if turn.prompt_tokens is not None or turn.completion_tokens is not None:
        parts.append(f"tokens {_num(turn.prompt_tokens)}→{_num(turn.completion_tokens)}")
    if turn.finish_reason:
        parts.append(turn.finish_reason)
    budget = turn.budget
    if budget is not None and budget.action in ("clamp", "reject") and budget.summary:
        parts.append(f"budget {budget.summary}")
    said = ", ".join(_short(call_text(call), 60) for call in turn.tool_calls)
    if turn.error:
        said = f"{turn.error.error_class}: {_short(turn.error.message or '', 80)}"
    elif not said and turn.reply:
        said = repr(_short(turn.reply, 60))
    return "  ".join(parts) + (f"  {said}" if said else "")


def _budget_text(budget: BudgetRecord) -> str:
    text = f"{budget.action}: prompt {_num(budget.prompt_tokens)} tokens"
    if budget.field and budget.action == "clamp":
        text += f", {budget.field} {_num(budget.requested)} → {_num(budget.allowed)}"
    elif budget.field:
        # An arrow would say the cap was changed: it was not, and `allowed` is only the most that fit.
        asked = f"{budget.field} {budget.requested}" if budget.requested is not None else f"no {budget.field}"
        text += f", {asked} (at most {_num(budget.allowed)} fit)"
    if budget.limit is not None:
        text += f" (limit {budget.limit})"
    for said in (budget.note, budget.error):
        if said:
            text += f"; {said}"
    return text


def _wrapped(prefix: str, text: str, width: int | None) -> Iterator[str]:
    """`text` after `prefix`: on one shortened line with a `width`, else in full, its own lines
    indented under the first."""
    if width is not None:
        yield prefix + _short(text, max(width - len(prefix), 20))
        return
    pad = " " * len(prefix)
    for n, line in enumerate(text.splitlines() or [""]):
        yield (prefix if n == 0 else pad) + line


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:.2f}s"
