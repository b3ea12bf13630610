"""What translation costs: a stream modeltap translates against one it relays as it is.

Owns: the translation run of ``make bench``: one ``modeltap serve --layout chat-only`` (recording on,
budget on) in front of the stand-in upstream, which serves chat only; the same short turn sent as
OpenAI chat (relayed as it is) and as Anthropic Messages (translated to chat and back, chunk by chunk),
streamed and not, at concurrency 1, interleaved in rounds; direct chat to the stand-in as the
baseline. Reported: latency, time to first byte and modeltap's CPU time per request, what
translation adds over the untranslated exchange through the same proxy, and the goals: translation
adds under 0.3 ms at c=1 (judged on CPU time per request, which other work on a shared machine hardly
moves, and shown on p50 latency too), and it never buffers a stream (a translated stream's first byte
comes before the stand-in has even sent its later chunks, STREAM_CONTENT_CHUNKS - 1 gaps apart).
Written to ``benchmarks/results/translation.{md,json}``.

    .venv-bench/bin/python -m benchmarks.bench_translation [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
from pathlib import Path
from typing import Any

from benchmarks.bodies import SYSTEM_PROMPT, short_turn
from benchmarks.configs import Direct, Modeltap
from benchmarks.harness import RESULTS, Running, log, run_configs, with_proxy_cpu
from benchmarks.load import Run, Target, run_load
from benchmarks.processes import HOST
from benchmarks.report import fmt, preamble, table
from benchmarks.stand_in import MODEL, STREAM_CONTENT_CHUNKS, STREAM_GAP_S

REQUESTS = 500
QUICK_DIVISOR = 10
ROUNDS = 3
# Per scenario and round: a cap on time, so a broken configuration still stops.
TIME_CAP_S = 20.0
# The goals set for translation: it adds under 0.3 ms at c=1, and never buffers a stream.
ADDED_GOAL_MS = 0.3
PROMPT_WORDS = 200
MESSAGES_STREAM_END = b"event: message_stop"


class ModeltapChatOnly(Modeltap):
    name, description = "modeltap", "modeltap serve --layout chat-only, recording on, budget on"

    def argv(self, upstream: str, port: int, workdir: Path) -> list[str]:
        return [*super().argv(upstream, port, workdir), "--layout", "chat-only"]


def messages_body_for(index: int, stream: bool = False) -> bytes:
    """The short turn as an Anthropic Messages request (its system prompt in `system`)."""
    words = " ".join(f"word{n % 97}" for n in range(PROMPT_WORDS))
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "system": SYSTEM_PROMPT,
        "messages": [{"role": "user", "content": f"{words} {index}"}],
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


def routes(running: Running) -> dict[str, tuple[Target, Any]]:
    """The exchanges sent to one configuration: route name -> (target, body_for)."""
    chat = running.started.target
    if running.config.name == "direct":
        return {"chat": (chat, short_turn(PROMPT_WORDS))}
    base = chat.url.removesuffix("/v1/chat/completions")
    assert base.startswith(f"http://{HOST}:")
    messages = Target(base + "/v1/messages", stream_end=MESSAGES_STREAM_END)
    return {"chat": (chat, short_turn(PROMPT_WORDS)), "messages (translated)": (messages, messages_body_for)}


async def measure(running: list[Running], quick: bool, results: dict[str, Any]) -> None:
    rounds = 1 if quick else ROUNDS
    requests = REQUESTS // (QUICK_DIVISOR if quick else rounds)
    runs: dict[tuple[str, str, bool], Run] = {}
    for round_index in range(rounds):
        for stream in (False, True):
            for r in running:
                for route, (target, body_for) in routes(r).items():
                    log(f"  round {round_index + 1}/{rounds} {r.config.name} {route} stream={stream}")
                    body = functools.partial(body_for, stream=stream)
                    load = run_load(target, body, requests, 1, stream, TIME_CAP_S)
                    run = await with_proxy_cpu(r.started, load)
                    runs.setdefault((r.config.name, route, stream), Run()).merge(run)
    results["runs"] = [
        {"config": name, "route": route, "stream": stream, **run.summary()}
        for (name, route, stream), run in runs.items()
    ]


def _value(results: dict[str, Any], config: str, route: str, stream: bool, key: str) -> float | None:
    for row in results["runs"]:
        if (row["config"], row["route"], row["stream"]) == (config, route, stream):
            value = row.get(key)
            return None if value is None else float(value)
    return None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The translation goals, each with the numbers it was judged on."""
    translated, relayed = "messages (translated)", "chat"
    checks = []
    for stream in (False, True):
        label = "streamed" if stream else "non-streamed"
        for key, what in (("cpu_ms_per_request", "modeltap CPU per request"), ("p50_ms", "p50 latency")):
            added = _minus(
                _value(results, "modeltap", translated, stream, key),
                _value(results, "modeltap", relayed, stream, key),
            )
            checks.append(
                {
                    "goal": f"translation adds under {ADDED_GOAL_MS} ms of {what} at c=1 ({label})",
                    "value": added,
                    "limit": ADDED_GOAL_MS,
                }
            )
    gaps_ms = round((STREAM_CONTENT_CHUNKS - 1) * STREAM_GAP_S * 1000, 3)
    total = _value(results, "modeltap", translated, True, "p50_ms")
    checks.append(
        {
            "goal": "no buffering: a translated stream's first byte (p50) comes at least the stand-in's "
            f"{gaps_ms:g} ms of chunk gaps before its end (p50): the limit is the end less the gaps",
            "value": _value(results, "modeltap", translated, True, "ttfb_p50_ms"),
            "limit": None if total is None else round(total - gaps_ms, 3),
        }
    )
    for check in checks:
        check["met"] = (
            None if check["value"] is None or check["limit"] is None else check["value"] <= check["limit"]
        )
    return checks


COLUMNS = [
    ("p50", "p50_ms"),
    ("p99", "p99_ms"),
    ("TTFB p50", "ttfb_p50_ms"),
    ("TTFB p99", "ttfb_p99_ms"),
    ("proxy CPU / request", "cpu_ms_per_request"),
]


def report(results: dict[str, Any]) -> str:
    lines = preamble(results, "Translation: a translated stream against an untranslated one")
    rows = [
        [row["config"], row["route"], "yes" if row["stream"] else "no", str(row.get("requests", "—"))]
        + [fmt(None if row.get(key) is None else float(row[key]), 3) for _, key in COLUMNS]
        for row in results["runs"]
    ]
    lines += ["", "## Latency at c=1 (ms)", ""]
    lines += table(["config", "route", "streamed", "requests", *[h for h, _ in COLUMNS]], rows)
    lines += ["", "## Goals", ""]
    met = {True: "yes", False: "**no**", None: "not measured"}
    lines += table(
        ["goal", "measured (ms)", "limit (ms)", "met"],
        [[g["goal"], fmt(g["value"], 3), fmt(g["limit"], 1), met[g["met"]]] for g in results["goals"]],
    )
    return "\n".join(lines) + "\n"


async def run_all(quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {}
    probe = short_turn(PROMPT_WORDS)(0)
    ran = await run_configs(
        __spec__.name, [Direct(), ModeltapChatOnly()], quick, probe, lambda r: measure(r, quick, results)
    )
    ran.update(results)
    ran["goals"] = goals(ran)
    return ran


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the requests, one round")
    args = parser.parse_args()
    results = asyncio.run(run_all(args.quick))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "translation.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "translation.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
