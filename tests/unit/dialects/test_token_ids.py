"""modeltap/dialects/token_ids.py, and the chat and completions assemblers merging streamed ids: every
documented shape of vLLM's and SGLang's token ids (docs/engines.md §6), streamed and not."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

from modeltap import dialects
from modeltap.dialects.roles import ReturnsTokenIds
from modeltap.dialects.sse import StreamAssembler
from modeltap.dialects.token_ids import TokenIds, common_prefix, without_ids
from tests.factories import (
    SSE_DONE,
    assistant,
    chat_chunk,
    chat_completion,
    completion_chunk,
    sse_data,
    usage,
)
from tests.standins import token_engine as te

PROMPT = te.render([{"role": "user", "content": "Say hello"}])
TEXT = "Hello! How can I help you today?"
COMPLETION = te.completion(TEXT)


def served(endpoint: str, body: Any) -> TokenIds | None:
    dialect = dialects.named(endpoint)
    return dialect.token_ids({}, body) if isinstance(dialect, ReturnsTokenIds) else None


def test_vllm_chat_has_the_prompt_at_the_top_and_the_completion_on_the_choice() -> None:
    body = chat_completion(assistant(TEXT), usage=usage(20, 10), token_ids=COMPLETION) | {
        "prompt_token_ids": PROMPT
    }
    assert served("chat", body) == TokenIds(PROMPT, COMPLETION, None, "served")


@pytest.mark.parametrize("key", ["response_token_ids", "token_ids"])  # 0.5.18+, 0.5.17
def test_sglang_chat_return_token_ids_sits_on_the_choice(key: str) -> None:
    body = chat_completion(assistant(TEXT), usage=usage(20, 10), prompt_token_ids=PROMPT, **{key: COMPLETION})
    assert served("chat", body) == TokenIds(PROMPT, COMPLETION)


def test_sglang_sglext_ids_are_one_list_per_choice() -> None:
    body = chat_completion(assistant(TEXT), usage=usage(20, 10)) | {
        "sglext": {"input_ids": PROMPT, "output_ids": [COMPLETION]}
    }
    assert served("chat", body) == TokenIds(PROMPT, COMPLETION)


def test_no_ids_or_half_of_them_is_none() -> None:
    assert served("chat", chat_completion(assistant(TEXT), usage=usage(20, 10))) is None
    vllm_without = chat_completion(assistant(TEXT), usage=usage(1, 1), token_ids=None) | {
        "prompt_token_ids": None
    }
    assert served("chat", vllm_without) is None
    assert served("chat", chat_completion(assistant(TEXT), usage=usage(1, 1), token_ids=COMPLETION)) is None
    assert served("messages", {"prompt_token_ids": PROMPT}) is None


def test_logprobs_are_kept_only_when_one_per_completion_id() -> None:
    content = [
        {"token": "x", "logprob": -0.5 * i, "bytes": None, "top_logprobs": []} for i in range(len(COMPLETION))
    ]
    body = chat_completion(
        assistant(TEXT), usage=usage(1, 1), token_ids=COMPLETION, logprobs={"content": content}
    ) | {"prompt_token_ids": PROMPT}
    ids = served("chat", body)
    assert ids is not None and ids.logprobs == [-0.5 * i for i in range(len(COMPLETION))]
    short = chat_completion(
        assistant(TEXT), usage=usage(1, 1), token_ids=COMPLETION, logprobs={"content": content[:-1]}
    ) | {"prompt_token_ids": PROMPT}
    assert served("chat", short) == TokenIds(PROMPT, COMPLETION, None)


def test_completions_carry_both_lists_per_choice_with_token_logprobs() -> None:
    choice = {
        "index": 0,
        "text": "hi",
        "finish_reason": "stop",
        "prompt_token_ids": [1, 2],
        "token_ids": [3, 4],
        "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-0.25, None], "top_logprobs": None},
    }
    assert served("completions", {"choices": [choice]}) == TokenIds([1, 2], [3, 4], [-0.25, None])


def vllm_stream(pieces: int) -> bytes:
    """vLLM's chat stream (docs/engines.md §1.3): `prompt_token_ids` on the role chunk, then the
    completion's ids spread over `pieces` content chunks, the end-of-turn id on the finish chunk."""
    ids = COMPLETION[:-1]
    step = -(-len(ids) // pieces)
    chunks = [chat_chunk({"role": "assistant", "content": ""}, prompt_token_ids=PROMPT)]
    for start in range(0, len(ids), step):
        part = ids[start : start + step]
        chunk = chat_chunk({"content": bytes(t - te.TEXT_OFFSET for t in part).decode()})
        chunk["choices"][0]["token_ids"] = part
        chunks.append(chunk)
    finish = chat_chunk({"content": ""}, "stop")
    finish["choices"][0]["token_ids"] = [te.IM_END]
    return b"".join(sse_data(chunk) for chunk in [*chunks, finish]) + SSE_DONE


def assembled(endpoint: str, raw: bytes, cut: int | None = None) -> dict[str, Any]:
    assembler = StreamAssembler(dialects.named(endpoint))
    for part in (raw,) if cut is None else (raw[:cut], raw[cut:]):
        assembler.feed(part)
    result = assembler.result()
    assert result.complete and result.error is None
    assert result.body is not None
    return result.body


def test_a_stream_whose_ids_are_split_over_many_chunks_reads_as_the_body_would() -> None:
    raw = vllm_stream(pieces=len(COMPLETION) - 1)  # one chunk per sampled token
    body = assembled("chat", raw)
    assert body["choices"][0]["message"]["content"] == TEXT
    assert served("chat", body) == TokenIds(PROMPT, COMPLETION)
    for cut in range(1, len(raw)):
        assert assembled("chat", raw, cut) == body


def test_sglang_streams_its_ids_in_a_trailing_chunk_with_no_choices() -> None:
    content = [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": TEXT}),
        chat_chunk({}, "stop"),
    ]
    trailer = chat_chunk({}) | {
        "choices": [],
        "usage": None,
        "sglext": {"input_ids": PROMPT, "output_ids": [COMPLETION]},
    }
    raw = b"".join(sse_data(chunk) for chunk in [*content, trailer]) + SSE_DONE
    body = assembled("chat", raw)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert served("chat", body) == TokenIds(PROMPT, COMPLETION)


def test_completions_streams_carry_the_prompt_on_each_choices_first_chunk() -> None:
    first = completion_chunk("he")
    first["choices"][0] |= {"prompt_token_ids": [1, 2], "token_ids": [3]}
    last = completion_chunk("y", "stop")
    last["choices"][0]["token_ids"] = [4, 5]
    body = assembled("completions", sse_data(first) + sse_data(last) + SSE_DONE)
    assert body["choices"][0]["text"] == "hey"
    assert served("completions", body) == TokenIds([1, 2], [3, 4, 5])


def test_the_stored_body_keeps_a_marker_where_the_recorded_ids_were() -> None:
    second = {"index": 1, "message": assistant("Hi"), "finish_reason": "stop", "token_ids": [9, 2]}
    body = chat_completion(assistant(TEXT), usage=usage(20, 10), token_ids=COMPLETION) | {
        "prompt_token_ids": PROMPT
    }
    body["choices"].append(second)
    body["sglext"] = {"input_ids": PROMPT, "output_ids": [COMPLETION, [9, 2]]}
    stored = without_ids(body)
    assert stored["prompt_token_ids"] == f"<{len(PROMPT)} token ids>"
    assert stored["choices"][0]["token_ids"] == f"<{len(COMPLETION)} token ids>"
    assert stored["choices"][1] == second and stored["sglext"]["output_ids"][1] == [9, 2]
    assert stored["sglext"]["input_ids"] == f"<{len(PROMPT)} token ids>"
    assert body["prompt_token_ids"] == PROMPT  # a copy: the exchange's own body is left alone
    assert without_ids(chat_completion(assistant(TEXT), usage=usage(1, 1))) == chat_completion(
        assistant(TEXT), usage=usage(1, 1)
    )


@pytest.mark.parametrize("garbage", [[1, "2"], [True, 2], [-1], [2**32], [1.0], "123"])
def test_lists_that_are_not_uint32_ids_are_no_ids_streamed_or_not(garbage: Any) -> None:
    body = chat_completion(assistant(TEXT), usage=usage(1, 1), token_ids=COMPLETION) | {
        "prompt_token_ids": garbage
    }
    assert served("chat", body) is None
    first = chat_chunk({"role": "assistant", "content": TEXT}, "stop", prompt_token_ids=PROMPT)
    first["choices"][0]["token_ids"] = garbage
    assert served("chat", assembled("chat", sse_data(first) + SSE_DONE)) is None


def test_common_prefix_matches_a_plain_loop_on_long_and_short_sequences() -> None:
    rng = random.Random(7)
    for _ in range(200):
        length = rng.choice([0, 1, 5, 1000, 40_000])
        a = [rng.randrange(150_000) for _ in range(length)]
        b = list(a)
        if b and rng.random() < 0.8:
            b[rng.randrange(len(b))] += 1
        if rng.random() < 0.3:
            b = b[: rng.randrange(len(b) + 1)]
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix(a, b) == expected
        assert common_prefix(array("I", a), b) == expected
