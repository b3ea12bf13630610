"""A test kit for observer authors: exchanges and session events built as the relay hands them over,
without a server (as mitmproxy's `mitmproxy.test.tflow` builds flows).

    from modeltap.testing import exchange

    def test_my_observer_counts_tool_calls() -> None:
        seen = MyObserver()
        seen.on_exchange(exchange({"model": "m", "messages": []}, {"choices": [...]}))

Every exchange it builds is sealed (assignment raises), as the one an observer receives.
"""

from __future__ import annotations

import json
from typing import Any

from modeltap.records.exchange import Exchange, ExchangeDraft, RolloutOutcome, SessionEvent, SessionEventKind

__all__ = ["exchange", "session_event"]


def exchange(
    body: dict[str, Any] | None = None, response: dict[str, Any] | None = None, **fields: Any
) -> Exchange:
    """A sealed chat exchange: `body` sent as JSON to `/v1/chat/completions`, answered 200 with
    `response`. `fields` sets any other field of the exchange (`session_id`, `labels`, `status`,
    `error_class`, `streamed`, ...) or overrides these (`path`, `endpoint`, the `request` bytes). It ends
    when it started if `started` is given, else now.

    >>> exchange({"model": "m", "messages": []}, status=500, error_class="upstream_error").status
    500
    """
    settings: dict[str, Any] = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "endpoint": "chat",
        "request": json.dumps(body).encode() if body is not None else b"",
        "request_json": body,
        "response": response,
        "status": 200,
    }
    # An exchange told when it started ended then too, unless told otherwise (seal stamps the clock).
    if "started" in fields:
        settings["ended"] = fields["started"]
    return ExchangeDraft(**(settings | fields)).seal()


def session_event(
    kind: SessionEventKind, session_id: str = "s-1", *, outcome: RolloutOutcome | None = None, **fields: Any
) -> SessionEvent:
    """A session opening, closing or reporting its rollout's outcome, as observers receive it.

    >>> session_event("outcome", outcome=RolloutOutcome("scored", reward=1.0)).outcome.reward
    1.0
    """
    return SessionEvent(kind, session_id, outcome=outcome, **fields)
