"""modeltap/counting/counter.py: the count equals transformers' full encode of the prompt the backend renders,
for every request of a growing conversation, whether it is counted from what a turn adds or in full.

The reference in every test is `len(tok.encode(tok.apply_chat_template(messages, tools=...,
add_generation_prompt=True, tokenize=False), add_special_tokens=False))` over messages written in the
form the backend hands its template, never over modeltap's own normalisation. transformers is the
oracle only: the counter never imports it.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import jinja2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat.completion_create_params import CompletionCreateParams
from pydantic import TypeAdapter
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from modeltap import dialects
from modeltap.compat import preparations, prompts
from modeltap.counting import counter as counter_module
from modeltap.counting.counter import CountError, TokenCounter
from modeltap.counting.segments import Segments
from modeltap.dialects.roles import Dialect
from tests import conversations as chat_shapes
from tests.factories import byte_level_tokenizer, qwen_folder

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
def unverified(qwen_dir: str) -> TokenCounter:
    """A counter that never falls back on a full encode, so every count it returns is the fast path's."""
    return TokenCounter.load(qwen_dir, verify_first=0, verify_every=0)


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
        assert unverified.stats.cache_hits > hits_before, "later turns reuse the earlier turns' pieces"
    assert (unverified.stats.mismatches, unverified.stats.fast_path) == (0, True)


def test_qwen_counts_through_tiktoken(unverified: TokenCounter) -> None:
    stats = unverified.stats
    assert (stats.encoder, stats.fast_path, stats.incremental) == ("tiktoken", True, True)


# --- normalisation the backends do --------------------------------------------------------------


def test_template_kwargs_configured_and_per_request(
    qwen: PreTrainedTokenizerBase, qwen_dir: str, unverified: TokenCounter
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    thinking_off = reference(qwen, messages, enable_thinking=False)
    assert thinking_off == reference(qwen, messages) + len(qwen.encode("<think>\n\n</think>\n\n"))
    body = {"messages": messages}
    configured = TokenCounter.load(qwen_dir, {"enable_thinking": False}, verify_first=0)
    assert configured.count(dialects.named("chat"), body) == thinking_off
    asked = {**body, "chat_template_kwargs": {"enable_thinking": False}}
    assert unverified.count(dialects.named("chat"), asked) == thinking_off
    # AReaL drops the request's chat_template_kwargs, so against it only the configured ones count.
    areal = TokenCounter.load(qwen_dir, request_template_kwargs=False, verify_first=0)
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


def test_chat_as_areal_validates_it(
    qwen: PreTrainedTokenizerBase, qwen_dir: str, unverified: TokenCounter
) -> None:
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
    typed = TokenCounter.load(qwen_dir, request_template_kwargs=False, openai_typed_chat=True, verify_first=0)
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
    tok = _write(tmp_path, byte_level_tokenizer(), template)
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    body = {"messages": [{"role": "user", "content": parts}]}
    assert TokenCounter.load(tmp_path).count(dialects.named("chat"), body) == reference(tok, body["messages"])


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


def test_load_finds_the_qwen_folder_and_its_template(qwen_dir: str) -> None:
    counter = TokenCounter.load(qwen_dir, {"enable_thinking": False})
    assert counter.count(dialects.named("chat"), {"messages": [{"role": "user", "content": "hi"}]}) > 0


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, byte_level_tokenizer(), None)
    with pytest.raises(ValueError, match="no chat template"):
        TokenCounter.load(tmp_path)


# --- other vocabularies, the cache bound, and the safety net ------------------------------------


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
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trained")
    _write(path, _trained(), CHATML_TEMPLATE)
    return path


@pytest.fixture(scope="module")
def trained(trained_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(trained_dir), local_files_only=True)


