"""Store benchmark: what recording and reading cost as the records of a training run grow.

Owns: filling one records database through the real writer (`RecordStore.submit`, the relay's own
path) with rollouts shaped like an AReaL run's (GRPO groups of 8 samples of a task played at once,
each ~30 turns of a coding agent's tool loop: a shared system prompt and task prompt, a tool call and
its output per turn, an outcome at the end), to about 10k, 100k and 1M exchanges, keeping a copy at
each size; then, on the copies in turns (so the shared machine's other work falls on every size
alike): each reader a user runs, timed in-process (what the command does after Python has started:
`sessions --limit 50`, a filtered `sessions`, `groups`, `show` of one rollout, and the viewer's list
call and live poll through its HTTP API), the writer's exchanges per second on each, and the bytes
per exchange. Writes `benchmarks/results/store.md` and `store.json`. Not: the relay's overhead
(bench_overhead.py).

    .venv/bin/python -m benchmarks.bench_store [--quick] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from benchmarks.report import fmt, heading, table, verdict
from modeltap.readers.sessions import groups_table, sessions_table
from modeltap.readers.show import session_turns
from modeltap.readers.ui import viewer_app
from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.query import SessionQuery
from modeltap.records.store import RecordStore
from modeltap.records.stores import Stores

RESULTS = Path(__file__).resolve().parent / "results"
# A GRPO group: this many samples of one task, their turns interleaved as AReaL plays them at once.
GROUP = 8
TURNS = 30
# Tasks in the dataset: `groups` prints one line each, and every size holds them all.
TASKS = 40
AGENTS = ("opencode", "claude-code")
EXCHANGES_PER_GROUP = GROUP * TURNS
# Each size is reached at a group's end; the numbers are then 10,080, 100,080 and 1,000,080 exchanges.
SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (2_000, 20_000)
# The writer's rate is measured over this many groups (10,080 exchanges) written into each size.
WINDOW_GROUPS = 42
# Each reader runs this many times at each size (after one warm-up run); the median is reported.
REPEATS = 15
# The goals: at 1M, each reader within 1.5x its 10k time, and the writer at 0.8x its 10k rate or better.
GOAL_READ_RATIO = 1.5
GOAL_WRITE_RATIO = 0.8
# A run in the recent past: group g starts at g minutes after this, its turns two seconds apart.
START = 1_750_000_000.0
GROUP_GAP_S = 60.0
TURN_GAP_S = 2.0
MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"
SYSTEM = {
    "role": "system",
    "content": "You are opencode, an interactive CLI coding agent. Use the tools to read, edit and test "
    "code in the working directory; keep answers short; run the tests before you finish. " * 6,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} files in the repository",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    for name in ("bash", "read", "edit", "grep")
]
OUTCOMES: list[tuple[str, float | None]] = [
    ("scored", 1.0), ("scored", 1.0), ("scored", 0.5), ("scored", 0.0), ("scored", 0.0), ("scored", 1.0),
    ("failed", None), ("model_fault", 0.0), ("unscored", None), ("timed_out", None), ("cancelled", None),
]  # fmt: skip
LOG_TAIL = "== opencode (run) ==\n" + "collected 12 items\n....F.......\nFAILED tests/test_parse.py\n" * 8


@dataclass(frozen=True, slots=True)
class Snippets:
    """Tool output to draw from: a pool of source-like lines, so bodies look like an agent's."""

    pool: tuple[str, ...]

    @classmethod
    def make(cls, seed: int = 1) -> Snippets:
        rng = random.Random(seed)
        words = "def return self value parse token node index result error if else for in while".split()
        lines = [" ".join(rng.choice(words) for _ in range(rng.randrange(4, 12))) for _ in range(400)]
        return cls(tuple("\n".join(rng.sample(lines, 8)) for _ in range(512)))


