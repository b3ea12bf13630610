"""Where modeltap spends its time under the benchmark's load, from py-spy samples, by file:function.

Owns: the profile of modeltap (recording on, budget on) in front of the stand-in, sampled by
py-spy while one scenario of the overhead benchmark runs against it, one recording per scenario; the
functions ranked by own time and by total time (callees included), as a share of all samples taken on
a busy thread. Writes ``benchmarks/results/profile-modeltap.md`` (and the raw py-spy stacks beside it
with ``--keep-raw``). Not: comparing with peers (bench_overhead.py).

    .venv-bench/bin/python -m benchmarks.bench_profile [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import linecache
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import machine
from benchmarks.bodies import BodyFor, conversations, qwen_token_counter, short_turn
from benchmarks.configs import BENCH_BIN, Modeltap
from benchmarks.harness import RESULTS, log, stand_in_upstream
from benchmarks.load import Run, first_answer, run_load
from benchmarks.processes import START_TIMEOUT_S, free_port, start, wait_listening
from benchmarks.report import table

# 250 Hz resolves a sub-millisecond request path over a few thousand requests at little cost to it.
SAMPLE_RATE_HZ = 250
TOP_FUNCTIONS = 25
# py-spy writes its file on SIGINT; give it this long to do so.
PROFILER_STOP_TIMEOUT_S = 30.0
TIME_CAP_S = 60.0
QUICK_DIVISOR = 10
SETTLE_REQUESTS = 50
# py-spy needs a moment to attach; requests sent before it samples would be in the CPU time only.
PY_SPY_ATTACH_S = 1.0
# "function (path/to/file.py:123)", as py-spy's raw format writes a frame.
FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")
# An innermost line that makes one of these calls is a thread waiting, not working.
IDLE_CALL = re.compile(r"(queue\.get|_queue\.get|\.poll|\.select|\.wait|\.acquire|time\.sleep|waitpid)\(")
# Threads by a function on their stack: modeltap's record writer (a process of its own, or a thread of
# serve's with --record-writer thread), the console line's thread, and the executor that counts tokens.
THREAD_ROLES = [
    ("modeltap/records/writer_process.py:main", "record writer process"),
    ("modeltap/records/store.py:RecordStore._run", "record writer thread"),
    ("modeltap/readers/console.py:ConsoleLog._write_lines", "console line thread"),
    ("concurrent/futures/thread.py:_worker", "executor threads (token counting)"),
]


@dataclass(frozen=True)
class ProfileScenario:
    """One recording: the load applied while py-spy samples."""

    key: str
    concurrency: int
    stream: bool
    requests: int
    prompt_tokens: int | None = None  # None: the overhead benchmark's short turn

    def body_for(self) -> BodyFor:
        """The bodies this scenario sends."""
        if self.prompt_tokens is None:
            return short_turn()
        return conversations([self.prompt_tokens], qwen_token_counter())[self.prompt_tokens]


SCENARIOS = [
    ProfileScenario("c1", 1, False, 2000),
    ProfileScenario("c1_stream", 1, True, 1000),
    ProfileScenario("c64", 64, False, 6000),
    # The scale benchmark's longest conversation, where modeltap's cost per request grows most.
    ProfileScenario("c1_100k_tokens", 1, False, 300, prompt_tokens=100_000),
]


@functools.cache
def _source_line(path: str, line: int) -> str:
    # py-spy prints paths relative to the sys.path entry they were found under; modeltap runs on this
    # interpreter, so the same entries find them.
    for base in ("", *sys.path):
        candidate = Path(base) / path
        if candidate.is_file():
            return linecache.getline(str(candidate), line)
    return ""


def _parse(frame: str) -> tuple[str, bool]:
    """``file:function`` of a py-spy frame, and whether its line is a blocking wait."""
    match = FRAME.match(frame)
    if match is None:
        return frame, False
    line = int(match["line"]) if match["line"] else 0
    return f"{match['path']}:{match['function']}", bool(IDLE_CALL.search(_source_line(match["path"], line)))


LOOP_ROLE = "event loop thread"


def _thread_role(names: list[str]) -> str:
    for marker, role in THREAD_ROLES:
        if any(name.startswith(marker) for name in names):
            return role
    return LOOP_ROLE


@dataclass
class Profile:
    """py-spy samples of one scenario, idle waits left out."""

    busy: int = 0
    idle: int = 0
    own: collections.Counter[str] = field(default_factory=collections.Counter)
    total: collections.Counter[str] = field(default_factory=collections.Counter)
    roles: collections.Counter[str] = field(default_factory=collections.Counter)
    # Own time on the serving event loop alone: what the relay's process does per exchange.
    loop_own: collections.Counter[str] = field(default_factory=collections.Counter)


def rank(raw_lines: Iterable[str]) -> Profile:
    """Count py-spy's raw stacks per ``file:function``: running itself (own) or anywhere on the stack (total).

    py-spy's own idle detection counts threads blocked in C (a queue ``get``, the selector's ``poll``)
    as busy on this machine, so a sample whose innermost line is such a wait is counted as idle here.
    """
    profile = Profile()
    for raw in raw_lines:
        stack, _, count_text = raw.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count, frames = int(count_text), [_parse(f) for f in stack.split(";")]
        if frames[-1][1]:
            profile.idle += count
            continue
        names = [name for name, _ in frames]
        profile.busy += count
        profile.own[names[-1]] += count
        role = _thread_role(names)
        profile.roles[role] += count
        if role == LOOP_ROLE:
            profile.loop_own[names[-1]] += count
        for name in set(names):
            profile.total[name] += count
    return profile


def _share_table(header: str, counts: list[tuple[str, int]], busy: int) -> list[str]:
    return table(
        [header, "% of busy samples"], [[f"`{name}`", f"{100 * n / busy:.1f}"] for name, n in counts]
    )


def render_profile(key: str, profile: Profile, run: Run, cpu_s: float, wall_s: float) -> list[str]:
    """One scenario: CPU used, share per thread, top functions by own time, modeltap's by total time."""
    busy = max(profile.busy, 1)
    sent = run.completed + run.errors + run.warmups
    out = [
        f"## {key}",
        "",
        f"{sent} requests in {wall_s:.1f} s. modeltap used {cpu_s:.2f} CPU seconds: "
        f"{1000 * cpu_s / max(sent, 1):.3f} ms a request, {cpu_s / wall_s:.0%} of one core.",
        f"py-spy: {profile.busy} busy samples, {profile.idle} idle.",
        "",
    ]
    out += [*_share_table("thread", profile.roles.most_common(), busy), "", "By own time:", ""]
    out += _share_table("function", profile.own.most_common(TOP_FUNCTIONS), busy)
    out += ["", "The serving event loop alone, by own time (shares of all busy samples):", ""]
    out += _share_table("function", profile.loop_own.most_common(TOP_FUNCTIONS), busy)
    ours = [(name, n) for name, n in profile.total.most_common() if name.startswith("modeltap/")]
    out += ["", "modeltap's functions by total time (callees included):", ""]
    return [*out, *_share_table("function", ours[:TOP_FUNCTIONS], busy), ""]


