"""The bounded sessions load test: N agents, each on a session of its own, streaming M chat
completions one after another through `modeltap serve`, all at once, in front of the benchmark stand-in.

Owns: opening the sessions through the admin API, driving the agents, checking every answer (status
200, the stand-in's content, `data: [DONE]` at the end), and comparing the record store against what
was sent after a graceful stop. Reports requests served, errors, records written against requests sent
(which must be equal, in total and per session), the proxy's peak RSS, and its CPU time over the load
(start-up left out). Not: latency comparisons with peers (bench_overhead.py, bench_scale.py).

Everything listens on 127.0.0.1, and the run is bounded by its request count and a time cap. It exits 1
when a request failed or the records do not match. tests/integration/test_load.py runs a small version.

    .venv/bin/python -m benchmarks.load_sessions --agents 200 --requests 20 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

from benchmarks.load import REQUEST_TIMEOUT_S, STREAM_END, percentile_ms
from benchmarks.processes import HOST, Service, free_port, start, wait_listening
from benchmarks.stand_in import CONTENT_MARKER, MODEL
from modeltap.records.reader import StoreReader

REPO = Path(__file__).resolve().parents[1]
# `modeltap serve` from the venv running this script, so the code under test is the checkout's.
MODELTAP = Path(sys.executable).parent / "modeltap"
DEFAULT_AGENTS = 100
DEFAULT_REQUESTS = 20
# Agents stop taking new requests after this; a run that hits it reports what completed.
DEFAULT_TIME_CAP_S = 600.0
ERROR_SNIPPET_CHARS = 300
CHAT = {
    "model": MODEL,
    "stream": True,
    "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "Say ok."}],
}


@dataclass
class Agent:
    """One agent's session and what became of its requests."""

    session_id: str
    base_url: str
    sent: int = 0
    served: int = 0
    errors: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)


@dataclass
class Report:
    """What one run measured. `records` counts exchanges in the store after the proxy stopped."""

    agents: int
    requests_per_agent: int
    sent: int
    served: int
    errors: int
    first_error: str | None
    records: int
    records_complete: int
    sessions_mismatched: list[str]
    open_s: float
    wall_s: float
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    peak_rss_mib: float
    proxy_cpu_s: float

    @property
    def ok(self) -> bool:
        """Every request served, and recorded once under its own session, complete."""
        return (
            self.errors == 0
            and self.served == self.sent == self.agents * self.requests_per_agent
            and self.records == self.records_complete == self.sent
            and not self.sessions_mismatched
        )

    def text(self) -> str:
        rate = self.served / self.wall_s if self.wall_s else 0.0
        cpu_ms = 1000 * self.proxy_cpu_s / max(self.sent, 1)
        lines = [
            f"agents {self.agents} x requests {self.requests_per_agent} (streamed), all at once",
            f"  sessions opened    {self.agents} in {self.open_s:.1f} s (admin API, one after another)",
            f"  requests sent      {self.sent}",
            f"  requests served    {self.served}  ({rate:.0f}/s over {self.wall_s:.1f} s)",
            f"  latency            p50 {self.p50_ms} ms, p99 {self.p99_ms} ms, max {self.max_ms} ms",
            f"  errors             {self.errors}"
            + (f"  first: {self.first_error}" if self.first_error else ""),
            f"  records written    {self.records}  (complete streams: {self.records_complete})",
            f"  sessions whose records differ from their requests: {len(self.sessions_mismatched)}",
            f"  proxy peak RSS     {self.peak_rss_mib:.1f} MiB",
            f"  proxy CPU time     {self.proxy_cpu_s:.1f} s ({cpu_ms:.2f} ms a request)",
            f"  result             {'OK' if self.ok else 'FAILED'}",
        ]
        return "\n".join(lines)


def run(agents: int, requests: int, workdir: Path, time_cap_s: float = DEFAULT_TIME_CAP_S) -> Report:
    """Start the stand-in and `modeltap serve`, run the agents, stop the proxy gracefully, and compare
    its records with what was sent."""
    upstream_port, proxy_port = free_port(), free_port()
    admin_key = secrets.token_urlsafe(16)
    store = workdir / "records.db"
    stand_in = start(
        "stand-in",
        [sys.executable, "-m", "benchmarks.stand_in", "--port", str(upstream_port)],
        workdir,
        cwd=REPO,
    )
    proxy: Service | None = None
    try:
        wait_listening(stand_in, upstream_port)
        argv = [
            str(MODELTAP),
            "serve",
            *("--upstream", f"http://{HOST}:{upstream_port}/v1"),
            *("--host", HOST, "--port", str(proxy_port)),
            *("--store", str(store), f"--admin-key={admin_key}", "--upstream-key", "sk-load-test"),
        ]
        proxy = start("modeltap", argv, workdir, cwd=REPO)
        wait_listening(proxy, proxy_port)
        cpu_before = proxy.cpu_seconds()
        done, open_s, wall_s = asyncio.run(
            _drive(f"http://{HOST}:{proxy_port}", admin_key, agents, requests, time_cap_s)
        )
        # Read before the stop: a process that has exited has no VmHWM left to read.
        peak_rss, cpu_s = proxy.peak_rss_bytes(), proxy.cpu_seconds() - cpu_before
        proxy.stop()  # SIGTERM: a graceful stop flushes every record
        if proxy.process.returncode != 0:
            raise RuntimeError(f"modeltap exited {proxy.process.returncode}:\n{proxy.log_tail()}")
    finally:
        if proxy is not None:
            proxy.stop()
        stand_in.stop()
    return _report(done, requests, store, (open_s, wall_s), peak_rss, cpu_s)


