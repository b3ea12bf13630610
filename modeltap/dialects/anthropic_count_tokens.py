"""Anthropic count_tokens: `POST /v1/messages/count_tokens`, a messages body in, `{"input_tokens"}` out.

Owns: the route (under `/v1` on AReaL too, which does not serve it), Anthropic's error shape, the
prompt (the messages body's own, counted exactly as `/v1/messages` would count it) and the answer,
which modeltap gives itself when it has the served model's tokenizer. Claude Code calls it before long
requests (docs/agents.md §4.3).
"""

from __future__ import annotations

from typing import Any

from modeltap.dialects import anthropic_messages
from modeltap.dialects.base import Prompt
from modeltap.dialects.roles import (
    AsChat,
    CountsPrompt,
    GeneratesNothing,
    ReturnsTokenIds,
    Streams,
    ThroughChat,
    TokenEndpoint,
)


class CountTokens(
    anthropic_messages.AnthropicShaped,
    GeneratesNothing,
    CountsPrompt,
    declines=(Streams, AsChat, ThroughChat, ReturnsTokenIds, TokenEndpoint),
):
    """A count generates nothing (no budget, no reply), but has the prompt `/v1/messages` renders."""

    name = "count_tokens"
    route = "messages/count_tokens"
    areal_v1 = True

    def check(self, body: dict[str, Any]) -> None:
        anthropic_messages.DIALECT.check(body)

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        return anthropic_messages.DIALECT.prompt(body)

    def count_answer(self, prompt_tokens: int) -> dict[str, Any]:
        return {"input_tokens": prompt_tokens}


DIALECT = CountTokens()
