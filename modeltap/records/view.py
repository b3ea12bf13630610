"""Text views of recorded sessions for a person at a terminal: the sessions table and a session's turns.

Owns: layout of `modeltap sessions` and `modeltap show`. Does not own: reading (store.py) or the
JSON forms (the CLI prints store rows as they are with --json).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from modeltap.records.summary import summarize


def sessions_table(sessions: Sequence[dict[str, Any]]) -> str:
    """One line per session: id, when, how many exchanges, tokens, errors, labels."""
    rows = [("SESSION", "STARTED", "TURNS", "PROMPT", "COMPLETION", "ERRORS", "LABELS")]
    for s in sessions:
        rows.append(
            (
                s["id"],
                _when(s["first"] or s["created"]),
                str(s["exchanges"]),
                _num(s["prompt_tokens"]),
                _num(s["completion_tokens"]),
                str(s["errors"] or 0),
                " ".join(f"{k}={v}" for k, v in s["labels"].items()),
            )
        )
    return _columns(rows)


def session_turns(session_id: str, exchanges: Sequence[dict[str, Any]]) -> str:
    """A session turn by turn: endpoint, status, latency, time to first byte, tokens, finish reason,
    tool calls and errors."""
    rows = [("#", "TIME", "ENDPOINT", "STATUS", "LATENCY", "TTFB", "TOKENS", "FINISH", "TOOL CALLS / ERROR")]
    for n, ex in enumerate(exchanges, 1):
        summary = summarize(ex["endpoint"] or "", ex.get("request"), ex.get("response"))
        calls = ", ".join(f"{c['name']}({_short(c['arguments'])})" for c in summary.tool_calls)
        note = calls
        if ex["error_class"]:
            note = f"{ex['error_class']}: {_short(ex['error_message'] or '', 90)}"
        elif not calls and summary.text:
            note = repr(_short(summary.text, 60))
        rows.append(
            (
                str(n),
                _when(ex["started"]),
                (ex["endpoint"] or "?") + (" (stream)" if ex["streamed"] else ""),
                str(ex["status"] or "-"),
                _ms(ex["started"], ex["ended"]),
                _ms(ex["started"], ex["first_byte"]),
                f"{_num(summary.prompt_tokens)}→{_num(summary.completion_tokens)}",
                summary.finish_reason or "-",
                note,
            )
        )
    title = f"session {session_id}: {len(exchanges)} exchange(s)"
    return title + "\n" + _columns(rows)


def _columns(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _when(ts: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def _ms(start: float | None, end: float | None) -> str:
    return f"{(end - start) * 1000:.0f}ms" if start and end else "-"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
