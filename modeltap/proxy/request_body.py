"""The request body: read once (within the body limit and the client timeout), inflated when the
client compressed it (only for a known caller, off the event loop, never past the limit), parsed once
and checked by its dialect; kept as received for the record.

Owns: the body's limits, encodings and errors (413, 415, 401, 408, 400). Does not own: what a format
requires of a body (its dialect's `check`) or what is done with it (relay.py).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import TYPE_CHECKING, Any

from aiohttp import hdrs, web

from modeltap.compat.hosts import is_json_type
from modeltap.proxy.errors import (
    BadRequest,
    ClientTooSlow,
    PayloadTooLarge,
    Unauthorized,
    UnsupportedMediaType,
)

if TYPE_CHECKING:
    from modeltap.proxy.flow import Flow

# Request body encodings modeltap inflates (off the event loop, the body limit applied to the inflated
# size), each with its zlib window: gzip's header, or zlib's (HTTP "deflate").
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Inflated in slices of this size, so a bomb is stopped at the limit and never held whole.
INFLATE_SLICE_BYTES = 1024 * 1024


async def read_body(flow: Flow, authenticated: bool) -> dict[str, Any]:
    """The body, read once and parsed once, kept as received (inflated) for the record. A compressed
    body is inflated only for an `authenticated` caller (a session token, or a peer on this host), off
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
            "a compressed request body from another machine needs a session token (…/s/TOKEN): "
            "modeltap inflates only what a known client sends"
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
    # Never without one: a web page may POST form or plain-text bodies, or none, to any server
    # without asking first (compat/hosts.py), and a loopback listener lends them the key.
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if not is_json_type(request.content_type if declared is not None else ""):
        raise BadRequest(
            f"Content-Type must be application/json, not {declared!r}"
            if declared is not None
            else "send Content-Type: application/json (this request has no Content-Type)"
        )
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
