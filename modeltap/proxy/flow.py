"""One request on its way through the relay's stages: where it goes (Target) and what is known of it
so far (Flow: the draft of its exchange, the dialect its errors are shaped in, the headers every
answer carries, the streamed response once it has begun).

Owns: the per-request state every stage shares. Does not own: the stages, or sealing the exchange
and handing it to the observers (relay.py), the request body (request_body.py), headers
(headers.py) or the answer to the client (answers.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from modeltap.dialects.roles import Dialect
from modeltap.proxy.anonymous import Conversation
from modeltap.proxy.context import ProxyContext
from modeltap.proxy.sessions import Session
from modeltap.proxy.upstream import Upstream
from modeltap.records.exchange import ExchangeDraft


@dataclass(slots=True)
class Target:
    """Where and with which credentials one request goes upstream."""

    upstream: Upstream
    key: str | None
    pass_client_credentials: bool
    session: Session | None


@dataclass(slots=True)
class Flow:
    """One request on its way through the stages: the draft of its exchange, the dialect its errors
    are shaped in (the route's, once routed), `answer_headers` (what every answer to it carries: the
    budget's decision, set once the decision is made), and the streamed response once it has begun
    (after which no error can change the status; `cut` says the upstream broke it, so the client's
    connection is cut rather than ended). `handed_over` says the exchange went to the observers;
    `render_ids` that its token ids are rendered first (the upstream returns none); `conversation` is
    the anonymous conversation it was named into, told of its answer when it is handed over. Built by
    `relay.handle`, which opens the draft."""

    ctx: ProxyContext
    request: web.Request
    draft: ExchangeDraft
    dialect: Dialect
    answer_headers: dict[str, str] = field(default_factory=dict)
    stream: web.StreamResponse | None = None
    cut: bool = False
    handed_over: bool = False
    render_ids: bool = False
    conversation: Conversation | None = None
