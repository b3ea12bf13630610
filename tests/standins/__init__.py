"""Stand-in upstreams: small aiohttp servers that behave like the backends modeltap sits in front of.

- `ArealStandIn` (areal.py): AReaL 1.0.4's agent proxy, bare chat path, FastAPI errors, control routes.
- `OpenAILikeStandIn` (openai_like.py): vLLM (`flavor="vllm"`) or SGLang (`flavor="sglang"`), all under /v1.
- `AnthropicLikeStandIn` (anthropic_like.py): the Anthropic Messages API.

All play one scripted model (script.py), log every request, and take injected faults (server.py).
Each runs on 127.0.0.1, port 0, from a thread of its own; pytest fixtures are in fixtures.py.

    with OpenAILikeStandIn(flavor="sglang") as upstream:
        ...  # point a client at upstream.v1_url
        assert upstream.model_requests[0].body["stream"] is True
"""

from tests.standins.anthropic_like import AnthropicLikeStandIn
from tests.standins.areal import ArealSession, ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.script import (
    FINAL_ANSWER,
    TITLE,
    TOOL_COMMAND,
    Conversation,
    Reply,
    ToolCall,
    approx_tokens,
)
from tests.standins.server import FaultKind, LoggedRequest, StandIn

__all__ = [
    "FINAL_ANSWER",
    "TITLE",
    "TOOL_COMMAND",
    "AnthropicLikeStandIn",
    "ArealSession",
    "ArealStandIn",
    "Conversation",
    "FaultKind",
    "LoggedRequest",
    "OpenAILikeStandIn",
    "Reply",
    "StandIn",
    "ToolCall",
    "approx_tokens",
]
