"""FaultWatch: an observer of the adapter's proxy that notes, per watched session, the first thing the
model did wrong, so that a failed run can be told apart from a model fault without reading the store.

Owns: what counts as the model's fault in one exchange: a context overflow (the record's error class
`model_fault`) or a tool call that did not parse (the format's `tool_call_parse_failure`, AReaL's
sign of it: docs/areal.md §4.2). Does not own: the failure policy (workflow.py).

    watch = FaultWatch()
    proxy = Proxy(config, observers=[watch])
    watch.watch(session.id); ...; fault = watch.release(session.id)   # None, or what went wrong
"""

from __future__ import annotations

import json
from typing import Any

from modeltap import dialects
from modeltap.dialects.roles import AsChat
from modeltap.records.exchange import Exchange

# A reply that says "tool call" without one is short; a longer body is not parsed on the event loop.
PARSE_MAX_BYTES = 1024 * 1024


class FaultWatch:
    """Remembers the first model fault of each watched session."""

    def __init__(self) -> None:
        self._faults: dict[str, str | None] = {}

    def watch(self, session_id: str) -> None:
        """Start watching a session (before its agent runs)."""
        self._faults[session_id] = None

    def release(self, session_id: str) -> str | None:
        """Stop watching a session; what the model did wrong in it, or None."""
        return self._faults.pop(session_id, None)

    def on_exchange(self, exchange: Exchange) -> None:
        session = exchange.session_id
        if session is None or session not in self._faults or self._faults[session] is not None:
            return
        self._faults[session] = model_fault(exchange)


def model_fault(exchange: Exchange) -> str | None:
    """What the model did wrong in one exchange, or None."""
    if exchange.error_class == "model_fault":
        return f"the model's context overflowed ({exchange.error_message})"
    dialect = dialects.of_record(exchange.endpoint)
    if isinstance(dialect, AsChat) and dialect.tool_call_parse_failure(_response(exchange)):
        return "the model's tool call did not parse (it finished for a tool call but none parsed)"
    return None


def _response(exchange: Exchange) -> Any:
    if exchange.response is not None:
        return exchange.response
    body = exchange.response_body
    if body is None or len(body) > PARSE_MAX_BYTES:
        return None
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None
