"""modeltap/proxy/tokens.py: the count equals a full Hugging Face encode of the prompt the backend renders.

The reference in every test is `len(tok.encode(tok.apply_chat_template(messages, tools=...,
add_generation_prompt=True, tokenize=False), add_special_tokens=False))` over messages written in the
form the backend hands its template, never over modeltap's own normalisation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat.completion_create_params import CompletionCreateParams
from pydantic import TypeAdapter
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modeltap import dialects
from modeltap.dialects.base import Dialect
from modeltap.proxy import tokens
from modeltap.proxy.tokens import CountError, TokenCounter

# Hypothesis budgets: enough generated conversations to cover tools, tool calls, unicode, code and
# growth, few enough that the file runs in well under a minute on two shared cores.
CONVERSATIONS = 40
GROWTH_CONVERSATIONS = 12
SMALL_VOCAB_CONVERSATIONS = 20

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def qwen(qwen_dir: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)


@pytest.fixture(scope="module")
def unverified(qwen: PreTrainedTokenizerBase) -> TokenCounter:
    """A counter that never falls back on a full encode, so every count it returns is the fast path's."""
    return TokenCounter(qwen, verify_first=0, verify_every=0)


def reference(
    tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]], tools: Any = None, **kw: Any
) -> int:
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False, **kw)
    return len(tok.encode(text, add_special_tokens=False))


# --- generated conversations --------------------------------------------------------------------

SNIPPETS = [
    "<think>",
    "</think>",
    "<|im_end|>",
    "<tool_call>",
    "\n\n",
    "```python\n",
    "   ",
    "e\u0301",
    "🤖",
    "\r\n",
]
CODE = Path(json.__file__).with_name("decoder.py").read_text()

texts = st.lists(
    st.one_of(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
        st.sampled_from(SNIPPETS),
        st.integers(0, len(CODE)).flatmap(lambda a: st.integers(0, 3000).map(lambda n: CODE[a : a + n])),
    ),
    max_size=6,
).map("".join)
names = st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
arguments = st.dictionaries(
    names, st.one_of(st.integers(), texts, st.lists(st.integers(), max_size=3)), max_size=3
)
tools = st.lists(
    st.builds(
        lambda name, doc, props: {
            "type": "function",
            "function": {
                "name": name,
                "description": doc,
                "parameters": {"type": "object", "properties": props},
            },
        },
        names,
        texts,
        st.dictionaries(names, st.just({"type": "string"}), max_size=3),
    ),
    max_size=3,
)


