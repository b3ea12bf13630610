"""What `serve --token-ids` costs, per exchange, and what its records cost on disk.

Owns: the token-ids run of ``make bench``, written to ``benchmarks/results/token_ids.{md,json}``:

- ``modeltap`` and ``modeltap-ids`` (the same with ``--token-ids --engine vllm``) side by side in front
  of the stand-in, which answers with vLLM's ids when asked: p50/p99 latency and the proxy's CPU per
  request, non-streamed and streamed, for a short turn and a ~20k-token turn; the difference is the
  added cost of asking for, extracting, checking and storing the ids;
- the bytes the client receives more per exchange (the ids modeltap leaves in the answer), and what
  stripping them would cost instead: one ``json.loads`` and ``json.dumps`` per chunk or body, timed in
  this process on the same answers (docs/token-ids.md §2 decides between the two);
- a 50-turn session that grows to ~20k ids, written through the real record writer: the stored ids
  against the session's final length and against the sum of its turns.

Not: the proxies' overhead side by side (bench_overhead.py).

    .venv-bench/bin/python -m benchmarks.bench_token_ids [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.bodies import conversations, qwen_token_counter, short_turn
from benchmarks.configs import Modeltap, ModeltapTokenIds
from benchmarks.harness import RESULTS, Running, log, run_configs, with_proxy_cpu
from benchmarks.load import Run, run_load
from benchmarks.report import fmt, preamble, table
from modeltap.records.exchange import Exchange
from modeltap.records.reader import StoreReader
from modeltap.records.store import RecordStore

TIME_CAP_S = 30.0
QUICK_DIVISOR = 10
# (key, body, streamed, requests): a short turn as in bench_overhead, and a long agent turn.
LONG_TOKENS = 20_000
SHORT_REQUESTS = 400
LONG_REQUESTS = 100
# Rounds the requests are split over, the order of the two configurations alternating.
ROUNDS = 2
# Times each in-process timing is repeated; the median is reported.
TIMING_REPEATS = 5
# The stored session: turns, ids each turn adds (a tool output) and each completion.
SESSION_TURNS = 50
NEW_IDS_PER_TURN = 360
COMPLETION_IDS = 40


async def measure(running: list[Running], quick: bool, bodies: dict[str, Any]) -> None:
    runs: dict[tuple[str, str], Run] = {}
    for round_index in range(1 if quick else ROUNDS):
        order = running if round_index % 2 == 0 else running[::-1]
        for key, (body_for, stream, requests) in bodies.items():
            count = max(requests // (QUICK_DIVISOR if quick else ROUNDS), 5)
            for r in order:
                log(f"  round {round_index + 1} {key} {r.config.name}: {count} requests")
                body = functools.partial(body_for, stream=stream)
                load = run_load(r.started.target, body, count, 1, stream, TIME_CAP_S)
                runs.setdefault((r.config.name, key), Run()).merge(await with_proxy_cpu(r.started, load))
    for r in running:
        mine = {key: run for (name, key), run in runs.items() if name == r.config.name}
        r.row["scenarios"] = {key: run.summary() for key, run in mine.items()}
        r.row["answer_bytes"] = {
            key: await answer_bytes(r.started.target.url, body_for(0, stream=stream))
            for key, (body_for, stream, _) in bodies.items()
        }


async def answer_bytes(url: str, body: bytes) -> int:
    """The bytes of one answer as the client receives them."""
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
        answer = await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {answer[:200]!r}")
        return len(answer)


def strip_cost(long_body: bytes) -> dict[str, float]:
    """Milliseconds to take vLLM's id fields out of one answer, the alternative to forwarding them:
    parse, delete and serialise the body, or each chunk of the stream, as a stripping relay would."""
    prompt = list(long_body[::4])
    body = {
        "id": "chatcmpl-bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "token_ids": [1] * 9}],
        "prompt_token_ids": prompt,
    }
    raw_body = json.dumps(body).encode()
    choices = [{"index": 0, "delta": {"content": "x"}, "token_ids": [1]}]
    chunks = [json.dumps({"choices": choices}).encode()] * 8
    chunks[0] = json.dumps({"choices": choices, "prompt_token_ids": prompt}).encode()

    def strip(raw: bytes) -> bytes:
        doc = json.loads(raw)
        doc.pop("prompt_token_ids", None)
        for choice in doc.get("choices", []):
            choice.pop("token_ids", None)
        return json.dumps(doc).encode()

    return {
        "body_ms": _median_ms(lambda: strip(raw_body)),
        "stream_ms": _median_ms(lambda: [strip(chunk) for chunk in chunks]),
        "prompt_ids": len(prompt),
    }


def _median_ms(action: Any) -> float:
    times = []
    for _ in range(TIMING_REPEATS):
        begun = time.perf_counter()
        action()
        times.append(time.perf_counter() - begun)
    return round(sorted(times)[len(times) // 2] * 1000, 3)


async def stored_session(workdir: Path) -> dict[str, Any]:
    """A 50-turn session whose prompt grows to ~20k ids, recorded by the real writer."""
    rng = random.Random(7)
    prompt = [rng.randrange(150_000) for _ in range(NEW_IDS_PER_TURN)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    store = RecordStore(workdir / "session.db")
    store.start()
    summed = 0
    for turn in range(SESSION_TURNS):
        completion = [rng.randrange(150_000) for _ in range(COMPLETION_IDS)]
        reply = {"role": "assistant", "content": f"reply {turn}"}
        response = {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop", "token_ids": completion}],
            "prompt_token_ids": prompt,
        }
        body = {"model": "m", "messages": list(messages)}
        await store.submit(
            Exchange(
                endpoint="chat",
                path="/v1/chat/completions",
                session_id="long",
                request=json.dumps(body).encode(),
                request_json=body,
                response=response,
                status=200,
            )
        )
        summed += len(prompt) + len(completion)
        prompt = prompt + completion + [rng.randrange(150_000) for _ in range(NEW_IDS_PER_TURN)]
        messages += [reply, {"role": "user", "content": f"tool output {turn}"}]
    await store.close()
    with StoreReader(workdir / "session.db") as reader:
        sizes = reader.size_bytes()
        [last] = reader.token_turns("long")[-1:]
    final = last["prompt_length"] + last["completion_length"]
    return {"turns": SESSION_TURNS, "final_ids": final, "summed_ids": summed, "bytes": sizes}


async def run(quick: bool) -> dict[str, Any]:
    long_body = conversations([LONG_TOKENS], qwen_token_counter())[LONG_TOKENS]
    bodies = {
        "short": (short_turn(), False, SHORT_REQUESTS),
        "short_stream": (short_turn(), True, SHORT_REQUESTS),
        "long": (long_body, False, LONG_REQUESTS),
        "long_stream": (long_body, True, LONG_REQUESTS),
    }
    results = await run_configs(
        __spec__.name,
        [Modeltap(), ModeltapTokenIds()],
        quick,
        short_turn()(0),
        functools.partial(measure, quick=quick, bodies=bodies),
    )
    results["strip"] = strip_cost(long_body(0))
    with tempfile.TemporaryDirectory(prefix="modeltap-bench-ids-") as tmp:
        results["storage"] = await stored_session(Path(tmp))
    return results


def report(results: dict[str, Any]) -> str:
    lines = preamble(results, "modeltap: the cost of serve --token-ids")
    rows = {row["name"]: row for row in results["configs"] if row.get("scenarios")}
    plain, ids = rows.get("modeltap"), rows.get("modeltap-ids")
    if plain is None or ids is None:
        return "\n".join([*lines, "", "One of the two configurations did not run."])
    lines += ["", "## Per exchange, one at a time (c=1)", ""]
    header = ["turn", "p50 plain", "p50 ids", "added p50", "p99 plain", "p99 ids",
              "CPU ms plain", "CPU ms ids", "answer bytes plain", "answer bytes ids"]  # fmt: skip
    body = []
    for key, a in plain["scenarios"].items():
        b = ids["scenarios"][key]
        added = None if a["p50_ms"] is None or b["p50_ms"] is None else b["p50_ms"] - a["p50_ms"]
        body.append([
            key, fmt(a["p50_ms"]), fmt(b["p50_ms"]), fmt(added), fmt(a["p99_ms"]), fmt(b["p99_ms"]),
            fmt(a["cpu_ms_per_request"]), fmt(b["cpu_ms_per_request"]),
            str(plain["answer_bytes"][key]), str(ids["answer_bytes"][key]),
        ])  # fmt: skip
    lines += table(header, body)
    strip = results["strip"]
    lines += [
        "",
        f"Stripping the ids instead (parse, delete, serialise; in process): {strip['body_ms']} ms for the "
        f"non-streamed answer to the long turn ({strip['prompt_ids']} prompt ids), "
        f"{strip['stream_ms']} ms for its stream's chunks.",
    ]
    storage = results["storage"]
    sizes, final, summed = storage["bytes"], storage["final_ids"], storage["summed_ids"]
    lines += [
        "",
        "## A growing session on disk",
        "",
        f"{storage['turns']} turns growing to {final} ids ({summed} ids over all turns' prompts and "
        f"completions): {sizes['token_ids']} bytes of ids, {sizes['token_ids'] / (4 * final):.2f}x the final "
        f"sequence as 4-byte ids, {sizes['token_ids'] / (4 * summed):.3f}x the turns' ids stored whole; the "
        f"whole store (requests, responses, message blobs and ids) {sizes['total']} bytes.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests, one round")
    args = parser.parse_args()
    results = asyncio.run(run(args.quick))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "token_ids.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "token_ids.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
