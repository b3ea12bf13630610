"""A reasoning parser and a tool parser combined into one answer, as vLLM 0.33.0's `DelegatingParser`
combines them for a non-streamed chat reply.

`DelegatingParser.parse` (vllm/parser/abstract_parser.py:839-852 at
https://github.com/vllm-project/vllm/blob/v0.33.0/): the reasoning stage splits the text, then
`_extract_tool_calls` (:391-491) reads the tool stage's answer on the content:
- calls found: they are the answer's, with the tool stage's content (whitespace alone is none);
- none found: the tool stage's content when both stages run on the parser engine (an unfinished
  XML call's markup is dropped), the reasoning stage's content as it was otherwise (hermes: the
  whole text);
- `tool_choice: none` or no tools: no calls; the content as the engine-based tool stage leaves it,
  or untouched.
`assemble_chat_message_fields` then keeps the calls only for `tool_choice: auto` with tools, and the
first only without parallel calls (chat_completion/message_assembly.py:26-118). Does not own the
stages (hermes.py, qwen3_coder.py, glm.py, reasoning.py) or streaming (reply_stream.py).

    parser = ReplyParser(HermesToolParser(), Qwen3Reasoning())
    parser.parse("plan</think>\\n\\n<tool_call>\\n{...}\\n</tool_call>", ReplyContext(tools=tools))
"""

from __future__ import annotations

from dataclasses import dataclass

from modeltap.compat.parsers.base import (
    ParsedCall,
    ParsedReply,
    ReasoningParser,
    ReasoningSplit,
    ReplyContext,
    ToolParser,
)


@dataclass(frozen=True)
class ReplyParser:
    """One tool parser and one reasoning parser (either may be None), as one `--tool-call-parser`
    and `--reasoning-parser` pair of a vLLM server."""

    tool_parser: ToolParser | None
    reasoning_parser: ReasoningParser | None

    @property
    def engine_based(self) -> bool:
        """Whether every configured stage runs on vLLM's parser engine (`Parser._engine_based`)."""
        return all(stage is None or stage.engine_based for stage in (self.tool_parser, self.reasoning_parser))

    def skip_special_tokens(self, context: ReplyContext) -> bool:
        """The `skip_special_tokens` vLLM's chat route detokenizes this request's generation with
        (docs/parsers.md §6): false once its parsers adjust the request (a reasoning parser, or calls
        kept) and one of them wants to see special tokens (an engine-based one always, hermes when it
        parses calls); true otherwise, the default. A token-in request asks the same of the engine."""
        if self.reasoning_parser is None and not context.calls_kept:
            return True
        wants = [self.reasoning_parser is not None and self.reasoning_parser.engine_based]
        if self.tool_parser is not None:
            wants.append(self.tool_parser.engine_based or context.calls_kept)
        return not any(wants)

    def prompt_closes_reasoning(self, prompt: str) -> bool:
        """Whether the rendered `prompt` already closed reasoning (for `ReplyContext`)."""
        return self.reasoning_parser is not None and self.reasoning_parser.prompt_closes(prompt)

    def parse(self, text: str, context: ReplyContext) -> ParsedReply:
        """The message vLLM answers for the complete generated `text`."""
        split = (
            ReasoningSplit(None, text)
            if self.reasoning_parser is None
            else self.reasoning_parser.split(text, context)
        )
        calls, content = self._tool_calls(split.content, context)
        if not context.parallel_tool_calls:
            calls = calls[:1]
        return ParsedReply(content, split.reasoning, calls)

    def _tool_calls(
        self, content: str | None, context: ReplyContext
    ) -> tuple[tuple[ParsedCall, ...], str | None]:
        tools = self.tool_parser
        if tools is None:
            return (), content
        with_reasoning = self.reasoning_parser is not None
        if not context.calls_kept:
            if self.engine_based:
                return (), tools.extract(content or "", context, with_reasoning=with_reasoning).content
            return (), content
        found = tools.extract(content or "", context, with_reasoning=with_reasoning)
        if found.tools_called:
            return found.tool_calls, found.content if found.content and found.content.strip() else None
        return (), (found.content or None) if self.engine_based else content
