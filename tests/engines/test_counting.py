"""Counting proven against a real server: for generated conversations of every shape, each request cut
after any message, modeltap's count (as `transformers serve` prepares messages, counted by windows
where a conversation grows) equals the `prompt_tokens` the server reports; and the server refuses
exactly the requests modeltap cannot count (tool-call arguments that are not JSON)."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings

from modeltap import dialects
from modeltap.compat import preparations
from modeltap.counting.counter import CountError, TokenCounter
from tests.conversations import conversations, requests
from tests.engines.conftest import TransformersServer

# Generated conversations sent in full, each cut after every message: ~4 requests each, a few seconds
# of CPU generation in all (one token per request).
CONVERSATIONS = 60
CHAT = dialects.named("chat")


class Tally:
    """What the generated run saw, printed when the module ends (the report quotes it)."""

    conversations = requests = equal = refused = 0
    reasons: ClassVar[collections.Counter[str]] = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    yield
    print(
        f"\nengines tier: {Tally.conversations} conversations, {Tally.requests} requests: {Tally.equal} "
        f"counted equal to the server's prompt_tokens, {Tally.refused} refused by both "
        f"({dict(Tally.reasons.most_common(3))})"
    )


@pytest.fixture(scope="module")
def counter(model_folder: Path) -> TokenCounter:
    """Counts by windows and pieces, never checked by a full encode: every count is the fast path's."""
    return TokenCounter.load(
        model_folder, preparation=preparations.TRANSFORMERS, verify_first=0, verify_every=0
    )


@settings(
    max_examples=CONVERSATIONS,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(conversation=conversations())
def test_every_request_counts_as_the_server_does(
    tfserve: TransformersServer,
    counter: TokenCounter,
    conversation: tuple[list[dict[str, Any]], list[dict[str, Any]] | None],
) -> None:
    messages, tools = conversation
    Tally.conversations += 1
    for body in requests(messages, tools, tfserve.model):
        status, answer = tfserve.post("/v1/chat/completions", body)
        Tally.requests += 1
        try:
            counted: int | None = counter.count(CHAT, body)
        except CountError as exc:
            Tally.reasons[str(exc)[:120]] += 1
            counted = None
        if counted is None:
            assert status >= 400, json.dumps(body)
            Tally.refused += 1
            continue
        assert status == 200, answer
        assert counted == answer["usage"]["prompt_tokens"], json.dumps(body)
        Tally.equal += 1


ASSISTANT_CALL = {
    "role": "assistant",
    "content": "I will look.",
    "reasoning_content": "The user wants the listing.",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}
    ],
}


@pytest.mark.parametrize(
    "messages",
    [
        [
            {"role": "user", "content": "list"},
            ASSISTANT_CALL,
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
        ],
        [
            {"role": "user", "content": "hi", "name": "alice"},
            {"role": "assistant", "content": "x", "reasoning": "r"},
        ],
    ],
    ids=["content beside tool calls, reasoning_content", "name, reasoning"],
)
def test_counting_without_the_servers_preparation_is_wrong(
    tfserve: TransformersServer, counter: TokenCounter, model_folder: Path, messages: list[dict[str, Any]]
) -> None:
    """The server drops an assistant's content beside its tool calls and every field but four: counted
    as an unknown engine, these requests overcount (the issue's 41 of 739)."""
    body = {"model": tfserve.model, "messages": messages, "max_tokens": 1}
    status, answer = tfserve.post("/v1/chat/completions", body)
    assert status == 200
    served = answer["usage"]["prompt_tokens"]
    unknown = TokenCounter.load(model_folder, verify_first=0, verify_every=0)
    assert counter.count(CHAT, body) == served < unknown.count(CHAT, body)
