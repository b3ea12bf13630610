"""The answer to the client: a body relayed whole, a stream relayed chunk by chunk (as it is, or
translated) with a copy to its assembler, a chat answer translated into the client's format, a stream
written from a JSON answer for a client that asked for one, or modeltap's own error in the client's
shape.

Owns: writing the response and noting on the draft what the client got and how the exchange ended
(complete, broken by the upstream, cut by the client). A writer stops before the end of a streamed
response: relay.py hands the exchange to the observers first (so that `--sync` commits before the
client sees the end), then ends it. Does not own: sending upstream (relay.py, upstream.py),
assembling streams (dialects/sse.py) or translating (translate.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web
from multidict import CIMultiDict

from modeltap.compat.layouts import classify, parse_error
from modeltap.dialects.openai_chat import DIALECT as CHAT
from modeltap.dialects.openai_chat import is_completion
from modeltap.dialects.roles import Streams
from modeltap.proxy.errors import InternalError, ProxyError, UpstreamUnreachable, error_bytes
from modeltap.proxy.headers import HOP_BY_HOP
from modeltap.proxy.translate import Chained, PassThrough, Transforming, Translation, synthesised
from modeltap.proxy.upstream import Reply, StreamedReply, WholeReply
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, ExchangeDraft, text_body

if TYPE_CHECKING:
    from modeltap.proxy.exact import ExactTranslation
    from modeltap.proxy.flow import Flow

# The upstream's response headers that describe its encoding or framing, which the relay changes.
_RESPONSE_DROP = HOP_BY_HOP | {"content-encoding", "date", "server"}
_SSE_HEADERS = {hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8", hdrs.CACHE_CONTROL: "no-cache"}


async def relay_body(flow: Flow, reply: WholeReply) -> web.Response:
    """Non-streamed: the body as the upstream sent it (decoded), noted for the record."""
    draft, body = flow.draft, reply.body
    draft.first_byte = time.time()
    draft.response_body = body  # parsed for the record by the store's writer, not here
    status = reply.response.status
    if status >= 400:
        draft.fail(classify(status, body), parse_error(status, body).message[:RESPONSE_TEXT_MAX_CHARS])
    return web.Response(status=status, body=body, headers=_response_headers(flow, reply))


async def relay_stream(
    flow: Flow, reply: StreamedReply, tap: PassThrough | Transforming
) -> web.StreamResponse:
    """Streamed: every chunk to the client as it arrives (through `tap`: as it is, or translated), a
    copy to the assembler. What arrived is recorded however the stream ends: complete, broken by the
    upstream, or cut by the client."""
    draft, request = flow.draft, flow.request
    draft.streamed = True
    raw: list[bytes] | None = [] if flow.ctx.config.keep_raw_sse else None
    response = flow.stream = web.StreamResponse(
        status=reply.response.status, headers=_response_headers(flow, reply)
    )
    await response.prepare(request)
    try:
        async for chunk in reply.chunks():
            if draft.first_byte is None:
                draft.first_byte = time.time()
            if tap.transforms:
                out = tap.relay(chunk)
                if out:
                    await response.write(out)
            else:
                out = chunk
                await response.write(chunk)
                tap.keep(chunk)
            if raw is not None:
                raw.append(out)
        out = tap.end()
        if out:
            await response.write(out)
            if raw is not None:
                raw.append(out)
    except ProxyError as err:
        # Passed on by `end` as a cut connection: a clean end would read as a complete (if short)
        # answer to SDKs that do not check for the final event (the openai SDK ends such a stream
        # silently).
        flow.cut = True
        draft.fail(err.error_class, f"the upstream stream broke: {err.message}")
    except ConnectionError:  # a write to a client that left
        client_left(draft, tap.complete)
    except asyncio.CancelledError:  # aiohttp cancels the handler of a client that left
        client_left(draft, tap.complete)
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
    return response


async def relay_translated(
    flow: Flow, reply: WholeReply | StreamedReply, translation: Translation
) -> web.StreamResponse:
    """A chat upstream's answer in the client's format: its errors in the client's shape, its stream
    translated chunk by chunk, its JSON body translated (as a stream when the client asked for one)."""
    ctx, draft = flow.ctx, flow.draft
    status = reply.response.status
    if isinstance(reply, StreamedReply):
        stream = translation.stream()
        try:
            return await relay_stream(flow, reply, stream)
        finally:
            # Also when the client hung up once it had the final event (its handler is cancelled then):
            # the chain continues from this answer.
            if stream.complete:
                translation.remember(ctx.chains, draft.session_id, draft.received, draft.response)
    raw = reply.body
    draft.first_byte = time.time()
    if status >= 400:
        return _translated_error(flow, translation, status, raw)
    try:
        chat = json.loads(raw)
    except (ValueError, RecursionError):
        chat = None
    # What the upstream said is kept, whatever it is: a gateway's HTML page answered 200 is the
    # evidence of what went wrong.
    draft.received = chat if isinstance(chat, dict) else text_body(raw)
    if not isinstance(chat, dict):
        raise UpstreamUnreachable(
            f"the upstream answered chat with {len(raw)} bytes that are not a JSON object"
        )
    if not is_completion(chat):
        raise UpstreamUnreachable("the upstream answered chat with a JSON object that is no completion")
    return await _translated_answer(flow, translation, chat)


def _translated_error(flow: Flow, translation: Translation, status: int, raw: bytes) -> web.Response:
    """A chat upstream's error status and body, in the client's shape."""
    answered, body, said = translation.error(status, raw)
    flow.draft.status = answered
    flow.draft.fail(classify(status, raw), said.message[:RESPONSE_TEXT_MAX_CHARS])
    return _error_answer(flow, answered, body)


async def _translated_answer(
    flow: Flow, translation: Translation, chat: dict[str, Any]
) -> web.StreamResponse:
    """A chat completion, in the client's format: as a stream when the client asked for one."""
    ctx, draft = flow.ctx, flow.draft
    if translation.streamed:
        events, answer = translation.events(chat)
        translation.remember(ctx.chains, draft.session_id, chat, answer)
        return await write_events(flow, events, answer)
    draft.response = translation.reply(chat)
    translation.remember(ctx.chains, draft.session_id, chat, draft.response)
    return web.json_response(draft.response, headers=flow.answer_headers)


