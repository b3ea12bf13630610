"""modeltap/readers/show.py: turns (what each added) and their text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modeltap.readers.show import session_turns, tail_line, turn_text
from modeltap.records.exchange import BudgetRecord, Exchange
from modeltap.records.reader import StoreReader
from modeltap.records.turns import TurnError, turns
from modeltap.testing import exchange
from tests.factories import assistant, recorded, tool_call

SYSTEM = {"role": "system", "content": "You are a coding agent."}
ASK = {"role": "user", "content": "Run `echo $((6 * 7))`."}
CALL = assistant(None, tool_call("call_1", "bash", '{"command": "echo 42"}'))
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "42\n"}
TITLE_ASK = [{"role": "system", "content": "You are a title generator."}, ASK]


def chat_reply(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    finish = "tool_calls" if calls else "stop"
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7},
    }


def chat(messages: list[dict[str, Any]], response: dict[str, Any] | None, **fields: Any) -> Exchange:
    request = {
        "model": "m",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": "bash"}}],
    }
    settings: dict[str, Any] = {
        "session_id": "s-view",
        "started": 1000.0,
        "first_byte": 1000.25,
        "ended": 1001.5,
        "user_agent": "OpenAI/Python 3.57.0",
    }
    return exchange(request, response, **(settings | fields))


async def recorded_rows(path: Path, *exchanges: Exchange) -> list[dict[str, Any]]:
    """`exchanges` written by the real store and read back as `show` reads them."""
    with StoreReader(await recorded(path, *exchanges)) as reader:
        return reader.exchanges()


async def test_each_turn_shows_what_it_added_against_the_turn_it_continues(tmp_path: Path) -> None:
    rows = await recorded_rows(
        tmp_path / "r.db",
        chat([SYSTEM, ASK], chat_reply(calls=CALL["tool_calls"])),
        chat(TITLE_ASK, chat_reply("Shell arithmetic"), request_json={"model": "m", "messages": TITLE_ASK}),
        chat([SYSTEM, ASK, CALL, RESULT], chat_reply("42")),
    )
    first, title, last = turns(rows)
    assert [m["role"] for m in first.new_messages] == ["system", "user"]
    assert first.tool_calls == [{"id": "call_1", "name": "bash", "arguments": '{"command": "echo 42"}'}]
    assert (first.finish_reason, first.prompt_tokens, first.completion_tokens) == (
        "tool_calls",
        100,
        7,
    )
    assert (first.ttfb_ms, first.latency_ms) == (250, 1500)
    assert title.continues is None and title.reply == "Shell arithmetic"
    # The title request sits between the two turns of the main loop; turn 3 still continues turn 1.
    assert last.continues == 1
    assert last.new_messages == [CALL, RESULT]
    assert last.tool_results == [{"id": "call_1", "content": "42\n", "is_error": False}]
    assert (last.reply, last.finish_reason, last.error) == ("42", "stop", None)
    assert last.request is None and turns(rows, full=True)[2].request["messages"][-1] == RESULT


async def test_errors_budget_and_parse_failures_are_part_of_the_turn(tmp_path: Path) -> None:
    budget = BudgetRecord("clamped 4096->100", "clamp", 900, 4096, 100, "max_tokens", 1000)
    overflow = chat(
        [SYSTEM, ASK],
        {"error": {"message": "maximum context length is 1000 tokens"}},
        status=400,
        error_class="model_fault",
        error_message="This model's maximum context length is 1000 tokens.",
    )
    broken = chat_reply()
    broken["choices"][0]["finish_reason"] = "tool_calls"  # AReaL's failed tool-call parse
    rows = await recorded_rows(tmp_path / "r.db", chat([SYSTEM, ASK], broken, budget=budget), overflow)
    clamped, failed = turns(rows)
    assert clamped.budget == budget and clamped.tool_call_parse_failure
    assert failed.error == TurnError("model_fault", "This model's maximum context length is 1000 tokens.")
    text = session_turns("s-view", rows)
    assert "budget clamp: prompt 900 tokens, max_tokens 4096 → 100 (limit 1000)" in text
    assert "! finish_reason says tool call but none parsed" in text
    assert "! model_fault" in text and "maximum context length is 1000 tokens" in text
    assert "model_fault: This model's maximum context length" in tail_line(failed)


async def test_session_text_lists_messages_calls_results_and_reply(tmp_path: Path) -> None:
    long_output = "line\n" * 100
    rows = await recorded_rows(
        tmp_path / "r.db",
        chat([SYSTEM, ASK], chat_reply(calls=CALL["tool_calls"])),
        chat([SYSTEM, ASK, CALL, {**RESULT, "content": long_output}], chat_reply("42"), streamed=True),
    )
    text = session_turns("s-view", rows)
    lines = text.splitlines()
    assert lines[0] == "session s-view: 2 turn(s)"
    assert lines[1].startswith("#1  ") and "chat  200  1.50s  tokens 100→7  tool_calls" in lines[1]
    assert "+ user       Run `echo $((6 * 7))`." in text
    assert '← tool call  → bash({"command": "echo 42"})' in text
    assert "chat (stream)  200  1.50s (first byte 250ms)" in text
    assert "+ tool       ⇐ call_1: line line" in text and "← reply      42" in text
    assert all(len(line) <= 110 for line in lines)  # one line per message, shortened
    full = turn_text(turns(rows, full=True)[1])
    assert full.count("line") > 100 and "── request" in full and "── response" in full
    assert "POST /v1/chat/completions  model m  client OpenAI/Python 3.57.0" in full


async def test_anthropic_turns_show_blocks_and_a_changed_system_prompt(tmp_path: Path) -> None:
    def messages(history: list[dict[str, Any]], system: str) -> Exchange:
        body = {"model": "claude", "system": system, "messages": history}
        reply = {
            "type": "message",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 5},
        }
        return exchange(body, reply, path="/v1/messages?beta=true", endpoint="messages", session_id="s-a")

    use = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
    }
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}],
    }
    rows = await recorded_rows(
        tmp_path / "r.db",
        messages([ASK], "be brief"),
        messages([ASK, use, result], "be brief"),
        messages([ASK, use, result], "be briefer"),
    )
    first, second, third = turns(rows)
    assert first.tool_calls[0]["name"] == "Bash" and first.finish_reason == "tool_use"
    assert second.new_messages == [use, result] and second.tool_results[0]["content"] == "a.txt"
    assert third.new_messages == [{"role": "system", "content": "be briefer"}]
    text = session_turns("s-a", rows)
    assert "+ assistant  → Bash({})" in text and "+ user       ⇐ toolu_1: a.txt" in text


async def test_a_long_session_shows_a_tools_list_once_and_by_name(tmp_path: Path) -> None:
    names = ["bash", "read", "edit", *(f"tool{n}" for n in range(9))]
    tools = [{"type": "function", "function": {"name": name, "parameters": {}}} for name in names]

    def turn(
        messages: list[dict[str, Any]], offered: list[dict[str, Any]], reply: dict[str, Any]
    ) -> Exchange:
        return chat(messages, reply, request_json={"model": "m", "messages": messages, "tools": offered})

    rows = await recorded_rows(
        tmp_path / "r.db",
        turn([SYSTEM, ASK], tools, chat_reply(calls=CALL["tool_calls"])),
        turn([SYSTEM, ASK, CALL, RESULT], tools, chat_reply("42")),
        turn([SYSTEM, ASK, CALL, RESULT], tools[:2], chat_reply("ok")),
    )
    text = session_turns("s-view", rows)
    first, second, third = text.split("\n#")[1:]
    assert "    tools: 12 offered (bash, read, edit, tool0, tool1," in first  # by name, not dumped
    assert '"parameters"' not in text
    assert "    tools: 12 offered (bash, read, edit, …), as in turn 1" in second
    assert "    tools: 2 offered (bash, read)\n" in third  # changed: listed again
    # One turn in full names its tools too.
    assert "tools: 12 offered (bash, read, edit, tool0" in turn_text(turns(rows)[0], rows[0]["request"])


async def test_a_system_prompt_seen_before_collapses_to_one_line(tmp_path: Path) -> None:
    """Claude Code switches its system prompt (plan mode) and back: the second time, one line."""
    long = "You are Claude Code. " * 434  # 9,114 characters
    plan = "You are in plan mode."

    def messages(system: str, turn: int) -> Exchange:
        history = [ASK]
        for n in range(1, turn):
            history += [{"role": "assistant", "content": f"ok {n}"}, {"role": "user", "content": "go on"}]
        body = {"model": "claude", "system": system, "messages": history}
        said = [{"type": "text", "text": f"ok {turn}"}]
        reply = {"type": "message", "content": said, "stop_reason": "end_turn"}
        return exchange(body, reply, path="/v1/messages", endpoint="messages", session_id="s-a")

    rows = await recorded_rows(tmp_path / "r.db", messages(long, 1), messages(plan, 2), messages(long, 3))
    first, second, third = session_turns("s-a", rows).split("\n#")[1:]
    assert "+ system     You are Claude Code. You are Claude Code." in first
    assert "+ system     You are in plan mode." in second
    assert "+ system     system prompt, 9.1k chars, as in turn 1" in third
    assert "You are Claude Code" not in third
    assert "You are Claude Code. You are" in turn_text(turns(rows)[2])  # a turn alone: in full


async def test_a_passed_budget_shows_the_cap_sent_not_an_arrow_to_the_most_that_fits(tmp_path: Path) -> None:
    passed = BudgetRecord("passed 900+50<=1310", "pass", 900, 50, 410, "max_tokens", 1310)
    rows = await recorded_rows(tmp_path / "r.db", chat([SYSTEM, ASK], chat_reply("42"), budget=passed))
    text = turn_text(turns(rows)[0])
    assert "budget pass: prompt 900 tokens, max_tokens 50 (at most 410 fit) (limit 1310)" in text
    assert "50 → 410" not in text


async def test_the_sent_body_is_titled_by_what_changed_it(tmp_path: Path) -> None:
    """A translated body with the budget off is not "clamped"; a clamped one says by how much."""
    chat_body = {"model": "m", "messages": [ASK], "max_completion_tokens": 64}
    translated = chat([ASK], chat_reply("42"), translated="chat", sent=chat_body, endpoint="messages")
    clamp = BudgetRecord("clamped 4096->100", "clamp", 900, 4096, 100, "max_tokens", 1000)
    clamped = chat(
        [ASK], chat_reply("42"), budget=clamp, sent={"model": "m", "messages": [ASK], "max_tokens": 100}
    )
    both = chat([ASK], chat_reply("42"), translated="chat", sent=chat_body, endpoint="messages", budget=clamp)
    rows = await recorded_rows(tmp_path / "r.db", translated, clamped, both)
    titles = [line for t in turns(rows, full=True) for line in turn_text(t).splitlines() if "── sent" in line]
    assert titles == [
        "── sent upstream (translated to chat)",
        "── sent upstream (max_tokens clamped 4096 → 100)",
        "── sent upstream (translated to chat; max_tokens clamped 4096 → 100)",
    ]
    assert turns(rows)[0].as_json()["sent_because"] == "translated to chat"