def group_records(group: int, snippets: Snippets) -> Iterator[Exchange | SessionEvent]:
    """One GRPO group's records in the order the proxy sees them: its sessions opening, their turns
    interleaved, then each one's outcome."""
    task = f"task-{group % TASKS:03d}"
    agent = AGENTS[group % len(AGENTS)]
    started = START + group * GROUP_GAP_S
    ids = [f"s-{group:06d}-{sample}" for sample in range(GROUP)]
    labels = [
        {"task_id": task, "agent": agent, "run": sid, "areal_session": f"{zlib.crc32(sid.encode()):08x}"}
        for sid in ids
    ]
    histories: list[list[dict[str, Any]]] = []
    for sid, label in zip(ids, labels, strict=True):
        yield SessionEvent("opened", sid, label, "http://areal:8000", at=started)
        histories.append([SYSTEM, {"role": "user", "content": f"Fix the failing test of {task}. " * 3}])
    for turn in range(TURNS):
        for sample, sid in enumerate(ids):
            yield _turn(sid, labels[sample], histories[sample], turn, started + turn * TURN_GAP_S, snippets)
    rng = random.Random(group)
    for sid, label in zip(ids, labels, strict=True):
        kind, reward = rng.choice(OUTCOMES)
        outcome = RolloutOutcome(kind, reward, (reward,) if reward is not None else (), 61.5, 0, LOG_TAIL)  # type: ignore[arg-type]
        yield SessionEvent("outcome", sid, label, at=started + TURNS * TURN_GAP_S, outcome=outcome)


def _turn(
    sid: str, labels: dict[str, str], history: list[dict[str, Any]], turn: int, at: float, snippets: Snippets
) -> Exchange:
    """One turn: the request with the session's history so far, and the model's tool call (its final
    answer on the last turn); the tool's output joins the history for the next turn."""
    last = turn == TURNS - 1
    call = {
        "id": f"call_{sid}_{turn}",
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": f"pytest -q tests/test_{turn}.py"})},
    }
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "Done: the parser handles it." if last else None,
    }
    if not last:
        message["tool_calls"] = [call]
    request = {"model": MODEL, "messages": list(history), "tools": TOOLS, "temperature": 1.0}
    response = {
        "id": f"chatcmpl-{sid}-{turn}",
        "object": "chat.completion",
        "created": int(at),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop" if last else "tool_calls"}],
        "usage": {"prompt_tokens": 600 + 180 * turn, "completion_tokens": 40},
    }
    history.append(message)
    output = f"[{sid} {turn}]\n" + snippets.pool[zlib.crc32(f"{sid} {turn}".encode()) % len(snippets.pool)]
    history.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return Exchange(
        method="POST",
        path="/s/…/v1/chat/completions",
        endpoint="chat",
        session_id=sid,
        labels=labels,
        started=at,
        first_byte=at + 0.8,
        ended=at + 1.1,
        upstream_url="http://areal:8000/chat/completions",
        status=200,
        request_json=request,
        response=response,
        user_agent="opencode/1.0.0",
    )


async def fill(path: Path, first_group: int, last_group: int, snippets: Snippets) -> None:
    """Write groups `first_group` to `last_group` (not included) through one RecordStore."""
    store = RecordStore(path)
    store.start()
    for group in range(first_group, last_group):
        await _write_group(store, group, snippets)
    await store.close()


async def _write_group(store: RecordStore, group: int, snippets: Snippets) -> None:
    """One group's records, in order; returns once its last exchange is committed."""
    records = list(group_records(group, snippets))
    final = max(n for n, record in enumerate(records) if isinstance(record, Exchange))
    for n, record in enumerate(records):
        if isinstance(record, SessionEvent):
            store.on_session(record)
        else:
            await store.submit(record, wait=n == final)


def list_sessions(path: Path, query: SessionQuery) -> str:
    """What `modeltap sessions` does after parsing its arguments."""
    with Stores.open([str(path)]) as stores:
        return sessions_table(stores.sessions(query), with_store=stores.several)


def list_groups(path: Path) -> str:
    with Stores.open([str(path)]) as stores:
        return groups_table(stores.groups("task_id"))


def show(path: Path, session: str) -> str:
    with Stores.open([str(path)]) as stores:
        reader, found = stores.resolve(session)
        return session_turns(found, reader.exchanges(found), reader.session(found))


Reader = Callable[[], Any]


