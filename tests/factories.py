"""Shared test factories, as mitmproxy's tflow.py: the requests, bodies, SSE pieces and exchanges that
tests build, each with the defaults most tests want and keywords for what a test pins.

Owns: the bash tool and the question the SDK-driven tests send; non-streamed OpenAI chat, completions
and Responses bodies and Anthropic messages; the chunks and SSE framing of their streams; modeltap
`Exchange`s and a record store written with them and with session events; copies of the Qwen3
tokenizer folder with another config or template, and small byte-level BPE tokenizers. Does not own:
what a stand-in upstream answers (tests/standins/) or any test's expected values.

    CHAT = chat_completion(assistant("42"), usage=usage(25, 5))
    stream = sse_data(chat_chunk({"content": "42"})) + SSE_DONE
    await recorded(tmp_path / "r.db", exchange({"model": "m", "messages": [ASK]}, CHAT, session_id="s1"))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from modeltap.counting import bpe
from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.store import RecordStore
from modeltap.testing import exchange
from tests.standins.anthropic_wire import sse_event
from tests.standins.openai_wire import SSE_DONE, sse_data

__all__ = [
    "ASK",
    "BASH_TOOL",
    "CREATED",
    "MODEL",
    "SSE_DONE",
    "assistant",
    "byte_level_tokenizer",
    "chat_chunk",
    "chat_completion",
    "completion_chunk",
    "function_call_item",
    "message",
    "message_item",
    "qwen_folder",
    "recorded",
    "response",
    "rollout",
    "sse_data",
    "sse_event",
    "text_completion",
    "tool_call",
    "tool_call_delta",
    "usage",
]

# Any fixed time: bodies built twice compare equal.
CREATED = 1764457200
# The model the stand-ins serve (tests/standins/openai_like.py).
MODEL = "standin-model"

# --- requests ------------------------------------------------------------------------------------------

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
# The stand-ins' script answers it with a call to bash, then "42" once the result is in.
ASK = {"role": "user", "content": "Run `echo $((6 * 7))` and reply with the number."}

# --- non-streamed bodies -------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """Chat and completions usage, with its total."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """An OpenAI chat tool call (`arguments` is the JSON string the model wrote)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None, *tool_calls: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """An assistant message of a chat completion; `tool_calls` only when there are some."""
    calls = {"tool_calls": list(tool_calls)} if tool_calls else {}
    return {"role": "assistant", "content": content, **fields, **calls}


def _openai_head(kind: str, id: str, created: int, model: str) -> dict[str, Any]:
    """The fields every OpenAI chat or completions object opens with."""
    return {"id": id, "object": kind, "created": created, "model": model}


def chat_completion(
    message: dict[str, Any],
    finish_reason: str = "stop",
    *,
    usage: dict[str, int],
    id: str = "chatcmpl-1",
    created: int = CREATED,
    model: str = MODEL,
    **choice: Any,
) -> dict[str, Any]:
    """A non-streamed chat completion with one choice; `choice` adds fields to it (`logprobs`)."""
    choices = [{"index": 0, "message": message, **choice, "finish_reason": finish_reason}]
    return {**_openai_head("chat.completion", id, created, model), "choices": choices, "usage": usage}


def text_completion(
    text: str,
    finish_reason: str = "stop",
    *,
    usage: dict[str, int],
    id: str = "cmpl-1",
    created: int = CREATED,
    model: str = MODEL,
) -> dict[str, Any]:
    """A non-streamed legacy completion with one choice."""
    return {**completion_chunk(text, finish_reason, id=id, created=created, model=model), "usage": usage}


