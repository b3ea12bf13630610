"""modeltap/proxy/token_recorder.py: fields added without re-serialising; when ids are rendered."""

from __future__ import annotations

import json

import pytest

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.counting.ids import IdRenderer
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.token_recorder import TokenIdRecorder, with_fields
from tests.factories import ASK, assistant, chat_completion, usage


@pytest.mark.parametrize(
    "payload",
    [
        b'{"model":"m","messages":[]}',
        b'  \n{"model": "m",\n "messages": [] }',
        b'\xef\xbb\xbf{"model":"m","messages":[]}',
    ],
)
def test_fields_go_in_after_the_brace_and_the_rest_is_byte_for_byte(payload: bytes) -> None:
    body = {"model": "m", "messages": []}
    sent = with_fields(payload, body, {"return_token_ids": True, "logprobs": True})
    head, rest = sent.split(b"{", 1)
    assert json.loads(sent.lstrip(b"\xef\xbb\xbf")) == {**body, "return_token_ids": True, "logprobs": True}
    assert payload.endswith(rest[len(b'"return_token_ids": true, "logprobs": true,') :])
    assert sent.startswith(head)


def test_nothing_to_add_forwards_the_same_bytes_and_an_empty_object_is_written_whole() -> None:
    payload = b'{"model":"m"}'
    assert with_fields(payload, {"model": "m"}, {}) is payload
    assert json.loads(with_fields(b"{}", {}, {"return_token_ids": True})) == {"return_token_ids": True}


async def test_the_recorder_renders_only_with_a_tokenizer_and_a_failing_render_costs_only_the_ids(
    qwen_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    renderer = IdRenderer(TokenCounter.load(qwen_dir))
    chat = dialects.named("chat")
    body, reply = {"model": "m", "messages": [ASK]}, chat_completion(assistant("42"), usage=usage(1, 1))
    assert await TokenIdRecorder(ProxyConfig(), None).render(chat, body, reply) is None
    assert (await TokenIdRecorder(ProxyConfig(), renderer).render(chat, body, reply)) is not None

    class Broken:
        def ids(self, *args: object) -> list[int]:
            raise RuntimeError("boom")

    assert await TokenIdRecorder(ProxyConfig(), Broken()).render(chat, body, reply) is None  # type: ignore[arg-type]
    assert "token ids not rendered for a chat exchange" in caplog.text
