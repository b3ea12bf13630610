"""The local web viewer: an aiohttp app serving a JSON API over a records database and static files.

Owns: the API the page reads (`/api/sessions`, a session's turns with their token ids and breaks, one
turn in full, a session's export) and serving `static/` (plain HTML, CSS and JavaScript: no build
step, nothing from a CDN).
Does not own: turns and their fields (view.py), export formats (export.py), reading (store.py).

The page polls the API, so it follows a database that `modeltap serve` is writing: each call opens a
read-only connection off the event loop, which WAL lets run beside the writer. The viewer shows
every prompt on record, so it answers only requests addressed to a loopback name when it listens on
loopback: a web page elsewhere cannot read it through DNS rebinding.

    app = viewer_app(".modeltap/records.db")      # serve with aiohttp, on 127.0.0.1
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from aiohttp import hdrs, web

from modeltap.records.export import FORMATS, write_export
from modeltap.records.store import StoreReader
from modeltap.records.view import turns

STATIC = Path(__file__).parent / "static"
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
_STORE = web.AppKey("store", Path)
_LOOPBACK_ONLY = web.AppKey("loopback_only", bool)
_EXPORT_TYPES = {
    "har": "application/json",
    "jsonl": "application/x-ndjson",
    "messages": "application/x-ndjson",
    "tokens": "application/x-ndjson",
}
_T = TypeVar("_T")


def viewer_app(store: Path | str, *, loopback_only: bool = True) -> web.Application:
    """The viewer of the records database at `store` (which may not exist yet: the page waits)."""
    app = web.Application(middlewares=[_loopback_hosts])
    app[_STORE] = Path(store)
    app[_LOOPBACK_ONLY] = loopback_only
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
    host = request.url.host or ""
    if request.app[_LOOPBACK_ONLY] and host not in _LOOPBACK_NAMES:
        raise web.HTTPMisdirectedRequest(text=f"this viewer answers only on loopback names, not {host!r}")
    return await handler(request)


async def _index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={hdrs.CACHE_CONTROL: "no-cache"})


async def _read(request: web.Request, action: Callable[[StoreReader], _T]) -> _T:
    """Run `action` on a fresh read-only reader in a worker thread (sqlite3 blocks)."""

    def run() -> _T:
        with StoreReader(request.app[_STORE]) as reader:
            return action(reader)

    return await asyncio.to_thread(run)


async def _sessions(request: web.Request) -> web.Response:
    store = request.app[_STORE]
    try:
        sessions = await _read(request, lambda reader: reader.sessions())
    except FileNotFoundError:
        return web.json_response({"store": str(store), "waiting": True, "sessions": []})
    return web.json_response({"store": str(store), "waiting": False, "sessions": sessions})


async def _turns(request: web.Request) -> web.Response:
    session = request.match_info["session"]
    listed = await _read(
        request, lambda reader: turns(reader.exchanges(session), tokens=reader.token_turns(session))
    )
    return web.json_response({"session": session, "turns": listed})


async def _turn(request: web.Request) -> web.Response:
    session, number = request.match_info["session"], int(request.match_info["turn"])
    listed = await _read(
        request,
        lambda reader: turns(reader.exchanges(session), full=True, tokens=reader.token_turns(session)),
    )
    if not 1 <= number <= len(listed):
        raise web.HTTPNotFound(text=f"session {session} has no turn {number}")
    return web.json_response(listed[number - 1])


async def _export(request: web.Request) -> web.Response:
    session, fmt = request.match_info["session"], request.match_info["format"]
    if fmt not in FORMATS:
        raise web.HTTPNotFound(text=f"format must be one of {', '.join(FORMATS)}")

    def export(reader: StoreReader) -> str:
        out = io.StringIO()
        write_export(reader, session, fmt, out)
        return out.getvalue()

    try:
        text = await _read(request, export)
    except ValueError as exc:
        raise web.HTTPUnprocessableEntity(text=str(exc)) from None
    name = f"{session}.{'har' if fmt == 'har' else 'jsonl'}"
    disposition = {hdrs.CONTENT_DISPOSITION: f'attachment; filename="{name}"'}
    return web.Response(text=text, content_type=_EXPORT_TYPES[fmt], headers=disposition)
