"""modeltap/records/reader.py: the pseudo-session of the exchanges recorded without a session is
listed, counted, filtered, resolved and read like a session, so every exchange is reachable."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from modeltap.cli import main
from modeltap.records.query import SessionQuery
from modeltap.records.reader import NO_SESSION_ID, StoreReader, StoreUnreadable
from modeltap.records.stores import Stores
from modeltap.testing import exchange
from tests.factories import assistant, recorded, rollout


async def store(tmp_path: Path) -> Path:
    not_json = exchange(
        None,
        {"error": {"message": "the body is not JSON", "type": "invalid_request_error"}},
        request=b"this is not json",
        status=400,
        error_class="client_error",
        error_message="the body is not JSON: Expecting value",
        started=500.0,
    )
    return await recorded(
        tmp_path / "r.db", *rollout("s-1", "t1", [assistant("ok")], started=100.0), not_json
    )


async def test_exchanges_without_a_session_are_a_session_of_their_own(tmp_path: Path) -> None:
    path = await store(tmp_path)
    listed = SessionQuery(unsessioned=True)
    with StoreReader(path) as reader:
        newest, oldest = reader.sessions(listed)
        assert (newest["id"], newest["exchanges"], newest["errors"], oldest["id"]) == (
            NO_SESSION_ID,
            1,
            1,
            "s-1",
        )
        failed = SessionQuery(errors=True, unsessioned=True)
        assert [row["id"] for row in reader.sessions(failed)] == [NO_SESSION_ID]
        labelled = SessionQuery(labels=(("task_id", "t1"),), unsessioned=True)
        assert [row["id"] for row in reader.sessions(labelled)] == ["s-1"]
        newest_only = SessionQuery(limit=1, unsessioned=True)
        assert [row["id"] for row in reader.sessions(newest_only)] == [NO_SESSION_ID]
        assert (
            reader.sessions(SessionQuery(since=600.0, unsessioned=True)) == [] and reader.count(listed) == 2
        )
        # A library caller asks for it: by default, only the sessions the store holds.
        assert [row["id"] for row in reader.sessions()] == ["s-1"] and reader.count() == 1
        [lost] = reader.exchanges(NO_SESSION_ID)
        assert lost["error_class"] == "client_error" and lost["request"] == "this is not json"
        assert reader.session(NO_SESSION_ID)["errors"] == 1
        assert reader.turn_number(NO_SESSION_ID, lost["seq"]) == 1
    with Stores.open([str(path)]) as stores:
        assert stores.resolve("no-s")[1] == NO_SESSION_ID


async def test_sessions_errors_and_show_find_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = await store(tmp_path)
    assert main(["sessions", "--errors", "--store", str(path)]) == 0
    listed = capsys.readouterr().out
    assert listed.splitlines()[1].startswith(NO_SESSION_ID) and "bodies that are not JSON" in listed
    assert main(["show", NO_SESSION_ID, "--store", str(path)]) == 0
    assert "client_error" in capsys.readouterr().out
    assert main(["grep", "not JSON", "--store", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{NO_SESSION_ID} #1 ")


# A statement that never ends on its own: a recursive query without a bound.
FOREVER = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r"


def hostile(folder: Path, good: Path) -> dict[str, Path]:
    """A file that is not a database, a truncated copy of a good store, and a store whose sessions
    table is a recursive VIEW (each reader would hang on it without limit)."""
    data = good.read_bytes()
    (folder / "text.db").write_text("hello, not a database\n")
    (folder / "truncated.db").write_bytes(data[: len(data) // 3])
    view = folder / "view.db"
    view.write_bytes(data)
    conn = sqlite3.connect(view)
    conn.execute("ALTER TABLE sessions RENAME TO sessions_real")
    conn.execute(f"CREATE VIEW sessions AS SELECT s.* FROM sessions_real s, ({FOREVER})")
    conn.commit()
    conn.close()
    return {"text": folder / "text.db", "truncated": folder / "truncated.db", "view": view}


@pytest.mark.parametrize("kind", ["text", "truncated", "view"])
async def test_a_hostile_store_is_refused_in_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    good = await store(tmp_path)
    bad = hostile(tmp_path, good)[kind]
    for command in (["sessions"], ["show", "s-1"], ["grep", "x"], ["stats"], ["groups"]):
        assert main([*command, "--store", str(bad)]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err, err
    # Among several stores it is skipped, said once, and the good one read.
    assert main(["sessions", "--store", str(good), "--store", str(bad)]) == 0
    captured = capsys.readouterr()
    assert "s-1" in captured.out and captured.err.count("skipped") == 1 and str(bad) in captured.err


def test_no_statement_runs_past_its_bound_or_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = asyncio.run(store(tmp_path))
    with StoreReader(path) as reader:
        reader._conn.timeout_s = 0.2  # a bound a test can wait out
        with pytest.raises(StoreUnreadable, match="stopped"):
            reader._conn.execute(FOREVER).fetchone()
    with Stores.open([str(path)]) as stores:
        stores.readers[0]._conn.timeout_s = 3600.0
        failed: list[BaseException] = []

        def read() -> None:
            try:
                stores.readers[0]._conn.execute(FOREVER).fetchone()
            except StoreUnreadable as exc:
                failed.append(exc)

        worker = threading.Thread(target=read)
        worker.start()
        while worker.is_alive() and not failed:
            stores.interrupt()
            worker.join(0.05)
        assert failed and "stopped" in str(failed[0])
