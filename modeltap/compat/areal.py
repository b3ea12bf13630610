"""The installed AReaL and what it can do, read from package metadata: AReaL itself is never imported.

Owns: the installed version (importlib.metadata), comparing it with the last release of a kind
(`packaging.version`, PEP 440), the capabilities that depend on it, and the rewrites a body needs
before AReaL's proxy can take it. Does not own: talking to
AReaL (proxy/upstream.py) or adapting to a missing capability (adapter/workflow.py,
proxy/upstream.py's `auto` layout).

Importing `areal` runs its whole package init (torch, ray, transformers; 8-10 s, docs/areal.md §10.2),
so this module only reads the distribution's metadata.

    >>> capabilities("2.1.0").serves_v1_chat
    False
    >>> capabilities("2.2.0").honours_should_reject_failed_sample
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

# The PyPI distribution (docs/areal.md §10.1: `pip download areal==1.0.4`).
AREAL_DISTRIBUTION = "areal"
# The last release whose proxy serves chat only at the bare `/chat/completions` and has no
# `should_reject_failed_sample` hook: both are expected after it (docs/areal.md §2, §3.4 say what is
# public of them). Earlier layouts (v0.4-v1.0.0rc1) put a session id in the base URL, but chat is
# still `{base}/chat/completions` there, so "bare" holds for every release up to this one.
LAST_BARE_ONLY_RELEASE = "2.1.0"


@dataclass(frozen=True, slots=True)
class ArealCapabilities:
    """What an AReaL version's agent proxy offers.

    `version` is None when AReaL is not installed. `serves_v1_chat`: the proxy also answers
    `/v1/chat/completions` (after 2.1.0; up to 2.1.0 that path is FastAPI's 404 `{"detail":"Not
    Found"}`, docs/areal.md §2). `honours_should_reject_failed_sample`: a failed sample is left out
    alone instead of failing its whole group (after 2.1.0; before, `GroupedRolloutWorkflow` gathers
    without `return_exceptions`, docs/areal.md §3.4). `auto_first`: the layout the proxy's `auto` mode
    tries first, `areal` wherever AReaL is installed, since the bare path works on every AReaL release.
    """

    version: str | None
    serves_v1_chat: bool
    honours_should_reject_failed_sample: bool
    auto_first: Literal["areal", "openai"]


def installed_version() -> str | None:
    """The installed AReaL's version string, or None when it is not installed. Never imports AReaL."""
    try:
        return metadata.version(AREAL_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def is_later_release(version: str, than: str) -> bool:
    """Whether `version` belongs to a release later than `than`.

    Post-releases and local builds (`2.1.0.post1`, `2.1.0+abc`) count as their release: they are fixes
    on a release branch, not the main branch that gained the new capabilities. A pre-release or dev
    build of a later release is later. Raises ValueError for a string that is not a PEP 440 version.

    >>> is_later_release("2.1.0.post1", "2.1.0"), is_later_release("2.2.0.dev0", "2.1.0")
    (False, True)
    """
    try:
        return Version(Version(version).base_version) > Version(than)
    except InvalidVersion as exc:
        raise ValueError(f"not a version: {version!r}") from exc


def capabilities(version: str | None) -> ArealCapabilities:
    """The capabilities of AReaL `version` (None: not installed).

    A version string that cannot be parsed gets the capabilities of 2.1.0 and earlier: the bare path
    works everywhere, and assuming the hook where it is missing would lose whole groups.
    """
    try:
        after = version is not None and is_later_release(version, LAST_BARE_ONLY_RELEASE)
    except ValueError:
        after = False
    return ArealCapabilities(
        version=version,
        serves_v1_chat=after,
        honours_should_reject_failed_sample=after,
        auto_first="areal" if version is not None else "openai",
    )


def installed_capabilities() -> ArealCapabilities:
    """The capabilities of the AReaL installed in this environment."""
    return capabilities(installed_version())


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


def responses_body_for_areal(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `/responses` body AReaL can take, or None when it needs no change.

    AReaL 1.0.4 refuses any non-empty `include` with a 500 "NotImplementedError: include is not
    supported yet", and answers a tool whose own `tools` list its request model reads as an iterator
    (Codex's `namespace` tool) with a 500 "TypeError: Object of type ValidatorIterator is not JSON
    serializable" when it renders the tools (docs/areal.md §1.1.9). Codex always sends both (docs/agents.md
    §6.4). So `include` is left out (AReaL returns no encrypted reasoning anyway) and so is every tool
    but a function tool (the only kind AReaL's tool-call parser can answer with).
    """
    tools = body.get("tools")
    kept = (
        [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
        if isinstance(tools, list)
        else tools
    )
    if not body.get("include") and kept == tools:
        return None
    fixed = {k: v for k, v in body.items() if k != "include"}
    if isinstance(tools, list):
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
