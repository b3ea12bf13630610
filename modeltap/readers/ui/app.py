"""The local web viewer: an aiohttp app serving a JSON API over records databases and static files.

Owns: the API the page reads and its parameters (`/api/sessions`: one page of sessions, filtered,
searched and sorted on the server, or only those changed since the page's last poll; a session's
turns with its row, token ids and breaks; one turn in full; a session's export) and serving
`static/` (plain HTML, CSS and JavaScript: no build step, nothing from a CDN). Does not own: the
filters (records/query.py), several stores as one (records/stores.py), turns and their fields
(records/turns.py), export formats (modeltap/exporters), reading (records/reader.py).

The page polls the API, so it follows databases that `modeltap serve` is writing: each call opens
read-only connections off the event loop, which WAL lets run beside the writer, and a poll asks
only for the sessions whose row changed after the revisions it has seen. The viewer shows every
prompt on record, so it answers only requests addressed to a loopback name when it listens on
loopback: a web page elsewhere cannot read it through DNS rebinding.

    app = viewer_app(["node1/records.db", "node2/*.db"])      # serve with aiohttp, on 127.0.0.1
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import hdrs, web

from modeltap.compat.hosts import own_host
from modeltap.exporters.export import FORMATS, write_export
from modeltap.records.exchange import OUTCOMES
from modeltap.records.query import DEFAULT_LIMIT, SORTS, SessionQuery, parse_label
from modeltap.records.reader import StoreReader, StoreUnreadable
from modeltap.records.stores import Stores
from modeltap.records.turns import turns

STATIC = Path(__file__).parent / "static"
# The most sessions one page asks for: the page grows by DEFAULT_LIMIT at each "more".
MAX_PAGE = 5000
_STORES: web.AppKey[tuple[str, ...]] = web.AppKey("stores", tuple)
_LOOPBACK_ONLY = web.AppKey("loopback_only", bool)
# The stores being read by a request right now, each in a worker thread: stopped on shutdown, so a
# viewer asked to stop (SIGTERM) does not wait for a statement to end.
_READING: web.AppKey[set[Stores]] = web.AppKey("reading", set)
_EXPORT_TYPES = {
    "har": "application/json",
    "jsonl": "application/x-ndjson",
    "messages": "application/x-ndjson",
    "tokens": "application/x-ndjson",
    "verl": "application/x-ndjson",
    "slime": "application/x-ndjson",
}
_T = TypeVar("_T")


def viewer_app(stores: Path | str | Sequence[Path | str], *, loopback_only: bool = True) -> web.Application:
    """The viewer of the records databases `stores` names (paths or globs; a path that does not exist
    yet is waited for)."""
    app = web.Application(middlewares=[_loopback_hosts, _json_errors])
    app[_STORES] = tuple(map(str, [stores] if isinstance(stores, str | Path) else stores))
    app[_LOOPBACK_ONLY] = loopback_only
    app[_READING] = set()
    app.on_shutdown.append(_interrupt_reads)
    app.router.add_get("/", _index)
    app.router.add_get("/api/sessions", _sessions)
    app.router.add_get("/api/sessions/{session}/turns", _turns)
    app.router.add_get("/api/sessions/{session}/turns/{turn:[0-9]+}", _turn)
    app.router.add_get("/api/sessions/{session}/export/{format}", _export)
    app.router.add_static("/static/", STATIC)
    return app


@web.middleware
async def _loopback_hosts(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    host = request.headers.get(hdrs.HOST)
    if request.app[_LOOPBACK_ONLY] and not own_host(host, "127.0.0.1"):
        raise web.HTTPMisdirectedRequest(text=f"this viewer answers only on loopback names, not {host!r}")
    return await handler(request)


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The API answers in JSON, errors too (`{"error": {"message", "status"}}`): a store that cannot
    be read (StoreUnreadable names it) is a 503, never aiohttp's text/plain 500."""
    if not request.path.startswith("/api/"):
        return await handler(request)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, exc.text or exc.reason)
    except StoreUnreadable as exc:
        return _error(503, str(exc))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "status": status}}, status=status)


async def _interrupt_reads(app: web.Application) -> None:
    reading: set[Stores] = app[_READING]
    for stores in list(reading):
        stores.interrupt()


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={hdrs.CACHE_CONTROL: "no-cache"})


async def _in_thread(request: web.Request, action: Callable[[Stores], _T]) -> _T:
    """Run `action` on fresh read-only readers of the stores, in a worker thread (sqlite3 blocks)."""

    patterns: tuple[str, ...] = request.app[_STORES]
    reading = request.app[_READING]

    def run() -> _T:
        with Stores.open(patterns, missing_ok=True) as stores:
            reading.add(stores)
            try:
                return action(stores)
            finally:
                reading.discard(stores)

    return await asyncio.to_thread(run)


