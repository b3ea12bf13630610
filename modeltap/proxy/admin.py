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
import re
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from yarl import URL

from modeltap import dialects
from modeltap.compat.clients import presented_key
from modeltap.compat.hosts import is_loopback
from modeltap.proxy.config import check_upstream_url
from modeltap.proxy.context import CONTEXT
from modeltap.proxy.errors import BadRequest, Forbidden, NotFound, ProxyError, Unauthorized, error_bytes
from modeltap.proxy.routes import names_a_control_route
from modeltap.proxy.sessions import Session

PREFIX = "/_modeltap/sessions"
# Bounds on what opening a session may carry: generous for any real deployment, small enough that a
# session cannot bloat every record and header it lands in.
MAX_URL_CHARS = 2048
MAX_KEY_CHARS = 4096
MAX_LABELS = 64
MAX_LABEL_CHARS = 256
_VISIBLE = re.compile(r"[\x21-\x7e]+")
_LABEL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
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
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    try:
        upstream, key, labels = session_request(body)
    except ValueError as exc:
        raise BadRequest(
            f'{exc}; send {{"upstream": URL, "upstream_key": KEY, "labels": {{…}}}}, each optional'
        ) from None
    assert ctx.sharing is not None
    # With `serve --workers N`, opened in the first worker's registry and in every worker's before
    # this answers (workers.py).
    session = await ctx.sharing.open(upstream=upstream, upstream_key=key, labels=labels)
    return web.json_response(session_view(session, with_token=True), status=201)


def session_request(body: Any) -> tuple[str | None, str | None, dict[str, str]]:
    """(upstream, upstream key, labels) of a request to open a session, each checked: they end up in
    URLs, in headers sent upstream and in every record, so nothing that could break one gets in.
    Raises ValueError naming the field and what it must be."""
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object, not {type(body).__name__}")
    unknown = sorted(set(body) - {"upstream", "upstream_key", "labels"})
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}")
    upstream, key, labels = body.get("upstream"), body.get("upstream_key"), body.get("labels")
    labels = {} if labels is None else labels
    if upstream is not None:
        _check_upstream(upstream)
    if key is not None and not (
        isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS and _VISIBLE.fullmatch(key)
    ):
        raise ValueError(
            f"upstream_key must be 1 to {MAX_KEY_CHARS} visible ASCII characters (it goes in a header)"
        )
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise ValueError(f"labels must be an object of at most {MAX_LABELS} names and texts")
    for name, value in labels.items():
        if not _LABEL_NAME.fullmatch(name):
            raise ValueError(f"label name {name!r} must be 1 to 64 of A-Z a-z 0-9 _ . -")
        # Numbers are welcome (a sample index) and kept as their text, as every label is.
        text = str(value) if isinstance(value, int | float) else value
        if not (isinstance(text, str) and len(text) <= MAX_LABEL_CHARS and text.isprintable()):
            raise ValueError(f"label {name!r} must be printable text of at most {MAX_LABEL_CHARS} characters")
    return upstream, key, labels


def _check_upstream(upstream: Any) -> None:
    if not (isinstance(upstream, str) and len(upstream) <= MAX_URL_CHARS and _VISIBLE.fullmatch(upstream)):
        raise ValueError(f"upstream must be a URL of at most {MAX_URL_CHARS} visible ASCII characters")
    check_upstream_url(upstream, "upstream")
    url = URL(upstream)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"upstream must be an http(s) URL with a host, not {upstream!r}")
    if names_a_control_route(url.path):
        raise ValueError("upstream must not point at one of AReaL's control routes")


@_guarded
async def _list(request: web.Request) -> web.Response:
    sessions = request.app[CONTEXT].sessions
    return web.json_response({"sessions": [session_view(s, with_token=False) for s in sessions]})


@_guarded
async def _close(request: web.Request) -> web.Response:
    sharing = request.app[CONTEXT].sharing
    assert sharing is not None
    if not await sharing.close(request.match_info["session_id"]):
        raise NotFound(f"no open session {request.match_info['session_id']!r}")
    return web.Response(status=204)
