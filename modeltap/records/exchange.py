"""Exchange: one request and its response, as the relay hands it to the observers; SessionEvent: a
session opening, closing or reporting its outcome.

Owns: the fields of a finished exchange and of a session event, and sealing: the relay fills an
`ExchangeDraft` as the exchange proceeds and seals it once it has ended (answered, failed, refused or
cut off); the sealed `Exchange` raises on any assignment. An exchange holds no secrets by
construction: the relay copies only the user agent and the SDK retry count from the headers, and the
path has its session token masked. Does not own: how it is stored (store.py) or read
(reader.py, the dialects).

    draft = ExchangeDraft(method="POST", path="/v1/chat/completions")
    draft.status = 200
    exchange = draft.seal()          # the same object, now an Exchange: exchange.status = 500 raises
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from modeltap.dialects.base import as_int, as_str
from modeltap.dialects.token_ids import TokenIds

# An upstream error message, or a response that is not a JSON object (an HTML page, plain text), is
# kept up to this size: AReaL's "Failed after N retries" detail can carry a whole prompt's token ids
# (docs/areal.md §4.1), and its start says what went wrong.
RESPONSE_TEXT_MAX_CHARS = 16 * 1024


def text_body(raw: bytes) -> dict[str, str]:
    """A body that is no JSON object, as a record keeps it: `{"text": …}`, the start of its text
    (bytes that are not UTF-8 as surrogate escapes, which the store keeps losslessly)."""
    return {"text": raw[:RESPONSE_TEXT_MAX_CHARS].decode("utf-8", "surrogateescape")}


@dataclass(frozen=True, slots=True)
class BudgetRecord:
    """What the budget decided for one exchange, as the record keeps it (no bodies): `action` "pass",
    "clamp" or "reject"; the counted `prompt_tokens`; the completion cap the client `requested` in its
    `field` and the most that was `allowed`; the `limit` on prompt + completion; the refusal's text
    (`error`) and a `note` (why it was not counted, say). `summary` is the decision in a few characters,
    as the `x-modeltap-budget` header carries it (`clamped 4000->3086`)."""

    summary: str
    action: str
    prompt_tokens: int | None = None
    requested: int | None = None
    allowed: int | None = None
    field: str | None = None
    limit: int | None = None
    error: str | None = None
    note: str | None = None

    @classmethod
    def from_json(cls, value: Any) -> BudgetRecord | None:
        """The decision as a store holds it (its JSON object), or None when there is none; members of
        the wrong type are taken as absent (a store written by another release). A BudgetRecord is
        itself (an exchange not yet stored: serve's line per exchange)."""
        if isinstance(value, BudgetRecord):
            return value
        if not isinstance(value, dict):
            return None
        return cls(
            summary=as_str(value.get("summary")) or "",
            action=as_str(value.get("action")) or "",
            prompt_tokens=as_int(value.get("prompt_tokens")),
            requested=as_int(value.get("requested")),
            allowed=as_int(value.get("allowed")),
            field=as_str(value.get("field")),
            limit=as_int(value.get("limit")),
            error=as_str(value.get("error")),
            note=as_str(value.get("note")),
        )


def new_id() -> str:
    """32 hex digits: the time in microseconds, then 72 random bits. In time order, so the store's
    index of ids grows at its end instead of at random places (a random id's insert touches a random
    page of an index as large as the store: docs/sqlite.md §7). The random bits only keep ids apart, they
    guard nothing: they come from `random`'s generator (seeded from the OS, reseeded in a forked child),
    not from `secrets`, which costs a getrandom system call per exchange."""
    return f"{time.time_ns() // 1000:014x}{random.getrandbits(72):018x}"


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
    id: str = field(default_factory=new_id)
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
    budget: BudgetRecord | None = None
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

    @property
    def upstream_body(self) -> dict[str, Any] | None:
        """The body as it went upstream: `sent` when modeltap changed it, else the client's own."""
        return self.sent if self.sent is not None else self.request_json

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

    def __init__(self, **fields: Any) -> None:
        """An exchange built whole (tests, a record read back): sealed once built."""
        super().__init__(**fields)
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}: the exchange is sealed")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}: the exchange is sealed")

    def fail(self, error_class: str, message: str) -> None:
        raise dataclasses.FrozenInstanceError("a sealed exchange cannot fail any more")


SessionEventKind = Literal["opened", "closed", "outcome"]

Outcome = Literal["scored", "failed", "unscored", "model_fault", "cancelled", "timed_out"]
"""How a rollout ended: scored (its checks gave a reward), failed (the run broke: sandbox, agent exit,
judge), unscored (it ended but no check scored it), model_fault (the model's own doing: context
overflow, a tool call that does not parse), cancelled (its caller gave up on it), timed_out (it ran
past its limit)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
# A run's log is kept from its end, where a failure shows: enough for a traceback and the agent's last
# words, small enough that listing fifty sessions stays cheap.
LOG_TAIL_MAX_CHARS = 4000


@dataclass(frozen=True, slots=True)
class RolloutOutcome:
    """What one rollout came to, as the adapter reports it on its session. `reward` is what the trainer
    got (None when the sample was left out); `scores` one per check; `exit_status` the solver's exit
    code in its sandbox (None when it never exited: cancelled, timed out, or no sandbox)."""

    outcome: Outcome
    reward: float | None = None
    scores: tuple[float, ...] = ()
    duration_s: float | None = None
    exit_status: int | None = None
    log_tail: str = ""

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {self.outcome!r}")
        if len(self.log_tail) > LOG_TAIL_MAX_CHARS:
            object.__setattr__(self, "log_tail", self.log_tail[-LOG_TAIL_MAX_CHARS:])

    def details(self) -> dict[str, Any]:
        """What the record keeps besides the reward and the outcome, as JSON."""
        return {
            "scores": list(self.scores),
            "duration_s": self.duration_s,
            "exit_status": self.exit_status,
            "log_tail": self.log_tail,
        }


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """A session opening, closing or reporting its rollout's outcome, for the observers (the store
    lists a session from its opening, before its first exchange). `outcome` is set for "outcome"."""

    kind: SessionEventKind
    session_id: str
    labels: dict[str, str] = field(default_factory=dict)
    upstream: str | None = None
    at: float = field(default_factory=time.time)
    outcome: RolloutOutcome | None = None
