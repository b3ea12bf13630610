"""What `serve --tokens exact` costs per turn against `--tokens observe`, at 2k and 60k tokens of history.

Owns: the exact-mode run of ``make bench``, written to ``benchmarks/results/exact.{md,json}``.
``modeltap-ids`` (``--token-ids``: the engine's chat route renders and tokenizes, modeltap asks for and
records its ids) and ``modeltap-exact`` (``--tokens exact``: modeltap builds the prompt's ids from the
previous turn's, sends them to ``/v1/completions`` and parses the generated ids back into a message)
run side by side in front of the stand-in, both with the Qwen3 tokenizer and the budget on. Each sends
one agent session whose history is cut at 2k and at 60k tokens, then grows a turn at a time (the
model's reply echoed, a new user message): the latency and the proxy's CPU per turn, after the
session's first turn, non-streamed and streamed. The stand-in's engine costs nothing; a real one
tokenizes the chat request (observe mode) where exact mode sends ids.

In observe mode the stand-in's prompt ids are made of the request's bytes, so each turn also finds a
break (a real agent's session finds none): its cost is the continuity check's at its worst.

    .venv-bench/bin/python -m benchmarks.bench_exact [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from benchmarks.bodies import MAX_TOKENS, STREAM_FIELDS, conversation_messages, qwen_token_counter
from benchmarks.configs import ModeltapExact, ModeltapTokenIds
from benchmarks.harness import RESULTS, Running, log, run_configs, with_proxy_cpu
from benchmarks.load import Run, run_load
from benchmarks.report import fmt, preamble, table
from benchmarks.stand_in import CONTENT_MARKER, MODEL

SIZES = (2_000, 60_000)
TURNS = 40
QUICK_TURNS = 6
TIME_CAP_S = 120.0


def session(history: list[dict[str, Any]], salt: str) -> Any:
    """``body_for(i, stream)``: turn ``i`` of a session on ``history``: each earlier turn's reply (the
    marker, as both modes answer it) and a user message after it. Warm-ups (``i < 0``) are sessions of
    their own."""

    def body_for(index: int, stream: bool = False) -> bytes:
        messages = [*history, {"role": "user", "content": f"Go on ({salt} {min(index, 0)})."}]
        for turn in range(max(index, 0)):
            messages += [
                {"role": "assistant", "content": CONTENT_MARKER},
                {"role": "user", "content": f"Go on ({salt} {turn + 1})."},
            ]
        raw = json.dumps({"model": MODEL, "max_tokens": MAX_TOKENS, "messages": messages}).encode()
        return raw[:-1] + STREAM_FIELDS if stream else raw

    return body_for


async def measure(running: list[Running], quick: bool) -> None:
    histories = conversation_messages(list(SIZES), qwen_token_counter())
    turns = QUICK_TURNS if quick else TURNS
    for r in running:
        r.row["scenarios"] = {}
    for stream in (False, True):
        for size in SIZES:
            for n, r in enumerate(running):
                key = f"{size // 1000}k{' streamed' if stream else ''}"
                log(f"  {key} {r.config.name}: {turns} turns")
                body_for = session(histories[size], f"{r.config.name}-{key}-{n}")
                # The session's first turn renders the whole history in both modes: it is the warm-up.
                load = run_load(
                    r.started.target,
                    lambda i, b=body_for, s=stream: b(i + 1, s),
                    turns,
                    1,
                    stream,
                    TIME_CAP_S,
                    warmup=0,
                )
                first = run_load(
                    r.started.target,
                    lambda i, b=body_for, s=stream: b(0, s),
                    1,
                    1,
                    stream,
                    TIME_CAP_S,
                    warmup=0,
                )
                await first
                run: Run = await with_proxy_cpu(r.started, load)
                r.row["scenarios"][key] = run.summary()


async def run(quick: bool) -> dict[str, Any]:
    return await run_configs(
        __spec__.name,
        [ModeltapTokenIds(), ModeltapExact()],
        quick,
        session([{"role": "system", "content": "probe"}], "probe")(0),
        lambda running: measure(running, quick),
    )


def report(results: dict[str, Any]) -> str:
    lines = preamble(results, "modeltap: what serve --tokens exact costs per turn, against --tokens observe")
    rows = {row["name"]: row for row in results["configs"] if row.get("scenarios")}
    observe, exact = rows.get("modeltap-ids"), rows.get("modeltap-exact")
    if observe is None or exact is None:
        return "\n".join([*lines, "", "One of the two configurations did not run."])
    lines += ["", "## Per turn, after the session's first (c=1)", ""]
    header = [
        "history",
        "p50 observe",
        "p50 exact",
        "exact ÷ observe",
        "CPU ms observe",
        "CPU ms exact",
        "CPU exact ÷ observe",
    ]
    body = []
    for key, a in observe["scenarios"].items():
        b = exact["scenarios"][key]
        ratio = None if not a["p50_ms"] or b["p50_ms"] is None else b["p50_ms"] / a["p50_ms"]
        cpu_a, cpu_b = a["cpu_ms_per_request"], b["cpu_ms_per_request"]
        cpu_ratio = None if not cpu_a or cpu_b is None else cpu_b / cpu_a
        body.append(
            [key, fmt(a["p50_ms"]), fmt(b["p50_ms"]), fmt(ratio), fmt(cpu_a), fmt(cpu_b), fmt(cpu_ratio)]
        )
    lines += table(header, body)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few turns per session")
    args = parser.parse_args()
    results = asyncio.run(run(args.quick))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "exact.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "exact.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
