"""`modeltap export --format messages`: a session's final conversation as one line of an SFT set.

Owns: the rule that picks a session's main conversation (`final_exchange`: the last successful
exchange that offered tools, else the last successful one), which `--format tokens` shares, and that
conversation in OpenAI chat format. Does not own: a format's conversion to chat (its dialect) or
reading the store (records/reader.py).

    print(json.dumps(conversation(reader.exchanges("s-3f2a"))))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modeltap import dialects
from modeltap.dialects.roles import AsChat


def conversation(exchanges: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The session's final conversation in OpenAI chat format: `{"messages": [...], "tools": [...]}`,
    one line of an SFT set (OpenAI's fine-tuning format for chat with tools).

    The final conversation is that of `final_exchange`: its request history followed by its reply,
    converted to chat by its format's dialect.
    """
    conversational = [ex for ex in exchanges if dialects.of_record(ex["endpoint"]).history_field is not None]
    final = final_exchange(conversational, "chat, messages or responses")
    done = [ex for ex in conversational if _succeeded(ex)]
    earlier = [
        (ex["request"], ex["response"])
        for ex in done
        if ex is not final and ex["endpoint"] == final["endpoint"]
    ]
    dialect = dialects.of_record(final["endpoint"])
    if not isinstance(dialect, AsChat):
        raise ValueError(f"{final['endpoint']} exchanges hold no conversation to export")
    chat = dialect.conversation(final["request"], final["response"], earlier)
    return {"messages": chat.messages, "tools": chat.tools} if chat.tools else {"messages": chat.messages}


def final_exchange(exchanges: Sequence[dict[str, Any]], formats: str) -> dict[str, Any]:
    """The exchange that ends a session's main conversation: the last successful one that offered
    tools, else the last successful one. Agents interleave tool-less side requests (opencode's title, a
    compaction summary: docs/agents.md §3.5) with their main loop, and those are not the conversation.
    Raises ValueError naming the `formats` looked for when none of `exchanges` succeeded."""
    done = [ex for ex in exchanges if _succeeded(ex)]
    if not done:
        raise ValueError(f"the session has no successful {formats} exchange to export")
    return ([ex for ex in done if ex["request"].get("tools")] or done)[-1]


def _succeeded(ex: dict[str, Any]) -> bool:
    return (
        dialects.of_record(ex["endpoint"]).completion_field(ex.get("request") or {}) is not None
        and ex["status"] == 200
        and isinstance(ex.get("request"), dict)
        and isinstance(ex.get("response"), dict)
    )
