"""modeltap's spans in a real tracing backend: `modeltap serve --otlp-endpoint` in front of the AReaL
stand-in, driven by the openai and anthropic SDKs and by opencode, read back from Arize Phoenix with its
own client. Phoenix must take every span, understand it as an LLM call (its GenAI conversion), read the
messages `--otlp-content` adds, group the spans of a modeltap session as one Phoenix session, and keep
the streams' time to first chunk."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from modeltap.records.reader import StoreReader
from tests.agents import TASK_PROMPT, run_opencode
from tests.factories import ASK
from tests.integration.test_otlp_export import sdk_turns
from tests.phoenix.conftest import Phoenix, serving
from tests.standins.areal import ArealStandIn


def by_exchange(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {span["attributes"]["modeltap.exchange.id"]: span for span in spans}


def recorded(store: Path) -> list[dict[str, Any]]:
    with StoreReader(store) as reader:
        return reader.exchanges()


def assert_phoenix_understood(span: dict[str, Any], row: dict[str, Any], session_id: str) -> None:
    """What modeltap sent, kept as sent, and what Phoenix made of it."""
    attrs = span["attributes"]
    assert span["name"] == f"chat {row['request']['model']}" and span["status_code"] == "UNSET"
    assert span["span_kind"] == "LLM"  # from gen_ai.operation.name
    assert (attrs["gen_ai.conversation.id"], attrs["session.id"]) == (session_id, session_id)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (
        row["prompt_tokens"],
        row["completion_tokens"],
    )
    assert attrs["llm.token_count.total"] == row["prompt_tokens"] + row["completion_tokens"]
    assert attrs["gen_ai.response.finish_reasons"] == [row["finish_reason"]]
    assert attrs["gen_ai.request.stream"] is row["streamed"] and attrs["http.response.status_code"] == 200
    if row["streamed"]:
        assert attrs["gen_ai.response.time_to_first_chunk"] == round(row["first_byte"] - row["started"], 6)
    else:
        assert "gen_ai.response.time_to_first_chunk" not in attrs


def test_sdk_sessions_reach_phoenix_as_its_sessions_with_tokens_and_stream_timing(
    phoenix: Phoenix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ArealStandIn() as areal, serving(areal, phoenix, tmp_path, monkeypatch, content=True) as serve:
        sessions = [serve.open_session(areal, {"task_id": f"task-{n}"}) for n in (1, 2)]
        for session in sessions:
            asyncio.run(sdk_turns(session["base_url"], "unused"))
    rows = recorded(serve.store)
    read = phoenix.read(serve.project, len(rows))
    spans = by_exchange(read["spans"])
    assert len(rows) == len(spans) == 8
    for row in rows:
        attrs = spans[row["id"]]["attributes"]
        assert_phoenix_understood(spans[row["id"]], row, row["session_id"])
        assert attrs["modeltap.label.task_id"] == row["labels"]["task_id"]
        # The content's JSON passed Phoenix's schema of the conventions' messages, OpenAI's and Anthropic's.
        assert attrs["llm.input_messages.0.message.content"] == ASK["content"]
        assert attrs["llm.output_messages.0.message.role"] == "assistant"
    in_phoenix = {s["session_id"]: s for s in read["sessions"]}
    assert sorted(in_phoenix) == sorted(s["id"] for s in sessions)
    for session in sessions:
        mine = [r for r in rows if r["session_id"] == session["id"]]
        assert len(in_phoenix[session["id"]]["traces"]) == len(mine) == 4  # a trace per exchange
        assert in_phoenix[session["id"]]["token_count_total"] == sum(
            r["prompt_tokens"] + r["completion_tokens"] for r in mine
        )
        # The Sessions tab: the first input is the user's message, the last output the model's last
        # answer (a call of the bash tool), as text, not a JSON stub.
        shown = read["session_io"][session["id"]]
        assert shown["first_input"] == ASK["content"], shown
        last = spans[mine[-1]["id"]]["attributes"]
        assert shown["last_output"] == last["output.value"] and last["output.value"].startswith("bash("), (
            shown
        )


@pytest.mark.agents
def test_an_opencode_run_is_one_phoenix_session_with_every_exchange(
    phoenix: Phoenix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ArealStandIn() as areal, serving(areal, phoenix, tmp_path, monkeypatch, content=True) as serve:
        session = serve.open_session(areal, {"agent": "opencode"})
        outcome = run_opencode(session["base_url"] + "/v1", "sk-agent", tmp_path / "project")
        assert outcome.exit_code == 0 and outcome.final_text == "42", outcome.describe()
    rows = recorded(serve.store)
    read = phoenix.read(serve.project, len(rows))
    spans = by_exchange(read["spans"])
    assert len(rows) == len(spans) == 3  # opencode's title request, the tool call, the answer
    for row in rows:
        span = spans[row["id"]]
        assert_phoenix_understood(span, row, session["id"])
        assert span["attributes"]["user_agent.original"].startswith("opencode/") and row["streamed"]
    [in_phoenix] = read["sessions"]
    assert (in_phoenix["session_id"], len(in_phoenix["traces"])) == (session["id"], 3)
    # The Sessions tab: the task as the user gave it first, the model's reply last.
    shown = read["session_io"][session["id"]]
    assert TASK_PROMPT in shown["first_input"] and shown["last_output"] == "42", shown
