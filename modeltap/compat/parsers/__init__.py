"""From generated text back to the client's message, as the engine's own parsers would: reasoning and
tool calls parsed out of what the model wrote, one module per model family behind one interface.

Reproduces vLLM v0.33.0's non-streaming parsers exactly (docs/parsers.md; the golden vectors in
tests/fixtures/parsers/ are vLLM's own answers): `hermes` (Qwen2.5 / Qwen3 JSON calls), `qwen3_coder`
(Qwen3's XML calls), `glm45` / `glm47` (GLM's `<arg_key>` calls) and the `qwen3`, `deepseek_r1` and
`glm45` reasoning parsers. Pure functions over text, standard library only; nothing of modeltap outside
compat.

    parser = reply_parser("hermes", "qwen3")           # names from infer_parsers(template) or a flag
    context = ReplyContext(tools=ToolSpec.from_chat(body.get("tools")))
    reply = parser.parse(generated_text, context)      # ParsedReply(content, reasoning, tool_calls)
    reply.finish_reason(engine_finish_reason)          # 'tool_calls' when calls and a natural stop

    stream = ReplyStream(parser, context)              # a streamed reply: the same message, in steps
    step = stream.feed(text_delta)                     # StreamStep(content, reasoning, tool_calls)
    last = stream.finish()
"""

from modeltap.compat.parsers.base import (
    ParsedCall,
    ParsedReply,
    ReplyContext,
    StreamStep,
    ToolSpec,
)
from modeltap.compat.parsers.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    ParserChoice,
    UnknownParserError,
    infer_parsers,
    reply_parser,
)
from modeltap.compat.parsers.reply import ReplyParser
from modeltap.compat.parsers.reply_stream import ReplyStream, StreamMismatchError

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ParsedCall",
    "ParsedReply",
    "ParserChoice",
    "ReplyContext",
    "ReplyParser",
    "ReplyStream",
    "StreamMismatchError",
    "StreamStep",
    "ToolSpec",
    "UnknownParserError",
    "infer_parsers",
    "reply_parser",
]
