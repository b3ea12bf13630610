"""modeltap/counting/conversations.py: a request finds the longest counted conversation it extends (same
tools and kwargs, earlier messages unchanged), and the cache stays within its bound, oldest out first."""

from __future__ import annotations

from typing import Any

from modeltap.counting.conversations import SIBLINGS_MAX, Conversation, ConversationCache

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "Fix the bug."}


def turn(n: int) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": f"step {n}"}, {"role": "tool", "content": f"output {n}"}]


def counted(
    messages: list[dict[str, Any]], chars: int = 100, tools: Any = None, **kwargs: Any
) -> Conversation:
    return Conversation(
        messages, tools, kwargs, counted=1, tail="", prompt_tokens=2, rewritable=(), chars=chars
    )


def test_a_request_finds_the_longest_conversation_it_extends() -> None:
    cache = ConversationCache(max_chars=10_000)
    short = counted([SYSTEM, TASK])
    longer = counted([SYSTEM, TASK, *turn(1)])
    other = counted([SYSTEM, TASK, *turn(9)])
    for conversation in (short, longer, other):
        cache.store(conversation)
    assert cache.find([SYSTEM, TASK, *turn(1), *turn(2)], None, {}) is longer
    assert cache.find([SYSTEM, TASK, *turn(3)], None, {}) is short
    # Equal messages from another request (other objects) match too.
    assert cache.find([dict(SYSTEM), dict(TASK), *turn(1)], None, {}) is longer


def test_tools_kwargs_and_earlier_messages_must_be_the_same() -> None:
    cache = ConversationCache(max_chars=10_000)
    cache.store(counted([SYSTEM, TASK, *turn(1)], tools=[{"type": "function"}], enable_thinking=False))
    request = [SYSTEM, TASK, *turn(1), *turn(2)]
    assert cache.find(request, [{"type": "function"}], {"enable_thinking": False}) is not None
    assert cache.find(request, None, {"enable_thinking": False}) is None
    assert cache.find(request, [{"type": "function"}], {}) is None
    edited = [SYSTEM, TASK, {**turn(1)[0], "content": "compacted"}, turn(1)[1], *turn(2)]
    assert cache.find(edited, [{"type": "function"}], {"enable_thinking": False}) is None


def test_a_one_message_conversation_is_found_by_a_longer_request() -> None:
    cache = ConversationCache(max_chars=10_000)
    alone = counted([TASK])
    cache.store(alone)
    assert cache.find([TASK, *turn(1)], None, {}) is alone


def test_an_extension_replaces_what_it_extends() -> None:
    cache = ConversationCache(max_chars=10_000)
    base = counted([SYSTEM, TASK])
    cache.store(base)
    cache.store(counted([SYSTEM, TASK, *turn(1)]), replacing=base)
    assert len(cache) == 1 and cache.chars == 100


def test_the_oldest_counted_goes_first_when_over_budget() -> None:
    cache = ConversationCache(max_chars=250)
    first, second = counted([SYSTEM, {"role": "user", "content": "one"}]), counted([SYSTEM, TASK])
    cache.store(first)
    cache.store(second)
    assert (
        cache.find([SYSTEM, {"role": "user", "content": "one"}], None, {}) is first
    )  # first is now the newest
    cache.store(counted([SYSTEM, {"role": "user", "content": "three"}]))
    assert len(cache) == 2 and cache.chars <= 250
    assert cache.find([SYSTEM, TASK], None, {}) is None, "the least recently counted was evicted"


def test_a_conversation_larger_than_the_budget_is_not_kept() -> None:
    cache = ConversationCache(max_chars=50)
    cache.store(counted([SYSTEM, TASK], chars=51))
    assert len(cache) == 0 and cache.chars == 0
    cache.store(counted([SYSTEM, TASK], chars=50))
    cache.clear()
    assert (len(cache), cache.chars) == (0, 0)


def test_at_most_siblings_max_conversations_are_kept_per_opening() -> None:
    cache = ConversationCache(max_chars=10**9)
    siblings = [counted([SYSTEM, TASK, *turn(n)]) for n in range(SIBLINGS_MAX + 1)]
    for conversation in siblings:
        cache.store(conversation)
    assert len(cache) == SIBLINGS_MAX
    assert cache.find([SYSTEM, TASK, *turn(0), *turn(99)], None, {}) is None, "the one stored first left"
    assert cache.find([SYSTEM, TASK, *turn(1), *turn(99)], None, {}) is siblings[1]
