"""Request bodies for the benchmarks: a short agent turn, and conversations of a chosen length in tokens.

Owns: what the load generator sends. Each body is built once as bytes with a slot for the request
number, so that every request differs in its last words (as an agent's turns do, and as a cache keyed on
whole bodies would notice) while building it costs the load generator next to nothing.
Not: sending them (load.py).
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.configs import qwen_tokenizer_dir
from benchmarks.stand_in import MODEL

# A 16-token answer, the request of the peer measurements (docs/peers.md §1).
MAX_TOKENS = 16
SYSTEM_PROMPT = "You are a helpful coding agent. Use the tools to inspect and change the repository."
STREAM_FIELDS = b', "stream": true, "stream_options": {"include_usage": true}}'
# Tool outputs in a coding agent's conversation run to a few thousand tokens each.
TOOL_OUTPUT_TOKENS = 2000
ASSISTANT_REPLY = "I read the output. Next I will run the tests again."
NEXT_TURN = "Go on."
# Lines run to about 25 tokens: a batch this long always fills one tool output.
LINES_PER_BATCH = TOOL_OUTPUT_TOKENS // 10
SEED = 7

# Each session of the sessions benchmark: a short task, then a few hundred tokens of tool output a turn.
SESSION_TASK = "Fix the failing test in tests/test_parser.py and run the suite."
SESSION_TOOL_OUTPUT = "\n".join(f"tests/test_parser.py::test_case_{n} PASSED" for n in range(40))

BodyFor = Callable[..., bytes]


def body_for_messages(messages: list[dict[str, Any]]) -> BodyFor:
    """``body_for(i, stream=False)``: the chat request ``messages`` with `` i`` after the last content."""
    text = json.dumps({"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages})
    tail = '"}]}'  # the end of the last message's content, the list and the body
    assert text.endswith(tail), "the last message must have string content"
    prefix, suffix = text[: -len(tail)].encode() + b" ", tail.encode()

    def body_for(index: int, stream: bool = False) -> bytes:
        body = prefix + str(index).encode() + suffix
        return body[:-1] + STREAM_FIELDS if stream else body

    return body_for


def short_turn(prompt_words: int = 200) -> BodyFor:
    """About ``prompt_words`` words of prompt: the small request of the overhead benchmark."""
    words = " ".join(f"word{n % 97}" for n in range(prompt_words))
    return body_for_messages(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": words}]
    )


def qwen_token_counter() -> Callable[[list[str]], list[int]]:
    """Count each string of a batch with the Qwen vocabulary that modeltap's budget uses in the benchmarks."""
    # The tokenizers package comes with modeltap's budget extra; reading tokenizer.json directly counts
    # with the vocabulary alone, no chat template.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
    return lambda texts: [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _code_lines(rng: random.Random) -> Iterator[str]:
    """Endless lines that read like a tool's output of code, varied enough that BPE works as usual."""
    verbs, names = ["load", "parse", "check", "merge", "render"], ["alpha", "beta", "gamma", "delta"]
    for step in itertools.count(1):
        yield (
            f"    result_{rng.randint(0, 999)} = {rng.choice(verbs)}_items(items[{rng.randint(0, 99)}], "
            f'"{rng.choice(names)}")  # step {step}'
        )


def conversations(targets: list[int], count_tokens: Callable[[list[str]], list[int]]) -> dict[int, BodyFor]:
    """For each target, a coding-agent conversation whose message contents hold about that many tokens.

    One history is cut at each target, so each conversation extends the shorter ones, as a growing agent
    session does. ``count_tokens`` counts each string of a batch with the served model's tokenizer.
    """
    histories = conversation_messages(targets, count_tokens)
    return {
        target: body_for_messages([*messages, {"role": "user", "content": NEXT_TURN}])
        for target, messages in histories.items()
    }


def conversation_messages(
    targets: list[int], count_tokens: Callable[[list[str]], list[int]]
) -> dict[int, list[dict[str, Any]]]:
    """The messages of `conversations`' histories, each ending on the assistant's reply."""
    lines = _code_lines(random.Random(SEED))
    system_tokens, reply_tokens = count_tokens([SYSTEM_PROMPT, ASSISTANT_REPLY])
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    total = system_tokens
    histories: dict[int, list[dict[str, Any]]] = {}
    for target in sorted(targets):
        while total < target:
            batch = list(itertools.islice(lines, LINES_PER_BATCH))
            counts = count_tokens(batch)
            take = _prefix_within(counts, min(TOOL_OUTPUT_TOKENS, target - total))
            messages.append({"role": "user", "content": "\n".join(batch[:take])})
            messages.append({"role": "assistant", "content": ASSISTANT_REPLY})
            total += sum(counts[:take]) + reply_tokens
        histories[target] = list(messages)
    return histories


def _prefix_within(counts: list[int], budget: int) -> int:
    """How many of ``counts`` fit in ``budget`` (at least one, so that every round makes progress)."""
    used = 0
    for taken, count in enumerate(counts):
        if used + count > budget:
            return max(taken, 1)
        used += count
    return len(counts)


def session_turn(session: int, turn: int) -> bytes:
    """Turn ``turn`` of agent session ``session``: its task, then a reply and a tool output per past turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{SESSION_TASK} (session {session})"},
    ]
    for done in range(turn):
        messages.append({"role": "assistant", "content": ASSISTANT_REPLY})
        messages.append({"role": "user", "content": f"{SESSION_TOOL_OUTPUT} (output {done})"})
    return json.dumps({"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages}).encode()
