"""tiktoken built from a byte-level BPE vocabulary, used only where it gives the ids `tokenizers` gives.

Owns: turning a tokenizer.json's byte-level BPE (streamed by tokenizer_json.py) into a tiktoken
Encoding, and proving at load that it encodes every text as the `tokenizers` BPE does. Does not own:
splitting text at added tokens or counting (segments.py), nor choosing an encoder (counter.py).

The two algorithms differ in one rule. tiktoken merges the adjacent pair whose concatenation has the
lowest id in the vocabulary; `tokenizers` merges the adjacent pair with the lowest priority among its
`merges` list (https://github.com/huggingface/tokenizers/blob/v0.23.0/tokenizers/src/models/bpe/word.rs,
leftmost first on a tie, as tiktoken). So they agree when
1. every merge makes a token whose id is above both parts' ids and above the previous merge's;
2. every token of two or more bytes is made by one merge (or is an added token, which never reaches
   the encoder: segments.py splits those out first); and
3. `tokenizers` encodes each token's own bytes back to that token.
Given 1 and 2, a difference needs a pair (x, y) that tiktoken merges into t = x + y although t's merge
is (a, b) != (x, y); the merges inside t's bytes then ran as in t alone and stopped at [x, y], so 3
fails for t. And 3 fails for t = (a, b) exactly when some merge joins a token at the right edge of a's
bytes to one at the left edge of b's while both exist: the right spine of a's merge tree (a, its right
part, that one's right part, ... a byte) against the left spine of b's, each token alive from its own
id (bytes from the start) until the id of the token that absorbs it. `_no_crossing_merges` walks
those spines for every merge: linear in the vocabulary, about a second for Qwen3's 151k merges.

The split regex and the NFC normaliser are checked on a probe text against the tokenizer's own
pre-tokenizer and normaliser, encoded by the reference BPE written out here.
"""

from __future__ import annotations

import codecs
import itertools
import logging
import unicodedata
from array import array
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken
from tokenizers import Tokenizer

from modeltap.counting.tokenizer_json import TokenizerJson

log = logging.getLogger(__name__)

Encoder = Callable[[str], list[int]]


@dataclass(frozen=True, slots=True)
class FastBPE:
    """tiktoken proven to encode as the tokenizer does: `encode` for the text between added tokens,
    and `token_bytes` for the bytes each of its ids stands for (decoding; not for added tokens)."""

    encode: Encoder
    token_bytes: Callable[[int], bytes]


# The regex of the `ByteLevel(use_regex=True)` pre-tokenizer of the `tokenizers` library (GPT-2's).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Text tiktoken must split and encode exactly as the tokenizer's own pipeline before it is trusted:
# code, contractions, digits, whitespace runs, CRLF, CJK, emoji, combining marks, full-width forms.
PROBE_TEXT = (
    "def f(x):\n    return x ** 2  # don't; I'LL we've\r\n\tif x>=10_000: print(f'{x!r}')\n\n\n"
    "  héllo wörld e\u0301 ﬁ 日本語のテキスト、句読点。 한국어 العربية 🤖🚀👩‍💻 ｆｕｌｌ　width\u00a0nbsp "
    '12345678901234567890 3.14159 -> => !== ... ```json\n{"a": [1, 2, {"b": null}]}\n```\n'
)

# Model fields that make BPE behave otherwise than tiktoken: dropout samples merges away, byte
# fallback and the subword affixes change what a token is.
_UNSUPPORTED_MODEL_FIELDS = ("dropout", "byte_fallback", "continuing_subword_prefix", "end_of_word_suffix")


def exact_tiktoken(path: Path, pipeline: Tokenizer, added: Collection[str]) -> FastBPE | None:
    """An encoder of text between added tokens giving the ids `tokenizers` gives, or None where that
    cannot be proven (the caller then encodes with `tokenizers` itself).

    `path` is the tokenizer.json, `pipeline` the tokenizer built from it (its normaliser and
    pre-tokenizer are what the probe is checked against), `added` the contents of its added tokens,
    which never reach the encoder. Streams the vocabulary once; the encoder keeps only tiktoken's
    own tables.
    """
    with TokenizerJson.read(path) as document:
        proven = _proven(document, pipeline, {text.encode() for text in added})
    if isinstance(proven, str):
        log.info("counting with the tokenizers library: %s", proven)
        return None
    # The file's bytes and the proof's tables are gone by now: tiktoken's build is the peak of a load.
    encoding = tiktoken.Encoding(
        "modeltap-bpe", pat_str=proven.pattern, mergeable_ranks=proven.ranks, special_tokens={}
    )
    # tiktoken keeps the dict only to pickle the Encoding (tiktoken/core.py `__getstate__`), which
    # nothing here does: emptying it gives back the ~15 MB a 151k vocabulary takes in Python.
    proven.ranks.clear()
    encoder = _nfc_first(encoding) if proven.nfc else encoding.encode_ordinary
    if encoder(PROBE_TEXT) != proven.probe_ids:
        log.info("counting with the tokenizers library: tiktoken disagrees with it on the probe text")
        return None
    return FastBPE(encoder, encoding.decode_single_token_bytes)


