"""modeltap/counting/segments.py: counts split at added tokens as the tokenizers library matches them
(leftmost, longest first), and a resumable cut after which any appended text counts the same.

The encoder here counts characters, so a count is the added tokens plus the characters between them,
and the reference splits by brute force.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap.counting.segments import Segments

# Overlapping tokens on purpose: "<a>" inside "<a>b", "b>" ending "<b>", a long one.
ADDED = ("<a>", "<a>b", "<b>", "b><", "<longest-token>")
CUTS = 300


def by_hand(text: str) -> int:
    """Added tokens matched leftmost, longest first; every other character one token."""
    count = pos = 0
    while pos < len(text):
        match = max((t for t in ADDED if text.startswith(t, pos)), key=len, default=None)
        pos += len(match) if match else 1
        count += 1
    return count


def segments(cache_max_chars: int = 1_000) -> Segments:
    return Segments(ADDED, list, cache_max_chars)


pieces = st.lists(st.sampled_from(["<", ">", "a", "b", "<a>", "b>", "<longest-", "token>", "x"]), max_size=30)


@settings(max_examples=CUTS, deadline=None)
@given(history=pieces.map("".join), prompt=pieces.map("".join), more=pieces.map("".join))
def test_appended_text_counts_the_same_after_the_cut(history: str, prompt: str, more: str) -> None:
    counter = segments()
    total, cut, before = counter.count_resumable(history + prompt, len(history))
    assert total == by_hand(history + prompt) == counter.count(history + prompt)
    assert cut <= len(history)
    assert before == by_hand(history[:cut])
    assert before + counter.count(history[cut:] + more) == by_hand(history + more)


def test_the_cut_stays_clear_of_where_a_longer_token_could_start() -> None:
    # "<a>" ends the history, but "<a>b" may follow: the cut is after the last token that starts at
    # least the longest token's length (15) before the end, here "<b>".
    history = "xx<b>" + "y" * 20 + "<a>"
    assert segments().count_resumable(history, len(history)) == (24, 5, 3)


def test_without_added_tokens_the_whole_text_is_one_piece() -> None:
    counter = Segments([], list, 100)
    assert not counter.splits
    assert counter.count("<a>bc") == 5
    assert counter.count_resumable("<a>bc", 5) == (5, 0, 0)


def test_piece_counts_are_cached_within_their_bound() -> None:
    encoded: list[str] = []
    counter = Segments(ADDED, lambda piece: encoded.append(piece) or list(piece), cache_max_chars=10)
    assert counter.count("hello<a>world") == counter.count("hello<a>world") == 11
    assert encoded == ["hello", "world"], "the second count came from the cache"
    counter.count("0123456789<a>abcdef")
    assert counter.cached_chars <= 10
    assert (counter.hits, counter.misses) == (2, 4)
    assert counter.encode_count("hello<a>world") == 11 and encoded[-2:] == ["hello", "world"]