@st.composite
def turns(draw: st.DrawFn) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(as the backend renders it, as a client sends it) pairs: a client may send tool-call arguments
    as a JSON string, text as a list of parts, and None for the content of a tool-calling turn."""
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if draw(st.booleans()):
        text = draw(texts)
        pairs.append(({"role": "system", "content": text}, {"role": "system", "content": text}))
    for _ in range(draw(st.integers(1, 4))):
        words = draw(st.lists(texts, min_size=1, max_size=3))
        sent: Any = [{"type": "text", "text": w} for w in words] if draw(st.booleans()) else " ".join(words)
        pairs.append(({"role": "user", "content": " ".join(words)}, {"role": "user", "content": sent}))
        calls = draw(st.lists(st.tuples(names, arguments), max_size=2))
        text = draw(texts)
        rendered: dict[str, Any] = {"role": "assistant", "content": text}
        client: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            as_string = draw(st.booleans())
            rendered["tool_calls"] = [
                {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
            ]
            client["tool_calls"] = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": n, "arguments": json.dumps(a) if as_string else a},
                }
                for i, (n, a) in enumerate(calls)
            ]
        pairs.append((rendered, client))
        for _ in calls:
            result = draw(texts)
            pairs.append(
                (
                    {"role": "tool", "content": result},
                    {"role": "tool", "content": result, "tool_call_id": "c0"},
                )
            )
    return pairs


@settings(max_examples=CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=turns(), tool_list=tools)
def test_chat_count_equals_a_full_encode(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter, conversation: list[Any], tool_list: list[Any]
) -> None:
    rendered = [r for r, _ in conversation]
    body = {"model": "m", "messages": [c for _, c in conversation], "tools": tool_list}
    assert unverified.count(dialects.named("chat"), body) == reference(qwen, rendered, tool_list or None)


@settings(max_examples=GROWTH_CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=turns(), tool_list=tools)
def test_growing_conversation_counts_each_turn_exactly(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter, conversation: list[Any], tool_list: list[Any]
) -> None:
    hits_before = unverified.stats.cache_hits
    for end in range(1, len(conversation) + 1):
        body = {"model": "m", "messages": [c for _, c in conversation[:end]], "tools": tool_list}
        want = reference(qwen, [r for r, _ in conversation[:end]], tool_list or None)
        assert unverified.count(dialects.named("chat"), body) == want
    if len(conversation) > 1:
        assert unverified.stats.cache_hits > hits_before, "later turns reuse the earlier turns' segments"
    assert (unverified.stats.mismatches, unverified.stats.fast_path) == (0, True)


def test_qwen_counts_through_tiktoken(unverified: TokenCounter) -> None:
    stats = unverified.stats
    assert (stats.encoder, stats.fast_path) == ("tiktoken", True)


# --- normalisation the backends do --------------------------------------------------------------


def test_template_kwargs_configured_and_per_request(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    thinking_off = reference(qwen, messages, enable_thinking=False)
    assert thinking_off == reference(qwen, messages) + len(qwen.encode("<think>\n\n</think>\n\n"))
    body = {"messages": messages}
    configured = TokenCounter(qwen, {"enable_thinking": False}, verify_first=0)
    assert configured.count(dialects.named("chat"), body) == thinking_off
    asked = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    assert unverified.count(dialects.named("chat"), asked) == thinking_off
    # AReaL drops the request's chat_template_kwargs, so against it only the configured ones count.
    areal = TokenCounter(qwen, request_template_kwargs=False, verify_first=0)
    assert areal.count(dialects.named("chat"), asked) == reference(qwen, messages)


def test_request_kwargs_cannot_change_how_the_prompt_is_tokenized(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tokenize": True}}
    assert unverified.count(dialects.named("chat"), body) == reference(qwen, body["messages"])


def test_tool_call_arguments_that_are_not_a_json_object_stay_text(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "not json"}}
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    assert unverified.count(dialects.named("chat"), {"messages": messages}) == reference(qwen, messages)


def test_chat_as_areal_validates_it(qwen: PreTrainedTokenizerBase, unverified: TokenCounter) -> None:
    # AReaL's proxy validates the body against the openai SDK's types with pydantic: fields they do
    # not declare are dropped and tool definitions take their key order. The reference runs that
    # very validation.
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
            {
                "role": "assistant",
                "content": "done",
                "reasoning_content": "thought about it",
                "tool_calls": [
                    {"type": "function", "id": "1", "function": {"name": "f", "arguments": '{"a": 1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": "42", "name": "f"},
            {"role": "user", "content": "and?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"parameters": {"type": "object"}, "strict": True, "name": "f", "x-extra": 1},
            }
        ],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    # The messages come back as a lazy iterator that needs its adapter alive while it is read.
    adapter = TypeAdapter(CompletionCreateParams)
    validated = adapter.validate_python(body)
    messages = [dict(m) for m in validated["messages"]]
    messages[1]["tool_calls"] = [
        {**call, "function": {**call["function"], "arguments": json.loads(call["function"]["arguments"])}}
        for call in messages[1]["tool_calls"]
    ]
    tool_list = list(validated["tools"])
    assert "chat_template_kwargs" not in validated and "reasoning_content" not in messages[1]
    typed = TokenCounter(qwen, request_template_kwargs=False, openai_typed_chat=True, verify_first=0)
    assert typed.count(dialects.named("chat"), body) == reference(qwen, messages, tool_list)
    assert unverified.count(dialects.named("chat"), body) != reference(qwen, messages, tool_list)


def test_responses_input_and_instructions_as_areal_converts_them(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "one"}, {"type": "input_text", "text": "two"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok", "annotations": None}],
            },
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
        "max_output_tokens": 10,
    }
    # areal/experimental/openai/client.py: instructions become the system message, every text part
    # its own message, a function_call_output a tool message.
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    counter = unverified
    assert counter.count(dialects.named("responses"), body) == reference(qwen, expected)
    plain = {"model": "m", "input": "hello"}
    assert counter.count(dialects.named("responses"), plain) == reference(
        qwen, [{"role": "user", "content": "hello"}]
    )


# A Claude Code turn (docs/agents.md §4.3: system blocks with cache_control, system
# entries inside `messages`, thinking, tool_use and tool_result, a tool with defer_loading).
CLAUDE_CODE_TURN: dict[str, Any] = {
    "max_tokens": 32000,
    "system": [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.332.31a; cc_entrypoint=sdk-cli;",
        },
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is 6*7? Use Bash."}]},
        {"role": "system", "content": [{"type": "text", "text": "<env>cwd: /proj</env>"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use bash.", "signature": "sig"},
                {"type": "text", "text": "Running it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "echo $((6*7))"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "42",
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
        {"role": "system", "content": []},
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command",
            "input_schema": {"type": "object", "required": ["command"]},
        },
        {
            "name": "DeferredToolPlaceholder",
            "description": "deferred",
            "input_schema": {"type": "object"},
            "defer_loading": True,
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "stream": True,
}
# What LiteLLM 1.104.9's AnthropicAdapter and AReaL's `_flatten_content_lists` make of it, as produced
# by running them (docs/areal.md §1.1.8), tool-call arguments parsed as AReaL does (§4.2).
CONVERTED_SYSTEM = "\n".join(block["text"] for block in CLAUDE_CODE_TURN["system"])
NOTE = (
    "Operator note (not from the user): the following was originally a mid-conversation system-role reminder."
)
CONVERTED_ASSISTANT = {
    "role": "assistant",
    "content": "Running it.",
    "thinking_blocks": [{"type": "thinking", "thinking": "Use bash.", "signature": "sig"}],
    "tool_calls": [
        {
            "id": "toolu_1",
            "type": "function",
            "function": {"name": "Bash", "arguments": {"command": "echo $((6*7))"}},
        }
    ],
    "reasoning_content": "Use bash.",
}
CONVERTED_RESULT = {
    "role": "tool",
    "tool_call_id": "toolu_1",
    "content": "42",
    "cache_control": {"type": "ephemeral"},
}
CONVERTED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "parameters": {"type": "object", "required": ["command"]},
            "description": "Run a command",
        },
    },
    {
        "type": "function",
        "function": {
            "name": "DeferredToolPlaceholder",
            "parameters": {"type": "object", "defer_loading": True},
            "description": "deferred",
        },
        "cache_control": {"type": "ephemeral"},
    },
]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # LiteLLM's model map does not flag this model for mid-conversation system messages: they
        # become user messages opened by a note, and the empty one a bare note.
        (
            "claude-sonnet-4-5",
            [
                {"role": "system", "content": CONVERTED_SYSTEM},
                {"role": "user", "content": "What is 6*7? Use Bash."},
                {"role": "user", "content": f"{NOTE}\n<env>cwd: /proj</env>"},
                CONVERTED_ASSISTANT,
                CONVERTED_RESULT,
                {"role": "user", "content": "Thanks"},
                {"role": "user", "content": NOTE},
            ],
        ),
        # Claude Code's default model is flagged: system messages stay, the empty one is dropped.
        (
            "claude-opus-5-5",
            [
                {"role": "system", "content": CONVERTED_SYSTEM},
                {"role": "user", "content": "What is 6*7? Use Bash."},
                {"role": "system", "content": "<env>cwd: /proj</env>"},
                CONVERTED_ASSISTANT,
                CONVERTED_RESULT,
                {"role": "user", "content": "Thanks"},
            ],
        ),
    ],
)
def test_anthropic_request_converted_as_areal_converts_it(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter, model: str, expected: list[dict[str, Any]]
) -> None:
    body = {**CLAUDE_CODE_TURN, "model": model}
    counter = unverified
    want = reference(qwen, expected, CONVERTED_TOOLS)
    assert counter.count(dialects.named("messages"), body) == want
    assert (
        counter.count(dialects.named("count_tokens"), {k: v for k, v in body.items() if k != "max_tokens"})
        == want
    )


def test_anthropic_text_blocks_and_long_tool_names(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    name = "t" * 70
    body = {
        "model": "policy",
        "system": "sys",
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "x",
                        "content": [{"type": "text", "text": "1"}, "2"],
                    }
                ],
            },
        ],
        "tools": [
            {"name": name, "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
    }
    # LiteLLM joins assistant text blocks with "", AReaL joins a tool result's parts with "\n", tool
    # names longer than 64 characters become 55 characters, "_" and 8 hex digits of their sha256,
    # and the web search tool becomes web_search_options rather than a tool.
    expected = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ab"},
        {"role": "tool", "tool_call_id": "x", "content": "1\n2"},
    ]
    short = "t" * 55 + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    converted = [{"type": "function", "function": {"name": short, "parameters": {"type": "object"}}}]
    assert unverified.count(dialects.named("messages"), body) == reference(qwen, expected, converted)


def test_list_content_for_a_template_that_iterates_over_parts(tmp_path: Path) -> None:
    # Such templates get the parts themselves (SGLang's and vLLM's content-format detection).
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% for part in m.content %}[{{ part.text }}]"
        "{% endfor %}<|im_end|>{% endfor %}<|im_start|>assistant\n"
    )
    tok = _write(tmp_path, _byte_level(), template)
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    body = {"messages": [{"role": "user", "content": parts}]}
    assert TokenCounter(tok).count(dialects.named("chat"), body) == reference(tok, body["messages"])


# --- completions, errors, loading ---------------------------------------------------------------


def test_completions_prompt_text_ids_and_batches(
    qwen: PreTrainedTokenizerBase, unverified: TokenCounter
) -> None:
    text = "def f(x):\n    return x  # <|im_end|>"
    assert unverified.count(dialects.named("completions"), {"prompt": text}) == len(qwen.encode(text))
    assert unverified.count(dialects.named("completions"), {"prompt": [1, 2, 3]}) == 3
    batch = {"prompt": ["short", text, [5] * 40]}
    assert unverified.count(dialects.named("completions"), batch) == 40


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (dialects.named("chat"), {"messages": "hello"}),
        (dialects.named("chat"), {"messages": []}),
        (dialects.named("chat"), {}),
        (dialects.named("responses"), {"input": 42}),
        (dialects.named("messages"), {"messages": [{"role": "user", "content": ["not a block"]}]}),
        (dialects.named("completions"), {"prompt": None}),
    ],
)
def test_bodies_that_cannot_be_rendered(
    unverified: TokenCounter, endpoint: Dialect, body: dict[str, Any]
) -> None:
    with pytest.raises(CountError):
        unverified.count(endpoint, body)


def test_load_never_downloads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never downloads"):
        TokenCounter.load(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="never downloads"):
        TokenCounter.load("no-such-org/no-such-model")


def test_load_finds_the_qwen_folder_and_its_template(qwen_dir: str) -> None:
    counter = TokenCounter.load(qwen_dir, {"enable_thinking": False})
    assert counter.count(dialects.named("chat"), {"messages": [{"role": "user", "content": "hi"}]}) > 0


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    tok = _write(tmp_path, _byte_level(), None)
    with pytest.raises(ValueError, match="chat template"):
        TokenCounter(tok)


# --- other vocabularies, the cache bound, and the safety net ------------------------------------


def _byte_level(
    merges: Sequence[tuple[str, str]] = (),
    extra: tuple[str, ...] = (),
    normalizer: Any = None,
) -> Tokenizer:
    """A GPT-2-style byte-level BPE: the 256 byte symbols, then each merge's result, then `extra`
    tokens that no merge produces."""
    symbols = list(tokens._bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(symbols)}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    for token in extra:
        vocab[token] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return tok


def _trained() -> Tokenizer:
    """A byte-level BPE vocabulary trained here on Python source, so its merges are its own."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.train_from_iterator([CODE, Path(os.__file__).read_text()], trainer)
    return tok