@dataclass(frozen=True, slots=True)
class _Proven:
    """A vocabulary tiktoken reproduces: its split regex, whether to apply NFC, its ranks, and the
    probe text's ids by the reference encoding."""

    pattern: str
    nfc: bool
    ranks: dict[bytes, int]
    probe_ids: list[int]


def _proven(document: TokenizerJson, pipeline: Tokenizer, added: set[bytes]) -> _Proven | str:
    """The vocabulary, proven reproducible by tiktoken (module docstring), or why not."""
    spec = document.spec
    why = _unsupported(spec)
    pattern = byte_level_pattern(spec.get("pre_tokenizer"))
    if why is not None or pattern is None:
        return why or "no byte-level split"
    try:
        ranks = _byte_level_ranks(document)
        if ranks is None:
            return "the vocabulary is not a byte-level one of ids 0..n-1"
        merged = _merge_parts(document, ranks)
    except ValueError as exc:  # a vocabulary or merges not in the shape a BPE model writes
        return str(exc)
    if isinstance(merged, str):
        return merged
    tokens = [b""] * len(ranks)
    for token, rank in ranks.items():
        tokens[rank] = token
    why = _not_reproducible(tokens, ranks, *merged, added)
    if why is not None:
        return why
    probe_ids = _reference_ids(PROBE_TEXT, pipeline, tokens, ranks, *merged)
    return _Proven(pattern, spec.get("normalizer") is not None, ranks, probe_ids)


def byte_level_pattern(pre_tokenizer: dict[str, Any] | None) -> str | None:
    """The split regex of a byte-level pre-tokenizer that tiktoken can run, else None."""
    if not pre_tokenizer:
        return None
    steps = pre_tokenizer.get("pretokenizers", [pre_tokenizer])
    last = steps[-1]
    if last.get("type") != "ByteLevel" or last.get("add_prefix_space"):
        return None
    if len(steps) == 1:
        return GPT2_PATTERN if last.get("use_regex", True) else None
    split = steps[0]
    if len(steps) != 2 or last.get("use_regex") or split.get("type") != "Split":
        return None
    if split.get("behavior") != "Isolated" or split.get("invert") or "Regex" not in split.get("pattern", {}):
        return None
    return str(split["pattern"]["Regex"])


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters, used by every byte-level BPE."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


# Byte-level text to bytes by a C charmap codec: a character outside the alphabet fails to encode.
_BYTE_LEVEL = codecs.charmap_build("".join(bytes_to_unicode()[byte] for byte in range(256)))


def _to_bytes(token: str) -> bytes:
    """A byte-level token's bytes. Raises UnicodeEncodeError for text outside the byte-level alphabet."""
    return codecs.charmap_encode(token, "strict", _BYTE_LEVEL)[0]


def _unsupported(spec: dict[str, Any]) -> str | None:
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"a {model.get('type')} model"
    field = next((name for name in _UNSUPPORTED_MODEL_FIELDS if model.get(name)), None)
    if field is not None:
        return f"the BPE model sets {field}"
    if spec.get("normalizer") not in (None, {"type": "NFC"}):
        return "a normaliser tiktoken does not apply"
    if byte_level_pattern(spec.get("pre_tokenizer")) is None:
        return "a pre-tokenizer that is not one byte-level split"
    return None


def _byte_level_ranks(document: TokenizerJson) -> dict[bytes, int] | None:
    """The vocabulary as tiktoken ranks (each token's bytes to its id), for ids 0..n-1 that hold every
    single byte; else None."""
    ranks: dict[bytes, int] = {}
    entries = 0
    try:
        for chunk in document.vocab():
            ranks.update((_to_bytes(token), rank) for token, rank in chunk)
            entries += len(chunk)
    except UnicodeEncodeError:
        return None
    if entries != len(ranks) or len(set(ranks.values())) != len(ranks):
        return None
    if max(ranks.values(), default=-1) != len(ranks) - 1:
        return None
    return ranks if sum(len(token) == 1 for token in ranks) == 256 else None