@settings(max_examples=SMALL_VOCAB_CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=turns())
def test_a_second_byte_level_vocabulary_through_tiktoken(
    trained: PreTrainedTokenizerBase, trained_dir: Path, conversation: list[Any]
) -> None:
    counter = TokenCounter.load(trained_dir, verify_first=0, verify_every=0)
    assert counter.stats.encoder == "tiktoken"
    messages = [{"role": r["role"], "content": r["content"]} for r, _ in conversation]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(trained, messages)


def test_the_tokenizers_library_where_tiktoken_cannot_reproduce_the_ids(tmp_path: Path) -> None:
    # A lowercasing normaliser is not one tiktoken applies: the pieces are encoded by tokenizers.
    lowercasing = byte_level_tokenizer([("h", "e")])
    lowercasing.normalizer = normalizers.Lowercase()
    tok = _write(tmp_path, lowercasing, CHATML_TEMPLATE)
    counter = TokenCounter.load(tmp_path, verify_first=0, verify_every=0)
    assert (counter.stats.encoder, counter.stats.fast_path) == ("tokenizers", True)
    messages = [{"role": "user", "content": "HELLO <|im_end|> Hé"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(tok, messages)


def test_tiktoken_only_where_its_ids_are_proven_equal(tmp_path: Path) -> None:
    # "xyz" is in the vocabulary but no merge makes it: tokenizers spells it x, y, z while tiktoken,
    # which takes any whole piece found in the vocabulary, would return one token. The proof at load
    # (bpe.py) sees it without any text containing it.
    tok = _write(tmp_path, byte_level_tokenizer([("h", "e")], extra=("xyz",)), CHATML_TEMPLATE)
    counter = TokenCounter.load(tmp_path, verify_first=0, verify_every=0)
    assert counter.stats.encoder == "tokenizers"
    messages = [{"role": "user", "content": "xyz xyz"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(tok, messages)


def test_full_encode_where_pieces_do_not_encode_alone(tmp_path: Path) -> None:
    # Metaspace prefixes the first piece only, so pieces between added tokens are not independent.
    tok = byte_level_tokenizer()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    hf = _write(tmp_path, tok, CHATML_TEMPLATE)
    counter = TokenCounter.load(tmp_path, verify_first=0, verify_every=0)
    assert (counter.stats.fast_path, counter.stats.incremental) == (False, False)
    messages = [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(hf, messages)


def test_split_special_tokens_turns_the_pieces_off(qwen_dir: str, tmp_path: Path) -> None:
    # With split_special_tokens, <|im_start|> in a message is text: the pieces would split it out.
    folder = qwen_folder(tmp_path / "split", qwen_dir, {"split_special_tokens": True})
    oracle = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    counter = TokenCounter.load(folder, verify_first=0, verify_every=0)
    assert (counter.stats.fast_path, counter.stats.incremental) == (False, False)
    messages = [{"role": "user", "content": "say <|im_end|> and <|im_start|>"}]
    assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(oracle, messages)


def test_a_piece_mismatch_turns_the_fast_paths_off_and_says_so(
    qwen: PreTrainedTokenizerBase, qwen_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A piece encoder that overcounts, as a vocabulary the load checks missed would: the first
    # request's check against a full encode notices, answers the true count and stops using pieces.
    loaded = TokenCounter.load(qwen_dir).tokenizer
    added = [token for token in ("<|im_start|>", "<|im_end|>")]
    wrong = Segments(added, lambda piece: [0] * (len(piece) + 1), cache_max_chars=1_000)
    counter = TokenCounter(dataclasses.replace(loaded, segments=wrong), verify_first=1, verify_every=0)
    messages = [{"role": "user", "content": "hello"}]
    with caplog.at_level(logging.WARNING, logger="modeltap.counting.counter"):
        assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(qwen, messages)
    assert "the tiktoken segment cache counted" in caplog.text
    stats = counter.stats
    assert (stats.mismatches, stats.fast_path, stats.incremental) == (1, False, False)
    later = [*messages, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert counter.count(dialects.named("chat"), {"messages": later}) == reference(qwen, later)


def test_verification_on_the_first_requests_then_a_sample(qwen_dir: str) -> None:
    counter = TokenCounter.load(qwen_dir, verify_first=2, verify_every=5)
    for i in range(12):
        counter.count(dialects.named("chat"), {"messages": [{"role": "user", "content": f"turn {i}"}]})
    # requests 1 and 2, then every fifth: 7 and 12
    assert (counter.stats.verifications, counter.stats.mismatches) == (4, 0)


def test_long_prompts_are_checked_less_often(qwen_dir: str) -> None:
    # A check costs what the whole prompt does: above VERIFY_SCALE_TOKENS the interval stretches with
    # the prompt, so that the checks' share of counting stays the same as a history grows.
    assert counter_module.check_interval(1_000, 128) == 128
    assert counter_module.check_interval(4 * counter_module.VERIFY_SCALE_TOKENS, 128) == 512
    counter = TokenCounter.load(qwen_dir, verify_first=0, verify_every=2)
    long = {"messages": [{"role": "user", "content": "word " * 3 * counter_module.VERIFY_SCALE_TOKENS}]}
    for _ in range(11):
        counter.count(dialects.named("chat"), long)
    assert counter.stats.verifications == 1, "one in 2 x 3: the sixth"


def test_the_segment_cache_stays_within_its_bound(qwen: PreTrainedTokenizerBase, qwen_dir: str) -> None:
    counter = TokenCounter.load(qwen_dir, verify_first=0, verify_every=0, cache_max_chars=2_000)
    messages: list[dict[str, Any]] = []
    for i in range(30):
        messages.append(
            {"role": "user" if i % 2 == 0 else "assistant", "content": CODE[i * 300 : i * 300 + 400]}
        )
        assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(qwen, messages)
        assert counter.stats.cached_chars <= 2_000


def test_conversations_stay_within_their_bound(qwen: PreTrainedTokenizerBase, qwen_dir: str) -> None:
    counter = TokenCounter.load(qwen_dir, verify_first=0, verify_every=0, conversations_max_chars=5_000)
    first: list[dict[str, Any]] = [{"role": "user", "content": "first task"}]
    second: list[dict[str, Any]] = [{"role": "user", "content": "second task"}]
    for i in range(8):
        for messages in (first, second):
            messages += [{"role": "assistant", "content": CODE[i * 500 : i * 500 + 400]}]
            assert counter.count(dialects.named("chat"), {"messages": messages}) == reference(qwen, messages)
    # Each conversation outgrew half the budget: the one counted last is kept, the older one evicted.
    assert counter.stats.conversations == 1


# --- growing conversations: counted from what each turn adds, exactly --------------------------

# A Qwen3-style template written here: an assistant turn after the last user message shows its
# reasoning, one before it does not, so a new user turn rewrites the earlier turns.
QWEN3_STYLE_TEMPLATE = """{%- set ns = namespace(last_query=-1) %}
{%- for m in messages %}{% if m.role == "user" %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}
{%- if tools %}<|im_start|>system
{% if messages[0].role == "system" %}{{ messages[0].content }}

{% endif %}# Tools
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% elif messages[0].role == "system" %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "system" and loop.first %}
{%- elif m.role == "assistant" %}<|im_start|>assistant
{% if loop.index0 > ns.last_query and m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}{% for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""


@pytest.fixture(scope="module")
def qwen3_style_dir(qwen_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen_folder(
        tmp_path_factory.mktemp("qwen3_style") / "t", qwen_dir, {"chat_template": QWEN3_STYLE_TEMPLATE}
    )


@pytest.fixture(scope="module")
def qwen3_style(qwen3_style_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(qwen3_style_dir), local_files_only=True)


class Conversation:
    """A conversation as the client sends it and as the backend renders it, grown step by step."""

    def __init__(self, tool_list: list[Any]) -> None:
        self.sent: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
        self.rendered: list[dict[str, Any]] = [dict(self.sent[0])]
        self.tools = tool_list

    def add(self, rendered: dict[str, Any], sent: dict[str, Any] | None = None) -> None:
        self.rendered.append(rendered)
        self.sent.append(sent if sent is not None else dict(rendered))

    def body(self) -> dict[str, Any]:
        return {"model": "m", "messages": list(self.sent), "tools": self.tools}


def _call(n: int, as_string: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    arguments = {"path": f"src/f{n}.py"}
    rendered = {"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": arguments}}
    sent = {
        **rendered,
        "function": {"name": "read", "arguments": json.dumps(arguments) if as_string else arguments},
    }
    return rendered, sent


def _agent_turn(conversation: Conversation, n: int, reasoning: str | None = None, calls: int = 1) -> None:
    """An assistant turn calling `calls` tools, and their results (source code)."""
    pairs = [_call(n * 10 + i, as_string=i % 2 == 0) for i in range(calls)]
    rendered: dict[str, Any] = {
        "role": "assistant",
        "content": f"Step {n}.",
        "tool_calls": [r for r, _ in pairs],
    }
    sent: dict[str, Any] = {**rendered, "tool_calls": [s for _, s in pairs]}
    if reasoning is not None:
        rendered["reasoning_content"] = sent["reasoning_content"] = reasoning
    conversation.add(rendered, sent)
    for i, (call, _) in enumerate(pairs):
        conversation.add(
            {"role": "tool", "tool_call_id": call["id"], "content": CODE[n * 700 + i : n * 700 + 900]}
        )


def _exact(counter: TokenCounter, oracle: PreTrainedTokenizerBase, conversation: Conversation) -> int:
    counted = counter.count(dialects.named("chat"), conversation.body())
    assert counted == reference(oracle, conversation.rendered, conversation.tools or None)
    return counted


TOOLS = [
    {
        "type": "function",
        "function": {"name": name, "description": f"{name} a file", "parameters": {"type": "object"}},
    }
    for name in ("read", "write")
]


def _start(folder: str | Path, oracle: PreTrainedTokenizerBase) -> tuple[TokenCounter, Conversation]:
    """A counter with no checks, and a conversation opened by a task (counted once)."""
    counter = TokenCounter.load(folder, verify_first=0, verify_every=0)
    conversation = Conversation(TOOLS)
    conversation.add({"role": "user", "content": "Fix the failing test."})
    _exact(counter, oracle, conversation)
    return counter, conversation


def _turns(
    counter: TokenCounter,
    oracle: PreTrainedTokenizerBase,
    conversation: Conversation,
    steps: range,
    **turn: Any,
) -> None:
    """Agent turns numbered `steps`, each counted and checked."""
    for n in steps:
        _agent_turn(conversation, n, **turn)
        _exact(counter, oracle, conversation)


def test_an_agent_loop_is_counted_from_what_each_turn_adds(
    qwen: PreTrainedTokenizerBase, qwen_dir: str
) -> None:
    counter, conversation = _start(qwen_dir, qwen)
    for n in range(25):
        _turns(counter, qwen, conversation, range(n, n + 1), calls=1 + n % 3)
    assert counter.stats.extended == 25, "every turn after the first extends the conversation"
    assert counter.stats.conversations == 1


def test_requests_ending_on_the_assistant_are_counted_from_what_each_turn_adds(
    qwen: PreTrainedTokenizerBase, qwen_dir: str
) -> None:
    # A prefill (the agent starts the reply) and a replayed history (the last reply sent back): the
    # template renders the last assistant message apart, so what stays is the history before it.
    counter, conversation = _start(qwen_dir, qwen)
    for n in range(12):
        _agent_turn(conversation, n, calls=1)
        prefill = {"role": "assistant", "content": f"Step {n + 1}: next I"}
        counted = counter.count(
            dialects.named("chat"), {**conversation.body(), "messages": [*conversation.sent, prefill]}
        )
        assert counted == reference(qwen, [*conversation.rendered, prefill], conversation.tools)
    assert counter.stats.extended == 12, "every prefilled turn extends the conversation"
    replayed = Conversation(TOOLS)
    replayed.add({"role": "user", "content": "Fix the failing test."})
    for n in range(6):
        _agent_turn(replayed, n, calls=1)
        replayed.add({"role": "assistant", "content": f"Done with step {n}."})
        _exact(counter, qwen, replayed)
    assert counter.stats.extended == 12 + 5, "after its first, every replayed turn extends it too"


def test_reasoning_a_new_user_turn_strips_is_counted_in_full(
    qwen3_style: PreTrainedTokenizerBase, qwen3_style_dir: Path
) -> None:
    counter, conversation = _start(qwen3_style_dir, qwen3_style)
    _turns(counter, qwen3_style, conversation, range(4), reasoning="I should look at the file first.")
    assert counter.stats.extended == 4, "turns that keep the reasoning are counted from what they add"
    conversation.add({"role": "assistant", "content": "Fixed."})
    conversation.add({"role": "user", "content": "Now add a test."})
    _exact(counter, qwen3_style, conversation)
    assert counter.stats.extended == 4, "the new user turn rewrites the earlier turns: a full render"
    _turns(counter, qwen3_style, conversation, range(9, 10), reasoning="Where do the tests live?")
    assert counter.stats.extended == 5


def test_a_tools_list_that_changes_midway_is_counted_in_full(
    qwen: PreTrainedTokenizerBase, qwen_dir: str
) -> None:
    counter, conversation = _start(qwen_dir, qwen)
    _turns(counter, qwen, conversation, range(3))
    conversation.tools = [*TOOLS, {"type": "function", "function": {"name": "grep", "parameters": {}}}]
    _turns(counter, qwen, conversation, range(3, 4))
    conversation.tools = TOOLS[:1]
    _exact(counter, qwen, conversation)
    _turns(counter, qwen, conversation, range(4, 5))
    assert counter.stats.extended == 4, "turns 0-2 and 4 extend; the two tool changes render in full"


def test_an_edited_earlier_message_is_counted_in_full(qwen: PreTrainedTokenizerBase, qwen_dir: str) -> None:
    counter, conversation = _start(qwen_dir, qwen)
    _turns(counter, qwen, conversation, range(4))
    # A compaction: the history is replaced by a summary, then the agent carries on.
    summary = {"role": "user", "content": "Summary of the work so far: read four files."}
    conversation.rendered[2:], conversation.sent[2:] = [summary], [dict(summary)]
    _exact(counter, qwen, conversation)
    _turns(counter, qwen, conversation, range(5, 6))
    # An edit in place of the summary.
    conversation.rendered[2] = conversation.sent[2] = {"role": "user", "content": "A shorter summary."}
    _exact(counter, qwen, conversation)
    assert counter.stats.extended == 5, "turns 0-3 and the turn after the compaction extend"


def test_a_repeated_request_is_answered_from_its_conversation(
    qwen: PreTrainedTokenizerBase, qwen_dir: str
) -> None:
    counter, conversation = _start(qwen_dir, qwen)
    _turns(counter, qwen, conversation, range(1))
    assert _exact(counter, qwen, conversation) == _exact(counter, qwen, conversation)
    assert counter.stats.extended == 3


class _Message(dict[str, Any]):
    """A message a test can hold a weak reference to."""


def test_an_extension_keeps_the_earlier_messages_it_holds(
    qwen: PreTrainedTokenizerBase, qwen_dir: str
) -> None:
    """Each request is freshly parsed: the counter keeps the first copy of the history it saw, so a
    turn's count never frees the last request's copy of every earlier message."""
    counter, conversation = _start(qwen_dir, qwen)
    _turns(counter, qwen, conversation, range(2))

    def parsed() -> dict[str, Any]:
        body = json.loads(json.dumps(conversation.body()))
        body["messages"] = [_Message(m) for m in body["messages"]]
        return body

    known = len(conversation.sent)
    _agent_turn(conversation, 2)
    first = parsed()
    counter.count(dialects.named("chat"), first)
    _agent_turn(conversation, 3)
    second = parsed()
    held = [weakref.ref(m) for m in first["messages"][known:]]
    copies = [weakref.ref(m) for m in second["messages"][: len(first["messages"])]]
    assert counter.count(dialects.named("chat"), second) == _exact(counter, qwen, conversation)
    del first, second
    assert all(ref() is not None for ref in held), "the history the counter held stays"
    assert all(ref() is None for ref in copies), "the later copies go with their request"


@st.composite
def growth(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Steps of a conversation: agent turns (with or without reasoning), user turns, edits of an
    earlier message, compactions, tool lists changing, and repeated requests."""
    steps: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["turn", "turn", "turn", "user", "edit", "compact", "tools", "repeat"]))
        payload: Any = None
        if kind == "turn":
            payload = (draw(st.one_of(st.none(), texts)), draw(st.integers(0, 2)), draw(texts))
        elif kind in ("user", "edit"):
            payload = (draw(st.integers(0, 1_000)), draw(texts))
        elif kind == "tools":
            payload = draw(tools)
        steps.append((kind, payload))
    return steps


def _apply(conversation: Conversation, step: tuple[str, Any], n: int) -> None:
    kind, payload = step
    if kind == "turn":
        reasoning, calls, content = payload
        _agent_turn(conversation, n % 40, reasoning=reasoning or None, calls=calls)
        conversation.rendered[-1 - calls]["content"] = conversation.sent[-1 - calls]["content"] = content
    elif kind == "user":
        conversation.add({"role": "user", "content": payload[1]})
    elif kind == "edit" and len(conversation.sent) > 2:
        index = 1 + payload[0] % (len(conversation.sent) - 1)
        conversation.rendered[index] = {**conversation.rendered[index], "content": payload[1]}
        conversation.sent[index] = {**conversation.sent[index], "content": payload[1]}
    elif kind == "compact" and len(conversation.sent) > 3:
        summary = {"role": "user", "content": f"Summary {n}."}
        conversation.rendered[2:], conversation.sent[2:] = [summary], [dict(summary)]
    elif kind == "tools":
        conversation.tools = payload


@pytest.fixture(scope="module", params=["qwen", "qwen3_style"])
def template_under_test(request: pytest.FixtureRequest) -> tuple[PreTrainedTokenizerBase, Path]:
    """(oracle, folder): the Qwen3 folder, and the fixture template."""
    folder = request.getfixturevalue("qwen_dir" if request.param == "qwen" else "qwen3_style_dir")
    return request.getfixturevalue(request.param), Path(folder)


@settings(max_examples=GROWTH_CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=growth(), tool_list=tools)
def test_every_request_of_a_changing_conversation_counts_exactly(
    template_under_test: tuple[PreTrainedTokenizerBase, Path],
    steps: list[tuple[str, Any]],
    tool_list: list[Any],
) -> None:
    oracle, folder = template_under_test
    counter = TokenCounter.load(folder, verify_first=0, verify_every=0)
    conversation = Conversation(tool_list)
    conversation.add({"role": "user", "content": "Start."})
    _exact(counter, oracle, conversation)
    for n, step in enumerate(steps):
        _apply(conversation, step, n)
        _exact(counter, oracle, conversation)


def test_a_dependence_the_load_check_cannot_see_is_caught_by_verification(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # This template marks the 25th message: longer than any conversation the load check renders, so
    # windows (which never hold 25 messages) miss the mark. Only the check against a full render can
    # notice; it then answers the truth and renders every later request in full.
    template = CHATML_TEMPLATE.replace(
        "<|im_end|>\n{% endfor %}",
        "<|im_end|>\n{% if loop.index0 == 24 %}[checkpoint]\n{% endif %}{% endfor %}",
    )
    oracle = _write(tmp_path, byte_level_tokenizer(), template)
    checked = TokenCounter.load(tmp_path, verify_first=0, verify_every=1)
    unchecked = TokenCounter.load(tmp_path, verify_first=0, verify_every=0)
    messages: list[dict[str, Any]] = []
    with caplog.at_level(logging.WARNING, logger="modeltap.counting.counter"):
        for i in range(30):
            messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"})
            body = {"messages": list(messages)}
            assert checked.count(dialects.named("chat"), body) == reference(oracle, messages)
            if i == 24:
                assert unchecked.count(dialects.named("chat"), body) != reference(oracle, messages)
            else:
                unchecked.count(dialects.named("chat"), body)
    assert "counting only the new messages gave" in caplog.text
    stats = checked.stats
    assert (stats.mismatches, stats.incremental, stats.fast_path) == (1, False, True)


# --- as each engine prepares messages (docs/engines.md §7) ------------------------------------------

ENGINE_VECTORS = Path(__file__).parents[2] / "fixtures" / "engine_prep" / "vectors.json.gz"
RELEASES = preparations.RELEASES_READ


@pytest.fixture(scope="module")
def release_counters(qwen_dir: str) -> dict[str, TokenCounter]:
    """A counter per engine release, never checked by a full encode: every count is the fast path's."""
    return {
        name: TokenCounter.load(qwen_dir, preparation=prep, verify_first=0, verify_every=0)
        for name, prep in RELEASES.items()
    }


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_each_release_counts_the_prompt_its_own_preparation_renders(
    release_counters: dict[str, TokenCounter], release: str
) -> None:
    """The vectors' counts come from each release's own preparation code rendered by transformers
    (tests/fixtures/engine_prep): a request the release refuses, or whose prepared messages the
    template cannot render, is one modeltap cannot count."""
    with gzip.open(ENGINE_VECTORS, "rt", encoding="utf-8") as f:
        cases = json.load(f)
    counter = release_counters[release]
    counted = 0
    for case in cases:
        body = {
            "model": "m",
            "messages": case["messages"],
            **({"tools": case["tools"]} if case["tools"] else {}),
        }
        want = case["engines"][release].get("prompt_tokens")
        if want is None:
            with pytest.raises(CountError):
                counter.count(dialects.named("chat"), body)
            continue
        assert counter.count(dialects.named("chat"), body) == want, case["case"]
        counted += 1
    assert counted >= 20


@settings(max_examples=GROWTH_CONVERSATIONS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=chat_shapes.conversations())
def test_each_release_counts_a_conversation_ending_on_any_role_exactly(
    qwen: PreTrainedTokenizerBase,
    release_counters: dict[str, TokenCounter],
    conversation: tuple[list[dict[str, Any]], list[dict[str, Any]] | None],
) -> None:
    """Every prefix of a generated conversation, as each release prepares it, counted by windows as it
    grows: equal to transformers' render of the release's prepared messages, or refused by both."""
    messages, tool_list = conversation
    for release, prep in RELEASES.items():
        for body in chat_shapes.requests(messages, tool_list, "m"):
            try:
                prepared = prompts.prepare_conversation(
                    prep, body["messages"], string_content=True, names_developer=False
                )
                want: int | None = reference(qwen, prepared, prompts.prepare_tools(prep, tool_list))
            except (ValueError, TypeError, jinja2.TemplateError):
                want = None
            if want is None:
                with pytest.raises(CountError):
                    release_counters[release].count(dialects.named("chat"), body)
            else:
                assert release_counters[release].count(dialects.named("chat"), body) == want, release
    for counter in release_counters.values():
        assert (counter.stats.mismatches, counter.stats.incremental) == (0, True)
