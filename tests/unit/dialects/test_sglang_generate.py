"""modeltap/dialects/sglang_generate.py: SGLang's `/generate` as `--tokens exact` speaks it: the prompt
of ids, the answer's ids, finish reason, usage and weight version, and its cumulative stream."""

from __future__ import annotations

import json

from modeltap.dialects.sglang_generate import DIALECT
from modeltap.dialects.sse import StreamAssembler
from modeltap.dialects.token_ids import Generated, TokenIds

REQUEST = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 8}, "stream": True}


def answer(ids: list[int], finish: str | None, **meta: object) -> dict[str, object]:
    info = {"finish_reason": {"type": finish} if finish else None, "prompt_tokens": 3}
    return {"text": "x", "output_ids": ids, "meta_info": {**info, "completion_tokens": len(ids), **meta}}


def events(*chunks: object, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def test_the_prompt_cap_and_usage_are_the_native_fields() -> None:
    assert DIALECT.completion_field(REQUEST) == "max_new_tokens"
    assert DIALECT.usage(answer([7, 8], "stop")) == (3, 2)
    assert DIALECT.read(answer([7], "length")) == ("length", "x", [])


def test_the_generated_ids_with_finish_weight_version_and_logprobs() -> None:
    logprobs = [[-0.5, 7, "a"], [-0.25, 8, "b"]]
    whole = answer([7, 8], "stop", weight_version="v3", output_token_logprobs=logprobs)
    assert DIALECT.generated(whole, streamed=False) == [Generated(0, [7, 8], [-0.5, -0.25], "stop", "v3")]
    assert DIALECT.token_ids(REQUEST, whole) == TokenIds([1, 2, 3], [7, 8], [-0.5, -0.25])
    # n > 1 answers a list, each with its index; a stream's chunk holds the output so far.
    many = [{**answer([7], "stop"), "index": 1}, {**answer([9], "stop"), "index": 0}]
    assert [g.index for g in DIALECT.generated(many, streamed=False)] == [1, 0]
    assert DIALECT.generated(answer([7], None), streamed=True)[0].cumulative
    # Logprobs that do not match the ids one for one are none.
    assert (
        DIALECT.generated(answer([7, 8], "stop", output_token_logprobs=logprobs[:1]), streamed=False)[
            0
        ].logprobs
        is None
    )


def test_a_stream_is_its_last_output_and_whole_at_its_finish_without_done() -> None:
    chunks = (answer([7], None), answer([7, 8], None), answer([7, 8, 9], "stop"))
    for done in (True, False):
        assembler = StreamAssembler(DIALECT)
        assembler.feed(events(*chunks, done=done))
        result = assembler.result()
        assert result.complete and result.error is None and result.body == chunks[-1]
    cut = StreamAssembler(DIALECT)
    cut.feed(events(*chunks[:2], done=False))
    result = cut.result()
    assert not result.complete and result.error is not None and "[DONE]" in result.error
