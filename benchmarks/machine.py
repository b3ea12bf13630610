"""What a benchmark ran on: CPU, cores, memory, kernel, Python, and how busy the machine was.

Owns: the facts printed beside every result, so that a number is never read without its machine.
Not: the versions of the configurations (configs.py knows those).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

# Long enough to see what other work the machine is doing, short enough not to delay the run.
BUSY_SAMPLE_S = 2.0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024**2, 1)
    return 0.0


def _cpu_times() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields), idle


def busy_percent(sample_s: float = BUSY_SAMPLE_S) -> float:
    """How much of all cores other processes used over the next ``sample_s`` seconds (0-100)."""
    total_before, idle_before = _cpu_times()
    time.sleep(sample_s)
    total_after, idle_after = _cpu_times()
    elapsed = total_after - total_before
    return round(100 * (1 - (idle_after - idle_before) / elapsed), 1) if elapsed else 0.0


def load() -> dict[str, float]:
    """The load averages and the CPU busy share right now."""
    one, five, fifteen = os.getloadavg()
    return {
        "load_1m": round(one, 2),
        "load_5m": round(five, 2),
        "load_15m": round(fifteen, 2),
        "busy_percent": busy_percent(),
        "sample_s": BUSY_SAMPLE_S,
    }


def facts() -> dict[str, str | int | float]:
    """CPU model, core count, memory, kernel, Python, hostname-free."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "memory_gib": _memory_gib(),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
    }
