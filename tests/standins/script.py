"""The scripted model that every stand-in upstream plays, and the cheap token count they all report.

Owns: reading a request body of any of the three wire formats (OpenAI chat, OpenAI Responses,
Anthropic Messages) into one `Conversation`, and deciding the `Reply`. Does not own: how a reply is
encoded on the wire (openai_wire.py, anthropic_wire.py and the backend modules) or HTTP (server.py).

The default script is the one the agent CLIs were measured against (docs/agents.md §0): a conversation
that already holds a tool result gets the text "42" (or, when its task names mini-swe-agent's submit
marker, a shell call that submits 42: docs/agents.md §8.3); one that offers a bash-like tool gets a call
to it running `echo $((6 * 7))`; anything else (an agent's title request) gets "Shell arithmetic check".

    >>> shell_arithmetic(chat_conversation({"messages": [{"role": "user", "content": "hi"}]})).text
    'Shell arithmetic check'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_COMMAND = "echo $((6 * 7))"
TOOL_DESCRIPTION = "Print the result of 6 * 7"
FINAL_ANSWER = "42"
TITLE = "Shell arithmetic check"
# The agents' shell tools: opencode and mini-swe-agent "bash", Claude Code "Bash", Qwen Code
# "run_shell_command", Codex "exec_command", whose command argument is `cmd` (docs/agents.md §0, §3.5,
# §4.3, §6.4, §7.4, §8.4).
BASH_LIKE_TOOLS = frozenset({"bash", "shell", "run_shell_command", "exec_command"})
# mini-swe-agent ends a run when a command's first output line is this marker; the rest is the
# answer (docs/agents.md §8.3).
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
# The stand-ins have no tokenizer: a token is counted as 4 bytes of compact JSON, the usual rule of thumb
# for English text. Only consistency matters: the same count is reported in `usage` and compared with
# the stand-in's context limit, so a test can compute what a stand-in will say.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class ToolCall:
    """A call the model makes: the tool's name and its arguments."""

    name: str
    arguments: Mapping[str, Any]

    @property
    def arguments_json(self) -> str:
        """The arguments as the JSON string OpenAI puts in `function.arguments`."""
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class Reply:
    """What the model answers: text, or a tool call (with empty text)."""

    text: str = ""
    tool_call: ToolCall | None = None


@dataclass(frozen=True)
class Conversation:
    """What a script looks at, whatever the wire format of the request.

    `tools` maps each offered tool's name to the JSON schema of its input; `tool_results` holds the
    text of every tool result already in the conversation, oldest first.
    """

    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    tool_results: Sequence[str] = ()
    last_user_text: str = ""


Script = Callable[[Conversation], Reply]


def shell_arithmetic(conversation: Conversation) -> Reply:
    """The default script: tool result -> "42" (submitted through the shell when the task names the
    submit marker); bash-like tool offered -> call it; else the title."""
    if conversation.tool_results and SUBMIT_MARKER not in conversation.last_user_text:
        return Reply(text=FINAL_ANSWER)
    command = f"echo {SUBMIT_MARKER}; echo {FINAL_ANSWER}" if conversation.tool_results else TOOL_COMMAND
    for name, schema in conversation.tools.items():
        if name.lower() in BASH_LIKE_TOOLS:
            properties = schema.get("properties", {})
            arguments = {"cmd" if "cmd" in properties and "command" not in properties else "command": command}
            if "description" in properties:
                arguments["description"] = TOOL_DESCRIPTION
            return Reply(tool_call=ToolCall(name=name, arguments=arguments))
    return Reply(text=FINAL_ANSWER if conversation.tool_results else TITLE)


def approx_tokens(*parts: Any) -> int:
    """The stand-ins' token count of `parts`: bytes of their compact JSON over BYTES_PER_TOKEN, at least 1."""
    size = sum(len(json.dumps(part, separators=(",", ":")).encode()) for part in parts if part is not None)
    return max(1, -(-size // BYTES_PER_TOKEN))


def reply_tokens(reply: Reply) -> int:
    """The completion token count of `reply`."""
    return approx_tokens(reply.text, reply.tool_call and dict(reply.tool_call.arguments))


def _text_of(content: Any) -> str:
    """The text of a message content: a string, or a list of blocks with `text` (OpenAI or Anthropic)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text_of(block.get("text") or block.get("content"))
            for block in content
            if isinstance(block, dict)
        )
    return ""


def chat_conversation(body: Mapping[str, Any]) -> Conversation:
    """An OpenAI chat completions request as a Conversation."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    tools = {
        tool["function"]["name"]: tool["function"].get("parameters") or {}
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict)
    }
    results = [_text_of(m.get("content")) for m in messages if m.get("role") == "tool"]
    users = [_text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    return Conversation(tools=tools, tool_results=results, last_user_text=users[-1] if users else "")


def messages_conversation(body: Mapping[str, Any]) -> Conversation:
    """An Anthropic Messages request as a Conversation (`system` entries inside `messages` are ignored)."""
    tools = {
        tool["name"]: tool.get("input_schema") or {}
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and "name" in tool
    }
    results: list[str] = []
    users: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        results += [
            _text_of(b.get("content"))
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        text = _text_of([b for b in blocks if isinstance(b, dict) and b.get("type") == "text"] or content)
        if text:
            users.append(text)
    return Conversation(tools=tools, tool_results=results, last_user_text=users[-1] if users else "")


def responses_conversation(body: Mapping[str, Any]) -> Conversation:
    """An OpenAI Responses request as a Conversation (`input` is a string or a list of items)."""
    tools = {
        tool["name"]: tool.get("parameters") or {}
        for tool in body.get("tools") or []
        if isinstance(tool, dict) and tool.get("type") == "function" and "name" in tool
    }
    items = body.get("input")
    if isinstance(items, str):
        return Conversation(tools=tools, last_user_text=items)
    items = [item for item in items or [] if isinstance(item, dict)]
    results = [str(item.get("output", "")) for item in items if item.get("type") == "function_call_output"]
    users = [_text_of(item.get("content")) for item in items if item.get("role") == "user"]
    return Conversation(tools=tools, tool_results=results, last_user_text=users[-1] if users else "")
