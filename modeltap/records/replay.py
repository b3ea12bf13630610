"""Play a recorded session again: re-send it to another upstream, or answer as a mock upstream.

Owns: `modeltap replay` (re-send each recorded request and compare the new answer with the recorded
one: status, finish reason, tokens, latency, and a diff of the content) and `modeltap mock` (an aiohttp
app that answers with recorded responses, streams played event by event). Does not own: carrying a
replay to its upstream (a modeltap Proxy does that, so replayed exchanges are recorded like any other
and the upstream's path layout, streams and errors are handled once, in proxy/; the CLI starts it),
stream formats (export.py) or turn views (view.py).

Mock matching is keyed on the session's turns, not on exact bytes as mitmproxy's replay is (agent
requests change every run: docs/peers.md §8.3). A request gets the first not yet
served recorded exchange on its path whose body matches exactly (a hash of the body less its transport
fields); failing that, with a session, the next not yet served exchange on its path in turn order,
preferring one of the same kind (same model and tools). Exact matches and kinds come first so that a
side request sent beside the main loop (opencode's title request, which offers no tools) gets its own
answer. When every exchange on a path has been served, the order starts again, as for a
new run of the agent.

    comparisons = await replay(store_path, "s-3f2a", session_base_url, replay_session="replay-1")
    app = mock_app(load_mock(store_path, session="s-3f2a"))
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import hdrs, web

from modeltap import dialects
from modeltap.dialects.base import ApiError, route_suffix
from modeltap.records.store import StoreReader
from modeltap.records.streams import stream_events
from modeltap.records.view import turn_record

# Request fields that say how to deliver an answer or who asks, not what is asked: a mock matches
# bodies without them. Claude Code's `metadata.user_id` holds its run's session id
# (docs/agents.md §4.3), so it differs on every run.
VOLATILE_FIELDS = frozenset({"stream", "stream_options", "metadata"})
# What says which kind of request a body is, for turn order: see `shape_digest`.
SHAPE_FIELDS = ("model", "tools")
# A replayed turn may be a long generation; the proxy in between has its own timeouts.
REPLAY_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)
# The fields a replay compares, in the order it shows them.
COMPARED = ("status", "finish_reason", "prompt_tokens", "completion_tokens", "latency_ms", "content")


# -- replay ---------------------------------------------------------------------------------------


async def replay(
    store: Path | str,
    session_id: str,
    base_url: str,
    *,
    replay_session: str,
    turn: int | None = None,
) -> list[dict[str, Any]]:
    """Re-send the recorded requests of `session_id` (or only turn `turn`, from 1) to `base_url`, in
    order, one at a time, and compare each answer with the recorded one.

    `base_url` is a modeltap session URL (`…/s/TOKEN`) whose records go to session `replay_session`
    in the same store, synchronously (`ProxyConfig.sync`), so each answer is read back from its record
    with its stream assembled. Each request goes out as recorded: same path, body and streaming.
    Returns one comparison per turn: `{"turn", "endpoint", "path", "recorded", "replayed", "differs"}`,
    the sides holding COMPARED and `differs` naming the fields that changed.
    """
    with StoreReader(store) as reader:
        numbered = list(enumerate(reader.exchanges(session_id), 1))
    chosen = [(n, ex) for n, ex in numbered if ex["endpoint"] and (turn is None or n == turn)]
    if not chosen:
        what = f"turn {turn}" if turn is not None else "any exchange"
        raise ValueError(f"session {session_id} has no {what} to replay (it has {len(numbered)} turn(s))")
    comparisons = []
    async with aiohttp.ClientSession(timeout=REPLAY_TIMEOUT) as client:
        for number, ex in chosen:
            last_seq = await asyncio.to_thread(_last_seq, store, replay_session)
            await _resend(client, base_url, ex)
            rows = await asyncio.to_thread(_exchanges_after, store, replay_session, last_seq)
            again = turn_record(rows[-1], number) if rows else None
            comparisons.append(_compare(number, ex, turn_record(ex, number), again))
    return comparisons


async def _resend(client: aiohttp.ClientSession, base_url: str, ex: dict[str, Any]) -> None:
    """Send one recorded request and read its answer to the end (the proxy records it)."""
    request = ex.get("request")
    headers: dict[str, str] = {hdrs.CONTENT_TYPE: "application/json"}
    if ex["user_agent"]:
        headers[hdrs.USER_AGENT] = ex["user_agent"]
    # Records keep no headers but the user agent: the format's own (Anthropic's version) are added.
    headers.update(dialects.of_record(ex["endpoint"]).request_headers)
    if request is None:
        data = None
    else:
        data = (request if isinstance(request, str) else json.dumps(request, ensure_ascii=False)).encode()
    url = base_url.rstrip("/") + _without_session(ex["path"])
    async with client.request(ex["method"], url, data=data, headers=headers) as response:
        await response.read()


def _without_session(path: str) -> str:
    """A recorded path without its session prefix (`/s/…/v1/chat/completions`: tokens are masked in
    records), its query kept."""
    if not path.startswith("/s/"):
        return path
    rest = path[3:].partition("/")[2]
    return "/" + rest


def _last_seq(store: Path | str, session: str) -> int:
    with StoreReader(store) as reader:
        rows = reader.exchanges(session, bodies=False)
    return rows[-1]["seq"] if rows else 0


def _exchanges_after(store: Path | str, session: str, seq: int) -> list[dict[str, Any]]:
    with StoreReader(store) as reader:
        return reader.exchanges(session, after_seq=seq)


def _compare(
    number: int, ex: dict[str, Any], recorded: dict[str, Any], replayed: dict[str, Any] | None
) -> dict[str, Any]:
    before = _side(recorded)
    after = _side(replayed) if replayed is not None else dict.fromkeys(COMPARED)
    differs = [key for key in COMPARED if key != "latency_ms" and before[key] != after[key]]
    return {
        "turn": number,
        "endpoint": ex["endpoint"],
        "path": ex["path"],
        "recorded": before,
        "replayed": after,
        "replayed_id": replayed["id"] if replayed is not None else None,
        "differs": differs,
    }


def _side(turn: dict[str, Any]) -> dict[str, Any]:
    """What a comparison looks at in one turn; `content` is its reply, tool calls and error as lines."""
    content = (turn["reply"] or "").splitlines()
    content += [f"→ {call['name']}({call['arguments'] or ''})" for call in turn["tool_calls"]]
    if turn["error"]:
        content.append(f"! {turn['error']['class']}: {turn['error']['message']}")
    return {key: turn[key] for key in COMPARED if key != "content"} | {"content": content}


def comparison_text(comparisons: Sequence[dict[str, Any]]) -> str:
    """Comparisons side by side, recorded on the left, replayed on the right, a `≠` on each field that
    changed (latency always differs and is shown, not flagged), then a diff of the content."""
    lines = []
    for comparison in comparisons:
        before, after = comparison["recorded"], comparison["replayed"]
        verdict = "differs: " + ", ".join(comparison["differs"]) if comparison["differs"] else "same"
        lines.append(f"turn {comparison['turn']}  {comparison['endpoint']}  {comparison['path']}  {verdict}")
        lines.append(f"    {'':<18}{'recorded':<28}replayed")
        for key in COMPARED[:-1]:
            mark = "≠" if key in comparison["differs"] else " "
            lines.append(f"  {mark} {key:<18}{_cell(before[key]):<28}{_cell(after[key])}")
        if "content" in comparison["differs"]:
            diff = difflib.unified_diff(
                before["content"], after["content"], "recorded", "replayed", lineterm="", n=2
            )
            lines += ["  ≠ content"] + [f"      {line}" for line in diff]
        else:
            lines.append("    content           same")
    changed = sum(1 for c in comparisons if c["differs"])
    lines.append(f"{len(comparisons)} turn(s) replayed, {changed} differ")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


# -- mock -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Recorded:
    number: int
    exchange: dict[str, Any]
    digest: str
    shape: str
    raw_sse: bytes | None


@dataclass
class Mock:
    """Recorded exchanges served as an upstream; see the module docstring for how requests match.

    `ordered` (a session was chosen) enables turn order; `realtime` replays each answer with its
    recorded time to first byte and duration, the events of a stream spread evenly over it.
    """

    recorded: list[_Recorded]
    ordered: bool
    realtime: bool = False
    served: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._routes: dict[tuple[str, str], list[_Recorded]] = {}
        for entry in self.recorded:
            key = (entry.exchange["method"], route_key(entry.exchange["path"]))
            self._routes.setdefault(key, []).append(entry)

    def match(self, method: str, path: str, body: Any) -> _Recorded | None:
        """The recorded exchange that answers this request, marked served; None when none can."""
        candidates = self._routes.get((method, route_key(path)), [])
        digest = body_digest(body)
        exact = [entry for entry in candidates if entry.digest == digest]
        pick = next((entry for entry in exact if entry.number not in self.served), None)
        if pick is None and self.ordered and candidates:
            unserved = [entry for entry in candidates if entry.number not in self.served]
            if not unserved:  # every turn on this path was served: a new run of the agent
                self.served -= {entry.number for entry in candidates}
                unserved = exact or candidates
            shape = shape_digest(body)
            pick = next((entry for entry in unserved if entry.shape == shape), unserved[0])
        pick = pick or (exact[0] if exact else None)
        if pick is not None:
            self.served.add(pick.number)
        return pick

    def reset(self) -> None:
        """Forget what was served, so the next request gets the first turn again."""
        self.served.clear()


def load_mock(store: Path | str, *, session: str | None = None, realtime: bool = False) -> Mock:
    """A Mock of one session (turn order and exact matches), or of every session (exact matches only).
    Reads the store once; call it off the event loop."""
    with StoreReader(store) as reader:
        exchanges = reader.exchanges(session)
        recorded = [
            _Recorded(
                n,
                ex,
                body_digest(ex.get("request")),
                shape_digest(ex.get("request")),
                reader.raw_sse(ex["id"]) if ex["streamed"] else None,
            )
            for n, ex in enumerate(exchanges, 1)
            if ex["endpoint"]
        ]
    if not recorded:
        raise ValueError(
            f"no recorded exchanges {'in session ' + session if session else 'in ' + str(store)}"
        )
    return Mock(recorded, ordered=session is not None, realtime=realtime)


def route_key(path: str) -> str:
    """The route of a path, as modeltap routes it: `/s/…/v1/chat/completions` and `/chat/completions`
    name the same route."""
    path = path.split("?", 1)[0]
    if path.startswith("/s/"):
        path = _without_session(path)
    return route_suffix(path)[1]


def body_digest(body: Any) -> str:
    """A hash of a request body without its VOLATILE_FIELDS, independent of key order and spacing."""
    if isinstance(body, dict):
        body = {key: value for key, value in body.items() if key not in VOLATILE_FIELDS}
    canonical = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def shape_digest(body: Any) -> str:
    """A hash of what kind of request a body is: its model and tools. A side request (a title, a
    summary) offers other tools than the agent's main loop, so it finds its own kind in turn order
    even when its text changed."""
    return body_digest({key: body.get(key) for key in SHAPE_FIELDS} if isinstance(body, dict) else None)


_MOCK = web.AppKey("mock", Mock)


def mock_app(mock: Mock, max_body_bytes: int) -> web.Application:
    """The mock as an aiohttp app: every path modeltap relays, plus `GET /_modeltap/mock` (what was
    served) and `POST /_modeltap/mock/reset`. It accepts bodies up to `max_body_bytes`, as a proxy
    does (recorded agent transcripts are long)."""
    app = web.Application(client_max_size=max_body_bytes)
    app[_MOCK] = mock
    app.router.add_get("/_modeltap/mock", _status)
    app.router.add_post("/_modeltap/mock/reset", _reset)
    app.router.add_route("HEAD", "/{tail:.*}", _head)
    app.router.add_route("*", "/{tail:.*}", _answer)
    return app


async def _status(request: web.Request) -> web.Response:
    mock = request.app[_MOCK]
    return web.json_response(
        {"exchanges": len(mock.recorded), "served": sorted(mock.served), "ordered": mock.ordered}
    )


async def _reset(request: web.Request) -> web.Response:
    request.app[_MOCK].reset()
    return web.json_response({"served": []})


async def _head(request: web.Request) -> web.Response:
    return web.Response()


async def _answer(request: web.Request) -> web.StreamResponse:
    mock = request.app[_MOCK]
    raw = await request.read()
    try:
        # Whatever JSON value the client sent, or its text when it is not JSON.
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    entry = mock.match(request.method, request.path_qs, body)
    if entry is None:
        return _no_match(request, len(mock.recorded))
    ex = entry.exchange
    headers = {"x-modeltap-mock-turn": str(entry.number), "x-modeltap-mock-exchange": ex["id"]}
    status = ex["status"] or 502
    wants_stream = isinstance(body, dict) and body.get("stream") is True
    streams = dialects.of_record(ex["endpoint"]).streams
    if wants_stream and status == 200 and streams and ex.get("response") is not None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = stream_events(ex, entry.raw_sse, include_usage=include_usage)
        return await _stream(request, events, headers, ex if mock.realtime else None)
    if mock.realtime and ex["ended"]:
        await asyncio.sleep(ex["ended"] - ex["started"])
    return web.json_response(ex.get("response"), status=status, headers=headers)


async def _stream(
    request: web.Request, events: list[bytes], headers: dict[str, str], timed: dict[str, Any] | None
) -> web.StreamResponse:
    """Write `events` one by one; with `timed`, at the recorded pace."""
    response = web.StreamResponse(
        headers={hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache", **headers}
    )
    await response.prepare(request)
    first_byte = gap = 0.0
    if timed is not None and timed["first_byte"] and timed["ended"]:
        first_byte = timed["first_byte"] - timed["started"]
        gap = (timed["ended"] - timed["first_byte"]) / max(len(events), 1)
    await asyncio.sleep(first_byte)
    for event in events:
        await response.write(event)
        await asyncio.sleep(gap)
    await response.write_eof()
    return response


def _no_match(request: web.Request, recorded: int) -> web.Response:
    message = (
        f"modeltap mock: no recorded exchange answers {request.method} {request.path} "
        f"({recorded} recorded; without --session only exact bodies match)"
    )
    error = ApiError(message, anthropic_type="not_found_error", code="no_recorded_exchange")
    return web.json_response(dialects.for_error(request.path).error_body(error), status=404)
