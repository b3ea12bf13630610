"""tokenizer.json read without turning its vocabulary into Python objects all at once.

Owns: finding the sections of a `tokenizers` file (the serialisation of the `tokenizers` library's
Tokenizer: https://huggingface.co/docs/tokenizers/api/tokenizer), parsing the small ones as JSON, and
streaming the model's `vocab` object and `merges` list a chunk at a time. Does not own what the
entries mean (bpe.py) or the pipeline built from the other sections (template.py).

Why: `json.loads` of Qwen3's 11 MB tokenizer.json holds about 80 MB of Python objects at its peak,
most of a small process's memory; streaming the same vocabulary holds the file's bytes and what the
caller keeps of each entry.

    with TokenizerJson.read("/models/qwen2.5/tokenizer.json") as document:
        document.spec["pre_tokenizer"], document.spec["model"]["type"]   # vocab and merges left empty
        for chunk in document.vocab(): ...   # [(token, id), ...]
        for chunk in document.merges(): ...  # [(left, right), ...]
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Entries are read this many at a time: one regex call validates a chunk, a second extracts it, so
# the Python work per entry is what the caller does with it, and a chunk's matches stay small.
CHUNK_ENTRIES = 4096

# Possessive quantifiers (Python >= 3.11) keep every scan linear, with no backtracking state to grow.
_WS = rb"[ \t\r\n]*"
_STRING = rb'"(?:[^"\\]++|\\.)*+"'
_CAPTURED = rb'"((?:[^"\\]++|\\.)*+)"'
_KEY = re.compile(_WS + rb"(" + _STRING + rb")" + _WS + rb":" + _WS)
_OPEN_OBJECT = re.compile(_WS + rb"\{")
_AFTER_VALUE = re.compile(_WS + rb"([,}])")
# Everything but brackets, strings whole: what lies between two brackets of a nested value.
_NO_BRACKETS = re.compile(rb"(?:[^\"\[\]{}]++|" + _STRING + rb")*+")
_STRING_VALUE = re.compile(_STRING)
_LITERAL = re.compile(rb"[^ \t\r\n,}\]]++")
# Nothing but whitespace before a section's closing bracket: an empty vocab or merges.
_EMPTY_REST = re.compile(_WS + rb"[}\]]")

_VOCAB_ENTRY = _WS + _STRING + _WS + rb":" + _WS + rb"\d++" + _WS
_MERGE_ENTRY = (
    _WS + rb"(?:" + _STRING + rb"|\[" + _WS + _STRING + _WS + rb"," + _WS + _STRING + _WS + rb"\])" + _WS
)
# A whole vocab object ({"token": id, ...}) and a whole merges list (["a b", ...] or [["a", "b"], ...]).
_VOCAB = re.compile(rb"\{(?:(?:" + _VOCAB_ENTRY + rb",)*+" + _VOCAB_ENTRY + rb"|" + _WS + rb")\}")
_MERGES = re.compile(rb"\[(?:(?:" + _MERGE_ENTRY + rb",)*+" + _MERGE_ENTRY + rb"|" + _WS + rb")\]")
_VOCAB_CHUNK = re.compile(rb"(?:" + _VOCAB_ENTRY + rb"[,}]){1,%d}+" % CHUNK_ENTRIES)
_MERGES_CHUNK = re.compile(rb"(?:" + _MERGE_ENTRY + rb"[,\]]){1,%d}+" % CHUNK_ENTRIES)
_TEXT_CAPTURED = _CAPTURED.decode()
_TEXT_WS = _WS.decode()
_VOCAB_FIELDS = re.compile(_TEXT_CAPTURED + _TEXT_WS + ":" + _TEXT_WS + r"(\d++)")
_MERGE_FIELDS = re.compile(
    _TEXT_CAPTURED + r"|\[" + _TEXT_WS + _TEXT_CAPTURED + _TEXT_WS + "," + _TEXT_WS + _TEXT_CAPTURED
)

_STREAMED = {"vocab": _VOCAB, "merges": _MERGES}


class TokenizerJson:
    """One tokenizer.json: its small sections parsed, the model's vocabulary and merges read on demand.

    Maps the file until `close()` (or the end of a `with` block). `spec` is the whole document with
    the model's `vocab` and `merges` replaced by empty ones.
    """

    __slots__ = ("_data", "_spans", "spec")

    def __init__(self, data: bytes | mmap.mmap) -> None:
        """Index `data`. Raises ValueError for data that is not a JSON object."""
        self._data = data
        # (start, end) of the model's vocab and merges, when each is the flat shape BPE models use.
        self._spans: dict[str, tuple[int, int]] = {}
        self.spec, _ = self._object(0, top=True)

    @classmethod
    def read(cls, path: str | Path) -> TokenizerJson:
        """Map and index `path`. Raises ValueError naming the file when it is malformed.

        Mapped rather than read: pages of a closed mapping leave the process, whereas freeing an
        11 MB bytes object after an earlier one of that size leaves it in the heap (glibc raises its
        mmap threshold to the size of a freed mapping: mallopt(3), M_MMAP_THRESHOLD).
        """
        with open(path, "rb") as file:
            try:
                data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # an empty file cannot be mapped
                raise ValueError(f"{path} is not a tokenizers file: {exc}") from exc
        try:
            return cls(data)
        except ValueError as exc:
            data.close()
            raise ValueError(f"{path} is not a tokenizers file: {exc}") from exc

    def close(self) -> None:
        """Unmap the file: `spec` stays, `vocab` and `merges` are gone."""
        if isinstance(self._data, mmap.mmap):
            self._data.close()
        self._spans.clear()

    def __enter__(self) -> TokenizerJson:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def vocab(self) -> Iterator[list[tuple[str, int]]]:
        """The model's vocabulary in file order, in chunks of (token, id). Raises ValueError where it
        is not an object of token to id (a Unigram model's list, for one)."""
        for fields in self._chunks("vocab", _VOCAB_CHUNK, _VOCAB_FIELDS):
            yield [(_text(token), int(rank)) for token, rank in fields]

    def merges(self) -> Iterator[list[tuple[str, str]]]:
        """The model's merges in priority order, in chunks of (left, right), whichever way the file
        spells them ("a b" or ["a", "b"])."""
        for fields in self._chunks("merges", _MERGES_CHUNK, _MERGE_FIELDS):
            yield [_merge(*field) for field in fields]

    def _chunks(self, name: str, chunk: re.Pattern[bytes], fields: re.Pattern[str]) -> Iterator[list[Any]]:
        if name not in self._spans:
            raise ValueError(f"the model has no {name} of the shape a BPE model has")
        pos, end = self._spans[name]
        pos += 1  # past the opening bracket
        if _EMPTY_REST.match(self._data, pos, end) is not None:
            return  # an empty object or list (matched in place: the section is megabytes)
        while pos < end:
            match = chunk.match(self._data, pos, end)
            if match is None:  # the section was validated whole when the file was indexed
                raise AssertionError(f"{name} changed shape at byte {pos}")
            # One decode per chunk: the fields are then found in text, with no per-entry decoding.
            yield fields.findall(self._data[pos : match.end()].decode("utf-8"))
            pos = match.end()

    def _streamed(self, key: str, pos: int, top: bool) -> re.Match[bytes] | None:
        """The model's vocab or merges at `pos`, validated whole, when it has the flat shape of BPE's."""
        shape = None if top else _STREAMED.get(key)
        return shape.match(self._data, pos) if shape is not None else None

    def _object(self, pos: int, top: bool) -> tuple[dict[str, Any], int]:
        """The object at `pos` and where it ends: the top level, or (top=False) the model, whose
        vocab and merges are validated and indexed instead of parsed."""
        opening = _OPEN_OBJECT.match(self._data, pos)
        if opening is None:
            raise ValueError(f"an object expected at byte {pos}")
        pos = opening.end()
        parsed: dict[str, Any] = {}
        empty = _AFTER_VALUE.match(self._data, pos)
        if empty is not None and empty[1] == b"}":
            return parsed, empty.end()
        while True:
            key_match = _KEY.match(self._data, pos)
            if key_match is None:
                raise ValueError(f"a key expected at byte {pos}")
            key, pos = _text(key_match[1][1:-1]), key_match.end()
            value: Any
            if top and key == "model":
                value, end = self._object(pos, top=False)
            elif (whole := self._streamed(key, pos, top)) is not None:
                end = whole.end()
                self._spans[key] = (pos, end)
                value = {} if key == "vocab" else []
            else:
                end = _value_end(self._data, pos)
                value = json.loads(self._data[pos:end])
            parsed[key] = value
            after = _AFTER_VALUE.match(self._data, end)
            if after is None:
                raise ValueError(f"',' or '}}' expected at byte {end}")
            if after[1] == b"}":
                return parsed, after.end()
            pos = after.end()


def _value_end(data: bytes | mmap.mmap, pos: int) -> int:
    """Where the JSON value starting at `pos` ends."""
    first = data[pos : pos + 1]
    if first == b'"':
        string = _STRING_VALUE.match(data, pos)
        if string is None:
            raise ValueError(f"an unterminated string at byte {pos}")
        return string.end()
    if first not in (b"{", b"["):
        literal = _LITERAL.match(data, pos)
        if literal is None:
            raise ValueError(f"a value expected at byte {pos}")
        return literal.end()
    depth = 0
    while pos < len(data):
        depth += 1 if data[pos] in b"{[" else -1
        pos += 1
        if depth == 0:
            return pos
        skipped = _NO_BRACKETS.match(data, pos)
        pos = skipped.end() if skipped is not None else pos
    raise ValueError("unbalanced brackets")


def _merge(spelled: str, left: str, right: str) -> tuple[str, str]:
    if spelled:
        left, space, right = _text(spelled).partition(" ")
        if not space:
            raise ValueError(f"a merge without a space: {spelled!r}")
        return left, right
    return _text(left), _text(right)


def _text(raw: str | bytes) -> str:
    """A JSON string's content (without its quotes) as text."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8")
    return raw if "\\" not in raw else str(json.loads(f'"{raw}"'))
