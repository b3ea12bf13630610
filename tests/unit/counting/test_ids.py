"""modeltap/counting/ids.py: ids rendered by the served template and tokenizer (the engine gave none)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.counting.ids import IdRenderer, rendered_ids
from tests.factories import ASK, BASH_TOOL, assistant, chat_completion, tool_call, usage


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


def test_the_turn_ends_are_the_served_tokenizers_own(renderer: IdRenderer, qwen_dir: str) -> None:
    # The oracle is the tokenizer as transformers loads it: Qwen3's <|im_end|> and <|endoftext|>.
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    assert renderer.turn_ends() == frozenset(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


@pytest.mark.parametrize(("finish", "turn_end"), [("stop", 1), ("length", 0)])
def test_a_rendered_completion_is_masked_to_what_the_reply_text_encodes(
    renderer: IdRenderer, finish: str, turn_end: int
) -> None:
    # What the template writes around the reply (the empty think block of the last turn, the newline
    # after it) is not the model's; the reply's text is, and its end of turn when it ended on its own.
    chat = dialects.named("chat")
    body = {"model": "m", "messages": [ASK]}
    response = chat_completion(assistant("It prints 42."), finish, usage=usage(1, 1))
    ids = rendered_ids(renderer, chat, body, response)
    assert ids is not None and ids.mask is not None and len(ids.mask) == len(ids.completion)
    text = renderer.decode_each(ids.completion)
    masked = "".join(t for t, m in zip(text, ids.mask, strict=True) if m)
    assert masked == "It prints 42." + ("<|im_end|>" if turn_end else "")
    assert "<think>" in "".join(text) and text[-1] == "\n"


def test_a_reply_with_reasoning_masks_the_reasoning_and_content_not_the_tags(renderer: IdRenderer) -> None:
    chat = dialects.named("chat")
    reply = {**assistant("42"), "reasoning_content": "Six times seven."}
    response = chat_completion(reply, "stop", usage=usage(1, 1))
    ids = rendered_ids(renderer, chat, {"model": "m", "messages": [ASK]}, response)
    assert ids is not None and ids.mask is not None
    text = renderer.decode_each(ids.completion)
    masked = [t for t, m in zip(text, ids.mask, strict=True) if m]
    # ".\n" merges the reasoning's last character with the template's newline: not wholly the model's.
    assert "".join(masked) == "Six times seven42<|im_end|>"
    assert not {"<think>", "</think>", ".\n"} & set(masked)
