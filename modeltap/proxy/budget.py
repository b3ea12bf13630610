"""Token budgets: the limits in force, the pass / clamp / reject decision, and its error messages.

Owns: the budget rule, how a clamp rewrites the completion field, and discovering the context length
from the upstream at start. Does not own: counting (counting/counter.py), which field caps a format's
completion or how its refusal is worded (the format's dialect), answering the error in the client's
shape (errors.py, relay.py), or when a budget applies (relay.py).

A request is safe on every known backend when P + M <= C - 1 - R and, with AReaL's
engine_max_tokens E, P + M <= E and P <= E - 1 (docs/token-budgets.md §0, §7): the -1
covers SGLang before PR #22546, which refuses P + M == C, and AReaL refuses P == E. Every request is
taken to need at least one completion token, which makes P <= E - 1 part of the same inequality.

    limits = Limits(context_length=32768, sources={"context_length": "--context-length"})
    decision = decide(dialects.named("chat"), body, prompt_tokens=31000, limits=limits, policy="clamp",
                      min_completion_tokens=1)
    decision.action, decision.body  # "clamp", the body with max_completion_tokens lowered to 1767
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
from collections.abc import Mapping
from typing import Any, TypedDict

from modeltap.counting.counter import CountError, TokenCounter
from modeltap.dialects.roles import CountsPrompt, Dialect
from modeltap.proxy.config import BUDGET_POLICIES, BudgetPolicy
from modeltap.proxy.errors import BadRequest, OverBudget
from modeltap.proxy.upstream import Upstream
from modeltap.records.exchange import BudgetRecord

log = logging.getLogger(__name__)

# Discovery runs once at start; an upstream that has not answered in this long is treated as not
# knowing its context length, and the operator is told to pass --context-length.
DISCOVERY_TIMEOUT_S = 10.0

# Counts of bodies seen before, by a digest of their bytes: an SDK retry, and the n samples of a GRPO
# group that all open with the same prompt (docs/token-budgets.md §5.4, "whole-request memo"). 4096 entries
# of ~60 bytes each.
COUNT_MEMO_MAX = 4096

# Where a server states its context length, in the order tried: vLLM and SGLang's model cards
# (docs/token-budgets.md §1.5, §2.4), then SGLang's server info (`context_length` is null there when it
# came from config.json, so the model card is tried first) and its model info.
_DISCOVERY_PATHS = ("/v1/models", "/server_info", "/get_server_info", "/get_model_info")
_CONTEXT_KEYS = ("max_model_len", "context_length", "context_len", "max_context_length")


@dataclasses.dataclass(frozen=True)
class Limits:
    """The limits in force: context length C, AReaL's engine_max_tokens E (prompt + completion),
    and a reserve R kept free (e.g. SGLang's EAGLE draft tokens, docs/token-budgets.md §1.1).

    `sources` says where each value came from ("--context-length", "GET /v1/models max_model_len",
    "default"), for the line `serve` prints at start.
    """

    context_length: int
    engine_max_tokens: int | None = None
    reserve: int = 0
    sources: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_total_tokens < 2:
            raise ValueError(
                f"limits leave no room for a prompt and a completion: context_length {self.context_length}, "
                f"engine_max_tokens {self.engine_max_tokens}, reserve {self.reserve}"
            )

    @property
    def max_total_tokens(self) -> int:
        """The most prompt + completion tokens a request may ask for: C - 1 - R, and at most E."""
        total = self.context_length - 1 - self.reserve
        return total if self.engine_max_tokens is None else min(total, self.engine_max_tokens)

    def describe(self) -> str:
        """One line for the start-up log: each limit with where it came from, then the rule."""
        values = {"context_length": self.context_length, "engine_max_tokens": self.engine_max_tokens}
        values["reserve"] = self.reserve
        parts = [
            f"{name.replace('_', ' ')} {value} ({self.sources.get(name, 'default')})"
            for name, value in values.items()
            if value is not None
        ]
        return f"{', '.join(parts)}: prompt + completion at most {self.max_total_tokens} tokens"

    def why(self) -> str:
        """Why the limit is what it is, in words for a refusal's reader."""
        window = self.context_length - 1 - self.reserve
        if self.engine_max_tokens is not None and self.engine_max_tokens <= window:
            return f"the limit is AReaL's engine_max_tokens, {self.engine_max_tokens}"
        reserve = f" and the {self.reserve} tokens kept in reserve" if self.reserve else ""
        return (
            f"the limit is the context length {self.context_length} less 1{reserve}, since some servers "
            "refuse a prompt and completion that fill the window exactly"
        )


@dataclasses.dataclass(frozen=True)
class Decision:
    """What the budget decided for one request.

    `action` is "pass" (forward unchanged), "clamp" (forward `body`, where only the `field` the client
    used, or the one added, changed to `allowed`) or "reject" (answer `error`, a 400). `requested` is
    the client's M (None when absent); `allowed` the most completion tokens that fit (None when the
    prompt was not counted); `limit` the most prompt + completion tokens allowed.
    """

    action: str
    prompt_tokens: int | None
    requested: int | None
    allowed: int | None
    field: str | None
    limit: int | None = None
    body: dict[str, Any] | None = None
    error: OverBudget | None = None
    note: str | None = None

    def summary(self) -> str:
        """The decision in a few characters, as the `x-modeltap-budget` header and the serve log say it:
        `passed 1203+4000<=4095`, `clamped 4000->3086`, `rejected 6009+1>4095`, `uncounted`."""
        if self.prompt_tokens is None or self.limit is None:
            return "uncounted"
        asked = self.requested if self.requested is not None else 1
        if self.action == "clamp":
            return f"clamped {self.requested if self.requested is not None else 'none'}->{self.allowed}"
        if self.action == "reject":
            return f"rejected {self.prompt_tokens}+{asked}>{self.limit}"
        return f"passed {self.prompt_tokens}+{asked}<={self.limit}"

    def as_record(self) -> BudgetRecord:
        """What the record keeps about the decision (no bodies)."""
        return BudgetRecord(
            summary=self.summary(),
            action=self.action,
            prompt_tokens=self.prompt_tokens,
            requested=self.requested,
            allowed=self.allowed,
            field=self.field,
            limit=self.limit,
            error=self.error.message if self.error else None,
            note=self.note,
        )


class _Shared(TypedDict):
    """The Decision fields every outcome of `decide` sets alike, so the checker sees each one's type."""

    prompt_tokens: int
    field: str
    limit: int
    allowed: int


def decide(
    dialect: Dialect,
    body: dict[str, Any],
    prompt_tokens: int,
    limits: Limits,
    policy: BudgetPolicy,
    min_completion_tokens: int,
    refuse_as: Dialect | None = None,
) -> Decision:
    """Pass, clamp or reject one request whose prompt counts `prompt_tokens`. Pure.

    clamp: M lowered to what fits (or set, when absent); rejected when fewer than
    `min_completion_tokens` would remain and the client's own M does not fit either.
    reject: rejected unless M (or, when absent, one token) fits. off: always passes.
    `refuse_as`: the format whose refusal the client reads, when it is not `dialect` (a request
    translated to chat is budgeted as chat and refused in its client's words).
    """
    _check_policy(policy, min_completion_tokens)
    field = _completion_field(dialect, body)
    requested = body.get(field)
    limit = limits.max_total_tokens
    room = limit - prompt_tokens
    common = _Shared(prompt_tokens=prompt_tokens, field=field, limit=limit, allowed=max(room, 0))
    if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int)):
        # Not a token count: the upstream refuses it in its own words.
        return Decision("pass", requested=None, note=f"{field} is not an integer", **common)
    if policy == "off":
        return Decision("pass", requested=requested, **common)
    asked = 1 if requested is None else max(requested, 1)
    # The fewest completion tokens with which this request still goes through.
    if policy == "reject":
        needed = asked
    else:
        needed = min_completion_tokens if requested is None else min(asked, min_completion_tokens)
    if room < needed:
        note = (
            f"modeltap refused this request before the upstream saw it: {limits.why()}; "
            f"at least {needed} completion token{'s' if needed > 1 else ''} must fit."
        )
        # A completion asked for beyond the whole window leaves no room for any prompt: 0, not below.
        refusal = (refuse_as or dialect).context_overflow(
            prompt_tokens, requested or 0, limit, max(limit - needed, 0), note
        )
        error = OverBudget.from_api_error(refusal)
        return Decision("reject", requested=requested, error=error, **common)
    if (requested is not None and asked <= room) or policy == "reject":
        return Decision("pass", requested=requested, **common)
    return Decision("clamp", requested=requested, body={**body, field: room}, **common)


