"""A recorded session in the formats other tools read: HAR 1.2, JSON lines, chat messages for SFT, and
token lines for RL trainers, and OpenTelemetry spans sent to a tracing backend.

Owns: `modeltap export` (`har`, `jsonl`, `messages`, `tokens`: token_export.py writes those lines, and
`otlp`, which sends through otlp.py), and the rule that picks a session's final conversation, which
`messages` and `tokens` share. Streamed responses go into the HAR as their events (streams.py), where
mitmproxy's HAR keeps no body at all for a streamed response (docs/peers.md §8.2). Does not own:
reading the store (reader.py), a format's conversion to chat (its dialect), synthesising streams
(streams.py), turn views (view.py) or spans (genai.py, otlp.py).

    with StoreReader(path) as reader:
        write_export(reader, "s-3f2a", "har", sys.stdout)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, TextIO
from urllib.parse import parse_qsl, urlsplit

from modeltap import __version__, dialects
from modeltap.records.reader import StoreReader
from modeltap.records.streams import stream_events
from modeltap.records.token_export import token_lines
from modeltap.records.view import pretty

FORMATS = ("har", "jsonl", "messages", "otlp", "tokens")
# Each JSONL line says which format it is in; a reader checks it before trusting the fields.
JSONL_FORMAT = "modeltap.exchange"
JSONL_FORMAT_VERSION = 1
# The host of a HAR entry that never reached an upstream (a budget refusal, an unknown route). HAR
# needs an absolute URL; `.invalid` is reserved never to resolve (RFC 2606).
LOCAL_ORIGIN = "http://modeltap.invalid"


def write_export(reader: StoreReader, session_id: str, fmt: str, out: TextIO) -> None:
    """Write session `session_id` to `out` in `fmt`: "har", "jsonl", "messages" or "tokens"."""
    if fmt == "har":
        out.write(pretty(har(reader, session_id)) + "\n")
    elif fmt == "jsonl":
        for line in jsonl(reader, session_id):
            out.write(line + "\n")
    elif fmt == "messages":
        out.write(json.dumps(conversation(reader.exchanges(session_id)), ensure_ascii=False) + "\n")
    elif fmt == "tokens":
        with_ids = {turn["exchange_id"] for turn in reader.token_turns(session_id) if turn["source"]}
        exchanges = [ex for ex in reader.exchanges(session_id) if ex["id"] in with_ids]
        if not exchanges:
            raise ValueError(f"session {session_id} has no token ids: record it with `serve --token-ids`")
        for record in token_lines(reader, session_id, final_exchange(exchanges, "generating")["id"]):
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    else:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")


def send_otlp(sessions: Iterable[tuple[StoreReader, str]], endpoint: str, *, content: bool) -> int:
    """Send the exchanges of the sessions (each named with the store it is in) to an OTLP/HTTP traces
    `endpoint` as spans with their original times, a session at a time; returns how many were sent."""
    try:
        from modeltap.records.otlp import backfill  # the optional extra, loaded only when asked for
    except ImportError as exc:
        raise ValueError(str(exc)) from exc
    rows = (row for reader, session_id in sessions for row in reader.exchanges(session_id))
    return backfill(rows, endpoint, content=content)


def jsonl(reader: StoreReader, session_id: str) -> Iterator[str]:
    """One JSON object per exchange, in recording order, with its bodies, turn number and format
    version; `raw_sse` is the stream's text when it was kept; `rollout` the session's reward, outcome,
    check scores, duration, exit status and log tail when it is a rollout, else null."""
    rollout = _rollout(reader.session(session_id))
    for number, ex in enumerate(reader.exchanges(session_id), 1):
        raw = reader.raw_sse(ex["id"]) if ex["streamed"] else None
        line = {"format": JSONL_FORMAT, "format_version": JSONL_FORMAT_VERSION, "turn": number, **ex}
        line["rollout"] = rollout
        line["raw_sse"] = raw.decode("utf-8", "replace") if raw is not None else None
        yield json.dumps(line, ensure_ascii=False)


def _rollout(session: dict[str, Any] | None) -> dict[str, Any] | None:
    if session is None or session["outcome"] is None:
        return None
    return {"reward": session["reward"], "outcome": session["outcome"], **(session["rollout"] or {})}


def har(reader: StoreReader, session_id: str) -> dict[str, Any]:
    """The session as a HAR 1.2 log (one page, one entry per exchange) that Chrome DevTools and other
    HAR viewers import. Streamed responses keep their SSE text as the body; modeltap's own fields
    (turn, tokens, budget, error, assembled body) sit under `_modeltap`, as HAR allows custom fields."""
    exchanges = reader.exchanges(session_id)
    entries = [_har_entry(ex, number, session_id, reader.raw_sse) for number, ex in enumerate(exchanges, 1)]
    started = exchanges[0]["started"] if exchanges else datetime.now(UTC).timestamp()
    page = {
        "startedDateTime": _iso(started),
        "id": session_id,
        "title": f"modeltap session {session_id}",
        "pageTimings": {"onContentLoad": -1, "onLoad": -1},
    }
    creator = {"name": "modeltap", "version": __version__}
    return {"log": {"version": "1.2", "creator": creator, "pages": [page], "entries": entries}}


def _har_entry(
    ex: dict[str, Any], number: int, page: str, raw_sse: Callable[[str], bytes | None]
) -> dict[str, Any]:
    streamed = (
        ex["streamed"] and dialects.of_record(ex["endpoint"]).streams and ex.get("response") is not None
    )
    raw = raw_sse(ex["id"]) if streamed else None
    wait = _span(ex["started"], ex["first_byte"])
    receive = _span(ex["first_byte"], ex["ended"])
    timings = {
        "blocked": -1,
        "dns": -1,
        "connect": -1,
        "ssl": -1,
        "send": 0,
        "wait": wait,
        "receive": receive,
    }
    modeltap = {key: ex[key] for key in _HAR_FIELDS} | {
        "exchange_id": ex["id"],
        "turn": number,
        "stream_source": ("raw" if raw is not None else "resynthesised") if streamed else None,
        "assembled_response": ex.get("response") if streamed else None,
        "sent": ex.get("sent"),
    }
    return {
        "pageref": page,
        "startedDateTime": _iso(ex["started"]),
        "time": wait + receive,
        "request": _har_request(ex),
        "response": _har_response(ex, stream_events(ex, raw) if streamed else None),
        "cache": {},
        "timings": timings,
        "_modeltap": modeltap,
    }


# Record fields a HAR entry carries under `_modeltap`, as they are.
_HAR_FIELDS = (
    "session_id", "path", "endpoint", "streamed", "stream_complete", "model", "finish_reason",
    "prompt_tokens", "completion_tokens", "budget", "error_class", "error_message", "retry_count",
)  # fmt: skip


def _har_request(ex: dict[str, Any]) -> dict[str, Any]:
    """The request as the client sent it, at the upstream URL it went to (else modeltap's own)."""
    url = ex["upstream_url"] or LOCAL_ORIGIN + ex["path"]
    headers = [{"name": "User-Agent", "value": ex["user_agent"]}] if ex["user_agent"] else []
    out: dict[str, Any] = {
        "method": ex["method"],
        "url": url,
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": headers,
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(urlsplit(url).query, True)],
        "headersSize": -1,
        "bodySize": 0,
    }
    request = ex.get("request")
    if request is not None:
        text = request if isinstance(request, str) else json.dumps(request, ensure_ascii=False)
        out["postData"] = {"mimeType": "application/json", "text": text}
        out["headers"] = [*headers, {"name": "Content-Type", "value": "application/json"}]
        out["bodySize"] = len(text.encode())
    return out


