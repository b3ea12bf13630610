"""The installed AReaL and what it can do, read from its metadata and its source: AReaL is never imported.

Owns: the installed version (importlib.metadata), whether the installed AReaL has a per-sample reject
hook (its source searched for the hook's name), where `auto` looks first, and the rewrites a body needs
before AReaL's proxy can take it. Does not own: talking to AReaL (proxy/upstream.py, which tells AReaL's
v1 agent proxy from its v2 gateway by what each answers on /health) or adapting to a missing capability
(adapter/workflow.py, proxy/upstream.py's `auto` layout).

No version string says what an AReaL has: main at cbff54d reports "2.0.0" like the v2.0.0 tag 55
commits before it (docs/areal.md §2), and no release has the reject hook or a `/v1/chat/completions`
on its agent proxy. So capabilities are read from what is installed, and the paths from what the
upstream answers. Importing `areal` runs its whole package init (torch, ray, transformers; 8-10 s,
docs/areal.md §10.2), so only its files are read.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

# The PyPI distribution and the package it installs (docs/areal.md §10.1: `pip download areal==1.0.4`).
AREAL_DISTRIBUTION = "areal"
AREAL_PACKAGE = "areal"
# The per-sample hook modeltap's AgentWorkflow offers (`AgentWorkflow.should_reject_failed_sample`):
# an AReaL whose workflow code asks it leaves a failed sample out alone. No AReaL up to main at cbff54d
# has it: their sample filter is `should_accept_fn`, which sees finished trajectories only, and one
# failed sample still costs its group (docs/areal.md §3.4).
REJECT_HOOK = "should_reject_failed_sample"


@dataclass(frozen=True, slots=True)
class ArealCapabilities:
    """What the installed AReaL offers.

    `version` is the distribution's version (None when none is installed; AReaL may still be importable
    from a source tree on the path). `honours_should_reject_failed_sample`: AReaL's source names the
    reject hook, so a failed sample is left out alone instead of failing its whole group.
    `auto_first`: the layout the proxy's `auto` mode tries first, `areal` wherever AReaL can be
    imported, since its v1 proxy serves chat only at the bare path and its v2 gateway serves it there
    too (docs/areal.md §2).
    """

    version: str | None
    honours_should_reject_failed_sample: bool
    auto_first: Literal["areal", "openai"]


def installed_version() -> str | None:
    """The installed AReaL's version string, or None when it is not installed. Never imports AReaL."""
    try:
        return metadata.version(AREAL_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def package_folders() -> list[Path]:
    """The folders the `areal` package would be imported from (several for a namespace package), or []
    when it cannot be imported. A top-level find_spec runs nothing of the package."""
    try:
        spec = importlib.util.find_spec(AREAL_PACKAGE)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [Path(folder) for folder in spec.submodule_search_locations]


def names_in_source(folders: list[Path], name: str) -> bool:
    """Whether any Python file under `folders` contains `name` (AReaL 2.0 has about 450 files, 5 MB)."""
    needle = name.encode()
    for folder in folders:
        for root, _, files in os.walk(folder):
            for file in files:
                if file.endswith(".py") and needle in _read(Path(root, file)):
                    return True
    return False


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def auto_first() -> Literal["areal", "openai"]:
    """Where `auto` looks first: AReaL's layout wherever AReaL can be imported (a path lookup only)."""
    return "areal" if package_folders() else "openai"


def installed_capabilities() -> ArealCapabilities:
    """The capabilities of the AReaL importable in this environment (reads its files: call it off the
    event loop, once)."""
    folders = package_folders()
    return ArealCapabilities(
        version=installed_version(),
        honours_should_reject_failed_sample=names_in_source(folders, REJECT_HOOK),
        auto_first="areal" if folders else "openai",
    )


def messages_body_for_areal(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `/v1/messages` body AReaL can render, or None when it needs no change.

    Claude Code sends an assistant turn that only calls tools as `tool_use` blocks with no text. AReaL's
    converter (LiteLLM's AnthropicAdapter) turns that into `content: None`, and Qwen chat templates
    then fail on `'</think>' in message.content`: AReaL answers 500 "Streaming setup failed: 500:
    UndefinedError: 'dict object' has no attribute 'content'" (measured against AReaL 1.0.4, see
    tests/areal). A leading empty text block gives the turn a content string and renders the same
    prompt; the anthropic SDK already sends one back, from AReaL's own replies.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(_tool_use_only(m) for m in messages):
        return None
    fixed = [
        {**m, "content": [{"type": "text", "text": ""}, *m["content"]]} if _tool_use_only(m) else m
        for m in messages
    ]
    return {**body, "messages": fixed}


def chat_body_for_areal(body: dict[str, Any]) -> dict[str, Any] | None:
    """The chat body AReaL can render, or None when it needs no change.

    An assistant turn that only calls tools has no content (`null`, or no key), which is how modeltap
    translates Claude Code's tool_use-only turns and Codex's function calls through chat, as LiteLLM
    does. AReaL's proxy validates the body against the openai SDK's types, which drop the null, and
    Qwen chat templates then fail on `message.content`: AReaL's v2 gateway answers 500 "UndefinedError:
    'dict object' has no attribute 'content'" (measured against AReaL 2.0.0 and main, tests/areal2).
    An empty string renders the same prompt, as `messages_body_for_areal`'s empty text block does.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not any(_without_content(m) for m in messages):
        return None
    return {**body, "messages": [{**m, "content": ""} if _without_content(m) else m for m in messages]}


def _without_content(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("role") == "assistant"
        and bool(message.get("tool_calls"))
        and message.get("content") is None
    )


def responses_body_for_areal(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `/responses` body AReaL can take, or None when it needs no change.

    AReaL 1.0.4 refuses any non-empty `include` with a 500 "NotImplementedError: include is not
    supported yet", and answers a tool whose own `tools` list its request model reads as an iterator
    (Codex's `namespace` tool) with a 500 "TypeError: Object of type ValidatorIterator is not JSON
    serializable" when it renders the tools (docs/areal.md §1.1.9). Codex always sends both (docs/agents.md
    §6.4). So `include` is left out (AReaL returns no encrypted reasoning anyway) and so is every tool
    but a function tool (the only kind AReaL's tool-call parser can answer with). A body without
    `tools` gets an empty list: 1.0.4, 2.0.0 and main build their `Response` with `tools=None` and
    answer 500 "1 validation error for Response tools" (docs/areal.md §1.1.9).
    """
    tools = body.get("tools")
    kept = (
        [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if isinstance(tools, list)
        else []
    )
    if not body.get("include") and kept == tools:
        return None
    fixed = {k: v for k, v in body.items() if k != "include"}
    fixed["tools"] = kept
    return fixed


def _tool_use_only(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return (
        message.get("role") == "assistant"
        and isinstance(content, list)
        and bool(content)
        and all(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
    )
