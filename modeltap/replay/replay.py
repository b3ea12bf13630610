"""Play a recorded session again: re-send it to another upstream and compare the answers.

Owns: `modeltap replay` (re-send each recorded request and compare the new answer with the recorded
one: status, finish reason, tokens, latency, and a diff of the content), and where a recorded request
was sent (`without_session`). Does not own: carrying a replay to its upstream (a modeltap Proxy does
that, so replayed exchanges are recorded like any other and the upstream's path layout, streams and
errors are handled once, in proxy/; the CLI starts it), answering as a mock upstream (mock.py) or turns
(records/turns.py).

    comparisons = await replay(store_path, "s-3f2a", session_base_url, replay_session="replay-1")
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import hdrs

from modeltap import dialects
from modeltap.compat.clients import without_query_credentials
from modeltap.records.reader import StoreReader
from modeltap.records.turns import Turn, turn_record

# A replayed turn may be a long generation; the proxy in between has its own timeouts.
REPLAY_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10)
# The fields a replay compares, in the order it shows them.
COMPARED = ("status", "finish_reason", "prompt_tokens", "completion_tokens", "latency_ms", "content")


async def replay(
    store: Path | str,
    session_id: str,
    base_url: str,
    *,
    replay_session: str,
    turn: int | None = None,
) -> list[dict[str, Any]]:
    """Re-send the recorded requests of `session_id` (or only turn `turn`, from 1) to `base_url`, in
    order, one at a time, and compare each answer with the recorded one.

    `base_url` is a modeltap session URL (`…/s/TOKEN`) whose records go to session `replay_session`
    in the same store, synchronously (`ProxyConfig.sync`), so each answer is read back from its record
    with its stream assembled. Each request goes out as recorded: same path, body and streaming.
    Returns one comparison per turn: `{"turn", "endpoint", "path", "recorded", "replayed", "differs"}`,
    the sides holding COMPARED and `differs` naming the fields that changed.
    """
    with StoreReader(store) as reader:
        numbered = list(enumerate(reader.exchanges(session_id), 1))
    chosen = [(n, ex) for n, ex in numbered if ex["endpoint"] and (turn is None or n == turn)]
    if not chosen:
        what = f"turn {turn}" if turn is not None else "any exchange"
        raise ValueError(f"session {session_id} has no {what} to replay (it has {len(numbered)} turn(s))")
    comparisons = []
    async with aiohttp.ClientSession(timeout=REPLAY_TIMEOUT) as client:
        for number, ex in chosen:
            last_seq = await asyncio.to_thread(_last_seq, store, replay_session)
            await _resend(client, base_url, ex)
            rows = await asyncio.to_thread(_exchanges_after, store, replay_session, last_seq)
            again = turn_record(rows[-1], number) if rows else None
            comparisons.append(_compare(number, ex, turn_record(ex, number), again))
    return comparisons


async def _resend(client: aiohttp.ClientSession, base_url: str, ex: dict[str, Any]) -> None:
    """Send one recorded request and read its answer to the end (the proxy records it)."""
    request = ex.get("request")
    headers: dict[str, str] = {hdrs.CONTENT_TYPE: "application/json"}
    if ex["user_agent"]:
        headers[hdrs.USER_AGENT] = ex["user_agent"]
    # Records keep no headers but the user agent: the format's own (Anthropic's version) are added.
    headers.update(dialects.of_record(ex["endpoint"]).request_headers)
    if request is None:
        data = None
    else:
        data = (request if isinstance(request, str) else json.dumps(request, ensure_ascii=False)).encode()
    url = base_url.rstrip("/") + without_session(ex["path"])
    async with client.request(ex["method"], url, data=data, headers=headers) as response:
        await response.read()


def without_session(path: str) -> str:
    """A recorded path without its session prefix (`/s/…/v1/chat/completions`: tokens are masked in
    records), its query kept less any credential in it (`?key=`, which a record written before
    modeltap redacted them may still hold): a key is never sent on to another upstream."""
    base, mark, query = path.partition("?")
    if base.startswith("/s/"):
        base = "/" + base[3:].partition("/")[2]
    query = without_query_credentials(query) if mark else ""
    return base + ("?" + query if query else "")


def _last_seq(store: Path | str, session: str) -> int:
    with StoreReader(store) as reader:
        rows = reader.exchanges(session, bodies=False)
    return rows[-1]["seq"] if rows else 0


def _exchanges_after(store: Path | str, session: str, seq: int) -> list[dict[str, Any]]:
    with StoreReader(store) as reader:
        return reader.exchanges(session, after_seq=seq)


def _compare(number: int, ex: dict[str, Any], recorded: Turn, replayed: Turn | None) -> dict[str, Any]:
    before = _side(recorded)
    after = _side(replayed) if replayed is not None else dict.fromkeys(COMPARED)
    differs = [key for key in COMPARED if key != "latency_ms" and before[key] != after[key]]
    return {
        "turn": number,
        "endpoint": ex["endpoint"],
        "path": ex["path"],
        "recorded": before,
        "replayed": after,
        "replayed_id": replayed.id if replayed is not None else None,
        "differs": differs,
    }


def _side(turn: Turn) -> dict[str, Any]:
    """What a comparison looks at in one turn; `content` is its reply, tool calls and error as lines."""
    content = (turn.reply or "").splitlines()
    content += [f"→ {call['name']}({call['arguments'] or ''})" for call in turn.tool_calls]
    if turn.error:
        content.append(f"! {turn.error.error_class}: {turn.error.message}")
    return {key: getattr(turn, key) for key in COMPARED if key != "content"} | {"content": content}


def comparison_text(comparisons: Sequence[dict[str, Any]]) -> str:
    """Comparisons side by side, recorded on the left, replayed on the right, a `≠` on each field that
    changed (latency always differs and is shown, not flagged), then a diff of the content."""
    lines = []
    for comparison in comparisons:
        before, after = comparison["recorded"], comparison["replayed"]
        verdict = "differs: " + ", ".join(comparison["differs"]) if comparison["differs"] else "same"
        lines.append(f"turn {comparison['turn']}  {comparison['endpoint']}  {comparison['path']}  {verdict}")
        lines.append(f"    {'':<18}{'recorded':<28}replayed")
        for key in COMPARED[:-1]:
            mark = "≠" if key in comparison["differs"] else " "
            lines.append(f"  {mark} {key:<18}{_cell(before[key]):<28}{_cell(after[key])}")
        if "content" in comparison["differs"]:
            diff = difflib.unified_diff(
                before["content"], after["content"], "recorded", "replayed", lineterm="", n=2
            )
            lines += ["  ≠ content"] + [f"      {line}" for line in diff]
        else:
            lines.append("    content           same")
    changed = sum(1 for c in comparisons if c["differs"])
    lines.append(f"{len(comparisons)} turn(s) replayed, {changed} differ")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)
