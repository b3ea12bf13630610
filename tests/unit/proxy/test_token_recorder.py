"""modeltap/proxy/token_recorder.py: adding the engine's fields without re-serialising, and rendered ids."""

from __future__ import annotations

import json

import pytest

from modeltap import dialects
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.token_recorder import IdRenderer, TokenIdRecorder, rendered_ids, with_fields
from modeltap.proxy.tokens import TokenCounter
from tests.factories import ASK, BASH_TOOL, assistant, chat_completion, tool_call, usage


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


@pytest.fixture(scope="module")
def renderer(qwen_dir: str) -> IdRenderer:
    return IdRenderer(TokenCounter.load(qwen_dir))


def test_rendered_ids_are_the_prompt_and_what_the_template_adds_for_the_reply(renderer: IdRenderer) -> None:
    chat = dialects.named("chat")
    body = {"model": "m", "messages": [ASK], "tools": [BASH_TOOL]}
    reply = assistant(None, tool_call("c1", "bash", '{"command": "echo $((6 * 7))"}'))
    ids = rendered_ids(
        renderer, chat, body, json.dumps(chat_completion(reply, "tool_calls", usage=usage(1, 1))).encode()
    )
    assert ids is not None and ids.source == "rendered"
    assert ids.prompt == renderer.ids(chat, body)
    assert ids.prompt + ids.completion == renderer.ids(
        chat, body, {k: v for k, v in reply.items() if v is not None}
    )
    text = "".join(renderer.decode_each(ids.completion))
    assert "<tool_call>" in text and "echo $((6 * 7))" in text and text.rstrip().endswith("<|im_end|>")


def test_a_reply_that_is_not_json_renders_nothing(renderer: IdRenderer) -> None:
    chat = dialects.named("chat")
    assert rendered_ids(renderer, chat, {"model": "m", "messages": [ASK]}, b"<html>") is None
    assert rendered_ids(renderer, chat, {"model": "m", "messages": "not a list"}, {"choices": []}) is None


def test_a_completions_prompt_of_text_renders_as_the_server_encodes_it(renderer: IdRenderer) -> None:
    completions = dialects.named("completions")
    reply = {"choices": [{"index": 0, "text": " world", "finish_reason": "stop"}]}
    ids = rendered_ids(renderer, completions, {"model": "m", "prompt": "Hello"}, reply)
    assert ids is not None and "".join(renderer.decode_each(ids.prompt + ids.completion)).endswith(
        "Hello world"
    )
    # A prompt of token ids has no text to render: no ids.
    assert rendered_ids(renderer, completions, {"model": "m", "prompt": [1, 2]}, reply) is None


async def test_the_recorder_renders_only_with_a_tokenizer_and_a_failing_render_costs_only_the_ids(
    renderer: IdRenderer, caplog: pytest.LogCaptureFixture
) -> None:
    chat = dialects.named("chat")
    body, reply = {"model": "m", "messages": [ASK]}, chat_completion(assistant("42"), usage=usage(1, 1))
    assert await TokenIdRecorder(ProxyConfig(), None).render(chat, body, reply) is None
    assert (await TokenIdRecorder(ProxyConfig(), renderer).render(chat, body, reply)) is not None

    class Broken:
        def ids(self, *args: object) -> list[int]:
            raise RuntimeError("boom")

    assert await TokenIdRecorder(ProxyConfig(), Broken()).render(chat, body, reply) is None  # type: ignore[arg-type]
    assert "token ids not rendered for a chat exchange" in caplog.text