async def readers(path: Path, groups: int, client: TestClient) -> dict[str, Reader]:
    """The readers to time on the store at `path` (holding `groups` groups, served by `client`)."""
    middle = f"s-{groups // 2:06d}-3"
    filtered = SessionQuery(labels=(("agent", AGENTS[0]),), outcome="scored", since=START, limit=50)
    first = await (await client.get("/api/sessions", params={"limit": "50"})).json()
    since = json.dumps(first["revisions"])

    async def page() -> None:
        assert (await client.get("/api/sessions", params={"limit": "50"})).status == 200

    async def poll() -> None:
        assert (await client.get("/api/sessions", params={"limit": "50", "since": since})).status == 200

    return {
        "sessions --limit 50": lambda: list_sessions(path, SessionQuery(limit=50)),
        "sessions --label agent=opencode --outcome scored --since T": lambda: list_sessions(path, filtered),
        "groups": lambda: list_groups(path),
        f"show (one {TURNS}-turn rollout)": lambda: show(path, middle),
        "viewer: list page (GET /api/sessions)": page,
        "viewer: live poll, nothing changed": poll,
    }


async def time_readers(stores: dict[int, Path]) -> dict[int, dict[str, dict[str, float]]]:
    """Each reader's median CPU and wall milliseconds on each store, the stores taking turns run by run
    so that the machine's other work falls on every size alike."""
    async with contextlib.AsyncExitStack() as stack:
        runs: dict[int, dict[str, Reader]] = {}
        for groups, path in stores.items():
            client = await stack.enter_async_context(TestClient(TestServer(viewer_app(path))))
            runs[groups] = await readers(path, groups, client)
        samples: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for name in runs[next(iter(runs))]:
            for repeat in range(REPEATS + 1):  # the first run of each warms up
                for groups, named in runs.items():
                    spent = await _timed(named[name])
                    if repeat:
                        samples.setdefault((groups, name), []).append(spent)
    return {
        groups: {
            name: {
                "cpu": statistics.median(cpu for cpu, _ in samples[(groups, name)]),
                "wall": statistics.median(wall for _, wall in samples[(groups, name)]),
            }
            for name in named
        }
        for groups, named in runs.items()
    }


async def _timed(fn: Reader) -> tuple[float, float]:
    """Milliseconds of the process's CPU time and of wall time that `fn` takes (awaited if need be)."""
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    result = fn()
    if inspect.isawaitable(result):
        await result
    return (time.process_time() - start_cpu) * 1000, (time.perf_counter() - start_wall) * 1000


async def time_writers(stores: dict[int, Path], snippets: Snippets) -> dict[int, dict[str, float]]:
    """The writer's exchanges per CPU second and per second on a copy of each store: the same
    WINDOW_GROUPS groups (new to every store) written into each, the stores taking turns group by
    group, each group timed from an idle writer to its last exchange's commit."""
    spent = {groups: [0.0, 0.0] for groups in stores}
    async with contextlib.AsyncExitStack() as stack:
        writers = {}
        for groups, path in stores.items():
            scratch = path.with_name(f"writing-{path.name}")
            _copy(path, scratch)
            stack.callback(scratch.unlink)
            writers[groups] = RecordStore(scratch)
            writers[groups].start()
            stack.push_async_callback(writers[groups].close)
        first = max(stores)
        for group in range(first, first + WINDOW_GROUPS):
            for groups, store in writers.items():
                start_cpu, start_wall = time.process_time(), time.perf_counter()
                await _write_group(store, group, snippets)
                spent[groups][0] += time.process_time() - start_cpu
                spent[groups][1] += time.perf_counter() - start_wall
    exchanges = WINDOW_GROUPS * EXCHANGES_PER_GROUP
    return {
        groups: {"per_cpu_s": exchanges / cpu, "per_s": exchanges / wall}
        for groups, (cpu, wall) in spent.items()
    }


