"""Views of recorded sessions for a person debugging an agent: turns, and their text for a terminal.

Owns: turning a session's exchanges into turns, each saying what it added against the turn whose
conversation it continues (new messages, tool calls and their results, the reply, finish reason,
tokens, timing, budget decision, error, and with `--token-ids` its ids and any break in its token
history), as JSON-ready dicts (`show --json`, `tail --json`, the web viewer) and as text (`show`, a
`tail` line). Does not own: reading the store (reader.py), reading one body (its format's dialect),
listings of sessions and groups (listing.py), following a store as it grows (tail.py), export
formats (export.py).

A turn is one exchange of the session, numbered from 1 in recording order, so `show S 3`,
`replay S --turn 3` and the viewer's #3 name the same exchange.

    with StoreReader(path) as reader:
        print(session_turns("s-3f2a", reader.exchanges("s-3f2a"), reader.session("s-3f2a")))
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from modeltap import dialects
from modeltap.records.listing import rollout_lines
from modeltap.records.messages import call_text, describe_message, tool_names, tool_results
from modeltap.records.text import num as _num
from modeltap.records.text import short as _short
from modeltap.records.text import when as _when

# How many earlier exchanges a turn is compared with to find the one it continues. Agents interleave
# side requests with their main thread (opencode's title request, a compaction request, Claude Code's
# small-model calls: docs/agents.md §3.5, §4.3), so "the previous exchange" is often not the
# previous turn of the conversation; a handful of look-backs finds it.
LOOKBACK = 16
# One message or reply per line in the session view; the full text is one `show SESSION TURN` away.
LINE_CHARS = 110
_ROLE_WIDTH = 10
# A tools list an earlier turn showed is named by its first few tools.
TOOLS_NAMED = 3
# The roles a system prompt comes in (OpenAI's newer models call it developer).
SYSTEM_ROLES = ("system", "developer")


def turns(
    exchanges: Sequence[dict[str, Any]], *, full: bool = False, tokens: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """A session's exchanges (from `StoreReader.exchanges(session)`, with bodies) as turns, numbered
    from 1. With `full`, each turn also carries its `request`, `sent` (the body as it went upstream
    when the budget clamped it or modeltap translated it), `response` and `received` (the upstream's
    own answer to a translated request). `tokens` are the session's token rows
    (`StoreReader.token_turns(session)`)."""
    by_exchange = {row["exchange_id"]: row for row in tokens}
    numbers = {row["exchange_id"]: row["turn"] for row in tokens}
    out = []
    for index, ex in enumerate(exchanges):
        continues = _continued(exchanges, index)
        previous = exchanges[continues]["request"] if continues is not None else None
        turn = turn_record(ex, index + 1, previous, continues + 1 if continues is not None else None)
        turn |= _token_fields(by_exchange.get(ex["id"]), numbers)
        if full:
            turn |= {key: ex.get(key) for key in ("request", "sent", "response", "received")}
        out.append(turn)
    return out


def turn_record(
    ex: dict[str, Any], number: int | None, previous_request: Any = None, continues: int | None = None
) -> dict[str, Any]:
    """One exchange as a turn. `previous_request` is the request of the turn it continues (number
    `continues`); without it every message of the request counts as new."""
    dialect = dialects.of_record(ex.get("endpoint"))
    request = ex.get("request") if isinstance(ex.get("request"), dict) else None
    summary = dialect.summary(request, ex.get("response"))
    added = dialect.new_messages(request, previous_request) if request is not None else []
    error = {"class": ex["error_class"], "message": ex["error_message"]} if ex.get("error_class") else None
    return {
        "turn": number,
        "id": ex["id"],
        "seq": ex["seq"],
        "session_id": ex["session_id"],
        "labels": ex["labels"],
        "method": ex["method"],
        "endpoint": ex["endpoint"],
        "path": ex["path"],
        "status": ex["status"],
        "streamed": ex["streamed"],
        "stream_complete": ex["stream_complete"],
        "model": ex["model"],
        "started": ex["started"],
        "ttfb_ms": _ms(ex["started"], ex["first_byte"]),
        "latency_ms": _ms(ex["started"], ex["ended"]),
        "prompt_tokens": ex["prompt_tokens"] if ex["prompt_tokens"] is not None else summary.prompt_tokens,
        "completion_tokens": summary.completion_tokens,
        "counted_prompt_tokens": ex["counted_prompt_tokens"],
        "finish_reason": summary.finish_reason,
        "reply": summary.text,
        "tool_calls": summary.tool_calls,
        "continues": continues,
        "new_messages": added,
        "tool_results": tool_results(added),
        "budget": ex["budget"],
        "error": error,
        "tool_call_parse_failure": dialect.tool_call_parse_failure(ex.get("response")),
        "user_agent": ex["user_agent"],
        "retry_count": ex["retry_count"],
        "client_disconnected": ex["client_disconnected"],
        "translated": ex.get("translated"),
        "synthesised": bool(ex.get("synthesised")),
        "upstream_reply": _upstream_reply(ex),
    }


def _token_fields(row: dict[str, Any] | None, numbers: dict[str, int]) -> dict[str, Any]:
    """A turn's `token_ids` (where they came from, their counts, the turn they continue) and its
    `token_drift` (the break in its token history, or None)."""
    if row is None:
        return {"token_ids": None, "token_drift": None}
    summary = {key: row[key] for key in ("source", "ask", "prompt_length", "completion_length", "shared")}
    summary["continues"] = numbers.get(row["continues"]) if row["continues"] else None
    return {"token_ids": summary, "token_drift": row["drift"]}


def _upstream_reply(ex: dict[str, Any]) -> dict[str, Any] | None:
    """What the upstream answered a translated request, in its own format, at a glance."""
    if not ex.get("translated") or not isinstance(ex.get("received"), dict):
        return None
    summary = dialects.of_record(ex["translated"]).summary(ex.get("sent"), ex["received"])
    return {"finish_reason": summary.finish_reason, "reply": summary.text, "tool_calls": summary.tool_calls}


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
    labels = listed[0]["labels"] if listed else {}
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


def turn_text(turn: dict[str, Any], request: Any = None) -> str:
    """One turn in full (`modeltap show S TURN`); with its bodies when the turn carries them. The tools
    its `request` (or its own `request`) offers are named."""
    lines = _turn_lines(turn, None, tools=request if request is not None else turn.get("request"))
    for key, title in (("request", "request"), ("sent", "sent upstream (clamped)"), ("response", "response")):
        if turn.get(key) is not None:
            lines += [f"── {title}", pretty(turn[key])]
    return "\n".join(lines)


def pretty(value: Any) -> str:
    """`value` as indented JSON, for a person. Indenting recurses in Python, a few frames a level, so a
    body nested hundreds deep (the proxy accepts what its JSON parser does) comes out compact instead,
    which the C encoder writes as deep as the parser read."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except RecursionError:
        return json.dumps(value, ensure_ascii=False)


