"""modeltap/readers/ui: rollouts in the viewer (reward and outcome in the list and the session's
header), the list searched, filtered, sorted and paged on the server, a live poll that asks only for
what changed, and several stores at once; in headless Chromium and through the API."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from modeltap.readers.ui import viewer_app
from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from modeltap.records.store import RecordStore
from modeltap.testing import exchange
from tests.factories import assistant, recorded, rollout, tool_call
from tests.ui.browser import Browser

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "ui"
# The sessions the page lists, in its order, as one string (what each step waits for).
LISTED = "[...document.querySelectorAll('.session-item')].map(e => e.dataset.sessionId).join(' ')"
LOG = "== sdk (run fix-parser-1) ==\nTraceback (most recent call last):\nAssertionError: parse('1+') raised"


def samples() -> list[Exchange | SessionEvent]:
    """A GRPO group of four samples of one task and one sample of another."""
    call = assistant(None, tool_call("call_1", "bash", '{"command": "pytest -q"}'))
    outcomes = [
        RolloutOutcome("scored", 1.0, (1.0, 1.0), 41.5, 0, "2 passed"),
        RolloutOutcome("failed", None, (), 60.2, 1, LOG),
        RolloutOutcome("scored", 0.5, (1.0, 0.0), 38.0, 0, "1 passed, 1 failed"),
        RolloutOutcome("model_fault", 0.0, (), 12.0, None, "context overflow"),
    ]
    records: list[Exchange | SessionEvent] = []
    for n, outcome in enumerate(outcomes):
        records += rollout(
            f"s-fix{n}", "fix-parser", [call, assistant("done")], outcome=outcome, started=1000.0 + n
        )
    return records + rollout("s-other", "add-docs", [assistant("ok")], started=2000.0)


async def test_rollouts_in_the_list_and_header_filtered_and_live(
    tmp_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    path = await recorded(tmp_path / "records.db", *samples())
    server: TestServer = await aiohttp_server(viewer_app(path))
    async with Browser() as browser:
        await browser.goto(str(server.make_url("/")))
        await browser.wait_for("document.querySelectorAll('.session-item').length === 5")
        item = await browser.text('[data-session-id="s-fix1"]')
        assert "failed · reward -" in item and "task_id=fix-parser" in item
        assert "scored · reward 1" in await browser.text('[data-session-id="s-fix0"]')
        assert await browser.text('[data-session-id="s-other"] .outcome') == ""  # not a rollout

        await browser.click('[data-session-id="s-fix1"]')
        header = await browser.wait_for("document.querySelector('.rollout')?.innerText")
        assert "failed" in header and "60.2 s" in header and "exit status 1" in header
        await browser.click(".rollout summary")
        assert "AssertionError: parse('1+') raised" in await browser.text(".rollout pre")
        await browser.screenshot(ARTIFACTS / "viewer-rollout.png")

        # The server filters and sorts: best reward first, then only failed ones, then a search.
        await _choose(browser, "filter-sort", "reward")
        await browser.wait_for(f"{LISTED} === 's-fix0 s-fix2 s-fix3 s-other s-fix1'")
        await _choose(browser, "filter-sort", "time")
        await _choose(browser, "filter-outcome", "failed")
        await browser.wait_for(f"{LISTED} === 's-fix1'")
        await _choose(browser, "filter-outcome", "")
        await _type(browser, "task_id=add-docs")
        await browser.wait_for(f"{LISTED} === 's-other'")
        await _type(browser, "s-fix")
        await browser.wait_for(f"{LISTED} === 's-fix3 s-fix2 s-fix1 s-fix0'")
        await _type(browser, "")
        await browser.wait_for(f"{LISTED}.split(' ').length === 5")

        # Live: a new rollout's outcome shows up without a reload, through a poll for what changed.
        store = RecordStore(path)
        store.start()
        for record in rollout("s-new", "fix-parser", [assistant("x")], started=3000.0):
            await _write(store, record)
        await browser.wait_for("document.querySelector('.session-item')?.dataset.sessionId === 's-new'")
        store.on_session(
            SessionEvent("outcome", "s-new", outcome=RolloutOutcome("timed_out", None, (), 900.0))
        )
        await store.close()
        await browser.wait_for(
            "document.querySelector('[data-session-id=\"s-new\"] .outcome')?.innerText.includes('timed_out')"
        )
        assert browser.errors == []


async def test_the_api_pages_filters_and_answers_a_poll_with_only_what_changed(
    tmp_path: Path, aiohttp_client: Callable[..., Any]
) -> None:
    path = await recorded(tmp_path / "records.db", *samples())
    client: TestClient = await aiohttp_client(viewer_app(path))

    async def listed(**params: str) -> dict[str, Any]:
        return dict(await (await client.get("/api/sessions", params=params)).json())

    page = await listed(limit="2")
    assert [s["id"] for s in page["sessions"]] == ["s-other", "s-fix3"] and page["full"] is True
    assert [s["id"] for s in (await listed(q="fix-parser", outcome="scored"))["sessions"]] == [
        "s-fix2",
        "s-fix0",
    ]
    assert [s["reward"] for s in (await listed(sort="reward", limit="3"))["sessions"]] == [1.0, 0.5, 0.0]
    since = json.dumps(page["revisions"])
    unchanged = await listed(since=since)
    assert (unchanged["full"], unchanged["sessions"]) == (False, [])

    store = RecordStore(path)
    store.start()
    store.on_session(SessionEvent("outcome", "s-other", outcome=RolloutOutcome("scored", 0.25)))
    await store.close()
    changed = await listed(since=since)
    assert changed["full"] is False and [(s["id"], s["reward"]) for s in changed["sessions"]] == [
        ("s-other", 0.25)
    ]
    assert (await listed(since=json.dumps({str(path): 0}), limit="2"))["full"] is True  # more than a page

    turns = await (await client.get("/api/sessions/s-fix1/turns")).json()
    assert turns["details"]["outcome"] == "failed" and turns["details"]["rollout"]["log_tail"] == LOG
    assert len(turns["turns"]) == 2 and turns["store"] == str(path)
    assert (await client.get("/api/sessions/s-nope/turns")).status == 404
    assert (await client.get("/api/sessions", params={"limit": "0"})).status == 400
    assert (await client.get("/api/sessions", params={"since": "[1]"})).status == 400


async def test_several_stores_in_one_viewer(tmp_path: Path, aiohttp_client: Callable[..., Any]) -> None:
    one = await recorded(
        tmp_path / "n1" / "records.db", *rollout("s-same", "t", [assistant("one")], started=1.0)
    )
    two = await recorded(
        tmp_path / "n2" / "records.db", *rollout("s-same", "t", [assistant("two")], started=2.0)
    )
    client: TestClient = await aiohttp_client(viewer_app([str(tmp_path / "n*" / "records.db")]))
    doc = await (await client.get("/api/sessions")).json()
    assert doc["stores"] == [str(one), str(two)]
    assert [(s["id"], s["store"]) for s in doc["sessions"]] == [("s-same", str(two)), ("s-same", str(one))]
    assert (await client.get("/api/sessions/s-same/turns")).status == 404  # which one?
    for path, reply in ((one, "one"), (two, "two")):
        got = await (await client.get("/api/sessions/s-same/turns", params={"store": str(path)})).json()
        assert got["turns"][0]["reply"] == reply
    export = await client.get("/api/sessions/s-same/export/jsonl", params={"store": str(two)})
    assert (
        json.loads((await export.text()).splitlines()[0])["response"]["choices"][0]["message"]["content"]
        == "two"
    )


async def _choose(browser: Browser, select: str, value: str) -> None:
    await browser.evaluate(
        f"(() => {{ const s = document.getElementById('{select}'); s.value = {json.dumps(value)};"
        " s.dispatchEvent(new Event('change')); })()"
    )


async def _type(browser: Browser, text: str) -> None:
    await browser.evaluate(
        f"(() => {{ const i = document.getElementById('filter-q'); i.value = {json.dumps(text)};"
        " i.dispatchEvent(new Event('input')); })()"
    )


async def _write(store: RecordStore, record: Exchange | SessionEvent) -> None:
    if isinstance(record, SessionEvent):
        store.on_session(record)
    else:
        await store.submit(record)


async def test_the_header_shows_the_labels_and_a_long_id_wraps_whole(
    tmp_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    long_id = "s-" + "0123456789abcdef" * 4 + "-retry-7"
    labels = {"agent": "claude-code", "experiment": "grpo-7"}
    path = await recorded(
        tmp_path / "records.db", *rollout(long_id, "fix-parser", [assistant("ok")], labels=labels)
    )
    server: TestServer = await aiohttp_server(viewer_app(path))
    async with Browser() as browser:
        await browser.goto(str(server.make_url("/")))
        item = f'[data-session-id="{long_id}"]'
        await browser.wait_for(f"document.querySelector('{item}') !== null")
        await browser.click(item)
        header = await browser.wait_for("document.querySelector('.session-labels')?.innerText")
        assert header.split() == ["task_id=fix-parser", "agent=claude-code", "experiment=grpo-7"]
        for where in (f"{item} .id", "main h2"):
            shown = await browser.evaluate(
                f"(() => {{ const e = document.querySelector('{where}'); "
                "return [e.innerText, e.scrollWidth <= e.clientWidth, getComputedStyle(e).textOverflow]; })()"
            )
            assert shown == [long_id, True, "clip"]  # whole, wrapped inside its box, no ellipsis
        assert (await browser.evaluate(f"document.querySelector('{item} .id').getClientRects().length")) >= 1
        await browser.screenshot(ARTIFACTS / "viewer-labels-long-id.png")
        assert browser.errors == []


async def test_a_session_without_rollout_labels_or_drift_shows_no_null(
    tmp_path: Path, aiohttp_server: Callable[..., Any]
) -> None:
    """The parts a session lacks are left out of its header and its full turn, never written as "null"."""
    bare = exchange(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {"choices": [{"index": 0, "message": assistant("hello"), "finish_reason": "stop"}]},
        session_id="s-bare",
    )
    path = await recorded(tmp_path / "records.db", bare)
    server: TestServer = await aiohttp_server(viewer_app(path))
    async with Browser() as browser:
        await browser.goto(str(server.make_url("/")))
        await browser.wait_for("document.querySelector('[data-session-id=\"s-bare\"]') !== null")
        await browser.click('[data-session-id="s-bare"]')
        await browser.wait_for("document.querySelectorAll('.turn').length === 1")
        await browser.click('.turn[data-turn="1"] .turn-row')
        await browser.click('.turn[data-turn="1"] .full')
        await browser.wait_for("document.querySelector('.full-bodies h3') !== null")
        shown = await browser.text("main")
        assert "null" not in shown, shown
        assert "Sent upstream" not in shown  # it went as the client sent it
        assert browser.errors == []
