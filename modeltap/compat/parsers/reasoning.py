"""The `<think>…</think>` reasoning parsers, as vLLM 0.33.0 runs them: `qwen3`, `glm45` / `glm47` (on the
parser engine) and `deepseek_r1` (a plain split).

`qwen3` (vllm/reasoning/qwen3_engine_reasoning_parser.py → vllm/parser/qwen3.py:148-344, at
https://github.com/vllm-project/vllm/blob/v0.33.0/): the text starts in reasoning unless
`enable_thinking` is false or the prompt already closed it; `<think>` is absorbed, `</think>` ends
reasoning (a later `</think>` is dropped), and `<tool_call>` ends it too, staying in the content for
the tool parser (vLLM 0.33's implicit end). No `</think>` at all: everything is reasoning. Nothing is
stripped. With `enable_thinking` false the text is all content, tags included.

`glm45` / `glm47` (vllm/parser/glm47_moe.py): the same, except that `<think>` in content opens
reasoning again and the reasoning loses its trailing whitespace.

`deepseek_r1` (vllm/reasoning/basic_parsers.py:153-176): the text after the first `<think>` (all of
it when there is none; what came before is discarded), split at the first `</think>`; no `</think>`:
all reasoning. No implicit end at `<tool_call>`, nothing dropped, nothing stripped.

vLLM 0.19.1 and SGLang differ (no implicit end at `<tool_call>`; SGLang 0.5.10 strips): docs/parsers.md §5.

    Qwen3Reasoning().split("plan</think>\\n\\nanswer", ReplyContext())
    # ReasoningSplit(reasoning='plan', content='\\n\\nanswer')
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

from modeltap.compat.parsers.base import (
    GrowingText,
    ReasoningParser,
    ReasoningSplit,
    ReasoningStream,
    ReplyContext,
    partial_suffix,
)
from modeltap.compat.parsers.glm import glm_grammar, glm_thinking
from modeltap.compat.parsers.markup import Event, Grammar, Machine, State, split_reasoning
from modeltap.compat.parsers.qwen3_coder import qwen3_grammar, qwen3_thinking

THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALL_START = "<tool_call>"

# The special tokens that open and close a turn in each family's prompt: only the prompt's last turn
# tells whether reasoning is already closed (qwen3.py:46, glm47_moe.py:51-53).
QWEN3_TURN_BOUNDARIES = ("<|im_start|>", "<|im_end|>")
GLM_TURN_BOUNDARIES = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")


def prompt_closes_reasoning(prompt: str, turn_boundaries: tuple[str, ...]) -> bool:
    """Whether a rendered prompt's last turn already closed reasoning, so that an engine-based
    reasoning parser starts in content (`ParserEngine.set_prompt_token_ids`, parser_engine.py:235-245,
    and `is_reasoning_end`, :712-734): after the last turn boundary, the last of `<think>`,
    `</think>` and `<tool_call>` is one of the two that end reasoning. The markers are single tokens in
    both families' vocabularies, so their text stands for their ids.

        prompt_closes_reasoning("<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n", QWEN3_TURN_BOUNDARIES)
        # True
    """
    start = max(
        (prompt.rfind(boundary) + len(boundary) for boundary in turn_boundaries if boundary in prompt),
        default=0,
    )
    last_turn = prompt[start:]
    last = max((last_turn.rfind(marker), marker) for marker in (THINK_START, THINK_END, TOOL_CALL_START))
    return last[0] >= 0 and last[1] != THINK_START


class EngineReasoning(ReasoningParser):
    """A reasoning stage on the engine (vLLM's `ParserEngineReasoningAdapter`): the grammar run with
    call markup left as text, from reasoning (or from content when the prompt closed it)."""

    engine_based = True
    turn_boundaries: tuple[str, ...]

    @abstractmethod
    def grammar(self, thinking: bool) -> Grammar:
        """The family's grammar."""

    @abstractmethod
    def thinking(self, chat_template_kwargs: Mapping[str, Any]) -> bool:
        """Whether the request thinks (when not, the text is all content)."""

    def prompt_closes(self, prompt: str) -> bool:
        return prompt_closes_reasoning(prompt, self.turn_boundaries)

    def _machine(self, context: ReplyContext) -> tuple[Grammar, Machine] | None:
        if not self.thinking(context.chat_template_kwargs):
            return None
        grammar = self.grammar(True)
        state = State.CONTENT if context.prompt_closes_reasoning else State.REASONING
        machine = Machine(grammar, state=state, skip_tools=True, special_tokens=context.special_tokens)
        return grammar, machine

    def split(self, text: str, context: ReplyContext) -> ReasoningSplit:
        started = self._machine(context)
        if started is None:
            return ReasoningSplit(None, text)
        grammar, machine = started
        return ReasoningSplit(*split_reasoning(machine.feed(text) + machine.finish(), grammar))

    def stream(self, context: ReplyContext) -> ReasoningStream:
        started = self._machine(context)
        return _ContentOnly() if started is None else _EngineReasoningStream(*started)


class Qwen3Reasoning(EngineReasoning):
    """`--reasoning-parser qwen3`."""

    name = "qwen3"
    turn_boundaries = QWEN3_TURN_BOUNDARIES

    def grammar(self, thinking: bool) -> Grammar:
        return qwen3_grammar(thinking)

    def thinking(self, chat_template_kwargs: Mapping[str, Any]) -> bool:
        return qwen3_thinking(chat_template_kwargs)


class GlmReasoning(EngineReasoning):
    """`--reasoning-parser glm45` / `glm47`."""

    name = "glm45"
    turn_boundaries = GLM_TURN_BOUNDARIES

    def grammar(self, thinking: bool) -> Grammar:
        return glm_grammar(thinking)

    def thinking(self, chat_template_kwargs: Mapping[str, Any]) -> bool:
        return glm_thinking(chat_template_kwargs)


class DeepSeekR1Reasoning(ReasoningParser):
    """`--reasoning-parser deepseek_r1`."""

    name = "deepseek_r1"
    engine_based = False

    def split(self, text: str, context: ReplyContext) -> ReasoningSplit:
        before, opened, after = text.partition(THINK_START)
        output = after if opened else before
        if THINK_END not in output:
            return ReasoningSplit(output, None)
        reasoning, _, content = output.partition(THINK_END)
        return ReasoningSplit(reasoning, content or None)

    def stream(self, context: ReplyContext) -> ReasoningStream:
        return _DeepSeekR1Stream()


class _ContentOnly(ReasoningStream):
    """Thinking off: the text is the content as it comes."""

    def feed(self, text: str) -> tuple[str, str]:
        return "", text


class _EngineReasoningStream(ReasoningStream):
    """The engine is a left-to-right machine: its reasoning and content events are final as they
    come, but for a reasoning that loses its trailing whitespace at the end (GLM)."""

    def __init__(self, grammar: Grammar, machine: Machine) -> None:
        self._machine = machine
        self._strip = grammar.strip_trailing_reasoning
        self._reasoning = GrowingText()

    def feed(self, text: str) -> tuple[str, str]:
        events = self._machine.feed(text)
        self._reasoning.add("".join(value for kind, value, _ in events if kind is Event.REASONING))
        content = "".join(value for kind, value, _ in events if kind is Event.TEXT)
        return (self._reasoning.take_rstripped() if self._strip else self._reasoning.take_all()), content


class _DeepSeekR1Stream(ReasoningStream):
    """Nothing is certain before a `<think>` arrives (one would discard what came before it); after
    it, the text up to `</think>` is reasoning and the rest content."""

    def __init__(self) -> None:
        self._held = ""
        self._opened = False
        self._closed = False

    def feed(self, text: str) -> tuple[str, str]:
        if self._closed:
            return "", text
        if not self._opened:
            # Only a `<think>` is looked for: the text before it is discarded, so only the tail
            # that may complete one is worth keeping.
            held = self._held + text
            _, opened, after = held.partition(THINK_START)
            if not opened:
                self._held = held[-(len(THINK_START) - 1) :]
                return "", ""
            self._held, self._opened, text = "", True, after
        held = self._held + text
        reasoning, closed, content = held.partition(THINK_END)
        if closed:
            self._held, self._closed = "", True
            return reasoning, content
        keep = partial_suffix(held, THINK_END)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep], ""
