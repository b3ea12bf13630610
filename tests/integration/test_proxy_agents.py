"""The real opencode and Claude Code CLIs, run offline, through modeltap to the AReaL stand-in: each
completes the `echo $((6 * 7))` tool-call task, and the records hold every request. With a budget,
each reacts to modeltap's 400 as it does to a real context overflow."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from modeltap.proxy.server import Proxy
from tests.agents import AgentRun, arun_claude, arun_opencode
from tests.integration.conftest import records
from tests.standins.areal import ArealSession, ArealStandIn

pytestmark = pytest.mark.agents

# Long enough for several compact-and-retry rounds of opencode (each well under a second here).
# opencode compacts within seconds on a quiet machine; a loaded CI runner gets much longer.
COMPACTION_RUN_S = 180.0


def tool_names(row: dict) -> list[str]:
    return [t.get("function", t).get("name") for t in (row["request"] or {}).get("tools") or []]


AgentRunner = Callable[[str], Awaitable[AgentRun]]
Recorded = tuple[ArealSession, list[dict[str, Any]]]


@pytest.fixture
def answers_42_through_modeltap(
    areal: ArealStandIn, areal_proxy: Proxy, store_path: Path
) -> Callable[[str, AgentRunner], Awaitable[Recorded]]:
    """`(agent, run_agent)`: `run_agent(base_url)` in a modeltap session of its own over an AReaL
    session of its own, to the answer 42; then modeltap stops, flushing its records. Returns the AReaL
    session and the modeltap session's records."""

    async def run(agent: str, run_agent: AgentRunner) -> Recorded:
        upstream_session = areal.open_session(agent)
        session = areal_proxy.sessions.open(upstream_key=upstream_session.api_key, labels={"agent": agent})
        outcome = await run_agent(session.host_base_url)
        assert outcome.exit_code == 0 and outcome.final_text == "42", outcome.describe()
        await areal_proxy.stop()
        return upstream_session, records(store_path, session.id)

    return run


@pytest.mark.parametrize("suffix", ["/v1", ""])
async def test_opencode_through_modeltap_to_areal(
    areal: ArealStandIn, answers_42_through_modeltap: Callable[..., Any], tmp_path: Path, suffix: str
) -> None:
    upstream_session, rows = await answers_42_through_modeltap(
        "opencode", lambda url: arun_opencode(url + suffix, "agent-never-sees-the-real-key", tmp_path)
    )
    assert len(rows) == 3, [r["path"] for r in rows]
    title, first, second = rows
    assert tool_names(title) == [] and title["request"]["messages"][0]["content"].startswith(
        "You are a title"
    )
    assert "bash" in tool_names(first) and first["finish_reason"] == "tool_calls"
    assert first["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
    assert second["request"]["messages"][-1]["role"] == "tool" and second["finish_reason"] == "stop"
    assert second["response"]["choices"][0]["message"]["content"] == "42"
    assert all(r["streamed"] and r["status"] == 200 and r["user_agent"].startswith("opencode/") for r in rows)
    upstream_calls = areal.model_requests
    assert [r.path for r in upstream_calls] == ["/chat/completions"] * 3
    assert {r.headers["Authorization"] for r in upstream_calls} == {f"Bearer {upstream_session.api_key}"}


@pytest.mark.parametrize("suffix", ["", "/v1"])
async def test_claude_code_through_modeltap_to_areal(
    areal: ArealStandIn, answers_42_through_modeltap: Callable[..., Any], tmp_path: Path, suffix: str
) -> None:
    _, rows = await answers_42_through_modeltap(
        "claude", lambda url: arun_claude(url + suffix, "agent-key", tmp_path)
    )
    assert [(r["endpoint"], r["status"], r["finish_reason"]) for r in rows] == [
        ("messages", 200, "tool_use"),
        ("messages", 200, "end_turn"),
    ]
    assert rows[0]["path"].endswith(("/v1/messages?beta=true", "/v1/v1/messages?beta=true"))
    [tool_use] = [b for b in rows[0]["response"]["content"] if b["type"] == "tool_use"]
    assert tool_use["name"] == "Bash" and tool_use["input"]["command"] == "echo $((6 * 7))"
    assert [r.path for r in areal.model_requests] == ["/v1/messages", "/v1/messages"]


async def test_opencode_compacts_on_modeltaps_context_length_400(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, tmp_path: Path, qwen_dir: str
) -> None:
    # opencode's system prompt and ten tools are ~7k tokens: a 3000-token window cannot hold its first
    # turn, while its title request and its compaction request fit. The scripted model's summary cannot
    # shrink the system prompt, so opencode compacts and retries for ever: the run is stopped once a
    # compaction request followed a refusal (however long a loaded machine takes to get there).
    async with make_proxy(upstream=areal.url, tokenizer=qwen_dir, context_length=3000, sync=True) as proxy:
        run = asyncio.ensure_future(
            arun_opencode(
                proxy.host_base_url + "/v1",
                areal.open_session("c").api_key,
                tmp_path,
                timeout_s=COMPACTION_RUN_S,
            )
        )
        try:
            rows = await until(lambda: _compacted(store_path), COMPACTION_RUN_S, "opencode compacted")
        finally:
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
    first_rejection = next(i for i, r in enumerate(rows) if r["status"] == 400)
    rejected = rows[first_rejection]
    assert (rejected["budget"]["action"], rejected["error_class"]) == ("reject", "model_fault")
    assert "bash" in tool_names(rejected)
    after = rows[first_rejection + 1]
    assert "summarization agent" in after["request"]["messages"][0]["content"]
    assert tool_names(after) == [] and after["status"] == 200


def _compacted(store_path: Path) -> list[dict[str, Any]] | None:
    """The records once one request after the first refusal has been answered, else None."""
    try:
        rows = records(store_path)
    except FileNotFoundError:
        return None
    statuses = [row["status"] for row in rows]
    return rows if 400 in statuses and 200 in statuses[statuses.index(400) + 1 :] else None


async def until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`check()`'s first true value, polled until `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (found := check()) is None:
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting until {what}")
        await asyncio.sleep(0.2)
    return found


async def test_claude_code_stops_on_prompt_too_long_without_retrying(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, tmp_path: Path, qwen_dir: str
) -> None:
    async with make_proxy(upstream=areal.url, tokenizer=qwen_dir, context_length=3000) as proxy:
        run = await arun_claude(proxy.host_base_url, areal.open_session("c").api_key, tmp_path)
    assert run.exit_code == 1
    assert "Prompt is too long" in (run.final_text or ""), run.describe()
    rows = records(store_path)
    assert [(r["status"], r["budget"]["action"]) for r in rows] == [(400, "reject")]
    assert areal.model_requests == []
