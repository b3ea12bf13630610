"""modeltap/testing.py: the kit observer authors build exchanges and session events with."""

from __future__ import annotations

import dataclasses
import json

import pytest

from modeltap.records.exchange import Exchange, RolloutOutcome
from modeltap.testing import exchange, session_event


def test_an_exchange_is_sealed_and_says_what_it_was_given() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ex = exchange(body, {"choices": []}, session_id="s-7", labels={"task_id": "t1"}, status=429)
    assert isinstance(ex, Exchange)
    assert (ex.endpoint, ex.path, ex.session_id, ex.labels, ex.status) == (
        "chat",
        "/v1/chat/completions",
        "s-7",
        {"task_id": "t1"},
        429,
    )
    assert json.loads(ex.request) == body and ex.request_json == body and ex.ended is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ex.status = 200  # type: ignore[misc]


def test_an_exchange_with_no_body_sent_none_and_two_exchanges_differ_in_id() -> None:
    a, b = exchange(), exchange()
    assert a.request == b"" and a.request_json is None and a.id != b.id


def test_a_session_event_carries_its_outcome() -> None:
    event = session_event("outcome", "s-2", outcome=RolloutOutcome("scored", reward=0.5), labels={"a": "b"})
    assert (event.kind, event.session_id, event.outcome, event.labels) == (
        "outcome",
        "s-2",
        RolloutOutcome("scored", reward=0.5),
        {"a": "b"},
    )