async def _read(request: web.Request, action: Callable[[StoreReader, str], _T]) -> _T:
    """Run `action(reader, session id)` for the session the URL names, in the store `?store=` names
    (else in the one store that has it)."""
    session, store = request.match_info["session"], request.query.get("store")

    def run(stores: Stores) -> _T:
        readers = [r for r in stores.readers if store is None or str(r.path) == store]
        if store is not None and not readers:
            raise web.HTTPNotFound(text=f"no store {store!r} is open")
        try:
            reader, session_id = Stores(readers).resolve(session)
        except ValueError as exc:
            raise web.HTTPNotFound(text=str(exc)) from None
        return action(reader, session_id)

    return await _in_thread(request, run)


async def _sessions(request: web.Request) -> web.Response:
    """One page of sessions as the query string asks (`q`: an id prefix, a label value, or K=V;
    `outcome`, `errors`, `sort`, `limit`), or with `since` ({store: revision}) only those changed
    after it; `full` says when the page had to be sent whole instead."""
    query = _query(request.query)
    since = _revisions(request.query["since"]) if "since" in request.query else None

    def run(stores: Stores) -> dict[str, Any]:
        revisions = {str(r.path): r.revision() for r in stores.readers}
        rows, full = None, since is None
        if since is not None:
            probe = dataclasses.replace(query, limit=(query.limit or MAX_PAGE) + 1)
            rows = stores.sessions(probe, [since.get(str(r.path), 0) for r in stores.readers])
            full = len(rows) > (query.limit or MAX_PAGE)
        if full:
            rows = stores.sessions(query)
        return {
            "outcomes": OUTCOMES,
            "stores": [str(r.path) for r in stores.readers],
            "waiting": [str(p) for p in stores.missing],
            "refused": stores.refused,
            "revisions": revisions,
            "full": full,
            "sessions": rows,
        }

    return web.json_response(await _in_thread(request, run))


def _revisions(text: str) -> dict[str, int]:
    """`since`: the revision of each store the page has seen, as JSON."""
    try:
        revisions = json.loads(text)
    except ValueError:
        revisions = None
    if not isinstance(revisions, dict) or not all(isinstance(v, int) for v in revisions.values()):
        raise web.HTTPBadRequest(text='since must be a JSON object of revisions, {"store": 12}')
    return revisions


def _query(params: Any) -> SessionQuery:
    search = params.get("q", "").strip()
    labels = (parse_label(search),) if "=" in search else ()
    try:
        limit = min(int(params.get("limit", DEFAULT_LIMIT)), MAX_PAGE)
        sort = params.get("sort", "time")
        return SessionQuery(
            labels=labels,
            search=None if labels or not search else search,
            outcome=params.get("outcome") or None,
            errors=params.get("errors") == "1",
            sort=sort if sort in SORTS else "time",
            limit=limit,
            unsessioned=True,
        )
    except ValueError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


async def _turns(request: web.Request) -> web.Response:
    def run(reader: StoreReader, session: str) -> dict[str, Any]:
        listed = turns(reader.exchanges(session), tokens=reader.token_turns(session))
        return {
            "session": session,
            "store": str(reader.path),
            "details": reader.session(session),
            "turns": [turn.as_json() for turn in listed],
        }

    return web.json_response(await _read(request, run))


async def _turn(request: web.Request) -> web.Response:
    session, number = request.match_info["session"], int(request.match_info["turn"])
    listed = await _read(
        request,
        lambda reader, found: turns(reader.exchanges(found), full=True, tokens=reader.token_turns(found)),
    )
    if not 1 <= number <= len(listed):
        raise web.HTTPNotFound(text=f"session {session} has no turn {number}")
    return web.json_response(listed[number - 1].as_json())


async def _export(request: web.Request) -> web.Response:
    session, fmt = request.match_info["session"], request.match_info["format"]
    if fmt not in FORMATS:
        raise web.HTTPNotFound(text=f"format must be one of {', '.join(FORMATS)}")

    def export(reader: StoreReader, found: str) -> str:
        out = io.StringIO()
        write_export(reader, found, fmt, out)
        return out.getvalue()

    try:
        text = await _read(request, export)
    except ValueError as exc:
        raise web.HTTPUnprocessableEntity(text=str(exc)) from None
    name = f"{session}.{'har' if fmt == 'har' else 'jsonl'}"
    disposition = {hdrs.CONTENT_DISPOSITION: f'attachment; filename="{name}"'}
    return web.Response(text=text, content_type=_EXPORT_TYPES[fmt], headers=disposition)
