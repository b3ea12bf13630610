"""modeltap/counting/tokenizer_json.py: the spec and the streamed vocabulary and merges are what `json.loads`
reads from the same file, whatever the escapes, spacing, key order or spelling of the merges."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap.counting.tokenizer_json import TokenizerJson

DOCUMENTS = 200


def streamed(document: TokenizerJson) -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab = {token: rank for chunk in document.vocab() for token, rank in chunk}
    return vocab, [merge for chunk in document.merges() for merge in chunk]


def expected(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int], list[tuple[str, str]]]:
    """(the spec, the vocabulary, the merges as pairs) by json.loads."""
    model = data["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    spec = {**data, "model": {**model, "vocab": {}, "merges": []}}
    return spec, model["vocab"], merges


def test_the_qwen_file_reads_as_json_loads_reads_it(qwen_dir: str) -> None:
    path = Path(qwen_dir, "tokenizer.json")
    spec, vocab, merges = expected(json.loads(path.read_text(encoding="utf-8")))
    with TokenizerJson.read(path) as document:
        assert document.spec == spec
        assert streamed(document) == (vocab, merges)
    assert len(vocab) == 151_643 and len(merges) == 151_387


# Any text a UTF-8 file holds, control characters, quotes and backslashes included (json.dumps
# escapes them).
characters = st.characters(exclude_categories=("Cs",))
tokens = st.text(characters, min_size=1, max_size=6)
spaceless = st.text(st.characters(exclude_categories=("Cs",), exclude_characters=" "), min_size=1, max_size=6)
values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(characters, max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(characters, max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    merges = draw(st.lists(st.tuples(spaceless, spaceless), max_size=12))
    spelled = draw(st.booleans())
    model = {
        "type": "BPE",
        "dropout": None,
        "vocab": draw(st.dictionaries(tokens, st.integers(0, 10**6), min_size=1, max_size=20)),
        "merges": [f"{a} {b}" if spelled else [a, b] for a, b in merges],
        "extra": draw(values),
    }
    sections = {
        "version": "1.0",
        "added_tokens": [{"id": 9, "content": draw(tokens), "special": True}],
        "normalizer": draw(values),
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": draw(st.text(characters, max_size=10))}},
        "model": dict(draw(st.permutations(list(model.items())))),
    }
    return dict(draw(st.permutations(list(sections.items()))))


@settings(max_examples=DOCUMENTS, deadline=None)
@given(data=documents(), indent=st.sampled_from([None, 0, 2, "\t"]), ascii_only=st.booleans())
def test_any_document_reads_as_json_loads_reads_it(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], indent: Any, ascii_only: bool
) -> None:
    path = tmp_path_factory.mktemp("doc") / "tokenizer.json"
    path.write_text(json.dumps(data, indent=indent, ensure_ascii=ascii_only), encoding="utf-8")
    spec, vocab, merges = expected(json.loads(path.read_text(encoding="utf-8")))
    with TokenizerJson.read(path) as document:
        assert document.spec == spec
        assert streamed(document) == (vocab, merges)


def test_a_vocabulary_that_is_not_an_object_of_ids_is_parsed_whole_and_not_streamed(tmp_path: Path) -> None:
    # A Unigram model's vocabulary is a list of [piece, score]: the spec keeps it, vocab() refuses.
    data = {"model": {"type": "Unigram", "vocab": [["a", -1.5], ["b", -2.0]], "unk_id": 0}}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(data))
    with TokenizerJson.read(path) as document:
        assert document.spec == data
        with pytest.raises(ValueError, match="no vocab"):
            next(document.vocab())


@pytest.mark.parametrize("inside", ["", " ", "\n  \t\r\n"])
def test_empty_vocabulary_and_merges_stream_nothing(tmp_path: Path, inside: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(f'{{"model": {{"type": "BPE", "vocab": {{{inside}}}, "merges": [{inside}]}}}}')
    with TokenizerJson.read(path) as document:
        assert streamed(document) == ({}, [])


@pytest.mark.parametrize("text", ["", "[]", '{"model": {"vocab": {"a": 1}', '{"a": 1,}', '{"a" 1}'])
def test_a_malformed_file_is_a_value_error_naming_it(tmp_path: Path, text: str) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a tokenizers file"):
        TokenizerJson.read(path)


def test_a_merge_spelled_without_a_space_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}}))
    with TokenizerJson.read(path) as document, pytest.raises(ValueError, match="without a space"):
        streamed(document)


def test_closing_unmaps_the_file_and_keeps_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    with TokenizerJson.read(path) as document:
        pass
    assert document.spec["model"] == {"type": "BPE", "vocab": {}, "merges": []}
    with pytest.raises(ValueError):
        next(document.vocab())
