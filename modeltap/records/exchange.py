"""Exchange: one request and its response, as the relay hands it to observers.

Owns: the fields of a finished exchange. It holds no secrets by construction: the relay copies only
the user agent and the SDK retry count from the headers, and the path has its session token masked.
Does not own: how it is stored (store.py) or summarised (summary.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Exchange:
    """A finished exchange. `request` is the body as the client sent it; `sent` the body as it went
    upstream when modeltap changed it (a clamp), else None. `response` is the final body when the relay
    built it (an assembled stream, or modeltap's own error); `response_body` holds the bytes of a
    non-streamed upstream response, which the store parses for the record, off the event loop."""

    method: str
    path: str
    endpoint: str | None = None
    session_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.time)
    first_byte: float | None = None
    ended: float | None = None
    upstream_url: str | None = None
    status: int | None = None
    streamed: bool = False
    request: bytes = b""
    request_json: dict[str, Any] | None = None
    sent: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    response_body: bytes | None = None
    raw_sse: bytes | None = None
    stream_complete: bool | None = None
    budget: dict[str, Any] | None = None
    error_class: str | None = None
    error_message: str | None = None
    user_agent: str | None = None
    retry_count: int | None = None
    client_disconnected: bool = False

    def fail(self, error_class: str, message: str) -> None:
        """Note the first failure; a later one (say, the client leaving after an upstream error)
        does not hide it."""
        if self.error_class is None:
            self.error_class, self.error_message = error_class, message