async def run(sizes: tuple[int, ...], directory: Path) -> list[dict[str, Any]]:
    """Grow one store to each size, keeping a copy at each (or take the copies an earlier run kept in
    `directory`); then time the readers and the writer on them, in turns."""
    snippets = Snippets.make()
    path = directory / "records.db"
    counts = [-(-size // EXCHANGES_PER_GROUP) for size in sizes]  # up to the group that reaches each size
    stores = {groups: directory / f"records-{groups * EXCHANGES_PER_GROUP}.db" for groups in counts}
    if all(kept.exists() for kept in stores.values()):
        print(f"taking the stores an earlier run kept in {directory}", file=sys.stderr)
    else:
        done = 0
        for groups, kept in stores.items():
            await fill(path, done, groups, snippets)
            done = groups
            _copy(path, kept)  # closed: its log is checkpointed into the file
            print(f"{groups * EXCHANGES_PER_GROUP:>9,} exchanges written", file=sys.stderr)
        path.unlink()
    stored = {groups: copy.stat().st_size for groups, copy in stores.items()}
    reading = await time_readers(stores)
    writing = await time_writers(stores, snippets)
    return [
        {
            "exchanges": groups * EXCHANGES_PER_GROUP,
            "sessions": groups * GROUP,
            "writer_per_s": writing[groups]["per_s"],
            "writer_per_cpu_s": writing[groups]["per_cpu_s"],
            "bytes_per_exchange": stored[groups] / (groups * EXCHANGES_PER_GROUP),
            "file_bytes": stored[groups],
            "readers_ms": reading[groups],
        }
        for groups in stores
    ]


def _copy(source: Path, target: Path) -> None:
    """Copy a closed store and put the copy on disk, so no timed write waits for the copy's pages."""
    shutil.copyfile(source, target)
    with target.open("rb+") as copy:
        os.fsync(copy.fileno())


def report(results: list[dict[str, Any]], command: str, quick: bool) -> str:
    first, last = results[0], results[-1]
    sizes = [f"{r['exchanges']:,}" for r in results]
    lines = [
        *heading("Store: recording and reading as the records grow", command, quick),
        "",
        f"One store grows through the real writer to each size, a copy kept at each: GRPO groups of {GROUP}",
        f"samples of one of {TASKS} tasks played at once, each a {TURNS}-turn tool loop of a coding agent (a",
        "shared system prompt and task prompt, a bash call and ~400 bytes of its output per turn), then each",
        "sample's outcome. Then, on the copies taking turns run by run (so the machine's other work falls on",
        "every size alike), each reader is timed in-process as the command runs after Python has started",
        f"(opening the store, the query, the text it prints; median of {REPEATS} runs, warm page cache), and",
        f"the writer writes the same {WINDOW_GROUPS * EXCHANGES_PER_GROUP:,} new exchanges into each, group",
        "by group. Times are milliseconds of the process's CPU time, wall time in brackets; the machine is",
        "shared, and CPU time is what its other work barely moves, so the goals are judged on it.",
        "",
    ]
    rows = []
    for name in first["readers_ms"]:
        values = [r["readers_ms"][name] for r in results]
        ratio = values[-1]["cpu"] / values[0]["cpu"]
        cells = [f"{fmt(v['cpu'])} ({fmt(v['wall'])})" for v in values]
        rows.append([f"`{name}`", *cells, f"{ratio:.2f}x", verdict(ratio <= GOAL_READ_RATIO)])
    write_ratio = last["writer_per_cpu_s"] / first["writer_per_cpu_s"]
    rates = [f"{r['writer_per_cpu_s']:,.0f} ({r['writer_per_s']:,.0f})" for r in results]
    met = verdict(write_ratio >= GOAL_WRITE_RATIO)
    rows.append(["writer: exchanges per CPU second (per second)", *rates, f"{write_ratio:.2f}x", met])
    rows.append(["stored bytes per exchange", *(f"{r['bytes_per_exchange']:,.0f}" for r in results), "", ""])
    lines += table(["", *sizes, "last / first", "goal"], rows)
    lines += [
        "",
        f"Goals: every reader at the largest size within {GOAL_READ_RATIO:g}x its time at the smallest, and",
        f"the writer's rate at least {GOAL_WRITE_RATIO:g}x. The filtered listing combines a label, an",
        "outcome and a time and prints 50 rows at every size; `groups` one line per task at every size.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small stores: a smoke test")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep the stores in this directory (and take them from it, if a run kept them)",
    )
    # `make bench` passes BENCH_ARGS to every benchmark; those meant for the others (--only) do not apply.
    args, _ = parser.parse_known_args()
    sizes = QUICK_SIZES if args.quick else SIZES
    with tempfile.TemporaryDirectory(prefix="modeltap-bench-store-") as scratch:
        directory = args.keep or Path(scratch)
        directory.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(run(sizes, directory))
    command = "python -m benchmarks.bench_store" + (" --quick" if args.quick else "")
    text = report(results, command, args.quick)
    print(text)
    if not args.quick:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "store.md").write_text(text)
        (RESULTS / "store.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
