"""A minimal coding agent for the adapter's tests: one chat completion through the official openai SDK.

Usage: python sdk_agent.py PROMPT. It reads OPENAI_BASE_URL and OPENAI_API_KEY (as the bundle's
endpoint sets them), offers one bash tool, prints the model's text and exits 0. It exits 2 when the
model claims tool calls and sends none (AReaL's unparseable tool call, docs/areal.md §4.2),
and 1 when the API call fails. With AGENT_SLEEP_S set, it first sleeps that long (for cancellation);
AGENT_MODEL names the model (default "policy", which AReaL ignores). AGENT_FORMAT picks the API it
speaks, as the three agent families do: "chat" (opencode; the default), "messages" (Claude Code, the
anthropic SDK at the same base URL) or "responses" (Codex).
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
model, prompt = os.environ.get("AGENT_MODEL", "policy"), sys.argv[1]
api = os.environ.get("AGENT_FORMAT", "chat")
if api == "messages":
    import anthropic

    anthropic_client = anthropic.Anthropic(
        base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0
    )
    message = anthropic_client.messages.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": prompt}]
    )
    print("".join(block.text for block in message.content if block.type == "text"))
    sys.exit(0)
client = openai.OpenAI(max_retries=0)  # SDK retries leave orphan interactions in AReaL (docs/areal.md §7)
if api == "responses":
    print(client.responses.create(model=model, input=prompt).output_text)
    sys.exit(0)
reply = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": prompt}],
    tools=TOOLS,
)
choice = reply.choices[0]
if choice.finish_reason == "tool_calls" and not choice.message.tool_calls:
    print("the model announced tool calls and sent none", file=sys.stderr)
    sys.exit(2)
print(choice.message.content or "")