def _completion_field(dialect: Dialect, body: dict[str, Any]) -> str:
    field = dialect.completion_field(body)
    if field is None:
        raise ValueError(f"{dialect.name} requests have no completion budget")
    return field


def _check_policy(policy: str, min_completion_tokens: int) -> None:
    if policy not in BUDGET_POLICIES:
        raise ValueError(f"budget policy must be one of {', '.join(BUDGET_POLICIES)}, not {policy!r}")
    if min_completion_tokens < 1:
        raise ValueError("min_completion_tokens must be at least 1")


class Budget:
    """Counts and decides, counting off the event loop.

    >>> budget = Budget(TokenCounter.load("/models/qwen"), Limits(32768), policy="clamp")
    >>> decision = await budget.apply(dialects.named("chat"), body)
    """

    def __init__(
        self,
        counter: TokenCounter,
        limits: Limits,
        policy: BudgetPolicy = "clamp",
        min_completion_tokens: int = 1,
    ) -> None:
        _check_policy(policy, min_completion_tokens)
        self.counter = counter
        self.limits = limits
        self.policy = policy
        self.min_completion_tokens = min_completion_tokens
        self._memo: collections.OrderedDict[tuple[str, bytes], int] = collections.OrderedDict()

    async def apply(
        self,
        dialect: Dialect,
        body: dict[str, Any],
        raw: bytes | None = None,
        refuse_as: Dialect | None = None,
    ) -> Decision:
        """The decision for one request of a format with a completion budget. A body that cannot be
        rendered passes uncounted: the upstream will refuse it in its own words, which serves the
        client better than a guess of ours.

        Counting always runs off the event loop: even a small body's render costs ~0.1 ms. `raw`, the
        body as received, lets a repeated body be answered from a memo (COUNT_MEMO_MAX). `refuse_as`:
        see `decide`."""
        _completion_field(dialect, body)
        key = (dialect.name, hashlib.blake2b(raw, digest_size=16).digest()) if raw is not None else None
        try:
            prompt_tokens = self._memo.get(key) if key is not None else None
            if prompt_tokens is not None and key is not None:
                self._memo.move_to_end(key)
            else:
                prompt_tokens = await asyncio.to_thread(self.counter.count, dialect, body)
        except CountError as exc:
            log.warning("budget not applied: %s", exc)
            field = _completion_field(dialect, body)
            requested = body.get(field)
            requested = requested if isinstance(requested, int) and not isinstance(requested, bool) else None
            limit = self.limits.max_total_tokens
            return Decision("pass", None, requested, None, field, limit, note=str(exc))
        if key is not None and key not in self._memo:
            self._memo[key] = prompt_tokens
            if len(self._memo) > COUNT_MEMO_MAX:
                self._memo.popitem(last=False)
        return decide(
            dialect, body, prompt_tokens, self.limits, self.policy, self.min_completion_tokens, refuse_as
        )

    def decide_counted(
        self, dialect: Dialect, body: dict[str, Any], prompt_tokens: int, refuse_as: Dialect | None = None
    ) -> Decision:
        """The decision for a request whose prompt is known to be `prompt_tokens` long (the ids
        `--tokens exact` built), with nothing to count: `decide` with this budget's limits and policy."""
        return decide(
            dialect, body, prompt_tokens, self.limits, self.policy, self.min_completion_tokens, refuse_as
        )

    async def count_answer(self, dialect: CountsPrompt, body: dict[str, Any]) -> dict[str, Any]:
        """The answer of a format whose answer is the prompt's token count (Anthropic count_tokens:
        `{"input_tokens": N}`, N counted exactly as /v1/messages would count it). Raises BadRequest
        (400) for a body that cannot be rendered."""
        try:
            tokens = await asyncio.to_thread(self.counter.count, dialect, body)
        except CountError as exc:
            raise BadRequest(str(exc)) from exc
        return dialect.count_answer(tokens)