def _write(path: Path, tok: Tokenizer, template: str | None) -> PreTrainedTokenizerBase:
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(path)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    return _write(tmp_path_factory.mktemp("trained"), _trained(), CHATML_TEMPLATE)


@settings(max_examples=SMALL_VOCAB_CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=turns())
def test_a_second_byte_level_vocabulary_through_tiktoken(
    trained: PreTrainedTokenizerBase, conversation: list[Any]
) -> None:
    counter = TokenCounter(trained, verify_first=0, verify_every=0)
    assert counter.stats.encoder == "tiktoken"
    messages = [{"role": r["role"], "content": r["content"]} for r, _ in conversation]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(trained, messages)


def test_hf_encoder_where_tiktoken_cannot_reproduce_the_ids(tmp_path: Path) -> None:
    # A lowercasing normaliser is not one tiktoken applies: the segment cache encodes with the HF tokenizer.
    tok = _write(tmp_path, _byte_level([("h", "e")], normalizer=normalizers.Lowercase()), CHATML_TEMPLATE)
    counter = TokenCounter(tok, verify_first=0, verify_every=0)
    assert (counter.stats.encoder, counter.stats.fast_path) == ("huggingface", True)
    messages = [{"role": "user", "content": "HELLO <|im_end|> Hé"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(tok, messages)


def test_full_encode_where_pieces_do_not_encode_alone(tmp_path: Path) -> None:
    # Metaspace prefixes the first piece only, so pieces between added tokens are not independent.
    tok = _byte_level()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    hf = _write(tmp_path, tok, CHATML_TEMPLATE)
    counter = TokenCounter(hf, verify_first=0, verify_every=0)
    assert not counter.stats.fast_path
    messages = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(hf, messages)


def test_a_mismatch_turns_the_fast_path_off_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # "xyz" is in the vocabulary but no merge makes it: the HF BPE spells it x, y, z while tiktoken,
    # which takes any whole piece found in the vocabulary, returns one token. The probe text at load
    # does not contain it, so only the check against a full encode can notice.
    tok = _write(tmp_path, _byte_level([("h", "e")], extra=("xyz",)), CHATML_TEMPLATE)
    counter = TokenCounter(tok, verify_first=1, verify_every=0)
    assert counter.stats.encoder == "tiktoken"
    messages = [{"role": "user", "content": "xyz"}]
    with caplog.at_level(logging.WARNING, logger="modeltap.proxy.tokens"):
        assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(tok, messages)
    assert "token count mismatch" in caplog.text
    assert (counter.stats.mismatches, counter.stats.fast_path) == (1, False)
    later = [{"role": "user", "content": "xyz xyz"}]
    assert counter.count(dialects.named("chat"), {"messages": later}) == reference(tok, later)


def test_verification_on_the_first_requests_then_a_sample(qwen: PreTrainedTokenizerBase) -> None:
    counter = TokenCounter(qwen, verify_first=2, verify_every=5)
    for i in range(11):
        counter.count(dialects.named("chat"), {"messages": [{"role": "user", "content": f"turn {i}"}]})
    # requests 1 and 2, then 5 and 10
    assert (counter.stats.verifications, counter.stats.mismatches) == (4, 0)


def test_the_segment_cache_stays_within_its_bound(qwen: PreTrainedTokenizerBase) -> None:
    counter = TokenCounter(qwen, verify_first=0, verify_every=0, cache_max_chars=2_000)
    messages: list[dict[str, Any]] = []
    for i in range(30):
        messages.append(
            {"role": "user" if i % 2 == 0 else "assistant", "content": CODE[i * 300 : i * 300 + 400]}
        )
        assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(qwen, messages)
        assert counter.stats.cached_chars <= 2_000
