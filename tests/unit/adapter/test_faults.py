"""modeltap/adapter/faults.py: the fault watch notes a context overflow or an unparsed tool call of the
sessions it watches, the first one only, from the exchanges the proxy hands it."""

from __future__ import annotations

import json

from modeltap.adapter.faults import FaultWatch, model_fault
from modeltap.testing import exchange

UNPARSED = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": None},
                         "finish_reason": "tool_calls"}]}  # fmt: skip
PARSED = {
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}]
}


def test_a_context_overflow_is_a_model_fault() -> None:
    ex = exchange(
        {}, None, status=500, error_class="model_fault", error_message="exceeds max_total_tokens 256"
    )
    assert model_fault(ex) == "the model's context overflowed (exceeds max_total_tokens 256)"


def test_an_unparsed_tool_call_is_a_model_fault_streamed_or_not() -> None:
    assert model_fault(exchange({}, UNPARSED)) is not None  # a stream, assembled by the relay
    as_bytes = exchange({}, None, response_body=json.dumps(UNPARSED).encode())  # a body, as relayed
    assert model_fault(as_bytes) is not None
    assert model_fault(exchange({}, PARSED)) is None
    assert model_fault(exchange({}, None, response_body=b"<html>oops</html>")) is None


def test_the_watch_keeps_the_first_fault_of_watched_sessions_only() -> None:
    watch = FaultWatch()
    watch.watch("s1")
    watch.on_exchange(exchange({}, UNPARSED, session_id="other"))
    watch.on_exchange(exchange({}, PARSED, session_id="s1"))
    watch.on_exchange(exchange({}, UNPARSED, session_id="s1"))
    watch.on_exchange(exchange({}, None, session_id="s1", error_class="model_fault", error_message="later"))
    assert (
        watch.release("s1")
        == "the model's tool call did not parse (it finished for a tool call but none parsed)"
    )
    assert watch.release("s1") is None  # released: forgotten
    watch.on_exchange(exchange({}, UNPARSED, session_id="s1"))  # no longer watched: nothing is kept
    assert watch.release("s1") is None
