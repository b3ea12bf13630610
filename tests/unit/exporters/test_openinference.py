"""modeltap/exporters/openinference.py: the OpenInference attributes Phoenix reads, beside the GenAI
ones (their values from a real exchange: tests/unit/exporters/test_genai.py)."""

from __future__ import annotations

from modeltap.exporters.openinference import attributes_of_call, content_attributes


def test_openinference_messages_keep_the_newest_that_fit() -> None:
    many = [{"role": "user", "content": f"message {n} " + "x" * 100} for n in range(50)]
    attrs = content_attributes(many, [], cut=lambda text: text, limit=1000)
    kept = [value for key, value in attrs.items() if key.endswith(".message.content")]
    assert kept and kept[-1].startswith("message 49 ") and len("".join(kept)) <= 1000
    assert attrs["llm.input_messages.0.message.content"] == kept[0]


def test_a_call_is_an_llm_span_with_its_model_and_tokens() -> None:
    assert attributes_of_call("qwen", 12, 3) == {
        "openinference.span.kind": "LLM",
        "llm.model_name": "qwen",
        "llm.token_count.prompt": 12,
        "llm.token_count.completion": 3,
        "llm.token_count.total": 15,
    }
    assert attributes_of_call(None, None, 3) == {
        "openinference.span.kind": "LLM",
        "llm.token_count.completion": 3,
    }
