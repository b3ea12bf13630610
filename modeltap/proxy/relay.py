"""Forwards one exchange, in fixed stages:

    route -> identify the session -> read the body -> budget -> rewrite headers -> relay -> seal

Paths are resolved in routes.py, every format's particulars asked of its dialect (modeltap.dialects),
token budgets decided in budget.py, what to ask an engine for its token ids (or render) in
token_recorder.py, streams assembled in dialects/sse.py, upstream paths and client errors handled in
upstream.py, a format the upstream does not serve translated through chat and a stream made for a
client that asked for one in translate.py, and the sealed exchange handed to the observers
(observers.py; the record store is the first). This module only wires them together for one request,
and is the one boundary for failures: whatever a stage did not expect is answered 500 in the client's
shape and recorded as `proxy_error`, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

from aiohttp import HttpVersion10, hdrs, web
from multidict import CIMultiDict

from modeltap import dialects
from modeltap.compat.clients import credential_values, presented_key, retry_count
from modeltap.compat.layouts import classify, parse_error
from modeltap.dialects.base import Dialect
from modeltap.proxy.context import CONTEXT, ProxyContext
from modeltap.proxy.errors import (
    BadRequest,
    ClientTooSlow,
    InternalError,
    MethodNotAllowed,
    NotFound,
    NotImplemented_,
    PayloadTooLarge,
    ProxyError,
    Unauthorized,
    UnsupportedMediaType,
    UpstreamUnreachable,
    error_bytes,
)
from modeltap.proxy.naming import NamingError, client_labels, names_for
from modeltap.proxy.routes import Route, masked, resolve, session_token
from modeltap.proxy.sessions import Session
from modeltap.proxy.token_recorder import TokenIdRecorder, with_fields
from modeltap.proxy.translate import CHAT, StreamTap, Translation, Untouched, synthesised
from modeltap.proxy.upstream import Reply, Upstream
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, ExchangeDraft

log = logging.getLogger(__name__)

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
# The client's credentials (and cookies, which may be one); replaced by the session's upstream key, or
# passed through untouched when no key is configured.
_CREDENTIALS = frozenset(("authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie"))
# Headers some servers take as the path to serve, which would let a client reach a route modeltap
# refused (an AReaL control route) behind one it allowed.
_PATH_OVERRIDES = frozenset(("x-original-url", "x-rewrite-url"))
# The relay forwards the body it read, decoded: the client's encoding no longer describes it.
_BODY_FRAMING = frozenset(("content-encoding",))
# Request body encodings modeltap inflates (off the event loop, the body limit applied to the inflated
# size), each with its zlib window: gzip's header, or zlib's (HTTP "deflate").
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Inflated in slices of this size, so a bomb is stopped at the limit and never held whole.
INFLATE_SLICE_BYTES = 1024 * 1024
# aiohttp decodes gzip and deflate on its own; asking the upstream for only these keeps every body
# readable for the record (Claude Code asks for br and zstd too: docs/agents.md §4.3).
UPSTREAM_ACCEPT_ENCODING = "gzip, deflate"
# Response headers that describe the upstream's encoding or framing, which the relay changes.
_RESPONSE_DROP = _HOP_BY_HOP | {"content-encoding", "date", "server"}
# The header every budgeted answer carries: what the budget decided, in a few characters.
BUDGET_HEADER = "x-modeltap-budget"
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


class _Flow:
    """One request on its way through the stages: the draft of its exchange, the dialect its errors
    are shaped in, and the streamed response once it has begun (after which no error can change the
    status). The exchange is handed to the observers once, by `deliver`; with `render_ids`, after the
    token ids of a successful answer are rendered (the upstream returns none)."""

    __slots__ = ("ctx", "delivered", "dialect", "draft", "render_ids", "request", "stream")

    def __init__(self, ctx: ProxyContext, request: web.Request) -> None:
        self.ctx = ctx
        self.request = request
        self.dialect: Dialect = dialects.for_error(request.path)
        self.draft = ExchangeDraft(
            method=request.method,
            path=ctx.sessions.mask(_recorded_path(request)),
            user_agent=request.headers.get(hdrs.USER_AGENT),
            retry_count=retry_count(request.headers),
        )
        self.stream: web.StreamResponse | None = None
        self.delivered = False
        self.render_ids = False

    async def deliver(self) -> None:
        """Seal the exchange and hand it to the observers, once."""
        if not self.delivered:
            self.delivered = True
            draft, recorder = self.draft, self.ctx.token_ids
            if self.render_ids and recorder is not None and draft.status == 200 and draft.error_class is None:
                # What went upstream and what came back, in the upstream's format (chat, translated).
                sent = draft.sent if draft.sent is not None else draft.request_json or {}
                upstream = dialects.named(draft.translated) if draft.translated else self.dialect
                answer = draft.received if draft.translated else draft.response
                reply: dict[str, Any] | bytes | None = answer if answer is not None else draft.response_body
                draft.token_ids = await recorder.render(upstream, sent, reply)
            await self.ctx.observers.exchange(draft.seal())

    def deliver_later(self) -> None:
        """The same, from a handler that is being cancelled: the proxy's task owner does it."""
        self.delivered = True
        self.ctx.tasks.spawn(self.ctx.observers.exchange(self.draft.seal()), "record-disconnected")


