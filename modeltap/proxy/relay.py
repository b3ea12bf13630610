"""Forwards one exchange, in fixed stages:

    guard -> route -> identify the session -> read the body -> name it -> budget -> send -> answer
    -> seal -> end

Web pages are kept out in browsers.py, paths are resolved in routes.py, every format's particulars asked
of its dialect (modeltap.dialects), token budgets decided in budget.py, what to ask an engine for its
token ids (or render) in token_recorder.py, streams assembled in dialects/sse.py, upstream paths,
reading replies and client errors handled in upstream.py, a format the upstream does not serve
translated through chat and a stream made for a client that asked for one in translate.py. Within the
relay, the request's state lives in flow.py, its body is read in request_body.py, its upstream headers
are written in headers.py, and the answer is written to the client in answers.py, which stops before the
end of a stream. This module wires the stages together for one request; seals the exchange and hands it
to the observers (observers.py; the record store is the first), here and only here, once the answer is
written; then ends the response, so that `--sync` commits before the client sees the end. It is the one
boundary for failures: whatever a stage did not expect is answered 500 in the client's shape and
recorded as `proxy_error`, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import HttpVersion10, hdrs, web

from modeltap import dialects
from modeltap.compat.clients import (
    credential_values,
    presented_key,
    recorded_request,
    redacted_headers,
    retry_count,
)
from modeltap.compat.hosts import is_loopback
from modeltap.dialects.openai_chat import DIALECT as CHAT
from modeltap.dialects.roles import CountsPrompt, Dialect, Streams, ThroughChat
from modeltap.proxy import browsers
from modeltap.proxy.answers import (
    refusal,
    relay_body,
    relay_exact,
    relay_stream,
    relay_synthesised,
    relay_translated,
    unexpected,
)
from modeltap.proxy.context import CONTEXT, ProxyContext
from modeltap.proxy.errors import (
    BadRequest,
    MethodNotAllowed,
    NotFound,
    NotImplemented_,
    ProxyError,
    Unauthorized,
    UpstreamUnreachable,
)
from modeltap.proxy.flow import Flow, Target
from modeltap.proxy.headers import budget_headers, outbound
from modeltap.proxy.naming import client_labels, names_for
from modeltap.proxy.request_body import read_body
from modeltap.proxy.routes import Route, resolve, session_token
from modeltap.proxy.sessions import Session
from modeltap.proxy.token_recorder import TokenIdRecorder, with_fields
from modeltap.proxy.translate import Translation, Untouched
from modeltap.proxy.upstream import StreamedReply, WholeReply
from modeltap.records.exchange import ExchangeDraft

if TYPE_CHECKING:
    from modeltap.proxy.exact import ExactMode, ExactTranslation

log = logging.getLogger(__name__)

_SESSION_GONE = (
    "this session token is unknown, expired or closed: ask whoever gave you the URL for a new session"
)


async def handle(request: web.Request) -> web.StreamResponse:
    """The aiohttp handler for every relayed path: the answer, then the exchange sealed and handed to
    the observers (here, and only here), then the end of the response."""
    ctx = request.app[CONTEXT]
    query = request.rel_url.raw_query_string
    # The path as recorded: decoded, so that a token sent percent-encoded is masked too, with the query
    # as sent, less the value of any key in it (`?key=`); the headers with no credential or token.
    path, headers = recorded_request(
        f"{request.path}?{query}" if query else request.path,
        request.headers.items(),
        masked_path=ctx.sessions.masked_path,
        mask=ctx.sessions.mask,
    )
    draft = ExchangeDraft(
        method=request.method,
        path=path,
        user_agent=request.headers.get(hdrs.USER_AGENT),
        retry_count=retry_count(request.headers),
        request_headers=headers,
    )
    flow = Flow(ctx, request, draft, dialects.for_error(request.path))
    try:
        response = await _answer(flow)
        # No session token to mask: none ever goes upstream, and modeltap's own messages are masked.
        draft.response_headers = redacted_headers(response.headers.items())
        await _deliver(flow)
    except asyncio.CancelledError:
        # The client went away (aiohttp cancels the handler): the upstream request was cancelled with
        # us. Unless the client had the whole stream, the exchange is handed over now, failed (so no
        # ids are rendered for it).
        if not flow.handed_over:
            flow.draft.client_disconnected = True
            if flow.stream is not None and flow.draft.stream_complete:
                # The client had the stream's final event and hung up while modeltap still waited for
                # the upstream's end (the openai SDK closes at `[DONE]`): nothing failed, and the
                # exchange is sealed beside the connection, ids and all.
                flow.ctx.tasks.spawn(_deliver_beside(flow), "record-after-hang-up")
            else:
                flow.draft.fail(
                    "client_disconnect", "the client closed the connection before the response was complete"
                )
                _hand_over_now(flow)
        raise
    return await _end(flow, response)


async def _answer(flow: Flow) -> web.StreamResponse:
    """The answer to the request: the upstream's, or modeltap's own refusal, either in the client's
    shape. The one boundary for failures: whatever a stage did not expect is answered 500 and recorded
    as `proxy_error`, and the server keeps serving."""
    draft = flow.draft
    try:
        response = await _exchange(flow)
        if draft.status is None:
            draft.status = response.status
        return response
    except ProxyError as err:
        if draft.session_id is None:
            # A session asking for a control route is worth finding in its own records.
            token = session_token(flow.request.path) or presented_key(flow.request.headers) or ""
            _note_session(flow, flow.ctx.sessions.by_token(token))
        return refusal(flow, err)
    except Exception as exc:  # the boundary: anything a stage did not expect, answered and recorded
        log.exception("modeltap failed on %s %s (exchange %s)", flow.request.method, draft.path, draft.id)
        return unexpected(flow, exc)


async def _deliver(flow: Flow) -> None:
    """Seal the exchange and hand it to the observers, once. It counts as handed over as soon as every
    observer was called, before any is awaited (observers.py), so a cancellation then loses nothing.
    With `render_ids`, the token ids of a successful answer are rendered first (the upstream returns
    none)."""
    if flow.handed_over:
        return
    draft, recorder = flow.draft, flow.ctx.token_ids
    if flow.render_ids and recorder is not None and draft.status == 200 and draft.error_class is None:
        # What went upstream and what came back, in the upstream's format (chat, translated).
        upstream = CHAT if draft.translated else flow.dialect
        answer = draft.received if draft.translated else draft.response
        reply = answer if answer is not None else draft.response_body
        draft.token_ids = await recorder.render(upstream, draft.upstream_body or {}, reply)
    _note_reply(flow)
    flow.handed_over = True
    await flow.ctx.observers.exchange(draft.seal())


async def _deliver_beside(flow: Flow) -> None:
    """`_deliver` in a task of its own; a stop that cancels it while ids are rendered hands the
    exchange over without them rather than losing it."""
    try:
        await _deliver(flow)
    except asyncio.CancelledError:
        if not flow.handed_over:
            _hand_over_now(flow)
        raise


def _hand_over_now(flow: Flow) -> None:
    """Hand the exchange over as it stands, for a handler being cancelled: the observers have it
    before this returns, and a task owned by the proxy awaits the rest, so a stop loses nothing."""
    _note_reply(flow)
    flow.handed_over = True
    flow.ctx.tasks.spawn(flow.ctx.observers.hand_over(flow.draft.seal()), "record-disconnected")


async def _end(flow: Flow, response: web.StreamResponse) -> web.StreamResponse:
    """End a streamed response once its exchange was handed over: cut the connection when the stream
    broke (the client must see the break), else write its end unless the client already left. A whole
    response needs nothing: aiohttp sends it when the handler returns."""
    if response is not flow.stream:
        return response
    if flow.cut:
        if flow.request.transport is not None:
            flow.request.transport.abort()
    elif not flow.draft.client_disconnected:
        try:
            await response.write_eof()
        except ConnectionError:
            pass  # the client left after the last chunk (Codex hangs up once it has its final event)
    return response


async def _exchange(flow: Flow) -> web.StreamResponse:
    request, ctx, draft = flow.request, flow.ctx, flow.draft
    if request.version < HttpVersion10:
        # aiohttp reads a request line without a version as HTTP/0.9 yet still takes the lines after
        # it as headers, so a raw CR LF in a URL would turn the URL's tail into headers we forward.
        raise BadRequest("modeltap speaks HTTP/1.0 and later; the request line has no HTTP version")
    browsers.guard(flow)
    if request.method == hdrs.METH_OPTIONS:
        return browsers.preflight(flow)
    route = resolve(request.path)
    dialect = flow.dialect = route.dialect
    draft.endpoint = dialect.name
    if request.method != dialect.method:
        raise MethodNotAllowed(f"use {dialect.method} for {dialect.route}, not {request.method}")
    target = _identify(ctx, request, route)
    _note_session(flow, target.session)
    # Known as naming knows callers (naming.py): a session token, or a peer on this host.
    authenticated = target.session is not None or ctx.loopback_only or is_loopback(request.remote or "")
    body = await read_body(flow, authenticated) if dialect.method == "POST" else None
    names = names_for(
        request.headers,
        target.session,
        peer=request.remote,
        anonymous=ctx.anonymous,
        dialect=dialect,
        body=body,
        retry=bool(draft.retry_count),
    )
    draft.session_id, draft.labels = names.session_id, names.labels
    flow.conversation = names.conversation
    if names.refused is not None:
        raise BadRequest(names.refused)
    if isinstance(dialect, CountsPrompt) and ctx.budget is not None and body is not None:
        return web.json_response(await ctx.budget.count_answer(dialect, body), headers=flow.answer_headers)
    # `--tokens exact` sends every generating request to the engine's token endpoint as chat: a
    # Messages or Responses request is translated at once, never tried at the upstream's own path.
    exact = ctx.exact is not None and isinstance(dialect, ThroughChat)
    # Only a request that goes upstream asks it what it is (`auto`): a refused one never reaches it.
    await target.upstream.settle()
    translate = body is not None and (exact or target.upstream.translates(dialect))
    return await _forward(flow, target, route, body, translate)


async def _forward(
    flow: Flow, target: Target, route: Route, body: dict[str, Any] | None, translate: bool
) -> web.StreamResponse:
    """Budget, send and relay one request: as it is, or (`translate`) as OpenAI chat to an upstream
    that does not serve its format. Under `auto`, a format no upstream path serves is translated from
    then on, starting with this request."""
    ctx, draft, dialect = flow.ctx, flow.draft, flow.dialect
    translation = None
    if translate and body is not None and isinstance(dialect, ThroughChat):
        translation = Translation.start(dialect, body, ctx.chains, draft.session_id)
        draft.translated = CHAT.name
    upstream_dialect = CHAT if translation else dialect
    if ctx.exact is not None and upstream_dialect is CHAT and body is not None:
        return await _forward_exact(flow, ctx.exact, target, route, body, translation)
    payload = await _payload(flow, target, body, translation)
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
        return await relay_translated(flow, reply, translation)
    if isinstance(reply, StreamedReply):
        return await relay_stream(flow, reply, Untouched(reply.dialect))
    if (
        body is not None
        and body.get("stream") is True
        and isinstance(dialect, Streams)
        and isinstance(reply, WholeReply)
        and reply.response.status == 200
    ):
        return await relay_synthesised(flow, reply, dialect, body)
    return await relay_body(flow, reply)


async def _forward_exact(
    flow: Flow,
    mode: ExactMode,
    target: Target,
    route: Route,
    body: dict[str, Any],
    translation: Translation | None,
) -> web.StreamResponse:
    """A chat request (the client's, or its translation) as token ids to the engine's own endpoint
    (`--tokens exact`): the ids built, the budget decided on their exact number, the answer turned
    back into the client's message."""
    ctx, draft = flow.ctx, flow.draft
    chat = translation.chat_body if translation is not None else body
    exact = await mode.start(draft.session_id, chat)
    payload = exact.payload(_exact_cap(flow, exact))
    draft.sent, draft.translated, draft.token_ask = exact.recorded_request, exact.endpoint.name, exact.how
    try:
        reply = await _send(flow, target, route, payload, exact.endpoint, {}, paths=[exact.path])
    except NotFound:
        raise UpstreamUnreachable(
            f"the upstream serves no token endpoint at {exact.path}, which --tokens exact sends prompts to "
            f"({exact.mode.engine.describe()})"
        ) from None
    draft.upstream_url = ctx.sessions.mask(reply.url)
    draft.status = reply.response.status
    return await relay_exact(flow, reply, exact, translation)


def _exact_cap(flow: Flow, exact: ExactTranslation) -> int | None:
    """The completion cap of a token-in request: the budget's decision on the built prompt's exact
    length (refused in the client's words when it does not fit), else what the client asked for."""
    budget, chat = flow.ctx.budget, exact.chat_body
    field = CHAT.completion_field(chat)
    if budget is None:
        asked = chat.get(field)
        return asked if isinstance(asked, int) and not isinstance(asked, bool) else None
    decision = budget.decide_counted(CHAT, chat, len(exact.built.ids), refuse_as=flow.dialect)
    flow.draft.budget = decision.as_record()
    flow.answer_headers.update(budget_headers(flow.draft.budget))
    if decision.error is not None:
        raise decision.error
    sent = decision.body if decision.body is not None else chat
    capped = sent.get(decision.field or field)
    return capped if isinstance(capped, int) and not isinstance(capped, bool) else None


async def _payload(
    flow: Flow, target: Target, body: dict[str, Any] | None, translation: Translation | None
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
        flow.answer_headers.update(budget_headers(draft.budget))
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
    flow: Flow, recorder: TokenIdRecorder, target: Target, dialect: Dialect, payload: bytes
) -> tuple[bytes, Mapping[str, str]]:
    """`payload` (a request of `dialect`, as it goes upstream) and the extra headers that ask the
    upstream's engine for its token ids; or, when it returns none, the payload as it is and the
    exchange marked for rendering."""
    draft = flow.draft
    body = draft.upstream_body or {}
    probe = {"Authorization": f"Bearer {target.key}"} if target.key else {}
    if not probe and target.pass_client_credentials and hdrs.AUTHORIZATION in flow.request.headers:
        probe = {"Authorization": flow.request.headers[hdrs.AUTHORIZATION]}
    engine, ask = await recorder.ask(dialect, body, target.upstream, probe)
    # Decided again for a request retried through chat (its format was not served): the first try's
    # verdict is not this one's.
    flow.render_ids = ask is None and recorder.renders
    if ask is None:
        draft.token_ask = "rendered" if recorder.renders else None
        return payload, {}
    draft.token_ask = f"{engine.name}: {', '.join([*ask.fields, *ask.headers])}"
    return with_fields(payload, body, ask.fields), ask.headers


async def _send(
    flow: Flow,
    target: Target,
    route: Route,
    payload: bytes | None,
    dialect: Dialect,
    extra: Mapping[str, str],
    paths: Sequence[str] | None = None,
) -> WholeReply | StreamedReply:
    """The upstream's reply for `dialect`'s route (the client's, or chat for a translation), with the
    `extra` headers the token-id stage asks for. Raises NotFound when the upstream does not serve the
    route."""
    headers, query = outbound(flow, target, dialect)
    headers.update(extra)
    return await target.upstream.send(
        dialect,
        flow.request.method,
        query,
        headers,
        payload,
        # Quoted: a model id `%2E%2E` (sent as `%252E%252E`) would otherwise climb out of /models.
        f"/{quote(route.item, safe='')}" if route.item else "",
        paths,
    )


def _not_served(flow: Flow, route: Route, err: NotFound) -> web.StreamResponse:
    """modeltap's own answer when the upstream does not serve the route, or its NotFound `err`."""
    ctx, dialect = flow.ctx, flow.dialect
    served = [ctx.config.model] if ctx.config.model else []
    answer = dialect.local_answer(served, ctx.started, route.item)
    if answer is not None:
        return web.json_response(answer, headers=flow.answer_headers)
    if route.item is not None:
        raise NotFound(f"no model {route.item!r} here; modeltap serves {served or 'no model (give --model)'}")
    if isinstance(dialect, CountsPrompt):
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
    default = ctx.default_upstream
    if session is not None:
        key = session.upstream_key if session.upstream_key is not None else config.upstream_key
        upstream = ctx.upstream(session.upstream) if session.upstream else default
        if upstream is None:
            raise UpstreamUnreachable(f"session {session.id} has no upstream and modeltap has no --upstream")
        return Target(upstream, key, False, session)
    if default is None:
        raise UpstreamUnreachable(
            "modeltap has no default upstream: start it with --upstream URL, or use a session URL"
        )
    if config.upstream_key is None:
        return Target(default, None, True, None)
    if ctx.loopback_only or config.lend_key_to_anonymous:
        return Target(default, config.upstream_key, False, None)
    raise Unauthorized(
        "modeltap listens beyond loopback and lends its upstream key only to session tokens: use the "
        "session base URL printed by `modeltap serve` (…/s/TOKEN), or open a session with "
        "POST /_modeltap/sessions"
    )


def _note_reply(flow: Flow) -> None:
    """Tell the anonymous conversation the request was named into what its answer carried, as its
    client got it (the next request of the conversation echoes it)."""
    draft = flow.draft
    if flow.conversation is not None:
        ok = draft.status == 200 and draft.error_class is None
        reply = draft.response if draft.response is not None else draft.response_body
        flow.ctx.anonymous.replied(flow.conversation, ok, reply)


def _note_session(flow: Flow, session: Session | None) -> None:
    if session is not None:
        flow.draft.session_id = session.id
        flow.draft.labels = client_labels(flow.request.headers) | session.labels
