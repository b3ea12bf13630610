"""The real opencode and Claude Code CLIs through `modeltap serve --token-ids`: what the engines return
beside the answer is harmless to them, and a session's records export to the ids a trainer trains on.

The issue's acceptance: an opencode session to a vLLM-like upstream exports to one line whose
`input_ids` are the last turn's served prompt and completion, with the loss mask on exactly the model's
ids; the same session with one edited assistant message reports the break at its turn and exports two
lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from modeltap.records.reader import StoreReader
from tests.agents import run_claude, run_opencode
from tests.integration.test_cli_serve import START_TIMEOUT_S, serve_port, start_serve
from tests.standins import token_engine as te
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn

pytestmark = pytest.mark.agents

# Loading the served tokenizer (transformers) takes seconds, and many more on a loaded machine.
TOKENIZER_START_TIMEOUT_S = 120.0


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "modeltap", *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 0, out


def resend(port: int, body: dict[str, Any], session_hint: str) -> None:
    """One recorded request sent again through modeltap, in a session of its own, read to its end."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "x-session-id": session_hint},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200
        reply.read()


def served_line(requests: list[Any]) -> tuple[list[int], list[int]]:
    """The ids the vLLM stand-in served for opencode's two main turns, and the mask on its own ids:
    each turn's prompt renders its messages; turn 1 sampled the tool call turn 2 echoes, turn 2 "42"."""
    first, second = (request.body for request in requests if request.body.get("tools"))
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]["function"]
    prompts = [te.render(body["messages"], body["tools"]) for body in (first, second)]
    completions = [te.completion("", [(call["name"], json.loads(call["arguments"]))]), te.completion("42")]
    mask = [0] * (len(prompts[1]) + len(completions[1]))
    for prompt, completion in zip(prompts, completions, strict=True):
        mask[len(prompt) : len(prompt) + len(completion)] = [1] * len(completion)
    return prompts[1] + completions[1], mask


def test_opencode_session_exports_one_exact_line_and_an_edited_copy_breaks_into_two(
    vllm_standin: OpenAILikeStandIn, tmp_path: Path
) -> None:
    store = tmp_path / "records.db"
    proc, lines = start_serve(["--upstream", vllm_standin.v1_url, "--token-ids"], store)
    try:
        assert any("token ids asked of vllm 0.11.0" in line for line in lines), lines
        port = serve_port(lines)
        run = run_opencode(f"http://127.0.0.1:{port}/v1", "sk-test", tmp_path / "proj")
        assert run.exit_code == 0 and run.final_text == "42", run.describe()
        with StoreReader(store) as reader:
            [session] = [s["id"] for s in reader.sessions()]
            recorded = [ex["request"] for ex in reader.exchanges(session)]
        # The same session with one edited assistant message: opencode's tool call, now with text.
        edited = json.loads(json.dumps(recorded))
        echoed = next(m for m in edited[-1]["messages"] if m.get("tool_calls"))
        echoed["content"] = "I will run it in the shell."
        for body in edited:
            resend(port, body, "edited-copy")
    finally:
        stop(proc)
    upstream_turns = vllm_standin.model_requests[: len(recorded)]
    assert all(request.body["return_token_ids"] is True for request in upstream_turns)

    [line] = [
        json.loads(text)
        for text in cli("export", session, "--format", "tokens", "--store", str(store)).splitlines()
    ]
    input_ids, mask = served_line(upstream_turns)
    assert line["input_ids"] == input_ids and line["loss_mask"] == mask
    assert line["turns"] == [2, 3]  # turn 1 is opencode's title request, a conversation of its own

    sessions = {s["id"]: s for s in json.loads(cli("sessions", "--json", "--store", str(store)))}
    assert sessions[session]["token_drift"] is None
    drift = sessions["edited-copy"]["token_drift"]
    assert (drift["turn"], drift["continues_turn"], drift["kind"], drift["role"]) == (
        3,
        2,
        "assistant_text_changed",
        "assistant",
    )
    exported = cli("export", "edited-copy", "--format", "tokens", "--store", str(store)).splitlines()
    assert [json.loads(text)["turns"] for text in exported] == [[2], [3]]
    shown = cli("show", "edited-copy", "--store", str(store))
    assert "#3" in shown and "token drift" in shown and "text came back changed" in shown


def test_opencode_accepts_sglangs_trailing_ids_chunk(standin_factory: Any, tmp_path: Path) -> None:
    upstream = standin_factory(OpenAILikeStandIn, flavor="sglang")
    store = tmp_path / "records.db"
    proc, lines = start_serve(["--upstream", upstream.v1_url, "--token-ids"], store)
    try:
        port = serve_port(lines)
        run = run_opencode(f"http://127.0.0.1:{port}/v1", "sk-test", tmp_path / "proj")
        assert run.exit_code == 0 and run.final_text == "42", run.describe()
    finally:
        stop(proc)
    assert all(r.headers["x-sglext-return-output-ids"] == "1" for r in upstream.model_requests)
    with StoreReader(store) as reader:
        [session] = reader.sessions()
        assert [row["source"] for row in reader.token_turns(session["id"])] == ["served"] * 3


def test_claude_code_through_token_ids_gets_rendered_ids(
    areal: ArealStandIn, tmp_path: Path, qwen_dir: str
) -> None:
    # AReaL returns no ids: Claude Code's requests go up untouched and the ids are rendered.
    store = tmp_path / "records.db"
    proc, lines = start_serve(
        ["--upstream", areal.url, "--token-ids", "--tokenizer", qwen_dir], store, TOKENIZER_START_TIMEOUT_S
    )
    try:
        port = serve_port(lines)
        run = run_claude(f"http://127.0.0.1:{port}", areal.open_session("claude").api_key, tmp_path / "proj")
        assert run.exit_code == 0 and run.final_text == "42", run.describe()
    finally:
        stop(proc)
    assert all("return_token_ids" not in r.body for r in areal.model_requests)
    with StoreReader(store) as reader:
        [session] = reader.sessions()
        rows = reader.token_turns(session["id"])
    # Turn 2 echoes turn 1's tool call without its empty text block: AReaL's Anthropic adapter (litellm)
    # makes that a chat message whose content is None, AReaL's client drops every None, and Qwen3's
    # template then fails on the missing content in transformers as in modeltap's renderer. modeltap
    # records that turn as asked for ids and holding none rather than ids AReaL would not have made.
    assert [row["source"] for row in rows] == ["rendered", None]
    assert [row["ask"] for row in rows] == ["rendered", "rendered"]