async def handle(request: web.Request) -> web.StreamResponse:
    """The aiohttp handler for every relayed path."""
    flow = _Flow(request.app[CONTEXT], request)
    draft = flow.draft
    try:
        response = await _exchange(flow)
        if draft.status is None:
            draft.status = response.status
    except ProxyError as err:
        if draft.session_id is None:
            # A session asking for a control route is worth finding in its own records.
            token = session_token(request.path) or presented_key(request.headers) or ""
            _note_session(flow, flow.ctx.sessions.by_token(token))
        response = _error_response(flow, err)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels the handler): the upstream request was cancelled with
        # us. The record must outlive this handler, so its owner delivers it.
        if not flow.delivered:
            draft.client_disconnected = True
            draft.fail(
                "client_disconnect", "the client closed the connection before the response was complete"
            )
            flow.deliver_later()
        raise
    except Exception as exc:  # the boundary: anything a stage did not expect, answered and recorded
        log.exception("modeltap failed on %s %s (exchange %s)", request.method, draft.path, draft.id)
        response = _unexpected(flow, exc)
    await flow.deliver()
    return response


async def _exchange(flow: _Flow) -> web.StreamResponse:
    request, ctx, draft = flow.request, flow.ctx, flow.draft
    if request.version < HttpVersion10:
        # aiohttp reads a request line without a version as HTTP/0.9 yet still takes the lines after
        # it as headers, so a raw CR LF in a URL would turn the URL's tail into headers we forward.
        raise BadRequest("modeltap speaks HTTP/1.0 and later; the request line has no HTTP version")
    route = resolve(request.path)
    dialect = flow.dialect = route.dialect
    draft.endpoint = dialect.name
    if request.method != dialect.method:
        raise MethodNotAllowed(f"use {dialect.method} for {dialect.route}, not {request.method}")
    target = _identify(ctx, request, route)
    _note_session(flow, target.session)
    authenticated = target.session is not None or ctx.loopback_only
    body = await _read_body(flow, authenticated) if dialect.method == "POST" else None
    try:
        names = names_for(
            request.headers,
            target.session,
            loopback_only=ctx.loopback_only,
            anonymous=ctx.anonymous,
            dialect=dialect,
            body=body,
        )
    except NamingError as exc:
        raise BadRequest(str(exc)) from None
    draft.session_id, draft.labels = names.session_id, names.labels
    if dialect.counts_prompt and ctx.budget is not None and body is not None:
        return web.json_response(await ctx.budget.count_answer(dialect, body))
    translate = body is not None and target.upstream.translates(dialect)
    return await _forward(flow, target, route, body, translate)