def tail_line(turn: dict[str, Any]) -> str:
    """One exchange on one line, as `modeltap tail` prints it."""
    number = f"#{turn['turn']}" if turn["turn"] is not None else ""
    return f"{_when(turn['started'])}  {turn['session_id'] or '-'} {number}  " + _headline(turn)


def _continued(exchanges: Sequence[dict[str, Any]], index: int) -> int | None:
    """The index of the earlier exchange whose conversation exchange `index` extends furthest: the
    fewest new messages, the most recent on a tie, among the last LOOKBACK of the same endpoint."""
    ex = exchanges[index]
    dialect = dialects.of_record(ex.get("endpoint"))
    request = ex.get("request")
    if not isinstance(request, dict):
        return None
    best: tuple[int, int] | None = None
    for earlier in range(index - 1, max(index - 1 - LOOKBACK, -1), -1):
        candidate = exchanges[earlier]
        if candidate.get("endpoint") != ex.get("endpoint") or not isinstance(candidate.get("request"), dict):
            continue
        added = len(dialect.new_messages(request, candidate["request"]))
        if best is None or added < best[0]:
            best = (added, earlier)
    # A candidate sharing nothing with this turn is not its predecessor: everything is new.
    if best is None or best[0] >= len(dialect.new_messages(request, None)):
        return None
    return best[1]


def _turn_lines(
    turn: dict[str, Any], width: int | None, *, tools: Any = None, seen: _Seen | None = None
) -> list[str]:
    """A turn's lines: one per message cut to `width`, or in full (None). `tools` is its request (for
    the tools it offers); with `seen`, a system prompt or tools list an earlier turn of the session
    showed collapses to one line naming that turn."""
    lines = [f"#{turn['turn']}  {_when(turn['started'])}  {_headline(turn)}"]
    indent = "    "
    if width is None:
        client = f"  client {turn['user_agent']}" if turn["user_agent"] else ""
        retry = f"  SDK retry {turn['retry_count']}" if turn["retry_count"] else ""
        lines.append(f"{indent}{turn['method']} {turn['path']}  model {turn['model'] or '-'}{client}{retry}")
    if turn["continues"] is not None and turn["continues"] != turn["turn"] - 1:
        lines.append(f"{indent}(continues #{turn['continues']})")
    lines += _tools_lines(tools, turn["turn"], indent, width, seen)
    if turn["translated"]:
        lines += _translation_lines(turn, indent)
    elif turn["synthesised"]:
        lines.append(
            f"{indent}the upstream answered JSON; modeltap wrote the {turn['endpoint']} stream from it"
        )
    for message in turn["new_messages"]:
        role, text = describe_message(message)
        earlier = seen.system(text, turn["turn"]) if seen is not None and role in SYSTEM_ROLES else None
        if earlier is not None:
            said = f"system prompt, {_chars(len(text))} chars, as in turn {earlier}"
            lines.append(f"{indent}+ {role:<{_ROLE_WIDTH}} {said}")
            continue
        lines += _wrapped(f"{indent}+ {role:<{_ROLE_WIDTH}} ", text, width)
    for call in turn["tool_calls"]:
        lines += _wrapped(f"{indent}← {'tool call':<{_ROLE_WIDTH}} ", call_text(call), width)
    if turn["reply"]:
        lines += _wrapped(f"{indent}← {'reply':<{_ROLE_WIDTH}} ", turn["reply"], width)
    if turn["tool_call_parse_failure"]:
        lines.append(f"{indent}! finish_reason says tool call but none parsed (the model's tool-call output)")
    budget = turn["budget"]
    if budget and (budget.get("action") != "pass" or width is None):
        lines.append(f"{indent}budget {_budget_text(budget)}")
    if turn["error"]:
        lines += _wrapped(
            f"{indent}! {turn['error']['class']:<{_ROLE_WIDTH}} ", turn["error"]["message"] or "", width
        )
    return lines + _token_lines(turn, indent, width)