async def _record(
    modeltap: Modeltap, scenario: ProfileScenario, upstream: str, workdir: Path, quick: bool
) -> str:
    """Start modeltap, run ``scenario`` against it under py-spy, stop both; the report section."""
    body_for = scenario.body_for()
    port = free_port()
    service = modeltap.launch(upstream, port, workdir)
    try:
        wait_listening(service, port, START_TIMEOUT_S)
        target = modeltap.target(upstream, port)
        if (problem := await first_answer(target, body_for(0), False, START_TIMEOUT_S)) is not None:
            raise SystemExit(f"modeltap never answered: {problem}\n{service.log_tail()}")
        body = functools.partial(body_for, stream=scenario.stream)
        # Start-up work (the first requests' token count checks, caches filling) is not what a long
        # run pays per request: it happens before py-spy attaches.
        await run_load(target, body, SETTLE_REQUESTS, 1, scenario.stream, TIME_CAP_S, warmup=0)
        # One py-spy per process: serve, and its record writer (a child process). py-spy's own
        # --subprocesses sampled serve's event loop only now and then here (a few dozen samples of a
        # busy second), so each process gets a recorder of its own.
        raws = [workdir / f"py-spy-{pid}.txt" for pid in service.tree()]
        spies = [
            start(
                f"py-spy-{raw.stem}",
                [
                    str(BENCH_BIN / "py-spy"),
                    "record",
                    "--pid",
                    raw.stem.removeprefix("py-spy-"),
                    "--rate",
                    str(SAMPLE_RATE_HZ),
                    "--format",
                    "raw",
                    "--output",
                    str(raw),
                ],
                workdir,
            )
            for raw in raws
        ]
        await asyncio.sleep(PY_SPY_ATTACH_S)
        requests = scenario.requests // QUICK_DIVISOR if quick else scenario.requests
        log(f"  profiling {scenario.key}: {requests} requests")
        began, cpu_before = time.monotonic(), service.cpu_seconds()
        run = await run_load(
            target, body, requests, scenario.concurrency, scenario.stream, TIME_CAP_S, warmup=0
        )
        cpu_s, wall_s = service.cpu_seconds() - cpu_before, time.monotonic() - began
        for spy in spies:
            spy.stop(signal.SIGINT)
    finally:
        service.stop()
    (workdir / "py-spy.txt").write_text("".join(raw.read_text() for raw in raws if raw.exists()))
    lines = (workdir / "py-spy.txt").read_text().splitlines()
    return "\n".join(render_profile(scenario.key, rank(lines), run, cpu_s, wall_s))


