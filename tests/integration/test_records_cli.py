"""The debugging commands (show, tail, export, replay, mock) on recordings made by real clients: the
openai SDK and opencode through a real modeltap Proxy in front of the vLLM stand-in. `tail` and `mock`
run as the `modeltap` command in subprocesses, as a person runs them in a second terminal."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modeltap import dialects
from modeltap.cli import main
from modeltap.dialects.sse import StreamAssembler
from modeltap.exporters.messages import conversation
from modeltap.proxy.config import DEFAULT_MAX_BODY_BYTES
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from modeltap.records.turns import turns
from modeltap.replay.mock import load_mock, mock_app
from modeltap.replay.replay import replay
from tests.agents import arun_opencode
from tests.factories import ASK, BASH_TOOL
from tests.integration.conftest import records
from tests.standins.anthropic_like import AnthropicLikeStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.script import Conversation, Reply, ToolCall, shell_arithmetic

MODELTAP = str(Path(sys.executable).parent / "modeltap")
# A subprocess command prints its address within a second or two; a loaded CI machine gets more.
START_TIMEOUT_S = 30.0


def play(base_url: str, *, ask: dict[str, Any] = ASK) -> list[Any]:
    """The openai SDK's two-turn tool loop: a non-streamed tool call, the result, a streamed answer
    with usage. Returns what the SDK got: the tool call and the streamed text."""
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    first = client.chat.completions.create(model="standin-model", messages=[ask], tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]
    history = [ask, first.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "42\n"})
    stream = client.chat.completions.create(
        model="standin-model",
        messages=history,
        tools=[BASH_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    client.close()
    return [call.function.name, json.loads(call.function.arguments), text]


@pytest.fixture
def session_id(threaded_proxy: Callable[..., Any], vllm_standin: OpenAILikeStandIn) -> str:
    """The id of a session the openai SDK played (`play`) through modeltap to the vLLM stand-in."""
    with threaded_proxy(upstream=vllm_standin.url) as proxy:
        session = proxy.sessions.open(labels={"agent": "openai-sdk"})
        assert play(session.host_base_url + "/v1") == ["bash", {"command": "echo $((6 * 7))"}, "42"]
    return str(session.id)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


@contextmanager
def cli_process(*argv: str, ready: str | None) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`modeltap ARGV` in a subprocess, once it printed a line containing `ready` (at once for None);
    stopped by its pid."""
    process = subprocess.Popen(
        [MODELTAP, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert process.stdout is not None
        if ready is None:
            yield process, ""
            return
        for line in process.stdout:
            if ready in line:
                yield process, line.strip()
                break
            if time.monotonic() > deadline:
                break
        else:
            pytest.fail(
                f"modeltap {' '.join(argv)} exited: {process.stderr.read() if process.stderr else ''}"
            )
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_show_export_on_an_openai_sdk_session(
    vllm_standin: OpenAILikeStandIn,
    threaded_proxy: Callable[..., Any],
    store_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with threaded_proxy(upstream=vllm_standin.url) as proxy:
        session = proxy.sessions.open(labels={"agent": "openai-sdk"})
        play(session.host_base_url + "/v1")
        vllm_standin.inject("400ctx")
        with pytest.raises(openai.BadRequestError):
            openai.OpenAI(
                base_url=session.host_base_url + "/v1", api_key="k", max_retries=0
            ).chat.completions.create(
                model="standin-model", messages=[ASK, {"role": "user", "content": "and again"}]
            )
    store = str(store_path)

    code, out = run_cli(capsys, "show", session.id[:6], "--store", store)
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"session {session.id}: 3 turn(s)  client=openai-python agent=openai-sdk"
    assert lines[1].startswith("#1  ") and '  tool_calls  → bash({"command": "echo $((6 * 7))"})' in lines[1]
    assert "    + user       Run `echo $((6 * 7))` and reply with the number." in lines
    assert any(line.startswith("#2  ") and "chat (stream)  200" in line and "stop" in line for line in lines)
    assert any(
        line.startswith("    + tool       ⇐ chatcmpl-tool-") and line.endswith(": 42") for line in lines
    )
    assert "    ← reply      42" in lines
    assert any(
        "400" in line and "model_fault: This model's maximum context length is 8192" in line for line in lines
    )

    code, out = run_cli(capsys, "show", session.id, "2", "--full", "--json", "--store", store)
    turn = json.loads(out)
    assert (turn["turn"], turn["continues"], turn["streamed"], turn["reply"]) == (2, 1, True, "42")
    assert [m["role"] for m in turn["new_messages"]] == ["assistant", "tool"]
    assert turn["request"]["stream_options"] == {"include_usage": True}
    assert turn["response"]["usage"]["completion_tokens"] == turn["completion_tokens"] > 0

    har_path = tmp_path / "s.har"
    assert (
        run_cli(capsys, "export", session.id, "--format", "har", "-o", str(har_path), "--store", store)[0]
        == 0
    )
    entries = json.loads(har_path.read_text())["log"]["entries"]
    assert [e["response"]["status"] for e in entries] == [200, 200, 400]
    content = entries[1]["response"]["content"]
    assembler = StreamAssembler(dialects.named("chat"))
    assembler.feed(content["text"].encode())
    assert content["mimeType"] == "text/event-stream"
    assert assembler.result().body == records(store_path, session.id)[1]["response"]

    code, out = run_cli(capsys, "export", session.id, "--format", "messages", "--store", store)
    exported = json.loads(out)
    assert [m["role"] for m in exported["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert exported["messages"][1]["tool_calls"][0]["function"]["name"] == "bash"
    assert exported["messages"][-1]["content"] == "42" and exported["tools"] == [BASH_TOOL]

    code, out = run_cli(capsys, "export", session.id, "--format", "jsonl", "--store", store)
    assert [json.loads(line)["format_version"] for line in out.splitlines()] == [1, 1, 1]


def answers_41(conversation: Conversation) -> Reply:
    """A different model: the same tool call, then the wrong number."""
    return Reply(text="41") if conversation.tool_results else shell_arithmetic(conversation)


def test_replay_shows_what_another_upstream_answers_differently(
    session_id: str, vllm_standin: OpenAILikeStandIn, store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(store_path)

    code, out = run_cli(capsys, "replay", session_id, "--upstream", vllm_standin.url, "--store", store)
    assert code == 0 and "2 turn(s) replayed, 0 differ" in out, out
    assert len(vllm_standin.model_requests) == 4  # recorded twice, replayed twice

    with OpenAILikeStandIn(script=answers_41) as other:
        code, out = run_cli(
            capsys, "replay", session_id, "--upstream", other.url, "--turn", "2", "--store", store
        )
        assert code == 1
        assert "turn 2  chat  /s/…/v1/chat/completions  differs: content" in out
        assert "      -42" in out and "      +41" in out
        [replayed] = other.model_requests
        assert replayed.body["stream"] is True and replayed.body["messages"][-1]["role"] == "tool"
        code, out = run_cli(capsys, "replay", session_id, "--upstream", other.url, "--json", "--store", store)
    doc = json.loads(out)
    assert code == 1 and [t["differs"] for t in doc["turns"]] == [[], ["content"]]
    with StoreReader(store_path) as reader:
        replays = [s for s in reversed(reader.sessions()) if s["labels"].get("replay_of") == session_id]
    assert [s["exchanges"] for s in replays] == [2, 1, 2]  # each replay is a session of its own
    assert doc["replay_session"] == replays[-1]["id"]


def test_mock_serves_the_session_to_the_sdk_and_to_replay(
    session_id: str, vllm_standin: OpenAILikeStandIn, store_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served = vllm_standin.model_requests
    with cli_process("mock", "--session", session_id, "--store", str(store_path), ready="listening on") as (
        mock,
        line,
    ):
        url = line.split("listening on ")[1]
        # Another run of the agent, worded differently: turn order answers it, the stream event by event.
        other_ask = {"role": "user", "content": "What is 6 * 7? Use the shell."}
        assert play(url + "/v1", ask=other_ask) == ["bash", {"command": "echo $((6 * 7))"}, "42"]
        code, out = run_cli(capsys, "replay", session_id, "--upstream", url, "--store", str(store_path))
        assert code == 0 and "2 turn(s) replayed, 0 differ" in out, out
    assert vllm_standin.model_requests == served  # the upstream saw nothing of either
    assert mock.stderr is not None
    log = mock.stderr.read().splitlines()
    assert log[:2] == [
        "POST /v1/chat/completions  next in order #1 (diverged at message 1 (user), character 1: "
        "recorded 'Run `echo $((6 * 7))` and reply with the number.', sent 'What is 6 * 7? Use the shell.')",
        "POST /v1/chat/completions  next in order #2 (diverged at message 1 (user), character 1: "
        "recorded 'Run `echo $((6 * 7))` and reply with the number.', sent 'What is 6 * 7? Use the shell.')",
    ]
    assert log[2:] == ["POST /v1/chat/completions  exact #1", "POST /v1/chat/completions  exact #2"]  # replay


def test_strict_mock_is_a_fixture_that_catches_an_agent_going_off_script(
    session_id: str, store_path: Path
) -> None:
    argv = ("mock", "--session", session_id, "--strict", "--store", str(store_path))
    with cli_process(*argv, ready="listening on") as (_, line):
        url = line.split("listening on ")[1]
        assert play(url + "/v1") == ["bash", {"command": "echo $((6 * 7))"}, "42"]  # on script
        with pytest.raises(openai.ConflictError) as off:
            play(url + "/v1", ask={"role": "user", "content": "What is 6 * 7? Use the shell."})
    assert off.value.code == "mock_off_script"
    assert "off script: turn #1 is next, and the request diverged at message 1 (user)" in off.value.message


def test_tail_follows_serve_from_another_process(vllm_standin: OpenAILikeStandIn, store_path: Path) -> None:
    store = str(store_path)
    serve = ("serve", "--upstream", vllm_standin.url, "--host", "127.0.0.1", "--port", "0", "--store", store)
    with cli_process(*serve, ready="modeltap listening on") as (_, line):
        base = "http://" + line.split("listening on ")[1]
        with cli_process("tail", "--store", store, ready=None) as (tail, _):
            assert play(base + "/v1") == ["bash", {"command": "echo $((6 * 7))"}, "42"]
            assert tail.stdout is not None
            first, second = tail.stdout.readline(), tail.stdout.readline()
    assert " #1  chat  200" in first and '→ bash({"command": "echo $((6 * 7))"})' in first
    assert " #2  chat (stream)  200" in second and "stop" in second


def test_a_reader_started_elsewhere_reads_the_store_serve_last_wrote(
    vllm_standin: OpenAILikeStandIn,
    store_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("MODELTAP_STORE", raising=False)
    serve = ("serve", "--upstream", vllm_standin.url, "--port", "0", "--store", str(store_path))
    with cli_process(*serve, ready="modeltap listening on") as (_, line):
        assert play("http://" + line.split("listening on ")[1] + "/v1")[-1] == "42"
    note = tmp_path / "state" / "modeltap" / "last-store"
    assert note.read_text() == f"{store_path.resolve()}\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = subprocess.run([MODELTAP, "sessions"], cwd=elsewhere, capture_output=True, text=True, check=True)
    assert run.stderr == f"reading {store_path.resolve()} (the store the last modeltap serve wrote)\n"
    assert len(run.stdout.splitlines()) == 2  # the header and the one session


def long_tool_loop(turns: int) -> Callable[[Conversation], Reply]:
    """A model that reads a file per turn for `turns` turns, then answers."""

    def script(conversation: Conversation) -> Reply:
        done = len(conversation.tool_results)
        if done >= turns - 1:
            return Reply(text="All files read.")
        return Reply(tool_call=ToolCall("bash", {"command": f"cat notes/part{done}.txt"}))

    return script


def file_text(n: int, words: int = 170) -> str:
    vocabulary = (
        "the proxy records every turn of an agent run with its tools tokens timing and errors".split()
    )
    return " ".join(f"{vocabulary[(n * 7 + i * 3) % len(vocabulary)]}{(n + i) % 97}" for i in range(words))


async def test_a_long_session_costs_about_its_final_conversation(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    """A recorded 50-turn session of about 20k tokens takes at most 1.5x its final size."""
    turns = 50
    with OpenAILikeStandIn(script=long_tool_loop(turns)) as upstream:
        async with make_proxy(upstream=upstream.url) as proxy:
            session = proxy.sessions.open()
            client = openai.AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="k", max_retries=0)
            history: list[dict[str, Any]] = [{"role": "system", "content": file_text(999, 1400)}, ASK]
            for turn in range(turns):
                reply = await client.chat.completions.create(
                    model="standin-model",
                    messages=history,
                    tools=[BASH_TOOL],
                    stream=turn % 2 == 1,
                    **({"stream_options": {"include_usage": True}} if turn % 2 else {}),
                )
                if turn % 2:
                    chunks = [chunk async for chunk in reply]
                    calls = [
                        c.choices[0].delta.tool_calls
                        for c in chunks
                        if c.choices and c.choices[0].delta.tool_calls
                    ]
                    if not calls:
                        break
                    call = calls[0][0]
                    message = {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call.id,
                                "type": "function",
                                "function": {
                                    "name": call.function.name,
                                    "arguments": "".join(c[0].function.arguments or "" for c in calls),
                                },
                            }
                        ],
                    }
                else:
                    if not reply.choices[0].message.tool_calls:
                        break
                    message = reply.choices[0].message.model_dump(exclude_none=True)
                history.append(message)
                call_id = message["tool_calls"][0]["id"]
                history.append({"role": "tool", "tool_call_id": call_id, "content": file_text(turn)})
            await client.close()
    rows = records(store_path, session.id)
    with StoreReader(store_path) as reader:
        stored = reader.size_bytes()["total"]
    final = len(json.dumps(rows[-1]["request"]).encode()) + len(json.dumps(rows[-1]["response"]).encode())
    naive = sum(
        len(json.dumps(r["request"]).encode()) + len(json.dumps(r["response"]).encode()) for r in rows
    )
    tokens = rows[-1]["prompt_tokens"]
    on_disk = await asyncio.to_thread(os.path.getsize, store_path)  # SQLite pages included
    print(
        f"\n{len(rows)} turns, final prompt {tokens} tokens: final conversation {final} B, stored {stored} B "
        f"({stored / final:.2f}x; the database file {on_disk} B), naive {naive} B ({naive / final:.1f}x)"
    )
    assert len(rows) == turns and 18_000 <= tokens <= 24_000
    assert stored <= 1.5 * final < naive / 10


@pytest.mark.agents
async def test_opencode_session_shown_exported_mocked_and_replayed(
    vllm_standin: OpenAILikeStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    tmp_path: Path,
    aiohttp_server: Any,
) -> None:
    workdir = tmp_path / "project"
    async with make_proxy(upstream=vllm_standin.url) as proxy:
        session = proxy.sessions.open(labels={"agent": "opencode"})
        run = await arun_opencode(session.host_base_url + "/v1", "sk-opencode", workdir)
        assert run.exit_code == 0 and run.final_text == "42", run.describe()
    rows = records(store_path, session.id)
    assert len(rows) == 3 and all(r["streamed"] for r in rows)

    title, first, second = turns(rows)
    assert title.reply and first.tool_calls[0]["name"] == "bash"
    assert second.continues == 2 and [m["role"] for m in second.new_messages] == ["assistant", "tool"]
    assert second.tool_results[0]["content"].strip() == "42" and second.reply == "42"
    exported = conversation(rows)
    assert [m["role"] for m in exported["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert {t["function"]["name"] for t in exported["tools"]} >= {"bash", "read", "edit"}

    # opencode again, against the mock of its own recording: every answer comes from the record.
    server = await aiohttp_server(mock_app(load_mock(store_path, session=session.id), DEFAULT_MAX_BODY_BYTES))
    again = await arun_opencode(str(server.make_url("/v1")), "sk-offline", workdir)
    assert again.exit_code == 0 and again.final_text == "42", again.describe()
    assert len(vllm_standin.model_requests) == 3

    async with make_proxy(upstream=vllm_standin.url, sync=True) as proxy:
        replayed = proxy.sessions.open(labels={"replay_of": session.id})
        comparisons = await replay(store_path, session.id, replayed.host_base_url, replay_session=replayed.id)
    assert [c["differs"] for c in comparisons] == [[], [], []]


async def test_mock_streams_what_the_anthropic_and_responses_sdks_accept(
    make_proxy: Callable[..., Proxy], store_path: Path, aiohttp_server: Any
) -> None:
    """Recorded unstreamed, asked for streamed: the mock re-synthesises each dialect's events, and the
    real SDKs rebuild from them the very message that was recorded."""
    bash = {"name": "bash", "description": "shell", "input_schema": BASH_TOOL["function"]["parameters"]}
    responses_bash = {"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}
    with AnthropicLikeStandIn() as claude, OpenAILikeStandIn() as vllm:
        async with make_proxy(upstream=vllm.url) as proxy:
            session = proxy.sessions.open()
            claude_session = proxy.sessions.open(upstream=claude.url)
            async with anthropic.AsyncAnthropic(
                base_url=claude_session.host_base_url, api_key="k", max_retries=0
            ) as sdk:
                recorded_message = await sdk.messages.create(
                    model="claude-x", max_tokens=256, messages=[ASK], tools=[bash]
                )
            async with openai.AsyncOpenAI(
                base_url=session.host_base_url + "/v1", api_key="k", max_retries=0
            ) as sdk:
                recorded_response = await sdk.responses.create(
                    model="standin-model", input=ASK["content"], tools=[responses_bash]
                )
    server = await aiohttp_server(
        mock_app(await asyncio.to_thread(load_mock, store_path), DEFAULT_MAX_BODY_BYTES)
    )
    async with anthropic.AsyncAnthropic(base_url=str(server.make_url("")), api_key="k", max_retries=0) as sdk:
        async with sdk.messages.stream(
            model="claude-x", max_tokens=256, messages=[ASK], tools=[bash]
        ) as events:
            streamed_message = await events.get_final_message()
    assert streamed_message.model_dump() == recorded_message.model_dump()
    assert streamed_message.content[0].type == "tool_use"
    async with openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="k", max_retries=0) as sdk:
        async with sdk.responses.stream(
            model="standin-model", input=ASK["content"], tools=[responses_bash]
        ) as events:
            streamed_response = await events.get_final_response()
    dump = [item.model_dump(exclude_none=True) for item in streamed_response.output]
    assert dump == [item.model_dump(exclude_none=True) for item in recorded_response.output]
    assert streamed_response.output[0].type == "function_call"
