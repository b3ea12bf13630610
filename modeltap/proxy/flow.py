"""One request on its way through the relay's stages: where it goes (Target) and what is known of it
so far (Flow: the draft of its exchange, the dialect its errors are shaped in, the streamed response
once it has begun).

Owns: the per-request state every stage shares, and sealing the exchange and handing it to the
observers, once (`Flow.deliver`). Does not own: the stages (relay.py), the request body
(request_body.py), headers (headers.py) or the answer to the client (answers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import hdrs, web

from modeltap import dialects
from modeltap.compat.clients import retry_count
from modeltap.dialects.base import Dialect
from modeltap.proxy.context import ProxyContext
from modeltap.proxy.routes import masked
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


class Flow:
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
            path=ctx.sessions.mask(recorded_path(request)),
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
        # Handed over now, not when the task first runs: a stop that cancels the task must not lose it.
        self.ctx.tasks.spawn(self.ctx.observers.hand_over(self.draft.seal()), "record-disconnected")


def recorded_path(request: web.Request) -> str:
    """The path for the record: decoded, so that a token sent percent-encoded is masked too, with the
    query as sent."""
    path = masked(request.path)
    query = request.rel_url.raw_query_string
    return f"{path}?{query}" if query else path
