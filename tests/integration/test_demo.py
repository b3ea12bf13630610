"""`modeltap demo`, the README's first command, as a new user runs it: a subprocess on its own store,
with the openai SDK and the real opencode the test tier installs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai

from modeltap.records.reader import StoreReader
from tests.factories import ASK, BASH_TOOL

DEMO_RUN_S = 240


def test_the_demo_plays_an_sdk_and_an_opencode_session_and_records_both(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"
    run = subprocess.run(
        [sys.executable, "-m", "modeltap", "demo", "--store", str(store)],
        capture_output=True, text=True, timeout=DEMO_RUN_S, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "turn 1: the model calls bash" in out
    assert "turn 2 (streamed): the model answers" in out
    assert "(exit 0)" in out, "opencode did not finish cleanly through modeltap"
    assert f"modeltap sessions --store {store}" in out
    with StoreReader(str(store)) as reader:
        sessions = {s["labels"].get("agent"): s for s in reader.sessions()}
        assert set(sessions) >= {"openai-sdk", "opencode"}
        assert sessions["opencode"]["exchanges"] >= 1
        sdk = reader.exchanges(sessions["openai-sdk"]["id"])
    # models, a tool call, a streamed answer: the /v1 paths all reached the bare-path model (token masked).
    chat = "/s/…/v1/chat/completions"
    assert [e["path"] for e in sdk] == ["/s/…/v1/models", chat, chat]
    assert [e["status"] for e in sdk] == [200, 200, 200]
    assert sdk[-1]["streamed"] and sdk[-1]["response"]["choices"][0]["message"]["content"]


def test_the_model_alone_serves_both_sdks_through_modeltap_serve(tmp_path: Path) -> None:
    """`modeltap demo --model-only`, the README's "no model server yet?": a real `modeltap serve` in
    front of it, and the openai and anthropic SDKs, streams and tool calls, chat, Responses, Messages."""
    with _background(
        [sys.executable, "-m", "modeltap", "demo", "--model-only", "--port", "0"], tmp_path
    ) as model:
        upstream = model.split("listening on ")[1]
        serve = [
            sys.executable,
            "-m",
            "modeltap",
            "serve",
            "--upstream",
            upstream,
            "--port",
            "0",
            "--store",
            str(tmp_path / "r.db"),
        ]
        with _background(serve, tmp_path, ready="listening on 0.0.0.0:") as line:
            base = "http://127.0.0.1:" + line.rsplit(":", 1)[1].strip()
            sdk = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            assert [m.id for m in sdk.models.list().data] == ["demo-model"]
            called = sdk.chat.completions.create(model="demo-model", messages=[ASK], tools=[BASH_TOOL])
            assert called.choices[0].message.tool_calls[0].function.name == "bash"
            stream = sdk.chat.completions.create(model="demo-model", messages=[ASK], stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            first = sdk.responses.create(model="demo-model", input="Say hi")
            assert first.output_text
            chained = sdk.responses.create(model="demo-model", input="again", previous_response_id=first.id)
            assert chained.output_text
            claude = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
            with claude.messages.stream(model="demo-model", max_tokens=64, messages=[ASK]) as streamed:
                assert streamed.get_final_text()
    with StoreReader(str(tmp_path / "r.db")) as reader:
        statuses = [e["status"] for e in reader.exchanges()]
    assert statuses and set(statuses) == {200}, statuses


@contextlib.contextmanager
def _background(argv: list[str], cwd: Path, ready: str = "listening on") -> Iterator[str]:
    """`argv` running until the block ends, once its stdout printed `ready`: that line."""
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if ready in line:
                yield line.strip()
                break
        else:
            raise AssertionError(f"{argv} never printed {ready!r}")
    finally:
        process.terminate()
        process.wait(30)
