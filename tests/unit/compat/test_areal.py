"""Tests for modeltap/compat/areal.py against real installed distributions.

A fake AReaL is "installed" by putting a `*.dist-info` folder on sys.path, which is exactly where
importlib.metadata looks, beside an `areal` package whose import raises, so a test fails if anything
imports AReaL instead of reading its metadata and files.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from modeltap.compat.areal import (
    REJECT_HOOK,
    auto_first,
    installed_capabilities,
    installed_version,
    responses_body_for_areal,
)


@pytest.fixture
def install_areal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a fake AReaL of a given version (None: a source tree on the path, no distribution),
    whose workflow module has the given source."""

    def install(version: str | None, workflow_source: str = "async def arun_episode(): ...\n") -> None:
        if version is not None:
            dist = tmp_path / f"areal-{version}.dist-info"
            dist.mkdir()
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: areal\nVersion: {version}\n")
        package = tmp_path / "areal"
        (package / "infra").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('modeltap must never import areal')\n")
        (package / "infra" / "remote_inf_engine.py").write_text(workflow_source)
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()

    yield install
    importlib.invalidate_caches()


def test_no_areal_installed_here():
    # The project's venv has no AReaL; the tests below install a fake one.
    assert installed_version() is None
    caps = installed_capabilities()
    assert caps.version is None
    assert caps.auto_first == "openai" == auto_first()
    assert not caps.honours_should_reject_failed_sample


def test_reads_the_installed_version_without_importing_areal(install_areal):
    install_areal("2.0.0")
    assert installed_version() == "2.0.0"
    assert installed_capabilities().auto_first == "areal"
    assert "areal" not in sys.modules


@pytest.mark.parametrize(
    ("version", "source", "hook"),
    [
        # 2.0.0 and main (which also says 2.0.0) have no hook: their filter is should_accept_fn
        ("2.0.0", "def _check(should_accept_fn): ...\n", False),
        # a version past every release says nothing by itself
        ("2.2.0", "def _check(should_accept_fn): ...\n", False),
        # an AReaL that asks the hook has it, whatever its version string
        ("2.0.0", f"if hasattr(workflow, {REJECT_HOOK!r}): ...\n", True),
        # a source tree on the path, with no distribution installed
        (None, f"workflow.{REJECT_HOOK}(exc)\n", True),
    ],
)
def test_the_reject_hook_is_what_the_installed_source_asks_not_what_the_version_says(
    install_areal, version, source, hook
):
    install_areal(version, source)
    caps = installed_capabilities()
    assert caps.version == version
    assert caps.honours_should_reject_failed_sample is hook
    assert caps.auto_first == "areal"
    assert "areal" not in sys.modules


def test_a_responses_body_without_tools_gets_an_empty_list_for_areal():
    """AReaL's v1 proxy (1.0.4, 2.0.0, main) answers 500 "1 validation error for Response tools" to a
    /responses body without tools."""
    assert responses_body_for_areal({"model": "m", "input": "hi"}) == {
        "model": "m",
        "input": "hi",
        "tools": [],
    }
    assert responses_body_for_areal({"model": "m", "input": "hi", "tools": None})["tools"] == []  # type: ignore[index]
    assert responses_body_for_areal({"model": "m", "input": "hi", "tools": []}) is None


def test_tool_use_only_assistant_turns_get_an_empty_text_block_for_areal() -> None:
    from modeltap.compat.areal import messages_body_for_areal

    call = {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "go"}, {"role": "assistant", "content": [call]}, result],
    }
    fixed = messages_body_for_areal(body)
    assert fixed is not None and fixed["messages"][1]["content"] == [{"type": "text", "text": ""}, call]
    assert fixed["messages"][0] is body["messages"][0] and fixed["messages"][2] is result
    assert body["messages"][1]["content"] == [call]  # the client's body is left as it was
    with_text = {"role": "assistant", "content": [{"type": "text", "text": "ok"}, call]}
    assert messages_body_for_areal({"messages": [with_text]}) is None
    assert messages_body_for_areal({"messages": [{"role": "assistant", "content": "plain"}]}) is None
    assert messages_body_for_areal({"messages": "not a list"}) is None


def test_tool_call_only_assistant_turns_get_empty_content_for_areal() -> None:
    """A translated Claude Code or Codex history sent as chat: AReaL's v2 gateway (2.0.0, main) answers
    a tool-call turn with null content with 500 "'dict object' has no attribute 'content'"."""
    from modeltap.compat.areal import chat_body_for_areal

    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    asked = {"role": "user", "content": "go"}
    body = {"messages": [asked, {"role": "assistant", "content": None, "tool_calls": [call]}]}
    fixed = chat_body_for_areal(body)
    assert fixed is not None and fixed["messages"][1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [call],
    }
    assert fixed["messages"][0] is asked and body["messages"][1]["content"] is None
    assert chat_body_for_areal({"messages": [{"role": "assistant", "tool_calls": [call]}]}) is not None
    assert (
        chat_body_for_areal({"messages": [{"role": "assistant", "content": "x", "tool_calls": [call]}]})
        is None
    )
    assert chat_body_for_areal({"messages": [{"role": "assistant", "content": None}]}) is None
