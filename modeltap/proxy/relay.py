"""Forwards one exchange, in the fixed stages of DESIGN §3.2:

    route -> identify the session -> read the body -> budget -> rewrite headers -> relay -> record

Paths are resolved in routes.py, token budgets decided in budget.py, streams parsed in sse.py,
upstream paths and client errors handled in upstream.py, error bodies built in errors.py, and records
written by records/store.py. This module only wires them together for one request.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import HttpVersion10, hdrs, web
from multidict import CIMultiDict

from modeltap.compat.areal import messages_body_for_areal
from modeltap.compat.clients import presented_key, retry_count
from modeltap.compat.layouts import classify, parse_error
from modeltap.proxy.context import CONTEXT, ProxyContext
from modeltap.proxy.errors import (
    BadRequest,
    ClientTooSlow,
    MethodNotAllowed,
    NotFound,
    NotImplemented_,
    PayloadTooLarge,
    ProxyError,
    Unauthorized,
    UpstreamUnreachable,
    error_bytes,
)
from modeltap.proxy.routes import Dialect, Endpoint, Route, dialect_for_path, masked, resolve, session_token
from modeltap.proxy.sessions import Session
from modeltap.proxy.sse import StreamAssembler
from modeltap.proxy.upstream import Reply, Upstream
from modeltap.records.exchange import Exchange

# Never forwarded in either direction (RFC 9110 §7.6.1), plus the ones aiohttp recomputes itself.
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        hdrs.CONNECTION,
        "Keep-Alive",
        hdrs.PROXY_AUTHENTICATE,
        hdrs.PROXY_AUTHORIZATION,
        hdrs.TE,
        hdrs.TRAILER,
        hdrs.TRANSFER_ENCODING,
        hdrs.UPGRADE,
        hdrs.HOST,
        hdrs.CONTENT_LENGTH,
    )
)
# The client's credentials; replaced by the session's upstream key, or passed through untouched when
# no key is configured.
_CREDENTIALS = frozenset(("authorization", "x-api-key"))
# aiohttp decodes gzip and deflate on its own; asking the upstream for only these keeps every body
# readable for the record (Claude Code asks for br and zstd too: agent-clients.md).
UPSTREAM_ACCEPT_ENCODING = "gzip, deflate"
# Response headers that describe the upstream's encoding or framing, which the relay changes.
_RESPONSE_DROP = _HOP_BY_HOP | {"content-encoding", "date", "server"}
# An upstream error message is kept for the record up to this size (AReaL can put a whole prompt in one).
RESPONSE_TEXT_MAX_CHARS = 16 * 1024
# Session hints agents already send (peer-proxies.md §6): they group anonymous traffic by agent run.
_SESSION_HINTS = (("x-claude-code-session-id", "claude-code"), ("x-session-id", "opencode"))
_HINT_SAFE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# Traffic with no session token and no client hint; distinct from the "default" session `serve` opens.
ANONYMOUS_SESSION = "anonymous"
_SESSION_GONE = (
    "this session token is unknown, expired or closed: ask whoever gave you the URL for a new session"
)


@dataclass(slots=True)
class Target:
    """Where and with which credentials one request goes upstream."""

    upstream: Upstream
    key: str | None
    pass_client_credentials: bool
    session: Session | None


async def handle(request: web.Request) -> web.StreamResponse:
    """The aiohttp handler for every relayed path."""
    ctx = request.app[CONTEXT]
    token = session_token(request.path)
    ex = Exchange(
        method=request.method,
        path=_recorded_path(request),
        user_agent=request.headers.get(hdrs.USER_AGENT),
        retry_count=retry_count(request.headers),
    )
    dialect = dialect_for_path(request.path)
    recorded = False

    async def record() -> None:
        nonlocal recorded
        if not recorded:
            recorded = True
            ex.ended = time.time()
            await ctx.store.submit(ex, wait=ctx.config.sync)

    try:
        if request.version < HttpVersion10:
            # aiohttp reads a request line without a version as HTTP/0.9 yet still takes the lines after
            # it as headers, so a raw CR LF in a URL would turn the URL's tail into headers we forward.
            raise BadRequest("modeltap speaks HTTP/1.0 and later; the request line has no HTTP version")
        route = resolve(request.path)
        dialect = route.endpoint.dialect
        ex.endpoint = route.endpoint.value
        response = await _exchange(ctx, request, route, ex, record)
        ex.status = ex.status or response.status
    except ProxyError as err:
        if ex.session_id is None:
            # A session asking for a control route is worth finding in its own records.
            _note_session(ex, ctx.sessions.by_token(token or presented_key(request.headers) or ""))
        response = _error_response(err, dialect, ex)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels the handler): the upstream request was cancelled with
        # us. The record must outlive this handler, so its owner writes it.
        ex.client_disconnected = True
        ex.fail("client_disconnect", "the client closed the connection before the response was complete")
        if not recorded:
            recorded = True
            ex.ended = time.time()
            ctx.tasks.spawn(ctx.store.submit(ex), "record-disconnected")
        raise
    await record()
    return response


async def _exchange(
    ctx: ProxyContext, request: web.Request, route: Route, ex: Exchange, record: Callable[[], Awaitable[None]]
) -> web.StreamResponse:
    endpoint = route.endpoint
    if request.method != endpoint.method:
        raise MethodNotAllowed(f"use {endpoint.method} for {endpoint.value}, not {request.method}")
    target = _identify(ctx, request, route)
    if target.session is not None:
        _note_session(ex, target.session)
    else:
        ex.session_id = _session_hint(request)
    body = await _read_body(ctx, request, ex) if endpoint.method == "POST" else None
    if endpoint is Endpoint.COUNT_TOKENS and ctx.budget is not None and body is not None:
        return web.json_response(await ctx.budget.count_tokens_body(body))
    payload = ex.request if body is not None else None
    if ctx.budget is not None and endpoint.budgeted and body is not None:
        decision = await ctx.budget.apply(endpoint, body, ex.request)
        ex.budget = decision.as_record()
        if decision.error is not None:
            raise decision.error
        if decision.body is not None:
            ex.sent = decision.body
            payload = json.dumps(decision.body).encode()
    if endpoint is Endpoint.MESSAGES and target.upstream.areal_like and body is not None:
        fixed = messages_body_for_areal(ex.sent if ex.sent is not None else body)
        if fixed is not None:
            ex.sent = fixed
            payload = json.dumps(fixed).encode()
    try:
        reply = await target.upstream.send(
            endpoint,
            request.method,
            # As sent: the decoded form would turn an encoded `&`, `#` or CRLF into syntax.
            request.rel_url.raw_query_string,
            _upstream_headers(request, target, endpoint.dialect is Dialect.ANTHROPIC),
            payload,
            # Quoted: a model id `%2E%2E` (sent as `%252E%252E`) would otherwise climb out of /models.
            f"/{quote(route.model_id, safe='')}" if route.model_id else "",
        )
    except NotFound:
        if endpoint is Endpoint.MODELS:
            return _local_models(ctx, route.model_id)
        if endpoint is Endpoint.COUNT_TOKENS:
            raise NotImplemented_(
                "count_tokens needs the served model's tokenizer: start modeltap serve with --tokenizer "
                "(the upstream does not serve it either)"
            ) from None
        raise
    ex.upstream_url = reply.url
    ex.status = reply.response.status
    # Only the generating endpoints stream; anything else that claims to is relayed whole.
    if reply.response.content_type == "text/event-stream" and endpoint.budgeted:
        return await _relay_stream(ctx, request, target.upstream, reply, ex, record)
    return await _relay_body(target.upstream, reply, ex)


def _identify(ctx: ProxyContext, request: web.Request, route: Route) -> Target:
    """Stage 2: the session, the upstream and the credentials for this request (DESIGN §3.2)."""
    config = ctx.config
    if route.session_token is not None:
        session = ctx.sessions.by_token(route.session_token)
        if session is None:
            raise Unauthorized(_SESSION_GONE)
    else:
        presented = presented_key(request.headers)
        session = ctx.sessions.by_token(presented) if presented else None
        # A closed session's token is not the client's own key: passing it upstream would leak it.
        if session is None and presented and ctx.sessions.was_closed(presented):
            raise Unauthorized(_SESSION_GONE)
    if session is not None:
        url = session.upstream or config.upstream
        key = session.upstream_key if session.upstream_key is not None else config.upstream_key
        if url is None:
            raise UpstreamUnreachable(f"session {session.id} has no upstream and modeltap has no --upstream")
        return Target(ctx.upstream(url), key, False, session)
    if config.upstream is None:
        raise UpstreamUnreachable(
            "modeltap has no default upstream: start it with --upstream URL, or use a session URL"
        )
    if config.upstream_key is None:
        return Target(ctx.upstream(config.upstream), None, True, None)
    if ctx.loopback_only or config.lend_key_to_anonymous:
        return Target(ctx.upstream(config.upstream), config.upstream_key, False, None)
    raise Unauthorized(
        "modeltap listens beyond loopback and lends its upstream key only to session tokens: use the "
        "session base URL printed by `modeltap serve` (…/s/TOKEN), or open a session with "
        "POST /_modeltap/sessions"
    )


def _recorded_path(request: web.Request) -> str:
    """The path for the record: decoded, so that a token sent percent-encoded is masked too, with the
    query as sent."""
    path = masked(request.path)
    query = request.rel_url.raw_query_string
    return f"{path}?{query}" if query else path


def _note_session(ex: Exchange, session: Session | None) -> None:
    if session is not None:
        ex.session_id, ex.labels = session.id, dict(session.labels)


def _session_hint(request: web.Request) -> str:
    for header, client in _SESSION_HINTS:
        value = request.headers.get(header)
        if value and _HINT_SAFE.match(value):
            return f"{client}:{value}"
    return ANONYMOUS_SESSION


async def _read_body(ctx: ProxyContext, request: web.Request, ex: Exchange) -> dict[str, Any]:
    """Stage 3: the body, read once and parsed once, kept as received for the record."""
    limit = ctx.config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the request body is {request.content_length} bytes; the limit is {limit}")
    try:
        if request.content.is_eof():  # the whole body is already buffered: no wait to time
            ex.request = await request.read()
        else:
            async with asyncio.timeout(ctx.config.client_timeout_s):
                ex.request = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"the request body is over the limit of {limit} bytes") from None
    except TimeoutError:
        raise ClientTooSlow(
            f"the request body did not arrive within {ctx.config.client_timeout_s:g} s"
        ) from None
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if declared is not None and not _is_json_type(request.content_type):
        raise BadRequest(f"Content-Type must be application/json, not {declared!r}")
    try:
        body = json.loads(ex.request)
    except RecursionError:
        raise BadRequest("the request body is JSON nested too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    ex.request_json = body
    return body


def _is_json_type(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def _upstream_headers(request: web.Request, target: Target, anthropic: bool) -> CIMultiDict[str]:
    """Stage 4: the client's headers less hop-by-hop ones, with the upstream's credentials."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in _HOP_BY_HOP or lower == "accept-encoding":
            continue
        if lower in _CREDENTIALS and not target.pass_client_credentials:
            continue
        out.add(name, value)
    out[hdrs.ACCEPT_ENCODING] = UPSTREAM_ACCEPT_ENCODING
    if target.key is not None:
        out[hdrs.AUTHORIZATION] = f"Bearer {target.key}"
        if anthropic:
            out["x-api-key"] = target.key
    return out


