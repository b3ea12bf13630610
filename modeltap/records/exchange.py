"""Exchange: one request and its response, as the relay hands it to the observers; SessionEvent: a
session opening, closing or reporting its outcome.

Owns: the fields of a finished exchange and of a session event, and sealing: the relay fills an
`ExchangeDraft` as the exchange proceeds and seals it once it has ended (answered, failed, refused or
cut off); the sealed `Exchange` raises on any assignment. An exchange holds no secrets by
construction: the relay copies only the user agent and the SDK retry count from the headers, and the
path has its session token masked. Does not own: how it is stored (store.py) or read (the dialects).

    draft = ExchangeDraft(method="POST", path="/v1/chat/completions")
    draft.status = 200
    exchange = draft.seal()          # the same object, now an Exchange: exchange.status = 500 raises
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from modeltap.dialects.token_ids import TokenIds

# An upstream error message, or a response that is not a JSON object (an HTML page, plain text), is
# kept up to this size: AReaL's "Failed after N retries" detail can carry a whole prompt's token ids
# (docs/areal.md §4.1), and its start says what went wrong.
RESPONSE_TEXT_MAX_CHARS = 16 * 1024


@dataclass(slots=True)
class ExchangeDraft:
    """An exchange in progress. `request` is the body as the client sent it; `sent` the body as it went
    upstream when modeltap changed it (a clamp, a translation), else None. `response` is the final body
    when the relay built it (an assembled stream, a translated answer, or modeltap's own error);
    `response_body` holds the bytes of a non-streamed upstream response, which the store parses off the
    event loop. `translated` names the format the exchange went upstream as when modeltap translated it
    ("chat"), and `received` holds the upstream's answer in that format; `synthesised` says the client's
    stream was written from a JSON answer. With `serve --token-ids`, `token_ask` says what modeltap asked
    the engine for (the ids themselves come back in the response), and `token_ids` holds the ids modeltap
    rendered where the engine returns none."""

    # False until sealed, so that an Exchange built directly can tell its own construction (the
    # generated __init__ assigning each field) from a later assignment.
    _sealed: bool = field(default=False, init=False, repr=False, compare=False)
    method: str = "POST"
    path: str = "/"
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
    translated: str | None = None
    received: dict[str, Any] | None = None
    synthesised: bool = False
    token_ask: str | None = None
    token_ids: TokenIds | None = None

    def __post_init__(self) -> None:
        """A draft stays open; an Exchange built directly is sealed once built."""

    def fail(self, error_class: str, message: str) -> None:
        """Note the first failure; a later one (say, the client leaving after an upstream error) does
        not hide it."""
        if self.error_class is None:
            self.error_class, self.error_message = error_class, message

    def seal(self) -> Exchange:
        """End the draft: stamp its end time if unset and turn it, in place, into an Exchange. O(1):
        the relay's hot path pays nothing for the immutability its observers rely on."""
        if self.ended is None:
            self.ended = time.time()
        object.__setattr__(self, "__class__", Exchange)
        object.__setattr__(self, "_sealed", True)
        return self  # type: ignore[return-value]  # it is one now: the class was just swapped


class Exchange(ExchangeDraft):
    """A finished exchange, as every observer receives it: assignment raises
    `dataclasses.FrozenInstanceError`. Build one directly (tests) or by `ExchangeDraft.seal()`."""

    __slots__ = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}: the exchange is sealed")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}: the exchange is sealed")

    def fail(self, error_class: str, message: str) -> None:
        raise dataclasses.FrozenInstanceError("a sealed exchange cannot fail any more")


SessionEventKind = Literal["opened", "closed"]


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A session opening or closing, for the observers (the store lists a session from its opening,
    before its first exchange)."""

    kind: SessionEventKind
    session_id: str
    labels: dict[str, str] = field(default_factory=dict)
    upstream: str | None = None
    at: float = field(default_factory=time.time)
