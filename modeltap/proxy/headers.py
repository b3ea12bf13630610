"""The headers and query a request goes upstream with: the client's headers less hop-by-hop ones,
path overrides and credentials that are not the upstream's, with the upstream's key; the query less
any session token and, where the client's credentials are replaced, its own key (`?key=`); and the
header every budgeted answer carries.

Owns: which request headers are dropped and why, and the hop-by-hop set both directions drop. Does
not own: choosing the upstream or its key (relay.py), what a format's credential headers are (its
dialect), or the headers of the answer to the client (answers.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode

from aiohttp import hdrs, web
from multidict import CIMultiDict

from modeltap.compat.clients import presented_key, without_query_credentials
from modeltap.dialects.roles import Dialect
from modeltap.records.exchange import BudgetRecord

if TYPE_CHECKING:
    from modeltap.proxy.flow import Flow, Target

# Never forwarded in either direction (RFC 9110 §7.6.1), plus the ones aiohttp recomputes itself.
HOP_BY_HOP = frozenset(
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
# aiohttp decodes gzip and deflate on its own; asking the upstream for only these keeps every body
# readable for the record (Claude Code asks for br and zstd too: docs/agents.md §4.3).
UPSTREAM_ACCEPT_ENCODING = "gzip, deflate"
# The header every budgeted answer carries: what the budget decided, in a few characters.
BUDGET_HEADER = "x-modeltap-budget"


def upstream_headers(
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
    dropped = HOP_BY_HOP | _PATH_OVERRIDES | _BODY_FRAMING | named | {"accept-encoding"}
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


def outbound(flow: Flow, target: Target, dialect: Dialect) -> tuple[CIMultiDict[str], str]:
    """The headers (`upstream_headers`) and the query (`forwarded_query`) a request of `dialect` (the
    client's, or chat for a translation) goes upstream with."""
    headers = upstream_headers(flow.request, target, dialect, translated=dialect is not flow.dialect)
    query = forwarded_query(flow)
    if not target.pass_client_credentials:
        # A key in the query (`?key=`) is the client's, as its headers' are: the upstream's key replaces it.
        query = without_query_credentials(query)
    return headers, query


def budget_headers(decision: BudgetRecord) -> dict[str, str]:
    """`x-modeltap-budget: clamped 4000->3086`: what every answer to a budgeted request carries."""
    return {BUDGET_HEADER: decision.summary}


def forwarded_query(flow: Flow) -> str:
    """The query as sent (the decoded form would turn an encoded `&`, `#` or CRLF into syntax), less
    any parameter carrying a known session token: a token never goes upstream, wherever it was put."""
    query = flow.request.rel_url.raw_query_string
    if not query or flow.ctx.sessions.mask(query) == query:
        return query
    kept = [
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if flow.ctx.sessions.mask(k + v) == k + v
    ]
    return urlencode(kept)
