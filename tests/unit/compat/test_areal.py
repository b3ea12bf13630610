"""Tests for modeltap/compat/areal.py against real installed distributions.

A fake AReaL is "installed" by putting a `*.dist-info` folder on sys.path, which is exactly where
importlib.metadata looks; beside it sits an `areal` package whose import raises, so a test fails if
anything imports AReaL instead of reading its metadata.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from modeltap.compat.areal import (
    capabilities,
    installed_capabilities,
    installed_version,
    is_later_release,
)


@pytest.fixture
def install_areal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a fake AReaL of a given version into a fresh sys.path entry."""

    def install(version: str) -> None:
        dist = tmp_path / f"areal-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: areal\nVersion: {version}\n")
        package = tmp_path / "areal"
        package.mkdir()
        (package / "__init__.py").write_text("raise RuntimeError('modeltap must never import areal')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()

    yield install
    importlib.invalidate_caches()


def test_no_areal_installed_here():
    # The project's venv has no AReaL; the tests below install a fake one.
    assert installed_version() is None
    caps = installed_capabilities()
    assert caps.version is None
    assert caps.auto_first == "openai"
    assert not caps.honours_should_reject_failed_sample


def test_reads_the_installed_version_without_importing_areal(install_areal):
    install_areal("2.1.0")
    assert installed_version() == "2.1.0"
    assert "areal" not in sys.modules


@pytest.mark.parametrize(
    ("version", "after"),
    [
        ("1.0.4", False),
        ("2.0.0", False),
        ("2.1.0", False),
        ("2.1.0rc1", False),
        ("2.1.0.post1", False),
        ("2.1.0+cu128", False),
        ("v2.1.0", False),
        ("2.1.0-1", False),  # PEP 440's other spelling of a post-release
        ("2.1", False),
        ("2.1.1", True),
        ("2.2.0.dev0", True),
        ("3.0", True),
    ],
)
def test_capabilities_of_the_installed_version(install_areal, version, after):
    install_areal(version)
    caps = installed_capabilities()
    assert caps.version == version
    assert caps.serves_v1_chat is after
    assert caps.honours_should_reject_failed_sample is after
    # the bare path works on every AReaL release, so auto tries it first wherever AReaL is installed
    assert caps.auto_first == "areal"


def test_an_unparseable_version_gets_the_conservative_capabilities():
    caps = capabilities("main-nightly")
    assert not caps.serves_v1_chat
    assert not caps.honours_should_reject_failed_sample
    assert caps.auto_first == "areal"


@pytest.mark.parametrize("bad", ["", "main", "2.x", "2.1.0 beta"])
def test_what_is_not_a_version_is_refused(bad):
    with pytest.raises(ValueError, match="not a version"):
        is_later_release(bad, "2.1.0")


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
