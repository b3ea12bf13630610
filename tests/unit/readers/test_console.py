"""modeltap/readers/console.py: serve's line per exchange, numbered per session, written off the loop,
the same line `modeltap tail` prints."""

from __future__ import annotations

import io
import re

from modeltap.readers.console import ConsoleLog
from modeltap.records.exchange import BudgetRecord
from modeltap.testing import exchange
from tests.factories import assistant, chat_completion, tool_call, usage

REPLY = chat_completion(assistant("The answer is 42."), usage=usage(25, 5))
CALL = chat_completion(
    assistant(None, tool_call("c1", "bash", '{"command": "ls"}')), "tool_calls", usage=usage(9, 3)
)


def lines(*exchanges: object, verbose: bool = False) -> list[str]:
    out = io.StringIO()
    console = ConsoleLog(out, verbose=verbose)
    for ex in exchanges:
        console.on_exchange(ex)  # type: ignore[arg-type]
    console.close()
    return out.getvalue().splitlines()


def test_one_line_each_numbered_per_session_with_tokens_and_what_was_said() -> None:
    budget = BudgetRecord("clamped 4000->3086", "clamp", prompt_tokens=1000)
    first, second, other = lines(
        exchange({"model": "m", "messages": []}, CALL, session_id="s-a"),
        exchange({"model": "m", "messages": []}, REPLY, session_id="s-a", budget=budget),
        exchange({"model": "m", "messages": []}, REPLY, session_id="s-b"),
    )
    assert re.search(r"s-a #1  chat  200  .*tokens 9→3  tool_calls  → bash\(\{\"command\": \"ls\"\}\)", first)
    assert re.search(
        r"s-a #2  chat  200 .* tokens 25→5  stop  budget clamped 4000->3086  'The answer is 42.'", second
    )
    assert "s-b #1" in other


def test_an_error_shows_its_class_and_message_and_verbose_adds_the_request_line() -> None:
    failed = exchange(
        {"model": "m", "messages": []},
        None,
        status=502,
        session_id="s-a",
        error_class="upstream_error",
        error_message="cannot connect to upstream",
        user_agent="opencode/1.18",
        response_body=b"<html>bad gateway</html>",
    )
    [line, request] = lines(failed, verbose=True)
    assert "502" in line and "upstream_error: cannot connect to upstream" in line
    assert request.strip() == "POST /v1/chat/completions  opencode/1.18"


def test_a_line_that_cannot_be_made_does_not_stop_the_next(monkeypatch: object) -> None:
    broken = exchange({"model": "m", "messages": []}, REPLY, session_id="s-a", started="not a time")
    assert (
        lines(broken, exchange({"model": "m", "messages": []}, REPLY, session_id="s-a"))[-1].count("#2") == 1
    )