async def _forward(
    flow: _Flow, target: Target, route: Route, body: dict[str, Any] | None, translate: bool
) -> web.StreamResponse:
    """Budget, send and relay one request: as it is, or (`translate`) as OpenAI chat to an upstream
    that does not serve its format. Under `auto`, a format no upstream path serves is translated from
    then on, starting with this request."""
    ctx, draft, dialect = flow.ctx, flow.draft, flow.dialect
    translation = None
    if translate and body is not None:
        translation = Translation.start(dialect, body, ctx.chains, draft.session_id)
        draft.translated = CHAT.name
    payload = await _payload(flow, target, body, translation)
    upstream_dialect = CHAT if translation else dialect
    extra: Mapping[str, str] = {}
    if (
        ctx.token_ids is not None
        and payload is not None
        and upstream_dialect.completion_field({}) is not None
    ):
        payload, extra = await _ask_token_ids(flow, ctx.token_ids, target, upstream_dialect, payload)
    try:
        reply = await _send(flow, target, route, payload, upstream_dialect, extra)
    except NotFound as err:
        if translation is None and body is not None and target.upstream.translate_from_now_on(dialect):
            return await _forward(flow, target, route, body, translate=True)
        return _not_served(flow, route, err)
    draft.upstream_url = ctx.sessions.mask(reply.url)
    draft.status = reply.response.status
    if translation is not None:
        return await _relay_translated(flow, target.upstream, reply, translation)
    # Only the generating formats stream; anything else that claims to is relayed whole.
    if reply.response.content_type == "text/event-stream" and dialect.streams:
        return await _relay_stream(flow, target.upstream, reply, Untouched(dialect))
    if body is not None and body.get("stream") is True and dialect.streams and reply.response.status == 200:
        return await _relay_synthesised(flow, target.upstream, reply, body)
    return await _relay_body(flow, target.upstream, reply)


async def _payload(
    flow: _Flow, target: Target, body: dict[str, Any] | None, translation: Translation | None
) -> bytes | None:
    """The bytes that go upstream: the body as received unless the budget clamped it, AReaL needs it
    rewritten, or it is translated (then its chat form, which is what the budget counts)."""
    ctx, draft = flow.ctx, flow.draft
    if body is None:
        return None
    dialect, sent, raw = flow.dialect, body, draft.request
    if translation is not None:
        # No memo for a translated body: its bytes are the client's, not what is counted.
        dialect, sent, raw = CHAT, translation.chat_body, b""
        draft.sent = sent
    payload = draft.request if translation is None else None
    if ctx.budget is not None and dialect.completion_field(sent) is not None:
        decision = await ctx.budget.apply(dialect, sent, raw or None, refuse_as=flow.dialect)
        draft.budget = decision.as_record()
        if decision.error is not None:
            raise decision.error
        if decision.body is not None:
            sent = draft.sent = decision.body
            payload = None
    if target.upstream.areal_like:
        fixed = dialect.areal_body(sent)
        if fixed is not None:
            sent = draft.sent = fixed
            payload = None
    if translation is not None:
        translation.chat_body = sent
    return payload if payload is not None else json.dumps(sent).encode()


async def _ask_token_ids(
    flow: _Flow, recorder: TokenIdRecorder, target: Target, dialect: Dialect, payload: bytes
) -> tuple[bytes, Mapping[str, str]]:
    """`payload` (a request of `dialect`, as it goes upstream) and the extra headers that ask the
    upstream's engine for its token ids; or, when it returns none, the payload as it is and the
    exchange marked for rendering."""
    draft = flow.draft
    body = draft.sent if draft.sent is not None else draft.request_json or {}
    probe = {"Authorization": f"Bearer {target.key}"} if target.key else {}
    if not probe and target.pass_client_credentials and hdrs.AUTHORIZATION in flow.request.headers:
        probe = {"Authorization": flow.request.headers[hdrs.AUTHORIZATION]}
    engine, ask = await recorder.ask(dialect, body, target.upstream, probe)
    if ask is None:
        flow.render_ids = recorder.renders
        draft.token_ask = "rendered" if recorder.renders else None
        return payload, {}
    draft.token_ask = f"{engine.name}: {', '.join([*ask.fields, *ask.headers])}"
    return with_fields(payload, body, ask.fields), ask.headers