def message(
    content: list[dict[str, Any]],
    stop_reason: str | None,
    *,
    usage: dict[str, int],
    id: str = "msg_1",
    model: str,
) -> dict[str, Any]:
    """A non-streamed Anthropic message."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage,
    }


def message_item(text: str, id: str = "msg_1") -> dict[str, Any]:
    """A completed Responses output message holding `text`."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(call_id: str, name: str, arguments: str, id: str = "fc_1") -> dict[str, Any]:
    """A completed Responses function call."""
    return {
        "id": id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def response(
    output: list[dict[str, Any]],
    *,
    usage: dict[str, Any],
    id: str = "resp_1",
    model: str = "gpt-x",
    status: str = "completed",
    **fields: Any,
) -> dict[str, Any]:
    """A Responses API object; `fields` adds top-level ones (`created_at`)."""
    return {
        "id": id,
        "object": "response",
        **fields,
        "model": model,
        "status": status,
        "output": output,
        "usage": usage,
    }


# --- stream pieces ---------------------------------------------------------------------------------------


def chat_chunk(
    delta: dict[str, Any],
    finish_reason: str | None = None,
    *,
    id: str = "chatcmpl-1",
    created: int = CREATED,
    model: str = MODEL,
    **extra: Any,
) -> dict[str, Any]:
    """A chat completion chunk with one choice; `extra` adds top-level fields (`usage`)."""
    choices = [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    return {**_openai_head("chat.completion.chunk", id, created, model), "choices": choices, **extra}


def tool_call_delta(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """A tool-call delta of a chat chunk: the first one of a call carries its id, type and name."""
    if call_id is None:
        return {"index": index, "function": {"arguments": arguments}}
    return {
        "index": index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def completion_chunk(
    text: str,
    finish_reason: str | None = None,
    *,
    id: str = "cmpl-1",
    created: int = CREATED,
    model: str = MODEL,
) -> dict[str, Any]:
    """A legacy completion chunk with one choice (a non-streamed completion is one, with usage)."""
    choices = [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    return {**_openai_head("text_completion", id, created, model), "choices": choices}


# --- exchanges: modeltap.testing.exchange (the public kit) --------------------------------------------


def rollout(
    session_id: str,
    task_id: str,
    replies: Sequence[dict[str, Any]],
    *,
    outcome: RolloutOutcome | None = None,
    started: float = float(CREATED),
    labels: dict[str, str] | None = None,
) -> list[Exchange | SessionEvent]:
    """One rollout's records as the adapter's proxy writes them: its session opening (labelled with
    `task_id` and `labels`), a chat turn per assistant message in `replies` (the history growing
    from a system prompt and the task's prompt that every rollout of the task shares, each tool call
    answered by a tool result, each reply by "go on"), one second apart, and its outcome."""
    every = {"task_id": task_id, **(labels or {})}
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + "Be careful. " * 50},
        {"role": "user", "content": f"Solve task {task_id}."},
    ]
    records: list[Exchange | SessionEvent] = [SessionEvent("opened", session_id, every, at=started)]
    for turn, reply in enumerate(replies):
        calls = reply.get("tool_calls") or []
        body = {"model": MODEL, "messages": list(history), "tools": [BASH_TOOL]}
        answer = chat_completion(
            reply,
            "tool_calls" if calls else "stop",
            usage=usage(100 + 10 * turn, 5),
            id=f"chatcmpl-{session_id}-{turn}",
        )
        at = started + turn + 1
        records.append(
            exchange(body, answer, session_id=session_id, labels=every, started=at, ended=at + 0.5)
        )
        history.append(reply)
        history += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls] or [
            {"role": "user", "content": "go on"}
        ]
    if outcome is not None:
        records.append(
            SessionEvent("outcome", session_id, every, at=started + len(replies) + 1, outcome=outcome)
        )
    return records


async def recorded(
    path: Path,
    *records: Exchange | SessionEvent,
    keep_raw_sse: bool = False,
    turn_ends: frozenset[int] = frozenset(),
) -> Path:
    """Exchanges and session events written in order to a record store at `path` by the real writer,
    which knows the served tokenizer's `turn_ends` (as serve tells it); returns `path`."""
    store = RecordStore(path, keep_raw_sse=keep_raw_sse)
    store.tokens.turn_ends = turn_ends
    store.start()
    for record in records:
        if isinstance(record, SessionEvent):
            store.on_session(record)
        else:
            await store.submit(record)
    await store.close()
    return path


# AReaL's control routes (docs/areal.md §1.1.2, §1.2), each a way to set a reward or steer the trainer.
CONTROL_PATHS = [
    "/rl/start_session",
    "/rl/end_session",
    "/rl/set_reward",
    "/export_trajectories",
    "/grant_capacity",
    "/call",
    "/configure",
    "/create_engine",
    "/set_env",
    "/alloc_ports",
    "/internal/wait_for_session",
]


# --- tokenizer folders ---------------------------------------------------------------------------------


def qwen_folder(
    root: Path,
    qwen_dir: str,
    config: dict[str, Any] | None = None,
    *,
    drop: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
) -> Path:
    """A copy of the Qwen3 tokenizer folder (tokenizer.json linked), its config updated by `config`
    without the keys in `drop`, plus `files` (relative path: text, written byte for byte).

    The Qwen config's `"unk_token": null` stays: with the key missing, Qwen2Tokenizer would pass its
    code default to templates, which no folder reader can know (modeltap/counting/template.py).
    """
    root.mkdir(parents=True)
    (root / "tokenizer.json").symlink_to(Path(qwen_dir, "tokenizer.json"))
    saved = json.loads(Path(qwen_dir, "tokenizer_config.json").read_text(encoding="utf-8"))
    saved = {k: v for k, v in saved.items() if k not in drop} | (config or {})
    (root / "tokenizer_config.json").write_text(json.dumps(saved), encoding="utf-8")
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(text.encode("utf-8"))
    return root


def byte_level_tokenizer(merges: Sequence[tuple[str, str]] = (), extra: Sequence[str] = ()) -> Tokenizer:
    """A GPT-2-style byte-level BPE: the 256 byte symbols, then each merge's result (ids in merge
    order), then `extra` tokens that no merge produces; ChatML's two added tokens."""
    vocab = {symbol: i for i, symbol in enumerate(bpe.bytes_to_unicode().values())}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    for token in extra:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok
