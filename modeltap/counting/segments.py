"""Counting rendered prompt text in pieces split at the tokenizer's added tokens.

Owns: splitting text where a Hugging Face tokenizer matches its added tokens (before anything else,
leftmost and longest first), counting the pieces between them with an encoder and a bounded cache of
piece counts, and finding where a text may be cut so that whatever is appended to it later splits
the same way: the resume point of incremental counting. Does not own: which encoder (counter.py),
whether pieces may be counted apart at all (counter.py checks the tokenizer's flags), rendering.

    segments = Segments(["<|im_start|>", "<|im_end|>"], encoder, cache_max_chars=4_000_000)
    segments.count("<|im_start|>user\\nhi<|im_end|>\\n")                 # 2 added tokens + the pieces
    total, cut, before = segments.count_resumable(text, stable=len(history))

Thread-safe: the cache takes a lock; encoding runs outside it.
"""

from __future__ import annotations

import collections
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sized


class Segments:
    """Counts text as added tokens plus the encoder's tokens for each piece between them."""

    def __init__(self, added: Collection[str], encode: Callable[[str], Sized], cache_max_chars: int) -> None:
        """`added` are the added tokens' contents (none: the whole text is one piece), `encode` the
        encoder of a piece, `cache_max_chars` the most characters of pieces whose counts are kept."""
        longest_first = sorted(added, key=len, reverse=True)
        # A capturing group makes `split` return the added tokens too: odd indexes are added tokens.
        self._pattern = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if added else None
        self._longest = len(longest_first[0]) if longest_first else 0
        self._encode = encode
        self._cache: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._cache_max_chars = cache_max_chars
        self._cached_chars = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def splits(self) -> bool:
        """Whether there are added tokens to split at (else nothing can be counted incrementally)."""
        return self._pattern is not None

    @property
    def cached_chars(self) -> int:
        """Characters of the pieces whose counts the cache holds."""
        return self._cached_chars

    def count(self, text: str) -> int:
        """Tokens in `text`: its added tokens and the cached or encoded count of each piece between."""
        if self._pattern is None:
            return sum(self._counts([text]))
        pieces = self._pattern.split(text)
        return len(pieces) // 2 + sum(self._counts([piece for piece in pieces[::2] if piece]))

    def count_resumable(self, text: str, stable: int) -> tuple[int, int, int]:
        """(tokens in `text`, a cut, tokens in `text[:cut]`), where `text[:stable]` is what later texts
        will start with and the cut is the end of the last added token that starts at least as many
        characters before `stable` as the longest added token has.

        Appended text cannot change how anything before the cut splits: a match that reaches past
        `stable` starts within the longest token's length of it, so every match the scan finds before
        the cut, and where it resumes, depend on `text[:stable]` alone. So the tokens of
        `text[:stable] + more` are `before + count(text[cut:stable] + more)`.
        """
        if self._pattern is None:
            return self.count(text), 0, 0
        pieces = self._pattern.split(text)
        counts = iter(self._counts([piece for piece in pieces[::2] if piece]))
        limit = stable - self._longest
        total = cut = before = pos = 0
        for index, piece in enumerate(pieces):
            if index % 2 == 0:  # text between added tokens
                total += next(counts) if piece else 0
            else:  # an added token, starting at pos
                total += 1
                if pos <= limit:
                    cut, before = pos + len(piece), total
            pos += len(piece)
        return total, cut, before

    def ids(self, text: str, added_ids: Mapping[str, int], encode: Callable[[str], list[int]]) -> list[int]:
        """The ids of `text`: each added token's own id (`added_ids`), the pieces between encoded by
        `encode` (the same encoder as the counts'); not cached."""
        if self._pattern is None:
            return encode(text)
        out: list[int] = []
        for index, piece in enumerate(self._pattern.split(text)):
            if index % 2:
                out.append(added_ids[piece])
            elif piece:
                out += encode(piece)
        return out

    def encode_count(self, text: str) -> int:
        """`count` without the cache: what a sampled check compares the cached counts with."""
        if self._pattern is None:
            return len(self._encode(text))
        pieces = self._pattern.split(text)
        return len(pieces) // 2 + sum(len(self._encode(piece)) for piece in pieces[::2] if piece)

    def clear(self) -> None:
        """Forget every cached count."""
        with self._lock:
            self._cache.clear()
            self._cached_chars = 0

    def _counts(self, pieces: list[str]) -> list[int]:
        """Each piece's count: the cached ones, then the rest encoded (outside the lock) and cached."""
        with self._lock:
            counts = [self._cache.get(piece) for piece in pieces]
            for piece, count in zip(pieces, counts, strict=True):
                if count is not None:
                    self._cache.move_to_end(piece)
            found = sum(count is not None for count in counts)
            self.hits += found
            self.misses += len(pieces) - found
        encoded = {
            piece: len(self._encode(piece))
            for piece, count in zip(pieces, counts, strict=True)
            if count is None
        }
        if encoded:
            self._remember(encoded)
        return [
            encoded[piece] if count is None else count for piece, count in zip(pieces, counts, strict=True)
        ]

    def _remember(self, encoded: dict[str, int]) -> None:
        with self._lock:
            for piece, count in encoded.items():
                if piece not in self._cache and len(piece) <= self._cache_max_chars:
                    self._cache[piece] = count
                    self._cached_chars += len(piece)
            while self._cached_chars > self._cache_max_chars:
                evicted, _ = self._cache.popitem(last=False)
                self._cached_chars -= len(evicted)
