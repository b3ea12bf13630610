"""`modeltap export --format har`: a recorded session as a HAR 1.2 log.

Owns: one page per session, one entry per exchange, that Chrome DevTools and other HAR viewers import.
Streamed responses keep their SSE text as the body (records/streams.py gives the events: the raw SSE
when it was kept, else resynthesised), where mitmproxy's HAR keeps no body at all for a streamed
response (docs/peers.md §8.2); modeltap's own fields sit under `_modeltap`, as HAR allows custom
fields. Does not own: reading the store (records/reader.py) or a format's stream (its dialect).

    print(pretty(har(reader, "s-3f2a")))
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from modeltap import __version__, dialects
from modeltap.dialects.roles import Streams
from modeltap.records.jsontext import dumps, safe_text
from modeltap.records.reader import StoreReader
from modeltap.records.streams import stream_events

# The host of a HAR entry that never reached an upstream (a budget refusal, an unknown route). HAR
# needs an absolute URL; `.invalid` is reserved never to resolve (RFC 2606).
LOCAL_ORIGIN = "http://modeltap.invalid"


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
        ex["streamed"]
        and isinstance(dialects.of_record(ex["endpoint"]), Streams)
        and ex.get("response") is not None
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
    recorded = _har_headers(ex.get("request_headers"))
    headers = recorded or ([{"name": "User-Agent", "value": ex["user_agent"]}] if ex["user_agent"] else [])
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
        text = safe_text(request) or "" if isinstance(request, str) else dumps(request, compact=False)
        out["postData"] = {"mimeType": "application/json", "text": text}
        if not recorded:
            out["headers"] = [*headers, {"name": "Content-Type", "value": "application/json"}]
        out["bodySize"] = len(text.encode())
    return out


def _har_response(ex: dict[str, Any], events: list[bytes] | None) -> dict[str, Any]:
    """The response: a stream's SSE text when it was streamed, else the JSON body."""
    if events is not None:
        body, mime = b"".join(events).decode("utf-8", "replace"), "text/event-stream"
    else:
        body = dumps(ex["response"], compact=False) if ex.get("response") is not None else ""
        mime = "application/json"
    size = len(body.encode())
    return {
        "status": ex["status"] or 0,
        "statusText": _phrase(ex["status"]),
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": _har_headers(ex.get("response_headers")) or [{"name": "Content-Type", "value": mime}],
        "content": {"size": size, "mimeType": mime, "text": body},
        "redirectURL": "",
        "headersSize": -1,
        "bodySize": size,
    }


def _har_headers(recorded: Any) -> list[dict[str, str]]:
    """Recorded headers (credentials redacted when recorded) as HAR's name/value objects; [] for a
    record from before modeltap kept them."""
    return [{"name": name, "value": value} for name, value in recorded or ()]


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _span(start: float | None, end: float | None) -> float:
    return round(max(end - start, 0.0) * 1000, 3) if start and end else 0.0


def _phrase(status: int | None) -> str:
    try:
        return HTTPStatus(status or 0).phrase
    except ValueError:
        return ""