def _response_headers(reply: Reply) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in reply.response.headers.items() if k.lower() not in _RESPONSE_DROP)


async def _relay_body(upstream: Upstream, reply: Reply, ex: Exchange) -> web.Response:
    """Stage 5, non-streamed: the body as the upstream sent it (decoded), noted for the record."""
    body = reply.body if reply.body is not None else await upstream.read(reply.response)
    ex.first_byte = time.time()
    ex.response_body = body  # parsed for the record by the store's writer, not here
    if reply.response.status >= 400:
        ex.fail(
            classify(reply.response.status, body),
            parse_error(reply.response.status, body).message[:RESPONSE_TEXT_MAX_CHARS],
        )
    return web.Response(status=reply.response.status, body=body, headers=_response_headers(reply))


async def _relay_stream(
    ctx: ProxyContext,
    request: web.Request,
    upstream: Upstream,
    reply: Reply,
    ex: Exchange,
    record: Callable[[], Awaitable[None]],
) -> web.StreamResponse:
    """Stage 5, streamed: every chunk to the client as it arrives, a copy to the assembler."""
    ex.streamed = True
    assembler = StreamAssembler(ex.endpoint or "")
    raw: list[bytes] | None = [] if ctx.config.keep_raw_sse else None
    response = web.StreamResponse(status=reply.response.status, headers=_response_headers(reply))
    await response.prepare(request)
    try:
        async for chunk in upstream.chunks(reply.response):
            if ex.first_byte is None:
                ex.first_byte = time.time()
            await response.write(chunk)
            assembler.feed(chunk)
            if raw is not None:
                raw.append(chunk)
    except ProxyError as err:
        upstream_broke = True
        ex.fail(err.error_class, f"the upstream stream broke: {err.message}")
    except ConnectionError:
        ex.client_disconnected = True
        ex.fail("client_disconnect", "the client closed the connection mid-stream")
    else:
        upstream_broke = False
    result = assembler.result()
    ex.response, ex.stream_complete = result.body, result.complete
    if raw is not None:
        ex.raw_sse = b"".join(raw)
    if result.error is not None:
        ex.fail("upstream_error", result.error)
    await record()
    if upstream_broke and request.transport is not None:
        # Pass the break on: a clean end would read as a complete (if short) answer to SDKs that do
        # not check for the final event (the openai SDK ends such a stream silently).
        request.transport.abort()
    elif not ex.client_disconnected:
        try:
            await response.write_eof()
        except ConnectionError:
            ex.client_disconnected = True
    return response