def _merge_parts(document: TokenizerJson, ranks: dict[bytes, int]) -> tuple[array[int], array[int]] | str:
    """(left part, right part) of each token a merge makes, by id (-1: none); or why the merges do not
    meet condition 1 of the module docstring."""
    left, right = array("i", [-1]) * len(ranks), array("i", [-1]) * len(ranks)
    previous = -1
    for chunk in document.merges():
        try:
            lefts = [_to_bytes(text) for text, _ in chunk]
            rights = [_to_bytes(text) for _, text in chunk]
        except UnicodeEncodeError:
            return "a merge is not byte-level"
        made = list(map(ranks.get, map(bytes.__add__, lefts, rights)))
        firsts, seconds = list(map(ranks.get, lefts)), list(map(ranks.get, rights))
        for index, (result, first, second) in enumerate(zip(made, firsts, seconds, strict=True)):
            if result is None or first is None or second is None:
                return f"the merge {chunk[index]} uses or makes a token outside the vocabulary"
            if result <= previous or result <= first or result <= second:
                return "the merges are not in the order of the ids they make"
            left[result], right[result], previous = first, second, result
    return left, right


def _not_reproducible(
    tokens: list[bytes], ranks: dict[bytes, int], left: array[int], right: array[int], added: set[bytes]
) -> str | None:
    """Why conditions 2 or 3 of the module docstring fail, or None."""
    for rank, token in enumerate(tokens):
        if len(token) > 1 and left[rank] < 0 and token not in added:
            return f"the token {token!r} is in the vocabulary but no merge makes it"
    if not _no_crossing_merges(tokens, ranks, left, right):
        return "some token's own bytes do not encode back to it"
    return None


def _no_crossing_merges(
    tokens: list[bytes], ranks: dict[bytes, int], left: array[int], right: array[int]
) -> bool:
    """Condition 3 for every merge (module docstring): no merge joins the right spine of its left part
    to the left spine of its right part while both tokens exist. A token lives from its id (a byte
    from the start) until the id of the next one up its spine; the last ones, until `made`."""
    for made, part_a in enumerate(left):
        if part_a < 0:
            continue
        part_b = right[made]
        side_a, side_b = [part_a], [part_b]  # latest first, down to the bytes at the seam
        while left[side_a[-1]] >= 0:
            side_a.append(right[side_a[-1]])
        while left[side_b[-1]] >= 0:
            side_b.append(left[side_b[-1]])
        i, j = len(side_a) - 1, len(side_b) - 1
        while i or j:  # (part_a, part_b) itself, the pair at i = j = 0, is made's own merge
            x, y = side_a[i], side_b[j]
            ends_a = side_a[i - 1] if i else made
            ends_b = side_b[j - 1] if j else made
            joined = ranks.get(tokens[x] + tokens[y], -1)
            born = max(x if left[x] >= 0 else -1, y if left[y] >= 0 else -1)
            # On a tie with ends_b the pair here is the leftmost of two equal merges, so it goes first.
            if born < joined < ends_a and joined <= ends_b and left[joined] == x and right[joined] == y:
                return False
            if ends_a <= ends_b:
                i -= 1
            if ends_b <= ends_a:
                j -= 1
    return True


def _reference_ids(
    text: str,
    pipeline: Tokenizer,
    tokens: list[bytes],
    ranks: dict[bytes, int],
    left: array[int],
    right: array[int],
) -> list[int]:
    """`text` encoded by the tokenizer's own normaliser and pre-tokenizer and the `tokenizers` BPE
    rule written out: the pair with the lowest merge first (merges follow ids), leftmost on a tie."""
    if pipeline.normalizer is not None:
        text = pipeline.normalizer.normalize_str(text)
    assert pipeline.pre_tokenizer is not None  # byte_level_pattern found one
    ids: list[int] = []
    for piece, _ in pipeline.pre_tokenizer.pre_tokenize_str(text):
        word = [ranks[bytes([byte])] for byte in _to_bytes(piece)]
        while len(word) > 1:
            merges = []
            for at, (first, second) in enumerate(itertools.pairwise(word)):
                made = ranks.get(tokens[first] + tokens[second], -1)
                if made >= 0 and left[made] == first and right[made] == second:
                    merges.append((made, at))
            if not merges:
                break
            made, at = min(merges)
            word[at : at + 2] = [made]
        ids += word
    return ids


def _nfc_first(encoding: tiktoken.Encoding) -> Encoder:
    """Qwen's tokenizer.json carries an NFC normaliser, which tiktoken does not apply itself."""

    def encode(piece: str) -> list[int]:
        if not unicodedata.is_normalized("NFC", piece):
            piece = unicodedata.normalize("NFC", piece)
        return encoding.encode_ordinary(piece)

    return encode
