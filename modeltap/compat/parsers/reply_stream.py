"""The stream modeltap writes from a generation as it grows: at each step the content and reasoning
that no later text can change, and each tool call once it is final; at the end, the rest.

modeltap answers a streamed request with what it answers a non-streamed one (docs/parsers.md §7):
the complete text is parsed once, at the end, with the non-streaming algorithm (reply.py), and
before that only what that parse is certain to begin with is emitted. So the concatenated deltas
are the parsed reply's content and reasoning, and the calls are its calls, whatever pieces the text
came in. What is certain depends on the family: reasoning as it comes (but deepseek_r1 without an
opening tag, where a later `<think>` would discard it); content before a call up to its last
non-whitespace character; an XML (qwen3_coder, GLM) call when its closing tag arrives; a hermes call
only at the end, because one later block that fails to parse turns the whole reply into content.

    stream = ReplyStream(parser, context)
    for piece in pieces:
        step = stream.feed(piece)   # StreamStep(content, reasoning, tool_calls) to send now
    last = stream.finish()          # the rest; stream.reply is the parsed reply
"""

from __future__ import annotations

from modeltap.compat.parsers.base import (
    ParsedCall,
    ParsedReply,
    ReasoningStream,
    ReplyContext,
    StreamStep,
    ToolStream,
)
from modeltap.compat.parsers.reply import ReplyParser


class StreamMismatchError(RuntimeError):
    """What was streamed is not how the parsed reply begins (a defect of this package: the
    property tests hold it)."""


class _Passthrough(ToolStream):
    """No tool stage, or one whose answer leaves the content as it is."""

    def feed(self, text: str) -> tuple[str, tuple[ParsedCall, ...]]:
        return text, ()


class ReplyStream:
    """One generation's stream (`feed` each new piece of text, then `finish` once)."""

    def __init__(self, parser: ReplyParser, context: ReplyContext) -> None:
        self._parser = parser
        self._context = context
        self._pieces: list[str] = []
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: list[ParsedCall] = []
        self._reasoning_stage: ReasoningStream | None = (
            None if parser.reasoning_parser is None else parser.reasoning_parser.stream(context)
        )
        tools = parser.tool_parser
        if tools is None or not (context.calls_kept or parser.engine_based):
            self._tool_stage: ToolStream = _Passthrough()
        else:
            self._tool_stage = tools.stream(context, with_reasoning=parser.reasoning_parser is not None)
        self.reply: ParsedReply | None = None

    def feed(self, text: str) -> StreamStep:
        """The next piece of generated text; what to send for it."""
        if self.reply is not None:
            raise RuntimeError("the stream has finished")
        self._pieces.append(text)
        if self._reasoning_stage is None:
            reasoning, content = "", text
        else:
            reasoning, content = self._reasoning_stage.feed(text)
        content, calls = self._tool_stage.feed(content)
        return self._step(content, reasoning, calls)

    def finish(self) -> StreamStep:
        """The end of the generation: parse the whole text and send what the steps have not."""
        if self.reply is not None:
            raise RuntimeError("the stream has finished")
        reply = self._parser.parse("".join(self._pieces), self._context)
        self.reply = reply
        content = _rest(reply.content, "".join(self._content), "content")
        reasoning = _rest(reply.reasoning, "".join(self._reasoning), "reasoning")
        sent = len(self._calls)
        if tuple(self._calls) != reply.tool_calls[:sent]:
            raise StreamMismatchError(f"streamed calls {self._calls} do not begin {reply.tool_calls}")
        return self._step(content, reasoning, reply.tool_calls[sent:])

    def _step(self, content: str, reasoning: str, calls: tuple[ParsedCall, ...]) -> StreamStep:
        self._content.append(content)
        self._reasoning.append(reasoning)
        self._calls.extend(calls)
        return StreamStep(content, reasoning, calls)


def _rest(final: str | None, sent: str, field: str) -> str:
    text = final or ""
    if not text.startswith(sent):
        raise StreamMismatchError(f"streamed {field} {sent!r} does not begin the parsed {text!r}")
    return text[len(sent) :]
