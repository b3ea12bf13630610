"""The answer to the client, once the upstream has replied: a body relayed whole, a stream relayed
chunk by chunk (as it is, or translated) with a copy to its assembler, a chat answer translated into
the client's format, or a stream written from a JSON answer for a client that asked for one.

Owns: writing the response and noting on the draft what the client got and how the exchange ended
(complete, broken by the upstream, cut by the client). Does not own: sending upstream (relay.py,
upstream.py), assembling streams (dialects/sse.py) or translating (translate.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web

from modeltap.compat.layouts import classify, parse_error
from modeltap.proxy.errors import ProxyError, UpstreamUnreachable
from modeltap.proxy.headers import budget_header, response_headers
from modeltap.proxy.translate import StreamTap, Translation, synthesised
from modeltap.proxy.upstream import Reply, Upstream
from modeltap.records.exchange import RESPONSE_TEXT_MAX_CHARS, ExchangeDraft

if TYPE_CHECKING:
    from modeltap.proxy.flow import Flow


async def relay_body(flow: Flow, upstream: Upstream, reply: Reply) -> web.Response:
    """Non-streamed: the body as the upstream sent it (decoded), noted for the record."""
    draft = flow.draft
    body = reply.body if reply.body is not None else await upstream.read(reply.response)
    draft.first_byte = time.time()
    draft.response_body = body  # parsed for the record by the store's writer, not here
    status = reply.response.status
    if status >= 400:
        draft.fail(classify(status, body), parse_error(status, body).message[:RESPONSE_TEXT_MAX_CHARS])
    return web.Response(status=status, body=body, headers=response_headers(flow, reply))


async def relay_stream(flow: Flow, upstream: Upstream, reply: Reply, tap: StreamTap) -> web.StreamResponse:
    """Streamed: every chunk to the client as it arrives (through `tap`: as it is, or translated), a
    copy to the assembler. What arrived is recorded however the stream ends: complete, broken by the
    upstream, or cut by the client."""
    draft, request = flow.draft, flow.request
    draft.streamed = True
    raw: list[bytes] | None = [] if flow.ctx.config.keep_raw_sse else None
    headers = response_headers(flow, reply)
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


async def relay_translated(
    flow: Flow, upstream: Upstream, reply: Reply, translation: Translation
) -> web.StreamResponse:
    """A chat upstream's answer in the client's format: its errors in the client's shape, its stream
    translated chunk by chunk, its JSON body translated (as a stream when the client asked for one)."""
    ctx, draft = flow.ctx, flow.draft
    status = reply.response.status
    if status < 400 and reply.response.content_type == "text/event-stream":
        stream = translation.stream()
        response = await relay_stream(flow, upstream, reply, stream)
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
            status=answered, body=body, content_type="application/json", headers=budget_header(flow)
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
        return await write_events(flow, events, answer)
    draft.response = translation.reply(chat)
    translation.remember(ctx.chains, draft.session_id, chat, draft.response)
    return web.json_response(draft.response, headers=budget_header(flow))


async def relay_synthesised(
    flow: Flow, upstream: Upstream, reply: Reply, request_body: dict[str, Any]
) -> web.StreamResponse:
    """A JSON answer to a request that asked for a stream, given to the client as the stream its format
    defines; relayed whole when it is not a JSON object."""
    raw = reply.body if reply.body is not None else await upstream.read(reply.response)
    made = synthesised(flow.dialect, request_body, raw)
    if made is None:
        reply.body = raw
        return await relay_body(flow, upstream, reply)
    flow.draft.first_byte = time.time()
    return await write_events(flow, *made)


async def write_events(flow: Flow, events: list[bytes], body: dict[str, Any] | None) -> web.StreamResponse:
    """A stream modeltap wrote itself from a whole answer, in one write; recorded as synthesised."""
    draft, request = flow.draft, flow.request
    draft.streamed, draft.synthesised, draft.stream_complete, draft.response = True, True, True, body
    headers = {hdrs.CONTENT_TYPE: "text/event-stream; charset=utf-8", hdrs.CACHE_CONTROL: "no-cache"}
    response = flow.stream = web.StreamResponse(status=200, headers=headers | budget_header(flow))
    await response.prepare(request)
    try:
        await response.write(b"".join(events))
    except ConnectionError:
        client_left(draft, complete=False)
    await flow.deliver()
    if not draft.client_disconnected:
        try:
            await response.write_eof()
        except ConnectionError:
            pass  # Codex hangs up once it has its final event (docs/agents.md §6.5)
    return response


def client_left(draft: ExchangeDraft, complete: bool) -> None:
    """The client closed the connection: a failure unless it already had the stream's terminal event
    (Codex hangs up as soon as it has response.completed: docs/agents.md §6.5)."""
    draft.client_disconnected = True
    if not complete:
        draft.fail("client_disconnect", "the client closed the connection mid-stream")