async def relay_exact(
    flow: Flow, reply: WholeReply | StreamedReply, exact: ExactTranslation, translation: Translation | None
) -> web.StreamResponse:
    """The engine's answer to a token-in request (`--tokens exact`) as the chat completion it amounts
    to, in the client's format: a stream written as the ids arrive, or a whole answer; the ids are
    noted for the record, and the turn kept for the session's next request once it is complete."""
    draft = flow.draft
    if isinstance(reply, StreamedReply):
        engine = exact.stream()
        tap: Transforming = engine if translation is None else Chained(engine, translation.stream())
        response = await relay_stream(flow, reply, tap)
        draft.received = exact.recorded_answer(draft.received)
        draft.token_ids = exact.token_ids
        if tap.complete:
            exact.remember()
            if translation is not None:
                translation.remember(flow.ctx.chains, draft.session_id, engine.result().body, draft.response)
        return response
    draft.first_byte = time.time()
    status = reply.response.status
    if status >= 400:
        if translation is not None:
            return _translated_error(flow, translation, status, reply.body)
        return await relay_body(flow, reply)
    try:
        answer = json.loads(reply.body)
        chat = exact.reply(answer)
    except (ValueError, RecursionError) as exc:
        raise UpstreamUnreachable(
            f"the engine's answer to a token-in request holds no generated ids ({exc})"
        ) from None
    draft.received = exact.recorded_answer(answer)
    draft.token_ids = exact.token_ids
    exact.remember()
    if translation is not None:
        return await _translated_answer(flow, translation, chat)
    draft.response = chat
    if exact.streamed:
        options = exact.chat_body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await write_events(flow, CHAT.synthesise(chat, include_usage), chat)
    return web.json_response(chat, headers=flow.answer_headers)


async def relay_synthesised(
    flow: Flow, reply: WholeReply, dialect: Streams, request_body: dict[str, Any]
) -> web.StreamResponse:
    """A JSON answer to a request that asked for a stream, given to the client as the stream its format
    (`dialect`) defines; relayed whole when it is not a JSON object."""
    made = synthesised(dialect, request_body, reply.body)
    if made is None:
        return await relay_body(flow, reply)
    flow.draft.first_byte = time.time()
    return await write_events(flow, *made)


async def write_events(flow: Flow, events: list[bytes], body: dict[str, Any] | None) -> web.StreamResponse:
    """A stream modeltap wrote itself from a whole answer, in one write; recorded as synthesised."""
    draft, request = flow.draft, flow.request
    draft.streamed, draft.synthesised, draft.stream_complete, draft.response = True, True, True, body
    response = flow.stream = web.StreamResponse(status=200, headers=_SSE_HEADERS | flow.answer_headers)
    await response.prepare(request)
    try:
        await response.write(b"".join(events))
    except ConnectionError:
        client_left(draft, complete=False)
    return response


def refusal(flow: Flow, err: ProxyError) -> web.Response:
    """A proxy-made error in the client's dialect, noted on the record. A message that quotes the
    request (a path, a field) has any known session token in it masked."""
    err.message = flow.ctx.sessions.mask(err.message)
    draft = flow.draft
    draft.status = err.status
    draft.fail(err.error_class, err.message)
    return _error_answer(flow, err.status, error_bytes(err, flow.dialect))


def _error_answer(flow: Flow, status: int, body: bytes) -> web.Response:
    """An error body of modeltap's making, in the client's shape; the record keeps it parsed."""
    flow.draft.response = json.loads(body)
    return web.Response(
        status=status, body=body, content_type="application/json", headers=flow.answer_headers
    )


def unexpected(flow: Flow, exc: Exception) -> web.StreamResponse:
    """The answer to an exception no stage expected: a 500 in the client's shape, or, once a stream
    has begun and its status is sent, the stream marked to be cut, so the client sees the break."""
    err = InternalError(f"modeltap failed on this request ({type(exc).__name__}: {exc}); see the serve log")
    if flow.stream is None or not flow.stream.prepared:
        return refusal(flow, err)
    flow.draft.fail(err.error_class, err.message)
    flow.cut = True
    return flow.stream


def _response_headers(flow: Flow, reply: Reply) -> CIMultiDict[str]:
    """The upstream's headers less those that described its framing, and what every answer to this
    request carries (`Flow.answer_headers`)."""
    kept = (
        (k, v)
        for k, v in reply.headers.items()
        # The upstream's CORS answer is not ours: which pages may read modeltap is --allow-origin's.
        if k.lower() not in _RESPONSE_DROP and not k.lower().startswith("access-control-")
    )
    headers: CIMultiDict[str] = CIMultiDict(kept)
    headers.update(flow.answer_headers)
    return headers


def client_left(draft: ExchangeDraft, complete: bool) -> None:
    """The client closed the connection: a failure unless it already had the stream's terminal event
    (Codex hangs up as soon as it has response.completed: docs/agents.md §6.5)."""
    draft.client_disconnected = True
    if not complete:
        draft.fail("client_disconnect", "the client closed the connection mid-stream")
