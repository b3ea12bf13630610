"""The message preparation of every engine release modeltap knows, as facts, and which one applies.

Owns: `Preparation` (what one release of vLLM, SGLang, `transformers serve` or AReaL's proxy does to a
chat request's messages and tools before its chat template), one per release read and run
(docs/engines.md §7), and choosing one by engine and version (`preparation`). Does not own: applying
them (compat/prompts.py) or telling which engine an upstream is (compat/engines.py).

    preparation("vllm", "0.19.1")   # VLLM_0_19: reasoning_content ignored, bad argument JSON refused
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

PreparedEngine = Literal["vllm", "sglang", "transformers", "areal", "unknown"]
# How tool-call argument strings reach the template (docs/engines.md §7.2):
#   object_or_empty  a JSON object string becomes that object; anything else (bad JSON, a list, "") {}
#   json_or_empty    empty or missing: {}; a string: its JSON value, bad JSON refused
#   json             a string: its JSON value, bad JSON (or no arguments) refused
#   object           a string: its JSON object, anything else refused
#   json_or_text     a string: its JSON value, bad JSON left as the string
#   object_or_text   a JSON object string becomes that object, anything else stays as sent
#   text             left as sent (the template inserts the string verbatim)
ArgumentRule = Literal[
    "object_or_empty", "json_or_empty", "json", "object", "json_or_text", "object_or_text", "text"
]
# Which reasoning fields an assistant message carries to the template:
#   either   `reasoning`, else `reasoning_content`, written to both (vLLM >= 0.33)
#   reasoning  `reasoning` alone is read, written to both (vLLM 0.19)
#   as_sent  whatever survives the field filter
ReasoningRule = Literal["either", "reasoning", "as_sent"]
# How the tool list is rendered: as sent, or as the engine's pydantic models dump it.
ToolRule = Literal["as_sent", "vllm", "vllm_extra", "sglang", "sglang_strict"]


@dataclass(frozen=True, slots=True)
class Preparation:
    """One engine release's preparation of chat messages and tools before its chat template.

    `fields` are the message fields kept, by role ("*" for the other roles; None keeps every field);
    fields whose value is None are dropped, but those in `keep_none`, and with `drop_none_deep`, None
    values are dropped inside the message too. `missing_content` replaces a missing or None content
    (None: left out). Text parts are joined with `text_separator` for templates that take string
    content (`always_text`: for every template), and a tool result's text parts with
    `tool_separator` for every template (None: left as parts). `content_with_tool_calls=False`
    empties an assistant message's content beside its tool calls; `drop_empty_tool_calls` drops an
    empty tool-call list. `developer_to_system` turns developer messages into system ones, merged at
    the start, when the template names no developer role; `billing_header` drops Claude Code's
    attribution line from system text.
    """

    engine: PreparedEngine
    release: str
    fields: Mapping[str, tuple[str, ...]] | None
    arguments: ArgumentRule
    reasoning: ReasoningRule
    tools: ToolRule
    text_separator: str | None = " "
    tool_separator: str | None = None
    missing_content: str | None = ""
    keep_none: frozenset[str] = field(default_factory=frozenset)
    drop_none_deep: bool = False
    content_with_tool_calls: bool = True
    drop_empty_tool_calls: bool = False
    always_text: bool = False
    developer_to_system: bool = False
    billing_header: bool = False
    lowercase_roles: bool = False

    def describe(self) -> str:
        """`vllm 0.33.0`, for the start-up report."""
        return f"{self.engine} {self.release}" if self.release else self.engine

    def whole(self, messages: Sequence[Any], names_developer: bool) -> bool:
        """Whether `messages` are prepared as a conversation, not message by message: a developer
        message the engine turns into a system one merges every system message into the first."""
        return (
            self.developer_to_system
            and not names_developer
            and any(isinstance(m, dict) and m.get("role") == "developer" for m in messages)
        )


# vLLM builds each message from these fields only (vllm/renderers/chat_utils/chat_message.py,
# parse_chat_message_content; docs/engines.md §7.3). `task` is 0.33's.
_VLLM_COMMON = ("role", "content", "name", "task")
_VLLM_FIELDS = {
    "assistant": (*_VLLM_COMMON, "tool_calls", "reasoning", "reasoning_content"),
    "tool": (*_VLLM_COMMON, "tool_call_id"),
    "developer": (*_VLLM_COMMON, "tools"),
    "*": _VLLM_COMMON,
}
# SGLang's message models (sglang/srt/entrypoints/openai/protocol.py): a user message has role and
# content only; the others these fields (0.5.23 adds phase and prefix).
_SGLANG_GENERIC = ("role", "content", "tool_call_id", "name", "reasoning_content", "tool_calls", "tools")
_SGLANG_FIELDS = {"user": ("role", "content"), "*": (*_SGLANG_GENERIC, "phase", "prefix")}
_SGLANG_0510_FIELDS = {"user": ("role", "content"), "*": _SGLANG_GENERIC}
# transformers serve keeps these four (transformers/cli/serving/utils.py, get_processor_inputs_from_messages).
_TRANSFORMERS_FIELDS = {"*": ("role", "content", "tool_calls", "tool_call_id")}

VLLM = Preparation(
    "vllm",
    "0.33.0",
    _VLLM_FIELDS,
    arguments="object_or_empty",
    reasoning="either",
    tools="vllm",
    text_separator="\n",
    tool_separator="\n",
    keep_none=frozenset({"tool_call_id", "tools"}),
    drop_empty_tool_calls=True,
    developer_to_system=True,
    billing_header=True,
)
VLLM_0_19 = Preparation(
    "vllm",
    "0.19.1",
    _VLLM_FIELDS,
    arguments="json_or_empty",
    reasoning="reasoning",
    tools="vllm_extra",
    text_separator="\n",
    keep_none=frozenset({"tool_call_id", "tools"}),
    drop_empty_tool_calls=True,
)
SGLANG = Preparation(
    "sglang",
    "0.5.23",
    _SGLANG_FIELDS,
    "object",
    "as_sent",
    "sglang",
    tool_separator=" ",
    lowercase_roles=True,
)
SGLANG_0_5_10 = Preparation(
    "sglang",
    "0.5.10.post1",
    _SGLANG_0510_FIELDS,
    "text",
    "as_sent",
    "sglang_strict",
    tool_separator=" ",
    lowercase_roles=True,
)
TRANSFORMERS = Preparation(
    "transformers",
    "5.24.0",
    _TRANSFORMERS_FIELDS,
    arguments="json",
    reasoning="as_sent",
    tools="as_sent",
    keep_none=frozenset({"tool_call_id"}),
    content_with_tool_calls=False,
    drop_empty_tool_calls=True,
    always_text=True,
)
# AReaL's ArealOpenAI client, after its proxy's typed view (areal/experimental/openai/client.py):
# None dropped at every depth, argument strings parsed where they are JSON, content left as sent.
AREAL = Preparation(
    "areal",
    "2.0.0",
    None,
    "json_or_text",
    "as_sent",
    "as_sent",
    text_separator=None,
    missing_content=None,
    drop_none_deep=True,
)
# AReaL 1.0.4's client parses no argument strings (the template inserts them verbatim); the rest as 2.0.0.
AREAL_1_0_4 = Preparation(
    "areal",
    "1.0.4",
    None,
    "text",
    "as_sent",
    "as_sent",
    text_separator=None,
    missing_content=None,
    drop_none_deep=True,
)
# An engine modeltap does not know: what modeltap counted before it knew any (a space between text
# parts, JSON object arguments parsed, None dropped), the nearest to SGLang's.
UNKNOWN = Preparation("unknown", "", None, "object_or_text", "as_sent", "as_sent")

# Each engine's releases read and run, oldest first (docs/engines.md §7.1): a release takes the facts of
# the newest one read that is not newer than it, and an unknown version the newest's.
_RELEASES: dict[str, tuple[tuple[Version, Preparation], ...]] = {
    "vllm": ((Version("0.19.1"), VLLM_0_19), (Version("0.33.0"), VLLM)),
    "sglang": ((Version("0.5.10.post1"), SGLANG_0_5_10), (Version("0.5.23"), SGLANG)),
    "transformers": ((Version("5.24.0"), TRANSFORMERS),),
    "areal": ((Version("1.0.4"), AREAL_1_0_4), (Version("2.0.0"), AREAL)),
}
# Every release read and run, by its `describe()` ("vllm 0.33.0"): the names the tests' vectors use.
RELEASES_READ: dict[str, Preparation] = {p.describe(): p for rs in _RELEASES.values() for _, p in rs}


def preparation(engine: str, version: str | None = None) -> Preparation:
    """The preparation of `engine` (an EngineInfo name) at `version` (None or unparsable: the newest
    release read). An engine modeltap does not know gets UNKNOWN."""
    releases = _RELEASES.get(engine)
    if releases is None:
        return UNKNOWN
    try:
        wanted = Version(version) if version else None
    except InvalidVersion:
        wanted = None
    if wanted is None:
        return releases[-1][1]
    older = [prep for release, prep in releases if release <= wanted]
    return older[-1] if older else releases[0][1]


def template_names_developer(template: str) -> bool:
    """Whether a template handles the developer role, as vLLM tells it (vllm/renderers/hf.py,
    `_detect_developer_role_support`): it names `"developer"` or `'developer'`."""
    return '"developer"' in template or "'developer'" in template