async def _drive(
    base: str, admin_key: str, agents: int, requests: int, time_cap_s: float
) -> tuple[list[Agent], float, float]:
    """Open the sessions, then run every agent at once; return them, the opening time and the load's."""
    connector = TCPConnector(limit=0)  # one connection per agent, as N agent processes would hold
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=REQUEST_TIMEOUT_S)) as http:
        began = time.monotonic()
        opened = [await _open_session(http, base, admin_key, index) for index in range(agents)]
        loading = time.monotonic()
        deadline = loading + time_cap_s
        await asyncio.gather(*(_agent(http, agent, requests, deadline) for agent in opened))
    return opened, loading - began, time.monotonic() - loading


async def _open_session(http: ClientSession, base: str, admin_key: str, index: int) -> Agent:
    async with http.post(
        base + "/_modeltap/sessions",
        json={"labels": {"agent": str(index)}},
        headers={"Authorization": f"Bearer {admin_key}"},
    ) as response:
        if response.status != 201:
            raise RuntimeError(f"opening a session answered {response.status}: {await response.text()}")
        session = await response.json()
    return Agent(session["id"], session["base_url"] + "/v1")


async def _agent(http: ClientSession, agent: Agent, requests: int, deadline: float) -> None:
    """One agent: its requests one after another, as an agent waits for each answer."""
    for _ in range(requests):
        if time.monotonic() > deadline:
            return
        agent.sent += 1
        began = time.monotonic()
        try:
            async with http.post(agent.base_url + "/chat/completions", json=CHAT) as response:
                body = await response.read()
        except (ClientError, TimeoutError) as exc:
            agent.errors.append(f"{exc.__class__.__name__}: {exc}"[:ERROR_SNIPPET_CHARS])
            continue
        if response.status == 200 and CONTENT_MARKER.encode() in body and STREAM_END in body:
            agent.served += 1
            agent.latencies_s.append(time.monotonic() - began)
        else:
            agent.errors.append(f"{response.status}: {body[:ERROR_SNIPPET_CHARS]!r}")


def _report(
    agents: list[Agent], requests: int, store: Path, times: tuple[float, float], peak_rss: int, cpu_s: float
) -> Report:
    with StoreReader(store) as reader:
        rows = reader.exchanges(bodies=False)
    per_session = Counter(row["session_id"] for row in rows)
    errors = [error for agent in agents for error in agent.errors]
    latencies = [latency for agent in agents for latency in agent.latencies_s]
    return Report(
        agents=len(agents),
        requests_per_agent=requests,
        sent=sum(agent.sent for agent in agents),
        served=sum(agent.served for agent in agents),
        errors=len(errors),
        first_error=errors[0] if errors else None,
        records=len(rows),
        records_complete=sum(row["status"] == 200 and bool(row["stream_complete"]) for row in rows),
        sessions_mismatched=[a.session_id for a in agents if per_session[a.session_id] != a.sent],
        open_s=times[0],
        wall_s=times[1],
        p50_ms=percentile_ms(latencies, 50),
        p99_ms=percentile_ms(latencies, 99),
        max_ms=percentile_ms(latencies, 100),
        peak_rss_mib=peak_rss / 2**20,
        proxy_cpu_s=cpu_s,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS, help=f"default {DEFAULT_AGENTS}")
    parser.add_argument(
        "--requests", type=int, default=DEFAULT_REQUESTS, help=f"each; default {DEFAULT_REQUESTS}"
    )
    parser.add_argument(
        "--time-cap-s", type=float, default=DEFAULT_TIME_CAP_S, help="stop sending after this"
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the store and logs here (default: a temporary folder)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="modeltap-load-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        report = run(args.agents, args.requests, workdir, args.time_cap_s)
    print(json.dumps(dataclasses.asdict(report) | {"ok": report.ok}) if args.json else report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
