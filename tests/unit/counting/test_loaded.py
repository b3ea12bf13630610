"""modeltap/counting/loaded.py: a folder, or a model name in the local Hugging Face cache, loaded
once per process, and pieces counted apart only where the tokenizer allows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from modeltap import dialects
from modeltap.counting.counter import TokenCounter
from modeltap.counting.loaded import LoadedTokenizer, SharedTokenizers, resolve
from tests.factories import qwen_folder

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_model_name_in_the_local_hub_cache_loads_as_transformers_finds_it(
    qwen_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub cache's layout: models--ORG--NAME/refs/main names the snapshot holding the files.
    repo = tmp_path / "hub" / "models--someorg--tiny-qwen"
    snapshot = qwen_folder(repo / "snapshots" / "0123abc", qwen_dir, {"chat_template": CHATML_TEMPLATE})
    # AutoTokenizer reads the model's config.json first; modeltap needs only the tokenizer files.
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    qwen_folder(repo / "snapshots" / "older", qwen_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    # huggingface_hub read HF_HUB_CACHE when it was imported: the oracle is told the folder instead.
    oracle = AutoTokenizer.from_pretrained(
        "someorg/tiny-qwen", local_files_only=True, cache_dir=tmp_path / "hub"
    )
    counter = TokenCounter.load("someorg/tiny-qwen", verify_first=0)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    text = oracle.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert counter.count(dialects.named("chat"), {"messages": messages}) == len(
        oracle.encode(text, add_special_tokens=False)
    )
    assert counter.tokenizer.folder == snapshot.resolve()


def test_counters_of_one_process_share_a_loaded_folder(qwen_dir: str) -> None:
    first = TokenCounter.load(qwen_dir, {"enable_thinking": False})
    second = TokenCounter.load(Path(qwen_dir) / ".." / Path(qwen_dir).name, openai_typed_chat=True)
    assert first.tokenizer is second.tokenizer
    assert TokenCounter.load(qwen_dir, cache_max_chars=1_000).tokenizer is not first.tokenizer


def test_the_shared_tokenizers_are_bounded(qwen_dir: str, tmp_path: Path) -> None:
    shared = SharedTokenizers(max_entries=2)
    folders = [qwen_folder(tmp_path / name, qwen_dir) for name in ("a", "b", "c")]
    loaded = [shared.get(folder, 1_000) for folder in folders]
    assert shared.get(folders[2], 1_000) is loaded[2]
    assert shared.get(folders[0], 1_000) is not loaded[0], "the least recently used folder was dropped"
    (folders[2] / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert shared.get(folders[2], 1_000) is not loaded[2], "a changed folder is loaded anew"


def test_a_name_or_folder_modeltap_cannot_find_is_refused_without_a_download(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never downloads"):
        resolve(tmp_path / "missing")
    with pytest.raises(ValueError, match="never downloads"):
        resolve("no-such-org/no-such-model")


@pytest.mark.parametrize(
    ("flags", "pieces"),
    [
        ({}, True),
        ({"lstrip": True}, False),  # the token eats the whitespace before it: pieces are not apart
        ({"single_word": True}, False),
    ],
)
def test_pieces_are_counted_apart_only_where_the_added_tokens_allow_it(
    qwen_dir: str, tmp_path: Path, flags: dict[str, bool], pieces: bool
) -> None:
    config = json.loads(Path(qwen_dir, "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    decoder["151644"] = {**decoder["151644"], **flags}  # <|im_start|>
    loaded = LoadedTokenizer.load(qwen_folder(tmp_path / "t", qwen_dir, {"added_tokens_decoder": decoder}))
    assert (loaded.segments is not None) is pieces


def test_added_and_special_tokens_are_the_tokenizers_own(qwen_dir: str) -> None:
    loaded = LoadedTokenizer.load(Path(qwen_dir))
    oracle = AutoTokenizer.from_pretrained(qwen_dir)
    decoder = oracle.added_tokens_decoder
    assert dict(loaded.added_ids) == {token.content: index for index, token in decoder.items()}
    # The engines leave these out of a reply's text (skip_special_tokens): <|im_end|>, not <think>.
    assert loaded.special_tokens == {token.content for token in decoder.values() if token.special}
    assert "<|im_end|>" in loaded.special_tokens and "<think>" not in loaded.special_tokens


@pytest.fixture(scope="module")
def loaded_and_oracle(qwen_dir: str) -> tuple[LoadedTokenizer, Any]:
    """The folder as modeltap loads it, and as transformers does (the oracle)."""
    return LoadedTokenizer.load(Path(qwen_dir)), AutoTokenizer.from_pretrained(qwen_dir)


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60) | st.lists(
    st.sampled_from(["<think>", "</think>", "<tool_call>", "<|im_end|>", "\n", " x", "é", "中文", "  "])
).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=TEXT)
@example(text="\uf900")  # a compatibility ideograph: the tokenizer encodes its NFC form, U+8C48
def test_ids_and_their_bytes_are_the_tokenizers(
    loaded_and_oracle: tuple[LoadedTokenizer, Any], text: str
) -> None:
    loaded, oracle = loaded_and_oracle
    ids = loaded.encode_ids(text)
    assert ids == oracle.encode(text, add_special_tokens=False)
    assert loaded.token_bytes is not None
    # The ids are of the text as the tokenizer's normalizer left it (Qwen3's: NFC).
    normalizer = oracle.backend_tokenizer.normalizer
    said = normalizer.normalize_str(text) if normalizer is not None else text
    assert b"".join(loaded.token_bytes(i) for i in ids) == said.encode()
