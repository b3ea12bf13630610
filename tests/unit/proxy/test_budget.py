"""modeltap/proxy/budget.py: the rule at its boundary for every policy, clamps that touch only the
client's field, the canonical error bodies, counting off the loop, and limit discovery."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.dialects.roles import Dialect
from modeltap.proxy.budget import Budget, Limits, decide, discover_limits
from modeltap.proxy.errors import BadRequest
from modeltap.proxy.upstream import Upstream

COUNT_TOKENS = dialects.named("count_tokens")

C = 1000
M = 100
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": M}


@pytest.fixture(scope="module")
def counter(qwen_dir: str) -> TokenCounter:
    return TokenCounter.load(qwen_dir)


# --- the rule at its boundary -------------------------------------------------------------------
# Safe when P + M <= C - 1 (- R): at C - 2 and C - 1 the request passes everywhere; at C and C + 1
# clamp lowers M by 1 and 2, reject refuses, off forwards it unchanged.


@pytest.mark.parametrize(
    ("total", "policy", "action", "allowed"),
    [
        (C - 2, "clamp", "pass", M + 1),
        (C - 1, "clamp", "pass", M),
        (C, "clamp", "clamp", M - 1),
        (C + 1, "clamp", "clamp", M - 2),
        (C - 2, "reject", "pass", M + 1),
        (C - 1, "reject", "pass", M),
        (C, "reject", "reject", M - 1),
        (C + 1, "reject", "reject", M - 2),
        (C - 2, "off", "pass", M + 1),
        (C - 1, "off", "pass", M),
        (C, "off", "pass", M - 1),
        (C + 1, "off", "pass", M - 2),
    ],
)
def test_context_length_boundary(total: int, policy: str, action: str, allowed: int) -> None:
    decision = decide(dialects.named("chat"), CHAT, total - M, Limits(C), policy, min_completion_tokens=1)
    assert (decision.action, decision.allowed, decision.requested) == (action, allowed, M)
    if action == "clamp":
        assert decision.body == {**CHAT, "max_tokens": allowed}
    else:
        assert decision.body is None
    assert (decision.error is not None) == (action == "reject")


E = 800


@pytest.mark.parametrize(
    ("total", "policy", "action"),
    [
        (E - 1, "clamp", "pass"),
        (E, "clamp", "pass"),
        (E + 1, "clamp", "clamp"),
        (E - 1, "reject", "pass"),
        (E, "reject", "pass"),
        (E + 1, "reject", "reject"),
        (E + 1, "off", "pass"),
    ],
)
def test_engine_max_tokens_boundary(total: int, policy: str, action: str) -> None:
    # With AReaL's engine_max_tokens E below C, P + M <= E is the binding rule (equal allowed).
    decision = decide(dialects.named("chat"), CHAT, total - M, Limits(C, engine_max_tokens=E), policy, 1)
    assert decision.action == action
    assert decision.limit == E


@pytest.mark.parametrize(
    ("prompt", "action"), [(E - 2, "pass"), (E - 1, "pass"), (E, "reject"), (E + 1, "reject")]
)
def test_prompt_alone_against_engine_max_tokens(prompt: int, action: str) -> None:
    # AReaL refuses P == E (docs/areal.md §4.1), so with M absent P <= E - 1 must hold.
    body = {"model": "m", "messages": [], "stream": False}
    decision = decide(dialects.named("chat"), body, prompt, Limits(C, engine_max_tokens=E), "reject", 1)
    assert decision.action == action


def test_reserve_is_kept_free() -> None:
    limits = Limits(C, reserve=6)
    assert limits.max_total_tokens == C - 7
    assert decide(dialects.named("chat"), CHAT, C - 7 - M, limits, "reject", 1).action == "pass"
    assert decide(dialects.named("chat"), CHAT, C - 6 - M, limits, "reject", 1).action == "reject"


def test_clamp_rejects_when_fewer_than_min_completion_tokens_remain() -> None:
    limit = C - 1
    assert decide(dialects.named("chat"), CHAT, limit - 16, Limits(C), "clamp", 16).action == "clamp"
    decision = decide(dialects.named("chat"), CHAT, limit - 15, Limits(C), "clamp", 16)
    assert (decision.action, decision.allowed) == ("reject", 15)
    # A request asking for less than the minimum still goes through when what it asks for fits.
    small = {**CHAT, "max_tokens": 10}
    assert decide(dialects.named("chat"), small, limit - 12, Limits(C), "clamp", 16).action == "pass"


# --- which field, and only that field -----------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "body", "field"),
    [
        (dialects.named("chat"), {"messages": []}, "max_completion_tokens"),
        (dialects.named("completions"), {"prompt": "x"}, "max_tokens"),
        (dialects.named("responses"), {"input": "x"}, "max_output_tokens"),
        (dialects.named("messages"), {"messages": []}, "max_tokens"),
    ],
)
def test_absent_m_is_set_under_clamp_and_left_alone_under_reject(
    endpoint: Dialect, body: dict[str, Any], field: str
) -> None:
    clamped = decide(endpoint, body, 400, Limits(C), "clamp", 1)
    assert (clamped.action, clamped.field, clamped.requested) == ("clamp", field, None)
    assert clamped.body == {**body, field: C - 1 - 400}
    passed = decide(endpoint, body, 400, Limits(C), "reject", 1)
    assert (passed.action, passed.body) == ("pass", None)


def test_clamp_rewrites_the_field_the_client_used() -> None:
    body = {"model": "m", "messages": [], "max_tokens": 5000, "temperature": 0}
    decision = decide(dialects.named("chat"), body, 900, Limits(C), "clamp", 1)
    # AReaL answers 500 when both fields are sent, so max_completion_tokens is never added.
    assert decision.body == {"model": "m", "messages": [], "max_tokens": 99, "temperature": 0}
    assert list(decision.body) == list(body)
    assert body["max_tokens"] == 5000, "the client's body is not changed"
    both = {"messages": [], "max_tokens": 5000, "max_completion_tokens": 4000}
    # Backends read max_completion_tokens when both are sent; that is the one the budget holds to.
    assert decide(dialects.named("chat"), both, 900, Limits(C), "clamp", 1).body == {
        **both,
        "max_completion_tokens": 99,
    }


def test_m_that_is_not_a_count_is_left_to_the_upstream() -> None:
    for value in ("100", 1.5, True):
        decision = decide(
            dialects.named("chat"), {**CHAT, "max_tokens": value}, C * 2, Limits(C), "reject", 1
        )
        assert (decision.action, decision.body, decision.error) == ("pass", None, None)
        assert decision.note == "max_tokens is not an integer"


# --- the canonical errors -----------------------------------------------------------------------


WINDOW_NOTE = (
    "modeltap refused this request before the upstream saw it: the limit is the context length {c} less "
    "1, since some servers refuse a prompt and completion that fill the window exactly; at least {n} "
    "completion token{s} must fit."
)


def note(context_length: int, needed: int) -> str:
    return WINDOW_NOTE.format(c=context_length, n=needed, s="s" if needed > 1 else "")


def test_openai_error_body_verbatim() -> None:
    decision = decide(dialects.named("chat"), CHAT, 950, Limits(C), "reject", 1)
    assert decision.error is not None
    assert decision.error.status == 400
    assert dialects.named("chat").error_body(decision.error.api_error) == {
        "error": {
            "message": "This model's maximum context length is 999 tokens. However, you requested "
            "1050 tokens (950 in the messages, 100 in the completion). "
            "Please reduce the length of the messages or completion. " + note(C, M),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def test_openai_error_with_m_absent_counts_no_completion_and_names_what_must_fit() -> None:
    decision = decide(dialects.named("responses"), {"input": "x"}, 990, Limits(C), "clamp", 16)
    assert decision.error is not None
    assert decision.error.message == (
        "This model's maximum context length is 999 tokens. However, you requested 990 tokens "
        "(990 in the messages, 0 in the completion). Please reduce the length of the messages or completion. "
        + note(C, 16)
    )


def test_the_refusal_names_engine_max_tokens_when_it_is_the_limit() -> None:
    decision = decide(dialects.named("chat"), CHAT, 950, Limits(C, engine_max_tokens=900), "reject", 1)
    assert (
        decision.error is not None
        and "the limit is AReaL's engine_max_tokens, 900;" in decision.error.message
    )


def test_anthropic_error_body_verbatim() -> None:
    body = {"model": "claude", "messages": [], "max_tokens": 4096}
    decision = decide(dialects.named("messages"), body, 208656, Limits(200001), "reject", 1)
    assert decision.error is not None
    # P > 200000 - 4096: the prompt must leave room for the completion asked for.
    assert dialects.named("messages").error_body(decision.error.api_error) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 208656 tokens > 195904 maximum. " + note(200001, 4096),
        },
    }
    clamp = decide(dialects.named("messages"), body, 200000, Limits(200001), "clamp", 1)
    assert clamp.error is not None
    assert clamp.error.message == "prompt is too long: 200000 tokens > 199999 maximum. " + note(200001, 1)
    # A completion asked for beyond the whole window: no prompt fits, and the maximum never goes below 0.
    greedy = decide(dialects.named("messages"), body | {"max_tokens": 300000}, 5, Limits(200001), "reject", 1)
    assert greedy.error is not None and greedy.error.message.startswith(
        "prompt is too long: 5 tokens > 0 maximum."
    )


def test_decision_record_and_summary() -> None:
    decision = decide(dialects.named("chat"), CHAT, C, Limits(C), "reject", 1)
    record = decision.as_record()
    assert dataclasses.asdict(record) == {
        "summary": f"rejected {C}+{M}>{C - 1}",
        "action": "reject",
        "prompt_tokens": C,
        "requested": M,
        "allowed": 0,
        "field": "max_tokens",
        "limit": C - 1,
        "error": decision.error.message if decision.error else None,
        "note": None,
    }
    assert decide(dialects.named("chat"), CHAT, 900, Limits(C), "clamp", 1).summary() == "clamped 100->99"
    assert decide(dialects.named("chat"), CHAT, 100, Limits(C), "clamp", 1).summary() == "passed 100+100<=999"


# --- limits -------------------------------------------------------------------------------------


def test_limits_say_where_they_came_from() -> None:
    limits = Limits(
        32768,
        engine_max_tokens=32000,
        sources={
            "context_length": "GET /v1/models max_model_len",
            "engine_max_tokens": "--engine-max-tokens",
        },
    )
    assert limits.describe() == (
        "context length 32768 (GET /v1/models max_model_len), engine max tokens 32000 (--engine-max-tokens), "
        "reserve 0 (default): prompt + completion at most 32000 tokens"
    )


def test_limits_that_leave_no_room_are_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        Limits(10, reserve=9)
    with pytest.raises(ValueError, match="policy"):
        decide(dialects.named("chat"), CHAT, 1, Limits(C), "truncate", 1)
    with pytest.raises(ValueError, match="no completion budget"):
        decide(dialects.named("embeddings"), {}, 1, Limits(C), "clamp", 1)


# --- Budget: counting off the loop --------------------------------------------------------------


async def test_apply_counts_then_decides(counter: TokenCounter) -> None:
    prompt = counter.count(dialects.named("chat"), CHAT)
    budget = Budget(counter, Limits(prompt + M), policy="clamp")
    decision = await budget.apply(dialects.named("chat"), CHAT)
    assert (decision.action, decision.prompt_tokens, decision.body) == (
        "clamp",
        prompt,
        {**CHAT, "max_tokens": M - 1},
    )


async def test_counting_runs_off_the_event_loop(qwen_dir: str) -> None:
    threads: list[int] = []

    class Watched(TokenCounter):
        def count(self, endpoint: Dialect, body: dict[str, Any]) -> int:
            threads.append(threading.get_ident())
            return super().count(endpoint, body)

    budget = Budget(Watched.load(qwen_dir), Limits(C))
    await budget.apply(dialects.named("chat"), CHAT)
    await budget.apply(dialects.named("chat"), CHAT, json.dumps(CHAT).encode())  # small bodies too
    await budget.count_answer(COUNT_TOKENS, {"model": "c", "messages": [{"role": "user", "content": "hi"}]})
    assert len(threads) == 3 and threading.get_ident() not in threads


async def test_a_body_that_cannot_be_counted_passes_uncounted(counter: TokenCounter) -> None:
    decision = await Budget(counter, Limits(C)).apply(
        dialects.named("chat"), {"messages": "oops", "max_tokens": 5}
    )
    assert (decision.action, decision.prompt_tokens, decision.requested, decision.body) == (
        "pass",
        None,
        5,
        None,
    )
    assert decision.note and "cannot render" in decision.note


async def test_count_tokens_answers_what_messages_would_count(counter: TokenCounter) -> None:
    body = {"model": "claude", "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    budget = Budget(counter, Limits(C))
    expected = {"input_tokens": counter.count(dialects.named("messages"), body)}
    assert await budget.count_answer(COUNT_TOKENS, body) == expected
    with pytest.raises(BadRequest):
        await budget.count_answer(COUNT_TOKENS, {"model": "claude"})


async def test_apply_refuses_endpoints_without_a_budget(counter: TokenCounter) -> None:
    with pytest.raises(ValueError):
        await Budget(counter, Limits(C)).apply(dialects.named("models"), {})
    with pytest.raises(ValueError):
        Budget(counter, Limits(C), policy="lenient")


# --- discovering the context length -------------------------------------------------------------


async def _serve(aiohttp_server: Any, routes: dict[str, Any], key: str = "k") -> str:
    app = web.Application()
    for path, payload in routes.items():

        async def handler(request: web.Request, payload: Any = payload) -> web.Response:
            if request.headers.get("Authorization") != f"Bearer {key}":
                return web.json_response({"error": "no key"}, status=401)
            return web.json_response(payload)

        app.router.add_get(path, handler)
    server = await aiohttp_server(app, host="127.0.0.1")
    return str(server.make_url(""))


@pytest.mark.parametrize(
    ("routes", "found"),
    [
        # vLLM and SGLang model cards; with several cards every request must fit the smallest.
        (
            {
                "/v1/models": {
                    "data": [{"id": "a", "max_model_len": 32768}, {"id": "b", "max_model_len": 8192}]
                }
            },
            (8192, "GET /v1/models max_model_len"),
        ),
        # SGLang's server info has context_length null when it came from config.json.
        (
            {"/server_info": {"context_length": None}, "/get_server_info": {"context_length": 4096}},
            (4096, "GET /get_server_info context_length"),
        ),
        (
            {"/get_model_info": {"model_path": "m", "max_context_length": 2048}},
            (2048, "GET /get_model_info max_context_length"),
        ),
    ],
)
async def test_discover_limits(aiohttp_server: Any, routes: dict[str, Any], found: tuple[int, str]) -> None:
    base = await _serve(aiohttp_server, routes)
    async with aiohttp.ClientSession() as session:
        assert await discover_limits(Upstream(base, "auto", session), {"Authorization": "Bearer k"}) == found
        v1 = Upstream(base.rstrip("/") + "/v1", "auto", session)
        assert await discover_limits(v1, {"Authorization": "Bearer k"}) == found
        # The upstream's key goes with every probe.
        value, why = await discover_limits(Upstream(base, "auto", session), {})
        assert value is None and "reports no context length" in why


async def test_discover_limits_against_areal_or_nothing(aiohttp_server: Any) -> None:
    # AReaL serves none of the discovery paths (docs/areal.md §1.1.1): 404 everywhere.
    base = await _serve(aiohttp_server, {"/chat/completions": {}})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with aiohttp.ClientSession() as session:
        for url in (base, closed):
            value, why = await discover_limits(Upstream(url, "auto", session), {"Authorization": "Bearer k"})
            assert value is None and "/v1/models" in why


async def test_repeated_bodies_are_counted_once(counter: TokenCounter) -> None:
    counts: list[int] = []

    class Counting:  # the real counter, noting each count
        def count(self, endpoint: Dialect, body: dict[str, Any]) -> int:
            counts.append(1)
            return counter.count(endpoint, body)

    budget = Budget(Counting(), Limits(C), policy="clamp")  # type: ignore[arg-type]
    raw = json.dumps(CHAT).encode()
    first = await budget.apply(dialects.named("chat"), CHAT, raw)
    again = await budget.apply(dialects.named("chat"), CHAT, raw)  # a retry, or a GRPO group's next sample
    other = {**CHAT, "messages": [{"role": "user", "content": "hello there"}]}
    different = await budget.apply(dialects.named("chat"), other, json.dumps(other).encode())
    assert len(counts) == 2 and first == again
    assert different.prompt_tokens != first.prompt_tokens
