"""The turn: one recorded exchange as every reader sees it, typed.

Owns: `Turn` (and the parts it holds: `TurnError`, `UpstreamReply`, `TurnTokenIds`) and building turns
from a session's stored exchanges: each turn says what it added against the turn whose conversation it
continues (new messages, tool calls and their results, the reply, finish reason, tokens, timing, budget
decision, error, and with `--token-ids` its ids and any break in its token history); and the JSON every
reader that prints JSON writes (`show --json`, `tail --json`, the viewer: `Turn.as_json`). Does not own:
reading the store (reader.py), reading one body (its format's dialect), or printing turns for a person
(modeltap/readers/show.py).

A turn is one exchange of the session, numbered from 1 in recording order, so `show S 3`,
`replay S --turn 3` and the viewer's #3 name the same exchange.

    with StoreReader(path) as reader:
        for turn in turns(reader.exchanges("s-3f2a"), tokens=reader.token_turns("s-3f2a")):
            print(turn.number, turn.finish_reason, turn.reply)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modeltap import dialects
from modeltap.dialects.roles import AsChat
from modeltap.records.continuity import TokenDrift
from modeltap.records.exchange import BudgetRecord
from modeltap.records.message_text import tool_results

# How many earlier exchanges a turn is compared with to find the one it continues. Agents interleave
# side requests with their main thread (opencode's title request, a compaction request, Claude Code's
# small-model calls: docs/agents.md §3.5, §4.3), so "the previous exchange" is often not the
# previous turn of the conversation; a handful of look-backs finds it.
LOOKBACK = 16

ToolCall = dict[str, str | None]
"""One tool call as a dialect's `Summary` holds it: `{"id", "name", "arguments"}`, arguments as JSON text."""


@dataclass(frozen=True, slots=True)
class TurnError:
    """How a turn failed: the record's error class (`upstream_error`, `client_disconnect`, ...) and
    its message."""

    error_class: str
    message: str | None

    def as_json(self) -> dict[str, Any]:
        return {"class": self.error_class, "message": self.message}


@dataclass(frozen=True, slots=True)
class UpstreamReply:
    """What the upstream answered a translated request, in its own format, at a glance."""

    finish_reason: str | None
    reply: str | None
    tool_calls: list[ToolCall]


@dataclass(frozen=True, slots=True)
class TurnTokenIds:
    """A turn's token ids at a glance: where they came from (`served`, `rendered`, or None when none
    came back), what modeltap asked the engine for, their lengths, and the turn whose prompt and
    completion they continue with how many ids shared."""

    source: str | None
    ask: str | None
    prompt_length: int | None
    completion_length: int | None
    shared: int | None
    continues: int | None


@dataclass(frozen=True, slots=True)
class TurnBodies:
    """A turn's bodies: the request as the client sent it, as it went `sent` upstream when modeltap
    changed it (a clamp, a translation), the response the client got, and the upstream's own answer
    to a translated request (`received`); the headers of the request and of the answer, as recorded
    (credentials redacted), as (name, value) pairs."""

    request: Any = None
    sent: Any = None
    response: Any = None
    received: Any = None
    request_headers: tuple[tuple[str, str], ...] = ()
    response_headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Turn:
    """One exchange of a session as a turn. `continues` is the number of the turn whose conversation
    this one extends (None: it starts one); `new_messages` what it added against that turn. `bodies`
    is set only when the turns were built `full`."""

    number: int | None
    id: str
    seq: int | None
    session_id: str | None
    labels: dict[str, str]
    method: str
    endpoint: str | None
    path: str
    status: int | None
    streamed: bool
    stream_complete: bool | None
    model: str | None
    started: float | None
    ttfb_ms: int | None
    latency_ms: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    counted_prompt_tokens: int | None
    finish_reason: str | None
    reply: str | None
    tool_calls: list[ToolCall]
    continues: int | None
    new_messages: list[Any]
    tool_results: list[dict[str, Any]]
    budget: BudgetRecord | None
    error: TurnError | None
    tool_call_parse_failure: bool
    user_agent: str | None
    retry_count: int | None
    client_disconnected: bool
    translated: str | None
    synthesised: bool
    upstream_reply: UpstreamReply | None
    token_ids: TurnTokenIds | None = None
    token_drift: TokenDrift | None = None
    bodies: TurnBodies | None = None

    @property
    def request(self) -> Any:
        """The request as the client sent it, when the turn carries its bodies."""
        return self.bodies.request if self.bodies is not None else None

    @property
    def sent_because(self) -> str | None:
        """Why the body that went upstream is not the one the client sent (`translated to chat`,
        `max_tokens clamped 4000 → 3086`, both), or what else changed it; None when it went as sent."""
        reasons = []
        if self.translated:
            reasons.append(f"translated to {self.translated}")
        budget = self.budget
        if budget is not None and budget.action == "clamp":
            asked = budget.requested if budget.requested is not None else "none"
            reasons.append(f"{budget.field or 'completion cap'} clamped {asked} → {budget.allowed}")
        if not reasons and self.bodies is not None and self.bodies.sent is not None:
            # Neither: the one other rewrite, the empty text block AReaL's converter needs (relay.py).
            reasons.append("rewritten for AReaL's converter")
        return "; ".join(reasons) or None

    def as_json(self) -> dict[str, Any]:
        """The turn as the JSON readers print (`show --json`, `tail --json`, the viewer's app.js):
        its fields by name, `number` as `turn`, an error as `{"class", "message"}`, `sent_because`, and
        the bodies (`request`, `sent`, `response`, `received`) beside the rest when it carries them."""
        # Field by field rather than dataclasses.asdict, which would deep-copy the bodies.
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["turn"] = out.pop("number")
        for name in ("budget", "upstream_reply", "token_ids", "token_drift"):
            if out[name] is not None:
                out[name] = dataclasses.asdict(out[name])
        out["error"] = self.error.as_json() if self.error is not None else None
        out["sent_because"] = self.sent_because
        bodies = out.pop("bodies")
        if bodies is not None:
            out |= {field.name: getattr(bodies, field.name) for field in dataclasses.fields(bodies)}
        return out


