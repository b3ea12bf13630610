"""modeltap/counting/bpe.py: tiktoken is used only where it gives the ids the tokenizers library gives.

Where the proof accepts a vocabulary, generated text encodes to the same ids both ways; where it
refuses one, a text is shown on which tiktoken would have given other ids.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from modeltap.counting import bpe
from tests.factories import byte_level_tokenizer

TEXTS = 150
CODE = Path(json.__file__).with_name("decoder.py").read_text()


def _save(path: Path, tok: Tokenizer) -> Path:
    file = path / "tokenizer.json"
    tok.save(str(file))
    return file


def _encoder(file: Path) -> bpe.Encoder | None:
    tok = Tokenizer.from_file(str(file))
    fast = bpe.exact_tiktoken(file, tok, [t.content for t in tok.get_added_tokens_decoder().values()])
    return fast.encode if fast is not None else None


@pytest.fixture(scope="module")
def qwen(qwen_dir: str) -> tuple[Tokenizer, bpe.Encoder]:
    file = Path(qwen_dir, "tokenizer.json")
    encoder = _encoder(file)
    assert encoder is not None, "Qwen3's vocabulary is proven"
    tok = Tokenizer.from_file(str(file))
    # The encoder gets the text between added tokens: the reference must not split them out either.
    tok.encode_special_tokens = True
    return tok, encoder


text = st.text(st.characters(exclude_categories=("Cs",)), max_size=80) | st.integers(0, len(CODE)).map(
    lambda start: CODE[start : start + 400]
)


@settings(max_examples=TEXTS, deadline=None)
@given(sample=text)
def test_qwen_through_tiktoken_gives_the_tokenizers_ids(
    qwen: tuple[Tokenizer, bpe.Encoder], sample: str
) -> None:
    tok, encoder = qwen
    if any(token.content in sample for token in tok.get_added_tokens_decoder().values() if not token.special):
        return  # a non-special added token is split out by tokenizers; segments.py splits it first
    assert encoder(sample) == tok.encode(sample, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level vocabulary trained here on Python source: its merges are its own."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CODE, Path(os.__file__).read_text()], trainer)
    return _save(tmp_path_factory.mktemp("trained"), tok)


@settings(max_examples=TEXTS, deadline=None)
@given(sample=text)
def test_a_trained_vocabulary_through_tiktoken_gives_the_tokenizers_ids(trained: Path, sample: str) -> None:
    encoder = _encoder(trained)
    assert encoder is not None
    assert encoder(sample) == Tokenizer.from_file(str(trained)).encode(sample).ids


def test_a_token_whose_own_bytes_merge_otherwise_is_refused(tmp_path: Path) -> None:
    # "bc" is merged first, so tokenizers spells "abc" a, bc, and no merge joins those two; tiktoken
    # takes "abc" whole, being in the vocabulary. The proof finds it without any text.
    tok = byte_level_tokenizer([("b", "c"), ("a", "b"), ("ab", "c")])
    file = _save(tmp_path, tok)
    assert _encoder(file) is None
    ranks = {bytes([byte]): rank for byte, rank in zip(bpe.bytes_to_unicode(), range(256), strict=True)}
    ranks.update({b"bc": 256, b"ab": 257, b"abc": 258})
    as_tiktoken = tiktoken.Encoding("x", pat_str=bpe.GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    assert as_tiktoken.encode_ordinary("abc") != tok.encode("abc").ids


def test_a_token_no_merge_makes_is_refused(tmp_path: Path) -> None:
    tok = byte_level_tokenizer([("h", "e")], extra=["xyz"])
    assert _encoder(_save(tmp_path, tok)) is None
    assert tok.encode("xyz").ids != [tok.token_to_id("xyz")]


def test_merges_out_of_the_order_of_their_ids_are_refused(tmp_path: Path) -> None:
    tok = byte_level_tokenizer([("h", "e"), ("l", "l")])
    file = _save(tmp_path, tok)
    data = json.loads(file.read_text())
    data["model"]["merges"].reverse()  # "ll" (id 257) before "he" (id 256)
    file.write_text(json.dumps(data))
    assert _encoder(file) is None


def test_a_normaliser_tiktoken_does_not_apply_is_refused(tmp_path: Path) -> None:
    tok = byte_level_tokenizer([("h", "e")])
    tok.normalizer = normalizers.Lowercase()
    assert _encoder(_save(tmp_path, tok)) is None


def test_a_metaspace_model_is_refused(tmp_path: Path) -> None:
    tok = byte_level_tokenizer([("h", "e")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    assert _encoder(_save(tmp_path, tok)) is None


@pytest.mark.parametrize(
    ("pre_tokenizer", "pattern"),
    [
        ({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, bpe.GPT2_PATTERN),
        ({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}, None),
        (
            {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": r"\w+"}, "behavior": "Isolated", "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
                ],
            },
            r"\w+",
        ),
        ({"type": "Whitespace"}, None),
        (None, None),
    ],
)
def test_the_split_regex_of_a_byte_level_pre_tokenizer(
    pre_tokenizer: dict[str, object] | None, pattern: str | None
) -> None:
    assert bpe.byte_level_pattern(pre_tokenizer) == pattern