def _har_response(ex: dict[str, Any], events: list[bytes] | None) -> dict[str, Any]:
    """The response: a stream's SSE text when it was streamed, else the JSON body."""
    if events is not None:
        body, mime = b"".join(events).decode("utf-8", "replace"), "text/event-stream"
    else:
        body = json.dumps(ex["response"], ensure_ascii=False) if ex.get("response") is not None else ""
        mime = "application/json"
    size = len(body.encode())
    return {
        "status": ex["status"] or 0,
        "statusText": _phrase(ex["status"]),
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": [{"name": "Content-Type", "value": mime}],
        "content": {"size": size, "mimeType": mime, "text": body},
        "redirectURL": "",
        "headersSize": -1,
        "bodySize": size,
    }


# -- the conversation, for supervised fine-tuning -----------------------------------------------


def conversation(exchanges: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The session's final conversation in OpenAI chat format: `{"messages": [...], "tools": [...]}`,
    one line of an SFT set (OpenAI's fine-tuning format for chat with tools).

    The final conversation is that of `final_exchange`: its request history followed by its reply,
    converted to chat by its format's dialect.
    """
    conversational = [ex for ex in exchanges if dialects.of_record(ex["endpoint"]).history_field is not None]
    final = final_exchange(conversational, "chat, messages or responses")
    done = [ex for ex in conversational if _succeeded(ex)]
    earlier = [
        (ex["request"], ex["response"])
        for ex in done
        if ex is not final and ex["endpoint"] == final["endpoint"]
    ]
    chat = dialects.of_record(final["endpoint"]).conversation(final["request"], final["response"], earlier)
    if chat is None:
        raise ValueError(f"{final['endpoint']} exchanges hold no conversation to export")
    return {"messages": chat.messages, "tools": chat.tools} if chat.tools else {"messages": chat.messages}


def final_exchange(exchanges: Sequence[dict[str, Any]], formats: str) -> dict[str, Any]:
    """The exchange that ends a session's main conversation: the last successful one that offered
    tools, else the last successful one. Agents interleave tool-less side requests (opencode's title, a
    compaction summary: docs/agents.md §3.5) with their main loop, and those are not the conversation.
    Raises ValueError naming the `formats` looked for when none of `exchanges` succeeded."""
    done = [ex for ex in exchanges if _succeeded(ex)]
    if not done:
        raise ValueError(f"the session has no successful {formats} exchange to export")
    return ([ex for ex in done if ex["request"].get("tools")] or done)[-1]


def _succeeded(ex: dict[str, Any]) -> bool:
    return (
        dialects.of_record(ex["endpoint"]).completion_field(ex.get("request") or {}) is not None
        and ex["status"] == 200
        and isinstance(ex.get("request"), dict)
        and isinstance(ex.get("response"), dict)
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(start: float | None, end: float | None) -> float:
    return round(max(end - start, 0.0) * 1000, 3) if start and end else 0.0


def _phrase(status: int | None) -> str:
    try:
        return HTTPStatus(status or 0).phrase
    except ValueError:
        return ""