def _token_lines(turn: dict[str, Any], indent: str, width: int | None) -> list[str]:
    """The break in the turn's token history, and in full its ids' summary and the two sides."""
    ids, drift = turn.get("token_ids"), turn.get("token_drift")
    lines: list[str] = []
    if drift:
        where = f"at id {drift['position']} of the prompt continuing #{drift['continues_turn']}"
        lines += _wrapped(f"{indent}! {'token drift':<{_ROLE_WIDTH}} ", f"{where}: {drift['text']}", width)
    if width is None and ids:
        lines.append(f"{indent}token ids {_ids_text(ids)}")
    if width is None and drift:
        for side, title in (("expected", "expected"), ("got", "got")):
            lines.append(f"{indent}  {title:<9}{_window_text(drift[side], drift['position'])}")
    return lines


def _ids_text(ids: dict[str, Any]) -> str:
    if ids["source"] is None:
        return (
            "none: they could not be rendered"
            if ids["ask"] == "rendered"
            else f"none came back (asked {ids['ask']})"
        )
    text = f"{ids['source']}: prompt {ids['prompt_length']}, completion {ids['completion_length']}"
    if ids["continues"] is not None:
        text += f", continues #{ids['continues']} sharing {ids['shared']}"
    return text


def _window_text(side: dict[str, Any], position: int) -> str:
    """The ids around a break, decoded when the record has their text, the first differing one marked."""
    pieces = side["text"] or [str(token) for token in side["ids"]]
    shown = [json.dumps(piece, ensure_ascii=False) if side["text"] else piece for piece in pieces]
    mark = position - side["start"]
    if 0 <= mark < len(shown):
        shown[mark] = f"[{shown[mark]}]"
    return " ".join(shown)


def _translation_lines(turn: dict[str, Any], indent: str) -> list[str]:
    """How a translated turn went: the format it went upstream as, and what the upstream said in it."""
    how = "streamed" if turn["streamed"] and not turn["synthesised"] else "whole"
    lines = [
        f"{indent}translated: sent upstream as {turn['translated']}, answered {how} as {turn['endpoint']}"
    ]
    reply = turn["upstream_reply"]
    if reply is not None:
        said = ", ".join(call_text(call) for call in reply["tool_calls"]) or repr(
            _short(reply["reply"] or "")
        )
        lines.append(f"{indent}upstream {turn['translated']} reply: {reply['finish_reason'] or '-'}  {said}")
    return lines


def _headline(turn: dict[str, Any]) -> str:
    """Endpoint, status, timing, tokens and finish reason of a turn; its tool calls or error on tail."""
    timing = _duration(turn["latency_ms"])
    if turn["streamed"]:
        timing += f" (first byte {_duration(turn['ttfb_ms'])})"
    via = f" via {turn['translated']}" if turn["translated"] else ""
    parts = [
        (turn["endpoint"] or turn["path"]) + via + (" (stream)" if turn["streamed"] else ""),
        str(turn["status"] or "-"),
        timing,
    ]
    if turn["prompt_tokens"] is not None or turn["completion_tokens"] is not None:
        parts.append(f"tokens {_num(turn['prompt_tokens'])}→{_num(turn['completion_tokens'])}")
    if turn["finish_reason"]:
        parts.append(turn["finish_reason"])
    budget = turn["budget"] or {}
    if budget.get("action") in ("clamp", "reject") and budget.get("summary"):
        parts.append(f"budget {budget['summary']}")
    said = ", ".join(_short(call_text(call), 60) for call in turn["tool_calls"])
    if turn["error"]:
        said = f"{turn['error']['class']}: {_short(turn['error']['message'] or '', 80)}"
    elif not said and turn["reply"]:
        said = repr(_short(turn["reply"], 60))
    return "  ".join(parts) + (f"  {said}" if said else "")


def _budget_text(budget: dict[str, Any]) -> str:
    text = f"{budget.get('action')}: prompt {_num(budget.get('prompt_tokens'))} tokens"
    if budget.get("field"):
        text += f", {budget['field']} {_num(budget.get('requested'))} → {_num(budget.get('allowed'))}"
    if budget.get("limit") is not None:
        text += f" (limit {budget['limit']})"
    for key in ("note", "error"):
        if budget.get(key):
            text += f"; {budget[key]}"
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


def _ms(start: float | None, end: float | None) -> int | None:
    return round((end - start) * 1000) if start and end else None


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    return f"{ms}ms" if ms < 1000 else f"{ms / 1000:.2f}s"