async def discover_limits(upstream: Upstream, headers: Mapping[str, str]) -> tuple[int | None, str]:
    """The upstream's context length and where it came from, or (None, why not).

    Tries GET /v1/models (`max_model_len`, vLLM and SGLang), then SGLang's /server_info,
    /get_server_info and /get_model_info. AReaL serves none of them (docs/areal.md §1.1.1),
    so against AReaL the operator passes --context-length. Runs once at start, before any exchange.
    """
    for path in _DISCOVERY_PATHS:
        found = context_length_in(await upstream.fetch_json(path, headers, DISCOVERY_TIMEOUT_S))
        if found is not None:
            return found[0], f"GET {path} {found[1]}"
    return None, f"{upstream.root} reports no context length at {', '.join(_DISCOVERY_PATHS)}"


def context_length_in(payload: Any) -> tuple[int, str] | None:
    """(context length, key) from a /v1/models, /server_info or /get_model_info body. With several
    model cards the smallest window is the one every request must fit."""
    if isinstance(payload, dict) and isinstance(payload.get("data"), list):
        found = [context_length_in(card) for card in payload["data"]]
        known = [f for f in found if f is not None]
        return min(known) if known else None
    if not isinstance(payload, dict):
        return None
    for key in _CONTEXT_KEYS:
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None
