"""modeltap/compat/parsers/base.py (and the package's surface): the request fields a parser reads,
the finish reason of a parsed reply, the text a stream may emit by each rule, and a package that
imports nothing but the standard library."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import modeltap.compat.parsers as parsers
from modeltap.compat.parsers.base import (
    GrowingText,
    ParsedCall,
    ParsedReply,
    ReplyContext,
    StreamStep,
    ToolSpec,
    partial_suffix,
)

CALL = ParsedCall("f", "{}")


def test_the_function_tools_of_a_chat_request() -> None:
    tools = [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
        {"function": {"name": "g"}},  # `type` defaults to function, as vLLM's request model says
        {"type": "custom", "custom": {"name": "h"}},
        {"type": "function", "function": {"description": "no name"}},
        {"type": "function", "function": {"name": "k", "parameters": "not a schema"}},
    ]
    assert ToolSpec.from_chat(tools) == (ToolSpec("f", {"type": "object"}), ToolSpec("g"), ToolSpec("k"))
    assert ToolSpec.from_chat(None) == ()


def test_calls_are_kept_for_auto_with_tools_and_ignored_for_none() -> None:
    tools = (ToolSpec("f"),)
    assert ReplyContext(tools=tools).calls_kept
    assert not ReplyContext().calls_kept
    assert not ReplyContext(tools=tools, tool_choice="none").calls_kept
    assert ReplyContext(tools=tools, tool_choice="none").calls_suppressed
    assert not ReplyContext(tool_choice="none").calls_suppressed


def test_the_finish_reason_says_tool_calls_only_for_a_natural_stop() -> None:
    called = ParsedReply(None, None, (CALL,))
    assert called.called_tools
    assert called.finish_reason("stop") == "tool_calls"
    assert called.finish_reason(None) == "tool_calls"
    assert called.finish_reason("length") == "length"
    assert called.finish_reason("abort") == "abort"
    # A parse failure is content: the engine's reason stays.
    assert ParsedReply("<tool_call>{", None).finish_reason("stop") == "stop"


def test_an_empty_step_is_false() -> None:
    assert not StreamStep()
    assert StreamStep(reasoning=" ")
    assert StreamStep(tool_calls=(CALL,))


def grown(parts: list[str], take: str) -> str:
    text = GrowingText()
    out = []
    for part in parts:
        text.add(part)
        out.append(getattr(text, take)())
    return "".join(out)


@given(st.lists(st.text(" \na"), max_size=6))
def test_each_rule_emits_a_prefix_of_what_it_promises(parts: list[str]) -> None:
    whole = "".join(parts)
    assert grown(parts, "take_all") == whole
    assert whole.rstrip().startswith(grown(parts, "take_rstripped"))
    trimmed = grown(parts, "take_trimmed")
    assert whole.startswith(trimmed) and whole.strip().startswith(trimmed)
    assert grown(parts, "take_unless_blank") == ("" if whole.isspace() else whole)


@given(st.lists(st.text(" \na"), max_size=6), st.integers(0, 6))
def test_once_stripped_the_whole_emitted_text_is_the_stripped_text(parts: list[str], cut: int) -> None:
    text = GrowingText()
    out = []
    for part in parts[:cut]:
        text.add(part)
        out.append(text.take_trimmed())
    for part in parts[cut:]:
        text.add(part)
    out.append(text.take_stripped())
    assert "".join(out) == "".join(parts).strip()


def test_a_partial_marker_at_the_end() -> None:
    assert partial_suffix("Let me <tool_", "<tool_call>") == 6
    assert partial_suffix("<tool_call>", "<tool_call>") == 0  # a whole marker is no partial one
    assert partial_suffix("x<", "</think>") == 1
    assert partial_suffix("", "</think>") == 0


def test_the_package_surface_is_what_all_lists() -> None:
    public = {name for name in vars(parsers) if not name.startswith("_")}
    modules = {path.stem for path in Path(parsers.__file__).parent.glob("*.py")}
    assert public - modules == set(parsers.__all__)


def test_the_package_imports_only_the_standard_library_and_itself() -> None:
    for path in Path(parsers.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] in sys.stdlib_module_names or name.startswith(
                    "modeltap.compat.parsers"
                ), f"{path.name} imports {name}"


def test_importing_the_package_loads_nothing_else_of_modeltap() -> None:
    # A fresh interpreter: the test process has long since imported the rest of modeltap.
    listing = "sorted(m for m in sys.modules if m.startswith('modeltap'))"
    code = f"import sys\nimport modeltap.compat.parsers\nprint({listing})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    others = [m for m in ast.literal_eval(out) if not m.startswith("modeltap.compat.parsers")]
    assert others == ["modeltap", "modeltap.compat"]