def turns(
    exchanges: Sequence[dict[str, Any]], *, full: bool = False, tokens: Sequence[dict[str, Any]] = ()
) -> list[Turn]:
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
        token_row = by_exchange.get(ex["id"])
        out.append(
            turn_record(
                ex,
                index + 1,
                previous,
                continues + 1 if continues is not None else None,
                token_ids=_token_ids(token_row, numbers),
                token_drift=TokenDrift.from_json(token_row["drift"]) if token_row is not None else None,
                full=full,
            )
        )
    return out


def turn_record(
    ex: dict[str, Any],
    number: int | None,
    previous_request: Any = None,
    continues: int | None = None,
    *,
    token_ids: TurnTokenIds | None = None,
    token_drift: TokenDrift | None = None,
    full: bool = False,
) -> Turn:
    """One stored exchange (a row of `StoreReader.exchanges`, with bodies) as a turn.
    `previous_request` is the request of the turn it continues (number `continues`); without it every
    message of the request counts as new."""
    dialect = dialects.of_record(ex.get("endpoint"))
    request = ex.get("request") if isinstance(ex.get("request"), dict) else None
    summary = dialect.summary(request, ex.get("response"))
    added = dialect.new_messages(request, previous_request) if request is not None else []
    error = TurnError(ex["error_class"], ex["error_message"]) if ex.get("error_class") else None
    prompt_tokens = ex["prompt_tokens"] if ex["prompt_tokens"] is not None else summary.prompt_tokens
    bodies = TurnBodies(
        ex.get("request"),
        ex.get("sent"),
        ex.get("response"),
        ex.get("received"),
        tuple(ex.get("request_headers") or ()),
        tuple(ex.get("response_headers") or ()),
    )
    return Turn(
        number=number,
        id=ex["id"],
        seq=ex["seq"],
        session_id=ex["session_id"],
        labels=ex["labels"],
        method=ex["method"],
        endpoint=ex["endpoint"],
        path=ex["path"],
        status=ex["status"],
        streamed=ex["streamed"],
        stream_complete=ex["stream_complete"],
        model=ex["model"],
        started=ex["started"],
        ttfb_ms=_ms(ex["started"], ex["first_byte"]),
        latency_ms=_ms(ex["started"], ex["ended"]),
        prompt_tokens=prompt_tokens,
        completion_tokens=summary.completion_tokens,
        counted_prompt_tokens=ex["counted_prompt_tokens"],
        finish_reason=summary.finish_reason,
        reply=summary.text,
        tool_calls=summary.tool_calls,
        continues=continues,
        new_messages=added,
        tool_results=tool_results(added),
        budget=BudgetRecord.from_json(ex["budget"]),
        error=error,
        tool_call_parse_failure=isinstance(dialect, AsChat)
        and dialect.tool_call_parse_failure(ex.get("response")),
        user_agent=ex["user_agent"],
        retry_count=ex["retry_count"],
        client_disconnected=ex["client_disconnected"],
        translated=ex.get("translated"),
        synthesised=bool(ex.get("synthesised")),
        upstream_reply=_upstream_reply(ex),
        token_ids=token_ids,
        token_drift=token_drift,
        bodies=bodies if full else None,
    )


def _token_ids(row: dict[str, Any] | None, numbers: dict[str, int]) -> TurnTokenIds | None:
    """A turn's token ids at a glance, from its token row (records/token_store.py `session_tokens`)."""
    if row is None:
        return None
    continues = numbers.get(row["continues"]) if row["continues"] else None
    return TurnTokenIds(
        row["source"], row["ask"], row["prompt_length"], row["completion_length"], row["shared"], continues
    )


def _upstream_reply(ex: dict[str, Any]) -> UpstreamReply | None:
    if not ex.get("translated") or not isinstance(ex.get("received"), dict):
        return None
    summary = dialects.of_record(ex["translated"]).summary(ex.get("sent"), ex["received"])
    return UpstreamReply(summary.finish_reason, summary.text, summary.tool_calls)


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


def _ms(start: float | None, end: float | None) -> int | None:
    return round((end - start) * 1000) if start and end else None
