"""The relay's guard against web pages: a page the operator opens must not spend the upstream key that
a loopback listener lends to every caller, nor read what comes back.

Owns: the stage that runs before routing (a Host that is not the listener's own: 421; a request a
browser says comes from another origin the operator did not allow: 403), the answer to a browser's
preflight (OPTIONS), and the CORS headers an allowed origin's answers carry. Does not own: the facts
about browsers and Host headers (compat/hosts.py, shared with the viewer), the content type a model
request must have (request_body.py), or shaping and recording the refusal (relay.py, answers.py).

The Host is checked wherever modeltap lends its key without a session token: on a loopback listener
(every request), and beyond loopback with --lend-key-to-anonymous. Beyond loopback otherwise the key
goes only with a session token, which a page cannot know, and containers may use any name for the
host (a compose service name). `--allow-host NAME` adds a name (a reverse proxy's), `*` any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import hdrs, web

from modeltap.compat.hosts import cross_site, own_host
from modeltap.proxy.errors import Forbidden, MisdirectedRequest

if TYPE_CHECKING:
    from modeltap.proxy.config import ProxyConfig
    from modeltap.proxy.flow import Flow

# The methods an allowed page may use: what the model routes take.
_METHODS = "GET, POST, OPTIONS"
# How long a browser may keep a preflight's answer: ten minutes, the longest Chromium honours
# (https://developer.mozilla.org/en-US/docs/Web/HTTP/Headers/Access-Control-Max-Age).
PREFLIGHT_MAX_AGE_S = 600
# Chromium's Private Network Access asks before a public page reaches a private address
# (https://wicg.github.io/private-network-access/): answered yes only for an allowed origin.
_PRIVATE_NETWORK = "Access-Control-Allow-Private-Network"
_SEC_FETCH_SITE = "Sec-Fetch-Site"


def guard(flow: Flow) -> None:
    """Refuse a request a web page could have made: addressed by a name that is not the listener's
    own (DNS rebinding), or from a page of an origin the operator did not allow (`--allow-origin`).
    An allowed origin's answers carry its CORS headers."""
    request, ctx = flow.request, flow.ctx
    config = ctx.config
    checks_host = ctx.loopback_only or config.lend_key_to_anonymous
    if checks_host and not own_host(request.headers.get(hdrs.HOST), config.host, config.allow_hosts):
        raise MisdirectedRequest(
            f"modeltap answers only requests addressed to its own names and addresses, not "
            f"{request.headers.get(hdrs.HOST)!r} (a web page could be behind it); allow a name with "
            "serve --allow-host NAME"
        )
    origin = request.headers.get(hdrs.ORIGIN)
    if not cross_site(origin, request.headers.get(_SEC_FETCH_SITE)):
        return
    if not origin_allowed(config, origin):
        raise Forbidden(
            f"a web page ({origin or 'of another site'}) may not use modeltap: allow its origin with "
            "serve --allow-origin ORIGIN"
        )
    flow.answer_headers.update(cors_headers(origin))


def origin_allowed(config: ProxyConfig, origin: str | None) -> bool:
    """Whether `--allow-origin` lets pages of `origin` use the proxy (`*`: every page)."""
    allowed = config.allow_origins
    return "*" in allowed or (origin is not None and origin.rstrip("/") in allowed)


def cors_headers(origin: str | None) -> dict[str, str]:
    """What an allowed origin's answers carry: the origin itself (never `*`, which would let any page
    read answers that a cached response gave another), and Vary, so caches keep them apart."""
    if origin is None:
        return {}
    return {hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin, hdrs.VARY: hdrs.ORIGIN}


def preflight(flow: Flow) -> web.Response:
    """The answer to a browser's OPTIONS: what an allowed origin may send (any header it asks for,
    since an SDK in a page sends its own), or 403 in the client's shape for any other."""
    request, config = flow.request, flow.ctx.config
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None or not origin_allowed(config, origin):
        raise Forbidden(
            f"modeltap answers no web page's preflight from {origin or 'an unknown origin'}: allow its "
            "origin with serve --allow-origin ORIGIN"
        )
    headers = {
        **flow.answer_headers,
        hdrs.ACCESS_CONTROL_ALLOW_METHODS: _METHODS,
        hdrs.ACCESS_CONTROL_MAX_AGE: str(PREFLIGHT_MAX_AGE_S),
    }
    asked = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS)
    if asked:
        headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = asked
    if request.headers.get("Access-Control-Request-Private-Network", "").lower() == "true":
        headers[_PRIVATE_NETWORK] = "true"
    flow.draft.status = 204
    return web.Response(status=204, headers=headers)
