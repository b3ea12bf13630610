"""The sessions load test (benchmarks/load_sessions.py) at a size CI can afford: `modeltap serve` and the
benchmark stand-in as processes on loopback, agents on sessions of their own streaming at once, every
request served and recorded once under its session, and the proxy stopped gracefully (exit status 0)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.load_sessions import run

AGENTS = 40
REQUESTS = 5


def test_concurrent_streaming_sessions_are_all_served_and_recorded(tmp_path: Path) -> None:
    report = run(AGENTS, REQUESTS, tmp_path, time_cap_s=120.0)
    assert report.errors == 0, report.first_error
    assert report.sent == report.served == AGENTS * REQUESTS
    assert report.records == report.records_complete == report.sent
    assert report.sessions_mismatched == []
    assert report.peak_rss_mib > 0  # measured (the figures belong to `make bench`, not to a test)
    assert report.ok
