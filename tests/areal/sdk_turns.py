"""The tool-call turns the AReaL-tier tests drive through the official SDKs, whether the client talks to
AReaL's proxy directly (test_areal_baseline.py) or through modeltap (test_areal_behind_modeltap.py).

Owns: the order of the turns and what the client sends back between them. Does not own: the scripted
model's answers (fake_engine.py) or what a test asserts about them.
"""

from __future__ import annotations

from typing import Any

import anthropic
from anthropic.types import Message, ToolUseBlock
from fake_engine import ANTHROPIC_BASH_TOOL


async def anthropic_tool_turns(
    client: anthropic.AsyncAnthropic, question: str
) -> tuple[Message, ToolUseBlock, Message]:
    """`question` with the Bash tool offered: the model's tool_use, then, with its result "42" sent
    back, the final message read as a stream. Returns the first message, its tool_use and the last."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    first = await client.messages.create(
        model="policy", max_tokens=256, messages=messages, tools=[ANTHROPIC_BASH_TOOL]
    )
    tool_use = next(block for block in first.content if block.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "42"}]},
    ]
    async with client.messages.stream(
        model="policy", max_tokens=256, messages=messages, tools=[ANTHROPIC_BASH_TOOL]
    ) as stream:
        second = await stream.get_final_message()
    return first, tool_use, second
