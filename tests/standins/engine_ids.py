"""vLLM's and SGLang's token-id extensions as the OpenAI-like stand-in speaks them (docs/engines.md §1, §2).

Owns: which extension a request asked for (vLLM's `return_token_ids`; SGLang's `return_token_ids` on
non-streamed chat and completions, its `x-sglext-*` headers on chat, its 400 for `return_token_ids` on
a streamed chat), and putting the ids (and sampled logprobs) where each engine puts them, in a body
and across a stream's chunks. Does not own: the ids themselves (token_engine.py renders and samples
them) or the chunks of a reply (openai_like.py).

    ask = requested("vllm", "chat", body, headers)
    add_to_body(ask, completion, prompt_ids, completion_ids)          # non-streamed
    add_to_chunks(ask, chunks, prompt_ids, completion_ids)            # streamed, chunk dicts in order
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tests.standins.server import BackendError

Shape = Literal["vllm", "sglang", "sglext"]
# SGLang's refusal, word for word (docs/engines.md §2.1).
SGLANG_STREAM_REFUSAL = {
    "object": "error",
    "message": "return_token_ids is not supported with streaming on /v1/chat/completions. Please set "
    "stream=false when using return_token_ids=true.",
    "type": "BadRequest",
    "param": None,
    "code": 400,
}
SGLEXT_HEADERS = ("x-sglext-return-input-ids", "x-sglext-return-output-ids")


@dataclass(frozen=True)
class Ask:
    """What a request asked for: the shape its ids come back in, and whether with logprobs."""

    shape: Shape
    logprobs: bool


def requested(flavor: str, endpoint: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> Ask | None:
    """The extension `body` and `headers` ask `flavor` for, or None. Raises SGLang's 400 for
    `return_token_ids` on a streamed chat."""
    logprobs = body.get("logprobs") not in (None, False)
    streamed = body.get("stream") is True
    if flavor == "vllm":
        return Ask("vllm", logprobs) if body.get("return_token_ids") else None
    if endpoint == "chat" and all(headers.get(name) == "1" for name in SGLEXT_HEADERS):
        return Ask("sglext", logprobs)
    if body.get("return_token_ids"):
        if endpoint == "chat" and streamed:
            raise BackendError(400, SGLANG_STREAM_REFUSAL)
        return Ask("sglang", logprobs)
    return None


def add_to_body(
    ask: Ask, endpoint: str, body: dict[str, Any], prompt: list[int], completion: list[int]
) -> None:
    """Put the ids in a non-streamed body where the engine puts them."""
    choice = body["choices"][0]
    if ask.logprobs:
        choice["logprobs"] = _logprobs(endpoint, completion)
    if ask.shape == "sglext":
        body["sglext"] = {"input_ids": prompt, "output_ids": [completion]}
    elif ask.shape == "vllm" and endpoint == "chat":
        body["prompt_token_ids"] = prompt
        choice["token_ids"] = completion
    else:
        key = "response_token_ids" if endpoint == "chat" else "token_ids"
        choice.update({"prompt_token_ids": prompt, key: completion})


def add_to_chunks(
    ask: Ask, endpoint: str, chunks: list[dict[str, Any]], prompt: list[int], completion: list[int]
) -> list[dict[str, Any]]:
    """The chunks with the ids spread over them: vLLM and SGLang's completions send each chunk's own
    ids (the prompt's on the first chunk, the end-of-turn id on the finish chunk); SGLang's sglext adds
    one chunk with no choices after the finish chunk."""
    with_choices = [chunk for chunk in chunks if chunk["choices"]]
    if ask.shape == "sglext":
        last = with_choices[-1]
        trailer = {**{k: last[k] for k in ("id", "object", "created", "model")}, "choices": [], "usage": None}
        trailer["sglext"] = {"input_ids": prompt, "output_ids": [completion]}
        at = chunks.index(last) + 1
        return [*chunks[:at], trailer, *chunks[at:]]
    if len(with_choices) == 1:
        pieces = [completion]
    else:
        pieces = [*_spread(completion[:-1], len(with_choices) - 1), completion[-1:]]
    for chunk, ids in zip(with_choices, pieces, strict=True):
        choice = chunk["choices"][0]
        choice["token_ids"] = ids
        if ask.logprobs:
            choice["logprobs"] = _logprobs(endpoint, ids)
    if ask.shape == "vllm" and endpoint == "chat":
        with_choices[0]["prompt_token_ids"] = prompt
    else:
        with_choices[0]["choices"][0]["prompt_token_ids"] = prompt
    return chunks


def _spread(ids: list[int], parts: int) -> list[list[int]]:
    """`ids` cut into `parts` consecutive pieces, as even as they go (some may be empty)."""
    return [ids[len(ids) * i // parts : len(ids) * (i + 1) // parts] for i in range(parts)]


def _logprobs(endpoint: str, ids: list[int]) -> dict[str, Any]:
    """One logprob per id, each `-id / 1000` so a test can tell which id it belongs to."""
    values = [-token / 1000 for token in ids]
    if endpoint == "chat":
        return {
            "content": [
                {"token": f"token_id:{t}", "logprob": v, "bytes": None, "top_logprobs": []}
                for t, v in zip(ids, values, strict=True)
            ]
        }
    return {
        "tokens": [f"token_id:{t}" for t in ids],
        "token_logprobs": values,
        "top_logprobs": None,
        "text_offset": [0] * len(ids),
    }
