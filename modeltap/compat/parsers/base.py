"""The types every parser of this package speaks: what a request tells a parser, what a parsed reply
is, and the two stages (reasoning, then tool calls) each family implements.

Owns: `ToolSpec` (a tool as the parsers see it), `ReplyContext` (the request fields the engine's
parsers read), `ParsedCall` / `ParsedReply` (the message modeltap answers with) and `StreamStep` (what
a stream emits at one step), the abstract stages `ReasoningParser` and `ToolParser` and their
incremental halves, and `GrowingText`, the rules by which those halves emit a growing text. Does not
own: any format (hermes.py, qwen3_coder.py, glm.py, reasoning.py), how
the stages combine (reply.py) or stream (reply_stream.py), or the names (registry.py).

    reply = ParsedReply(content=None, reasoning="plan", tool_calls=(ParsedCall("f", '{"a": 1}'),))
    reply.finish_reason("stop")    # 'tool_calls': calls parsed and the engine stopped on its own
    reply.finish_reason("length")  # 'length': a cut reply stays cut
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

# What vLLM reports for a choice that ended on its own (the engine's EOS or a stop string/id) and
# what its chat route turns that into when the message carries tool calls
# (vllm/entrypoints/serve/utils/tool_calls_utils.py:41-59 at v0.33.0).
STOP = "stop"
TOOL_CALLS = "tool_calls"

ToolChoice = Literal["auto", "none"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function tool of the request: its name and its JSON-schema parameters (as the client sent
    them; None when it sent none). The XML families type their string values by this schema."""

    name: str
    parameters: Mapping[str, Any] | None = None

    @classmethod
    def from_chat(cls, tools: Sequence[Mapping[str, Any]] | None) -> tuple[ToolSpec, ...]:
        """The function tools of an OpenAI chat request's `tools` list, in order; other kinds (and
        malformed entries, which vLLM's request validation would have refused) are left out.

            ToolSpec.from_chat([{"type": "function", "function": {"name": "f", "parameters": {}}}])
            # (ToolSpec(name='f', parameters={}),)
        """
        found = []
        for tool in tools or ():
            function = tool.get("function") if tool.get("type", "function") == "function" else None
            if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                parameters = function.get("parameters")
                found.append(cls(function["name"], parameters if isinstance(parameters, Mapping) else None))
        return tuple(found)


@dataclass(frozen=True)
class ReplyContext:
    """What the engine's parsers know of the request besides the generated text.

    - `tools`: the request's function tools. Without any, vLLM's default `tool_choice` is "none": no
      call is returned (an engine-based XML family still removes its markup from the content).
    - `tool_choice`: "auto" (the default with tools) or "none". "required" and named choices rely
      on vLLM's guided decoding, which a token-in request does not apply, so they are not modelled.
    - `parallel_tool_calls`: False keeps the first call only, as vLLM does.
    - `chat_template_kwargs`: the request's; the Qwen3 parsers read `enable_thinking`, GLM's also
      `thinking`.
    - `prompt_closes_reasoning`: the prompt's last turn already closed reasoning (reasoning.py
      `prompt_closes_reasoning`), so vLLM's engine-based reasoning parsers start in content.
    - `special_tokens`: the tokenizer's special tokens (`all_special_tokens`); the engine-based
      parsers (qwen3, qwen3_coder, glm) drop them from the text, hermes and deepseek_r1 keep them.
    """

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    prompt_closes_reasoning: bool = False
    special_tokens: frozenset[str] = frozenset()

    @property
    def calls_kept(self) -> bool:
        """Whether the answer carries the calls a parser finds (vLLM's `keeps_tool_calls`)."""
        return bool(self.tools) and self.tool_choice == "auto"

    @property
    def calls_suppressed(self) -> bool:
        """Whether vLLM's engine-based tool parsers ignore call markup altogether (`tool_choice: none`
        with tools), rather than parsing it and dropping the calls."""
        return bool(self.tools) and self.tool_choice == "none"


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One tool call: its name and its arguments exactly as the engine emits them (a JSON string)."""

    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ParsedReply:
    """The assistant message the engine would answer with: content and reasoning (None when absent)
    and the tool calls. A reply whose markup failed to parse is content, as the engine answers it."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ParsedCall, ...] = ()

    @property
    def called_tools(self) -> bool:
        """Whether the reply carries tool calls."""
        return bool(self.tool_calls)

    def finish_reason(self, engine_finish_reason: str | None) -> str:
        """The chat finish reason for this reply, given the engine's: `tool_calls` when calls were
        parsed and the engine stopped on its own, the engine's reason otherwise (`length` stays)."""
        reason = engine_finish_reason or STOP
        return TOOL_CALLS if self.called_tools and reason == STOP else reason


@dataclass(frozen=True, slots=True)
class StreamStep:
    """What a stream emits after one piece of text: the content and reasoning text to append, and
    each tool call that became final (complete, and no later text can change it)."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ParsedCall, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True, slots=True)
class ReasoningSplit:
    """The reasoning stage's answer: the reasoning, and the content the tool stage reads next."""

    reasoning: str | None
    content: str | None


@dataclass(frozen=True, slots=True)
class ToolExtraction:
    """The tool stage's answer, as vLLM's `ExtractedToolCallInformation`."""

    tools_called: bool
    tool_calls: tuple[ParsedCall, ...]
    content: str | None


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (and may yet complete it).

    partial_suffix("Let me <tool_", "<tool_call>")  # 6
    """
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class GrowingText:
    """A text that grows at its end and is emitted in prefixes, by the rule its reader needs; what
    a rule does not emit yet is held for a later call.

        text = GrowingText()
        text.add("Let me check.  ")
        text.take_trimmed()  # 'Let me check.': trailing whitespace may still be stripped
    """

    def __init__(self) -> None:
        self._pending: list[str] = []
        self._started = False
        self._leading_space = False
        self._blank = True
        self._emitted = False

    def add(self, part: str) -> None:
        """Append `part`."""
        if not part:
            return
        if not self._started:
            self._started, self._leading_space = True, part[0].isspace()
        if self._blank and not part.isspace():
            self._blank = False
        self._pending.append(part)

    def take_all(self) -> str:
        """Everything not yet emitted."""
        return self._take(lambda held: len(held))

    def take_rstripped(self) -> str:
        """Up to the last non-whitespace character (trailing whitespace may yet be dropped)."""
        return self._take(lambda held: len(held.rstrip()))

    def take_trimmed(self) -> str:
        """What both the stripped and the whole text begin with: up to the last non-whitespace
        character, and nothing while the text begins with whitespace."""
        return "" if self._leading_space else self.take_rstripped()

    def take_unless_blank(self) -> str:
        """Everything, once the text is more than whitespace (whitespace alone may yet be dropped)."""
        return "" if self._blank else self.take_all()

    def take_stripped(self) -> str:
        """The rest of the stripped text: the whole text is known, and it is stripped."""
        held = "".join(self._pending)
        self._pending = []
        out = held.rstrip() if self._emitted else held.strip()
        self._emitted = self._emitted or bool(out)
        return out

    def _take(self, cut: Callable[[str], int]) -> str:
        if not self._pending:
            return ""
        held = "".join(self._pending)
        end = cut(held)
        self._pending = [held[end:]] if end < len(held) else []
        self._emitted = self._emitted or end > 0
        return held[:end]


class ReasoningStream(ABC):
    """The reasoning stage fed the generated text as it grows."""

    @abstractmethod
    def feed(self, text: str) -> tuple[str, str]:
        """Take the next piece of text; return the reasoning and the content (for the tool stage)
        that are now certain, whatever text follows."""


class ToolStream(ABC):
    """The tool stage fed the reasoning stage's content as it becomes certain."""

    @abstractmethod
    def feed(self, text: str) -> tuple[str, tuple[ParsedCall, ...]]:
        """Take the next piece of content; return the content now certain to open the answer's
        content, and each call now final."""


class ReasoningParser(ABC):
    """A reasoning stage: splits the generated text into reasoning and content.

    `engine_based` says whether vLLM runs it on its declarative parser engine, which changes how
    the tool stage's result is read (reply.py)."""

    name: str
    engine_based: bool

    @abstractmethod
    def split(self, text: str, context: ReplyContext) -> ReasoningSplit:
        """The reasoning and content of a complete generation."""

    @abstractmethod
    def stream(self, context: ReplyContext) -> ReasoningStream:
        """A fresh incremental reasoning stage for one generation."""

    def prompt_closes(self, prompt: str) -> bool:
        """Whether the rendered `prompt` already closed reasoning, so the generation starts in
        content (only vLLM's engine-based parsers look; `ReplyContext.prompt_closes_reasoning`)."""
        return False


class ToolParser(ABC):
    """A tool stage: finds the tool calls in the content the reasoning stage left."""

    name: str
    engine_based: bool

    @abstractmethod
    def extract(self, content: str, context: ReplyContext, *, with_reasoning: bool) -> ToolExtraction:
        """The calls and the remaining content of a complete content text. `with_reasoning`: a
        reasoning parser is configured too (without one, vLLM's engine-based tool parsers leave
        reasoning markup in the content)."""

    @abstractmethod
    def stream(self, context: ReplyContext, *, with_reasoning: bool) -> ToolStream:
        """A fresh incremental tool stage for one generation."""