async def _send(
    flow: _Flow,
    target: Target,
    route: Route,
    payload: bytes | None,
    dialect: Dialect,
    extra: Mapping[str, str],
) -> Reply:
    """The upstream's reply for `dialect`'s route (the client's, or chat for a translation), with the
    `extra` headers the token-id stage asks for. Raises NotFound when the upstream does not serve the
    route."""
    request = flow.request
    headers = _upstream_headers(request, target, dialect, translated=dialect is not flow.dialect)
    headers.update(extra)
    return await target.upstream.send(
        dialect,
        request.method,
        _forwarded_query(flow),
        headers,
        payload,
        # Quoted: a model id `%2E%2E` (sent as `%252E%252E`) would otherwise climb out of /models.
        f"/{quote(route.item, safe='')}" if route.item else "",
    )


def _not_served(flow: _Flow, route: Route, err: NotFound) -> web.StreamResponse:
    """modeltap's own answer when the upstream does not serve the route, or its NotFound `err`."""
    ctx, dialect = flow.ctx, flow.dialect
    served = [ctx.config.model] if ctx.config.model else []
    answer = dialect.local_answer(served, ctx.started, route.item)
    if answer is not None:
        return web.json_response(answer)
    if route.item is not None:
        raise NotFound(f"no model {route.item!r} here; modeltap serves {served or 'no model (give --model)'}")
    if dialect.counts_prompt:
        raise NotImplemented_(
            f"{dialect.route} needs the served model's tokenizer: start modeltap serve with "
            "--tokenizer (the upstream does not serve it either)"
        )
    raise err


def _identify(ctx: ProxyContext, request: web.Request, route: Route) -> Target:
    """The session, the upstream and the credentials for this request."""
    config = ctx.config
    if route.session_token is not None:
        session = ctx.sessions.by_token(route.session_token)
        if session is None:
            raise Unauthorized(_SESSION_GONE)
    else:
        session = None
        # Every credential header is looked at, in any scheme: a session token presented beside
        # another key, or as `Token TOKEN`, is still ours and must never go upstream as the client's.
        for presented in credential_values(request.headers):
            session = ctx.sessions.by_token(presented)
            if session is not None:
                break
            if ctx.sessions.was_closed(presented):
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


def _note_session(flow: _Flow, session: Session | None) -> None:
    if session is not None:
        flow.draft.session_id = session.id
        flow.draft.labels = client_labels(flow.request.headers) | session.labels


