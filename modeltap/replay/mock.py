"""`modeltap mock`: recorded responses served as a deterministic upstream, for debugging an agent
offline or as a test fixture.

Owns: matching a request to a recorded exchange, saying how it matched, and answering with the
recorded response (streams played event by event). Does not own: stream formats (records/streams.py) or
re-sending recordings to a live upstream (replay.py).

Matching is keyed on the session's turns, not on exact bytes as mitmproxy's replay is (agent requests
change every run: docs/peers.md §8.3). A request gets the first not yet served recorded exchange on
its path whose body matches exactly (a hash of the body less its transport fields); failing that,
with a session, the next not yet served exchange on its path in turn order, preferring one of the same
kind (same model and tools). Exact matches and kinds come first so that a side request sent beside the
main loop (opencode's title request, which offers no tools) gets its own answer. When every exchange
on a path has been served, the order starts again, as for a new run of the agent.

Every answer says how it matched, in a log line and in `x-modeltap-mock-match`: `exact #3`,
`next in order #4`, the latter with where the request parted from the recorded one (`diverged at
message 5: ...`). With `strict`, only exact matches are served: any other request gets a 409 in the
client's error shape naming where it diverged, so a test catches an agent going off script.

    app = mock_app(load_mock(store_path, session="s-3f2a", strict=True), max_body_bytes)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from modeltap import dialects
from modeltap.compat.hosts import is_loopback, own_host
from modeltap.dialects.base import ApiError, route_suffix
from modeltap.dialects.roles import Streams
from modeltap.records.reader import StoreReader
from modeltap.records.streams import asks_usage, stream_events
from modeltap.replay.replay import without_session

# Request fields that say how to deliver an answer or who asks, not what is asked: a mock matches
# bodies without them. Claude Code's `metadata.user_id` holds its run's session id
# (docs/agents.md §4.3), so it differs on every run.
VOLATILE_FIELDS = frozenset({"stream", "stream_options", "metadata"})
# What says which kind of request a body is, for turn order: see `shape_digest`.
SHAPE_FIELDS = ("model", "tools")
# How much of a differing message a divergence quotes, from a few characters before where it parts.
QUOTE_CHARS = 60
QUOTE_BEFORE_CHARS = 10
MATCH_HEADER = "x-modeltap-mock-match"
# The header the openai and anthropic SDKs (Stainless-generated) read before retrying: "false" stops
# them (openai-python src/openai/_base_client.py, `_should_retry`).
SHOULD_RETRY_HEADER = "x-should-retry"
_MODELS = dialects.named("models")
MODELS_MATCH = "not recorded: the models the recorded requests name"


@dataclass(frozen=True, slots=True)
class _Recorded:
    number: int
    exchange: dict[str, Any]
    digest: str
    shape: str
    raw_sse: bytes | None


@dataclass(frozen=True, slots=True)
class Match:
    """How a request was matched: the recorded exchange that answers it (None when none does) and
    the words for it (`exact #3`, `next in order #4 (diverged at message 5: ...)`, `no match ...`)."""

    entry: _Recorded | None
    how: str


@dataclass
class Mock:
    """Recorded exchanges served as an upstream; see the module docstring for how requests match.

    `ordered` (a session was chosen) enables turn order; `strict` serves exact matches only;
    `realtime` replays each answer with its recorded time to first byte and duration, the events of a
    stream spread evenly over it.
    """

    recorded: list[_Recorded]
    ordered: bool
    realtime: bool = False
    strict: bool = False
    served: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._routes: dict[tuple[str, str], list[_Recorded]] = {}
        for entry in self.recorded:
            key = (entry.exchange["method"], route_key(entry.exchange["path"]))
            self._routes.setdefault(key, []).append(entry)

    def match(self, method: str, path: str, body: Any) -> Match:
        """The recorded exchange that answers this request, marked served, and how it matched."""
        candidates = self._routes.get((method, route_key(path)), [])
        digest = body_digest(body)
        exact = [entry for entry in candidates if entry.digest == digest]
        unserved = [entry for entry in candidates if entry.number not in self.served]
        if exact:
            pick = next((entry for entry in exact if entry.number not in self.served), None)
            if pick is not None:
                return self._serve(pick, f"exact #{pick.number}")
            if not self.ordered or self.strict:  # asked again: the same answer again
                return self._serve(exact[0], f"exact #{exact[0].number}, again")
            if not unserved:  # every turn was served: a new run of the agent starts again
                self.served -= {entry.number for entry in candidates}
                return self._serve(exact[0], f"exact #{exact[0].number}")
        if not self.ordered or not candidates:
            return Match(None, f"no match: nothing recorded on {method} {route_key(path)} has this body")
        if not unserved:
            self.served -= {entry.number for entry in candidates}
            unserved = candidates
        shape = shape_digest(body)
        pick = next((entry for entry in unserved if entry.shape == shape), unserved[0])
        parted = divergence(pick.exchange, body)
        if self.strict:
            return Match(None, f"off script: turn #{pick.number} is next, and the request {parted}")
        return self._serve(pick, f"next in order #{pick.number} ({parted})")

    def _serve(self, entry: _Recorded, how: str) -> Match:
        self.served.add(entry.number)
        return Match(entry, how)

    def reset(self) -> None:
        """Forget what was served, so the next request gets the first turn again."""
        self.served.clear()


def divergence(recorded: dict[str, Any], body: Any) -> str:
    """Where `body` parts from the request `recorded` holds, in words: the first message that differs,
    both sides quoted from where they part (a shared system prompt is not quoted twice), or the first
    other field.

    >>> divergence({"endpoint": "chat", "request": {"messages": [{"role": "user", "content": "hi"}]}},
    ...            {"messages": [{"role": "user", "content": "ho"}]})
    "diverged at message 1 (user), character 2: recorded 'i', sent 'o'"
    """
    before = recorded.get("request")
    if not isinstance(before, dict) or not isinstance(body, dict):
        return "diverged: the body is not the recorded JSON object"
    dialect = dialects.of_record(recorded["endpoint"])
    old, new = dialect.history(before), dialect.history(body)
    for index, (was, now) in enumerate(zip(old, new, strict=False), 1):
        if was != now:
            return f"diverged at message {index} ({_role(now)}), {_parted(was, now)}"
    if len(old) != len(new):
        return f"diverged after message {min(len(old), len(new))}: recorded {len(old)}, sent {len(new)}"
    fields = sorted((set(before) | set(body)) - VOLATILE_FIELDS)
    changed = [key for key in fields if before.get(key) != body.get(key)]
    return f"diverged in {', '.join(changed)}" if changed else "same body"


def _role(message: Any) -> str:
    return str(message.get("role", "?")) if isinstance(message, dict) else type(message).__name__


def _parted(was: Any, now: Any) -> str:
    """Where two messages part: their texts (or, when those are the same, their JSON) from the first
    character that differs, a little before it for context."""
    old, new = _text(was), _text(now)
    if old == new:  # the same text: another field (a tool call), in an order both sides share
        old, new = _json(was, sort_keys=True), _json(now, sort_keys=True)
    at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), min(len(old), len(new)))
    start = max(at - QUOTE_BEFORE_CHARS, 0)
    return f"character {at + 1}: recorded {_quote(old, start)}, sent {_quote(new, start)}"


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else message
    return content if isinstance(content, str) else _json(content)


def _json(value: Any, *, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=sort_keys)


def _quote(text: str, start: int) -> str:
    cut = text[start : start + QUOTE_CHARS]
    return repr(("…" if start else "") + cut + ("…" if start + QUOTE_CHARS < len(text) else ""))


def load_mock(
    store: Path | str, *, session: str | None = None, realtime: bool = False, strict: bool = False
) -> Mock:
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
    return Mock(recorded, ordered=session is not None, realtime=realtime, strict=strict)


def route_key(path: str) -> str:
    """The route of a path, as modeltap routes it: `/s/…/v1/chat/completions` and `/chat/completions`
    name the same route."""
    return route_suffix(without_session(path.split("?", 1)[0]))[1]


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
_BIND = web.AppKey("bind_host", str)
_LOG: web.AppKey[Callable[[str], None]] = web.AppKey("mock_log")


def mock_app(
    mock: Mock,
    max_body_bytes: int,
    log: Callable[[str], None] | None = None,
    *,
    bind_host: str = "127.0.0.1",
) -> web.Application:
    """The mock as an aiohttp app: every path modeltap relays, plus `GET /_modeltap/mock` (what was
    served) and `POST /_modeltap/mock/reset`. It accepts bodies up to `max_body_bytes`, as a proxy
    does (recorded agent transcripts are long). `log` gets one line per request: how it matched.
    It serves recorded replies, so on a loopback `bind_host` it answers only requests addressed to its
    own names (a 421 otherwise), as the proxy and the viewer do: no web page reads them through DNS
    rebinding (compat/hosts.py)."""
    app = web.Application(client_max_size=max_body_bytes, middlewares=[_own_hosts])
    app[_BIND] = bind_host
    app[_MOCK] = mock
    app[_LOG] = log or (lambda line: None)
    app.router.add_get("/_modeltap/mock", _status)
    app.router.add_post("/_modeltap/mock/reset", _reset)
    app.router.add_route("HEAD", "/{tail:.*}", _head)
    app.router.add_route("*", "/{tail:.*}", _answer)
    return app


@web.middleware
async def _own_hosts(request: web.Request, handler: Handler) -> web.StreamResponse:
    bind = request.app[_BIND]
    host = request.headers.get(hdrs.HOST)
    if is_loopback(bind) and not own_host(host, bind):
        message = f"modeltap mock answers only requests addressed to its own names, not {host!r}"
        error = ApiError(message, anthropic_type="permission_error", code="misdirected_request")
        return web.json_response(dialects.for_error(request.path).error_body(error), status=421)
    return await handler(request)


async def _status(request: web.Request) -> web.Response:
    mock = request.app[_MOCK]
    return web.json_response(
        {
            "exchanges": len(mock.recorded),
            "served": sorted(mock.served),
            "ordered": mock.ordered,
            "strict": mock.strict,
        }
    )


async def _reset(request: web.Request) -> web.Response:
    request.app[_MOCK].reset()
    return web.json_response({"served": []})


async def _head(request: web.Request) -> web.Response:
    return web.Response()


async def _answer(request: web.Request) -> web.StreamResponse:
    mock = request.app[_MOCK]
    body = _parsed(await request.read())
    try:
        match = mock.match(request.method, request.path_qs, body)
    except RecursionError:  # a body nested deeper than Python compares: no recorded one is like it
        match = Match(None, "no match: the body nests deeper than any recorded one")
    listed = _models(request, mock) if match.entry is None else None
    how = MODELS_MATCH if listed is not None else match.how
    request.app[_LOG](f"{request.method} {without_session(request.path)}  {how}")
    if listed is not None:
        return listed
    if match.entry is None:
        return _no_match(request, mock, match.how)
    entry, ex = match.entry, match.entry.exchange
    headers = {
        "x-modeltap-mock-turn": str(entry.number),
        "x-modeltap-mock-exchange": ex["id"],
        MATCH_HEADER: match.how.encode("ascii", "backslashreplace").decode()[:512],
    }
    status = ex["status"] or 502
    wants_stream = isinstance(body, dict) and body.get("stream") is True
    streams = isinstance(dialects.of_record(ex["endpoint"]), Streams)
    if wants_stream and status == 200 and streams and ex.get("response") is not None:
        events = stream_events(ex, entry.raw_sse, include_usage=asks_usage(body))
        return await _stream(request, events, headers, ex if mock.realtime else None)
    if mock.realtime and ex["ended"]:
        await asyncio.sleep(ex["ended"] - ex["started"])
    return web.json_response(ex.get("response"), status=status, headers=headers)


def _parsed(raw: bytes) -> Any:
    """Whatever JSON value the client sent, or its text when it is not JSON (or nests deeper than
    Python's parser goes)."""
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return raw.decode("utf-8", "replace")


def _models(request: web.Request, mock: Mock) -> web.Response | None:
    """`GET /v1/models` (or one model's card) when none was recorded: the models the recorded requests
    named, so an SDK that lists models first (the quickstart's snippet) gets on to its requests."""
    routed = dialects.for_route(route_key(request.path))
    if request.method != "GET" or routed is None or routed[0] is not _MODELS:
        return None
    names = [
        e.exchange["request"].get("model") if isinstance(e.exchange["request"], dict) else None
        for e in mock.recorded
    ]
    served = list(dict.fromkeys(name for name in names if isinstance(name, str) and name))
    started = min(e.exchange["started"] for e in mock.recorded)
    answer = _MODELS.local_answer(served, started, routed[1])
    if answer is None:
        return None
    return web.json_response(answer, headers={MATCH_HEADER: MODELS_MATCH})


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


def _no_match(request: web.Request, mock: Mock, how: str) -> web.Response:
    """Nothing recorded answers the request: a 409 under strict (the agent went off script), else 404.
    Either says `x-should-retry: false`, which the openai and anthropic SDKs obey: they would otherwise
    send a 409 again twice (their `_should_retry` retries 408, 409, 429 and 5xx), and the log would
    show one request going off script three times."""
    hint = "" if mock.ordered else "; without --session only exact bodies match"
    message = f"modeltap mock ({len(mock.recorded)} recorded exchange(s)): {how}{hint}"
    no_retry = {SHOULD_RETRY_HEADER: "false"}
    if mock.strict:
        error = ApiError(message, code="mock_off_script")
        body = dialects.for_error(request.path).error_body(error)
        return web.json_response(body, status=409, headers=no_retry)
    error = ApiError(message, anthropic_type="not_found_error", code="no_recorded_exchange")
    return web.json_response(dialects.for_error(request.path).error_body(error), status=404, headers=no_retry)
