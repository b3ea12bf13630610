"""A minimal coding agent for the adapter's tests: one chat completion through the official openai SDK.

Usage: python sdk_agent.py PROMPT. It reads OPENAI_BASE_URL and OPENAI_API_KEY (as the bundle's
endpoint sets them), offers one bash tool, prints the model's text and exits 0. It exits 2 when the
model claims tool calls and sends none (AReaL's unparseable tool call, docs/areal.md §4.2),
and 1 when the API call fails. With AGENT_SLEEP_S set, it first sleeps that long (for cancellation);
AGENT_MODEL names the model (default "policy", which AReaL ignores).
"""

import os
import sys
import time

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]

time.sleep(float(os.environ.get("AGENT_SLEEP_S", "0")))
client = openai.OpenAI(max_retries=0)  # SDK retries leave orphan interactions in AReaL (docs/areal.md §7)
reply = client.chat.completions.create(
    model=os.environ.get("AGENT_MODEL", "policy"),
    messages=[{"role": "user", "content": sys.argv[1]}],
    tools=TOOLS,
)
choice = reply.choices[0]
if choice.finish_reason == "tool_calls" and not choice.message.tool_calls:
    print("the model announced tool calls and sent none", file=sys.stderr)
    sys.exit(2)
print(choice.message.content or "")
