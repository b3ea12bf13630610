"""The conversations a token counter has counted, kept so that the next turn counts only what is new.

Owns: the bounded cache of counted conversations (a request's messages, tools and template kwargs,
and where the rendered prompt's count stands), finding the longest cached one a request extends,
and eviction by age (least recently counted first) under a character budget and a bound per
opening (SIBLINGS_MAX). Does not own what is
counted or how (counter.py, windows.py, segments.py).

    cache = ConversationCache(max_chars=8_000_000)
    base = cache.find(messages, tools, kwargs)   # a Conversation whose messages start `messages`
    cache.store(extended, replacing=base)

Thread-safe: one lock around the index; a Conversation never changes once stored.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The characters of content a lookup key takes from each head message: enough to tell two agents'
# system prompts and tasks apart without hashing a long one whole on every request.
KEY_CHARS = 256
# Conversations kept per opening: a GRPO group's samples all open alike, and a request compares itself
# with each one kept under its opening. Past this, the one stored longest ago is dropped (its next turn
# is counted in full, exactly), so a lookup costs at most this many comparisons however many
# conversations have opened alike (10k requests of one task otherwise cost milliseconds each).
SIBLINGS_MAX = 64


@dataclass(frozen=True, slots=True, eq=False)
class Conversation:
    """One counted request, and where its count stands.

    `messages`, `tools` and `kwargs` are the prompt as the request held it (compared with later
    requests, never changed). The rendered prompt without its generation prompt has `counted` tokens
    up to a cut (segments.py, `count_resumable`) and `tail` after it; `prompt_tokens` is the count
    of the whole prompt with the generation prompt. `rewritable` are the indexes of messages a
    template may still rewrite (windows.py); `chars` is what the cache charges it.
    """

    messages: Sequence[Any]
    tools: Sequence[Mapping[str, Any]] | None
    kwargs: Mapping[str, Any]
    counted: int
    tail: str
    prompt_tokens: int
    rewritable: tuple[int, ...]
    chars: int


class ConversationCache:
    """Counted conversations by their opening messages, the least recently counted evicted first."""

    def __init__(self, max_chars: int) -> None:
        """`max_chars` bounds the characters of rendered prompt the cached conversations stand for
        (each keeps its request's messages alive, about as large)."""
        self._max_chars = max_chars
        self._chars = 0
        self._by_key: dict[tuple[Any, ...], list[Conversation]] = {}
        self._by_age: collections.OrderedDict[Conversation, tuple[Any, ...]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_age)

    @property
    def chars(self) -> int:
        """The characters the cached conversations are charged."""
        return self._chars

    def find(
        self, messages: Sequence[Any], tools: Sequence[Mapping[str, Any]] | None, kwargs: Mapping[str, Any]
    ) -> Conversation | None:
        """The longest cached conversation with these tools and kwargs whose messages begin `messages`."""
        with self._lock:
            # Stored under its first two messages, or its only one: a request looks under both.
            candidates = [
                *self._by_key.get(_key(messages[:2]), ()),
                *self._by_key.get(_key(messages[:1]), ()),
            ]
        best = None
        for candidate in candidates:
            length = len(candidate.messages)
            if best is not None and length <= len(best.messages):
                continue
            if length > len(messages) or (length and messages[length - 1] != candidate.messages[-1]):
                continue  # the last message first: where siblings differ, and cheaper than the tools
            if candidate.kwargs != kwargs or candidate.tools != tools:
                continue
            # Equal objects compare by identity first, and equal strings by memcmp: cheap at 100k tokens.
            if list(messages[:length]) == list(candidate.messages):
                best = candidate
        if best is not None:
            with self._lock:
                if best in self._by_age:
                    self._by_age.move_to_end(best)
        return best

    def store(self, conversation: Conversation, replacing: Conversation | None = None) -> None:
        """Keep `conversation` (as the most recent), dropping `replacing` (the one it extends), then
        evict the oldest while over budget. One larger than the whole budget is not kept."""
        if conversation.chars > self._max_chars:
            return
        key = _key(conversation.messages[:2])
        with self._lock:
            if replacing is not None:
                self._drop(replacing)
            siblings = self._by_key.setdefault(key, [])
            siblings.append(conversation)
            self._by_age[conversation] = key
            self._chars += conversation.chars
            if len(siblings) > SIBLINGS_MAX:
                self._drop(siblings[0])
            while self._chars > self._max_chars:
                self._drop(next(iter(self._by_age)))

    def clear(self) -> None:
        """Forget every conversation."""
        with self._lock:
            self._by_key.clear()
            self._by_age.clear()
            self._chars = 0

    def _drop(self, conversation: Conversation) -> None:
        key = self._by_age.pop(conversation, None)
        if key is None:
            return
        self._chars -= conversation.chars
        siblings = self._by_key[key]
        siblings.remove(conversation)
        if not siblings:
            del self._by_key[key]


def _key(messages: Sequence[Any]) -> tuple[Any, ...]:
    """The role and opening text of `messages` (a conversation's first one or two): what every later
    request of the conversation shares, and what tells two agents' tasks apart."""
    key: list[Any] = []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        opening = content[:KEY_CHARS] if isinstance(content, str) else type(content).__name__
        key.append((message.get("role") if isinstance(message, Mapping) else None, opening))
    return tuple(key)