async def profile(quick: bool, keep_raw: Path | None, only: list[str] | None = None) -> str:
    """Each scenario under its own py-spy recording of a fresh modeltap; the markdown report."""
    modeltap = Modeltap()
    problem = modeltap.missing()
    if problem is not None:
        raise SystemExit(f"modeltap cannot run: {problem}")
    facts, load_before = machine.facts(), machine.load()
    command = shlex.join(["python", "-m", __spec__.name, *sys.argv[1:]])
    out = [
        "# Where modeltap spends its time",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `{command}`.",
        f"py-spy at {SAMPLE_RATE_HZ} Hz on `modeltap serve` (recording on, budget on, Qwen tokenizer), "
        f"modeltap {modeltap.version()}, under the overhead benchmark's short request, and under the scale",
        "benchmark's 100k-token conversation (benchmarks/bodies.py).",
        f"Machine: {facts['cpu']}, {facts['cores']} cores, {facts['kernel']}, {facts['python']}; "
        f"load {load_before['load_1m']}, {load_before['busy_percent']}% CPU busy before the run.",
        "Shares are of busy samples over all of modeltap's threads and processes (the record writer's",
        "included); idle waits are left out.",
        "",
    ]
    with (
        tempfile.TemporaryDirectory(prefix="modeltap-profile-") as tmp,
        stand_in_upstream(Path(tmp)) as upstream,
    ):
        for scenario in SCENARIOS:
            if only is not None and scenario.key not in only:
                continue
            workdir = Path(tmp) / scenario.key
            workdir.mkdir()
            out.append(await _record(modeltap, scenario, upstream, workdir, quick))
            if keep_raw is not None:
                (keep_raw / f"profile-modeltap-{scenario.key}.txt").write_text(
                    (workdir / "py-spy.txt").read_text()
                )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"1/{QUICK_DIVISOR} of the requests (a smoke run)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for profile-modeltap.md")
    parser.add_argument("--keep-raw", action="store_true", help="also keep py-spy's raw stacks there")
    parser.add_argument(
        "--only", help=f"comma-separated scenarios (default all: {', '.join(s.key for s in SCENARIOS)})"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = args.only.split(",") if args.only else None
    report = asyncio.run(profile(args.quick, args.out if args.keep_raw else None, only))
    (args.out / "profile-modeltap.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
