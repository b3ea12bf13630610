"""The admin HTTP API: open, list and close sessions at `/_modeltap/sessions`.

Owns: the admin routes and their rules: an admin key is required (compared in constant time), and by
default only loopback callers are served, because a session lends the upstream key. Does not own: the
registry itself (sessions.py).

    curl -X POST http://127.0.0.1:8080/_modeltap/sessions -H "Authorization: Bearer $ADMIN_KEY" \
         -d '{"upstream": "http://10.0.0.5:41235", "upstream_key": "…", "labels": {"task_id": "t1"}}'
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from modeltap import dialects
from modeltap.compat.clients import presented_key
from modeltap.proxy.context import CONTEXT
from modeltap.proxy.errors import BadRequest, Forbidden, NotFound, ProxyError, Unauthorized, error_bytes
from modeltap.proxy.network import is_loopback
from modeltap.proxy.sessions import Session

PREFIX = "/_modeltap/sessions"
# The admin API's errors are shaped as OpenAI's, like every modeltap route that is not Anthropic's.
_SHAPE = dialects.named("chat")


def add_routes(app: web.Application) -> None:
    app.router.add_post(PREFIX, _open)
    app.router.add_get(PREFIX, _list)
    app.router.add_delete(PREFIX + "/{session_id}", _close)


def session_view(session: Session, *, with_token: bool) -> dict[str, Any]:
    """A session as the admin API shows it; the token only in the answer to the request that opened it,
    and the upstream key never. Base URLs end in `/s/TOKEN`: OpenAI-style clients add `/v1`."""
    view: dict[str, Any] = {"id": session.id, "upstream": session.upstream, "labels": session.labels}
    if with_token:
        view |= {
            "token": session.token,
            "base_url": session.host_base_url,
            "container_base_url": session.container_base_url,
        }
    return view


def _authorize(request: web.Request) -> None:
    ctx = request.app[CONTEXT]
    if not ctx.config.admin_remote and not is_loopback(request.remote or ""):
        raise Forbidden(
            "the admin API answers only on loopback (start modeltap serve with --admin-remote to change that)"
        )
    presented = presented_key(request.headers) or ""
    if not hmac.compare_digest(presented.encode(), (ctx.admin_key or "").encode()):
        raise Unauthorized(
            "the admin API needs Authorization: Bearer <admin key> (printed by modeltap serve)"
        )


def _guarded(handler: Handler) -> Handler:
    async def wrapper(request: web.Request) -> web.StreamResponse:
        try:
            _authorize(request)
            return await handler(request)
        except ProxyError as err:
            return web.Response(
                status=err.status, body=error_bytes(err, _SHAPE), content_type="application/json"
            )

    return wrapper


@_guarded
async def _open(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict) or not isinstance(body.get("labels", {}), dict):
        raise BadRequest('send {"upstream": URL, "upstream_key": KEY, "labels": {…}}, each optional')
    upstream = body.get("upstream")
    if upstream is not None and not str(upstream).startswith(("http://", "https://")):
        raise BadRequest(f"upstream must be an http(s) URL, not {upstream!r}")
    session = ctx.sessions.open(
        upstream=upstream, upstream_key=body.get("upstream_key"), labels=body.get("labels")
    )
    return web.json_response(session_view(session, with_token=True), status=201)


@_guarded
async def _list(request: web.Request) -> web.Response:
    sessions = request.app[CONTEXT].sessions
    return web.json_response({"sessions": [session_view(s, with_token=False) for s in sessions]})


@_guarded
async def _close(request: web.Request) -> web.Response:
    if not request.app[CONTEXT].sessions.close(request.match_info["session_id"]):
        raise NotFound(f"no open session {request.match_info['session_id']!r}")
    return web.Response(status=204)