def _local_models(ctx: ProxyContext, model_id: str | None) -> web.Response:
    """GET /v1/models when the upstream has none (AReaL: areal-proxy-protocol.md §1.1), from --model.

    One body satisfies both SDKs: OpenAI's `{"object": "list", "data": [...]}` and Anthropic's
    `{"data": [...], "has_more", "first_id", "last_id"}` (agent-clients.md, "Other endpoints").
    """
    names = [ctx.config.model] if ctx.config.model else []
    cards = [
        {
            "id": name,
            "object": "model",
            "type": "model",
            "display_name": name,
            "created": int(ctx.started),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ctx.started)),
            "owned_by": "modeltap",
        }
        for name in names
    ]
    if model_id is not None:
        card = next((c for c in cards if c["id"] == model_id), None)
        if card is None:
            raise NotFound(
                f"no model {model_id!r} here; modeltap serves {names or 'no model (give --model)'}"
            )
        return web.json_response(card)
    first, last = (cards[0]["id"], cards[-1]["id"]) if cards else (None, None)
    return web.json_response(
        {"object": "list", "data": cards, "has_more": False, "first_id": first, "last_id": last}
    )


def _error_response(err: ProxyError, dialect: Dialect, ex: Exchange) -> web.Response:
    """A proxy-made error in the client's dialect, noted on the record."""
    ex.status = err.status
    ex.fail(err.error_class, err.message)
    body = error_bytes(err, dialect is Dialect.ANTHROPIC)
    ex.response = json.loads(body)
    return web.Response(status=err.status, body=body, content_type="application/json")