async def _read_body(flow: _Flow, authenticated: bool) -> dict[str, Any]:
    """The body, read once and parsed once, kept as received (inflated) for the record. A compressed
    body is inflated only for an `authenticated` caller (a session token, or a loopback listener), off
    the event loop, and never past the body limit."""
    request, draft, config = flow.request, flow.draft, flow.ctx.config
    limit = config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"the request body is {request.content_length} bytes; the limit is {limit}")
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if encoding not in ("identity", "") and encoding not in _INFLATE_WBITS:
        raise UnsupportedMediaType(
            f"Content-Encoding {encoding!r} is not accepted: send the body as it is, gzip or deflate"
        )
    if encoding in _INFLATE_WBITS and not authenticated:
        raise Unauthorized(
            "a compressed request body needs a session token (…/s/TOKEN): modeltap inflates only "
            "what a known client sends"
        )
    try:
        if request.content.is_eof():  # the whole body is already buffered: no wait to time
            raw = await request.read()
        else:
            async with asyncio.timeout(config.client_timeout_s):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"the request body is over the limit of {limit} bytes") from None
    except TimeoutError:
        raise ClientTooSlow(f"the request body did not arrive within {config.client_timeout_s:g} s") from None
    draft.request = (
        raw if encoding not in _INFLATE_WBITS else await asyncio.to_thread(inflate, raw, encoding, limit)
    )
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if declared is not None and not _is_json_type(request.content_type):
        raise BadRequest(f"Content-Type must be application/json, not {declared!r}")
    try:
        body = json.loads(draft.request)
    except RecursionError:
        raise BadRequest("the request body is JSON nested too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    draft.request_json = body
    try:
        flow.dialect.check(body)
    except ValueError as exc:
        raise BadRequest(f"this {flow.dialect.name} request cannot be read: {exc}") from None
    return body


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` inflated, slice by slice, refused as soon as it passes `limit` bytes (a 2 MB gzip bomb
    stops at the limit instead of costing gigabytes). Blocking: run it off the event loop."""
    inflater = zlib.decompressobj(_INFLATE_WBITS[encoding])
    out, size, pending = [], 0, data
    try:
        while pending and not inflater.eof:
            piece = inflater.decompress(pending, INFLATE_SLICE_BYTES)
            pending = inflater.unconsumed_tail
            size += len(piece)
            if size > limit:
                raise PayloadTooLarge(f"the request body inflates past the limit of {limit} bytes")
            out.append(piece)
    except zlib.error as exc:
        raise BadRequest(f"the request body is not valid {encoding}: {exc}") from None
    if not inflater.eof:
        raise BadRequest(f"the request body is not valid {encoding}: it ends before its stream does")
    return b"".join(out)


def _forwarded_query(flow: _Flow) -> str:
    """The query as sent (the decoded form would turn an encoded `&`, `#` or CRLF into syntax), less
    any parameter carrying a known session token: a token never goes upstream, wherever it was put."""
    query = flow.request.rel_url.raw_query_string
    if not query or flow.ctx.sessions.mask(query) == query:
        return query
    kept = [
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if flow.ctx.sessions.mask(k + v) == k + v
    ]
    return urlencode(kept)


def _is_json_type(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


def _upstream_headers(
    request: web.Request, target: Target, dialect: Dialect, translated: bool = False
) -> CIMultiDict[str]:
    """The client's headers less hop-by-hop ones (those `Connection` names too, RFC 9110 §7.6.1), path
    overrides and the body's encoding, with the upstream's credentials. A translated request carries
    the client's own key, when it is passed through, where `dialect` (chat) puts keys: Claude Code's
    x-api-key would be refused by a server that reads only Bearer (AReaL's gateway, docs/areal.md §1.2)."""
    named = {
        token.strip().lower()
        for token in request.headers.getall(hdrs.CONNECTION, ())
        for token in token.split(",")
    }
    dropped = _HOP_BY_HOP | _PATH_OVERRIDES | _BODY_FRAMING | named | {"accept-encoding"}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in dropped or (lower in _CREDENTIALS and not target.pass_client_credentials):
            continue
        out.add(name, value)
    out[hdrs.ACCEPT_ENCODING] = UPSTREAM_ACCEPT_ENCODING
    key = target.key
    if key is None and translated and target.pass_client_credentials:
        key = presented_key(request.headers)
        for name in _CREDENTIALS - {"cookie"}:
            out.popall(name, None)
    if key is not None:
        out.update(dialect.credential_headers(key))
    return out


def _response_headers(flow: _Flow, reply: Reply) -> CIMultiDict[str]:
    """The upstream's headers less those that described its framing, and the budget's decision."""
    kept = ((k, v) for k, v in reply.response.headers.items() if k.lower() not in _RESPONSE_DROP)
    headers: CIMultiDict[str] = CIMultiDict(kept)
    headers.update(_budget_header(flow))
    return headers


def _budget_header(flow: _Flow) -> dict[str, str]:
    """`x-modeltap-budget: clamped 4000->3086` on every answer the budget decided on."""
    budget = flow.draft.budget
    return {BUDGET_HEADER: budget["summary"]} if budget else {}


async def _relay_body(flow: _Flow, upstream: Upstream, reply: Reply) -> web.Response:
    """Non-streamed: the body as the upstream sent it (decoded), noted for the record."""
    draft = flow.draft
    body = reply.body if reply.body is not None else await upstream.read(reply.response)
    draft.first_byte = time.time()
    draft.response_body = body  # parsed for the record by the store's writer, not here
    status = reply.response.status
    if status >= 400:
        draft.fail(classify(status, body), parse_error(status, body).message[:RESPONSE_TEXT_MAX_CHARS])
    return web.Response(status=status, body=body, headers=_response_headers(flow, reply))


async def _relay_stream(flow: _Flow, upstream: Upstream, reply: Reply, tap: StreamTap) -> web.StreamResponse:
    """Streamed: every chunk to the client as it arrives (through `tap`: as it is, or translated), a
    copy to the assembler. What arrived is recorded however the stream ends: complete, broken by the
    upstream, or cut by the client."""
    draft, request = flow.draft, flow.request
    draft.streamed = True
    raw: list[bytes] | None = [] if flow.ctx.config.keep_raw_sse else None
    headers = _response_headers(flow, reply)
    response = flow.stream = web.StreamResponse(status=reply.response.status, headers=headers)
    await response.prepare(request)
    upstream_broke = False
    try:
        async for chunk in upstream.chunks(reply.response):
            if draft.first_byte is None:
                draft.first_byte = time.time()
            out = tap.relay(chunk)
            if out:
                await response.write(out)
            tap.keep(chunk)
            if raw is not None:
                raw.append(out)
        out = tap.end()
        if out:
            await response.write(out)
            if raw is not None:
                raw.append(out)
    except ProxyError as err:
        upstream_broke = True
        draft.fail(err.error_class, f"the upstream stream broke: {err.message}")
    except ConnectionError:  # a write to a client that left
        _client_left(draft, tap.complete)
    except asyncio.CancelledError:  # aiohttp cancels the handler of a client that left
        _client_left(draft, tap.complete)
        raise
    finally:
        # However the stream ends (the handler cancelled because the client hung up, or a bug caught
        # at the boundary), the part of the reply that was said is kept, marked incomplete.
        result = tap.result()
        draft.response, draft.stream_complete, draft.received = result.body, result.complete, tap.received
        if raw is not None:
            draft.raw_sse = b"".join(raw)
    if result.error is not None:
        draft.fail("upstream_error", result.error)
    await flow.deliver()  # before the end of the response, so that `--sync` commits first
    if upstream_broke and request.transport is not None:
        # Pass the break on: a clean end would read as a complete (if short) answer to SDKs that do
        # not check for the final event (the openai SDK ends such a stream silently).
        request.transport.abort()
    elif not draft.client_disconnected:
        try:
            await response.write_eof()
        except ConnectionError:
            pass  # the client left after the last chunk; the record already holds all of it
    return response


async def _relay_translated(
    flow: _Flow, upstream: Upstream, reply: Reply, translation: Translation
) -> web.StreamResponse:
    """A chat upstream's answer in the client's format: its errors in the client's shape, its stream
    translated chunk by chunk, its JSON body translated (as a stream when the client asked for one)."""
    ctx, draft = flow.ctx, flow.draft
    status = reply.response.status
    if status < 400 and reply.response.content_type == "text/event-stream":
        stream = translation.stream()
        response = await _relay_stream(flow, upstream, reply, stream)
        if stream.complete:
            translation.remember(ctx.chains, draft.session_id, draft.received, draft.response)
        return response
    raw = reply.body if reply.body is not None else await upstream.read(reply.response)
    draft.first_byte = time.time()
    if status >= 400:
        answered, body, said = translation.error(status, raw)
        draft.status = answered
        draft.fail(classify(status, raw), said.message[:RESPONSE_TEXT_MAX_CHARS])
        draft.response = json.loads(body)
        return web.Response(
            status=answered, body=body, content_type="application/json", headers=_budget_header(flow)
        )
    try:
        chat = json.loads(raw)
    except ValueError:
        chat = None
    if not isinstance(chat, dict):
        raise UpstreamUnreachable(
            f"the upstream answered chat with {len(raw)} bytes that are not a JSON object"
        )
    draft.received = chat
    if translation.streamed:
        events, answer = translation.events(chat)
        translation.remember(ctx.chains, draft.session_id, chat, answer)
        return await _write_events(flow, events, answer)
    draft.response = translation.reply(chat)
    translation.remember(ctx.chains, draft.session_id, chat, draft.response)
    return web.json_response(draft.response, headers=_budget_header(flow))


async def _relay_synthesised(
    flow: _Flow, upstream: Upstream, reply: Reply, request_body: dict[str, Any]
) -> web.StreamResponse:
    """A JSON answer to a request that asked for a stream, given to the client as the stream its format
    defines; relayed whole when it is not a JSON object."""
    raw = reply.body if reply.body is not None else await upstream.read(reply.response)
    made = synthesised(flow.dialect, request_body, raw)
    if made is None:
        reply.body = raw
        return await _relay_body(flow, upstream, reply)
    flow.draft.first_byte = time.time()
    return await _write_events(flow, *made)


async def _write_events(flow: _Flow, events: list[bytes], body: dict[str, Any] | None) -> web.StreamResponse:
    """A stream modeltap wrote itself from a whole answer, in one write; recorded as synthesised."""
    draft, request = flow.draft, flow.request
    draft.streamed, draft.synthesised, draft.stream_complete, draft.response = True, True, True, body
    headers = {hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8", hdrs.CACHE_CONTROL: "no-cache"}
    response = flow.stream = web.StreamResponse(status=200, headers=headers | _budget_header(flow))
    await response.prepare(request)
    try:
        await response.write(b"".join(events))
    except ConnectionError:
        _client_left(draft, complete=False)
    await flow.deliver()
    if not draft.client_disconnected:
        try:
            await response.write_eof()
        except ConnectionError:
            pass  # Codex hangs up once it has its final event (docs/agents.md §6.5)
    return response


def _client_left(draft: ExchangeDraft, complete: bool) -> None:
    """The client closed the connection: a failure unless it already had the stream's terminal event
    (Codex hangs up as soon as it has response.completed: docs/agents.md §6.5)."""
    draft.client_disconnected = True
    if not complete:
        draft.fail("client_disconnect", "the client closed the connection mid-stream")


def _error_response(flow: _Flow, err: ProxyError) -> web.Response:
    """A proxy-made error in the client's dialect, noted on the record. A message that quotes the
    request (a path, a field) has any known session token in it masked."""
    err.message = flow.ctx.sessions.mask(err.message)
    draft = flow.draft
    draft.status = err.status
    draft.fail(err.error_class, err.message)
    body = error_bytes(err, flow.dialect)
    draft.response = json.loads(body)
    return web.Response(
        status=err.status, body=body, content_type="application/json", headers=_budget_header(flow)
    )


def _unexpected(flow: _Flow, exc: Exception) -> web.StreamResponse:
    """The answer to an exception no stage expected: a 500 in the client's shape, or, once a stream
    has begun and its status is sent, the connection cut so the client sees the break."""
    err = InternalError(f"modeltap failed on this request ({type(exc).__name__}: {exc}); see the serve log")
    if flow.stream is None or not flow.stream.prepared:
        return _error_response(flow, err)
    flow.draft.fail(err.error_class, err.message)
    if flow.request.transport is not None:
        flow.request.transport.abort()
    return flow.stream
