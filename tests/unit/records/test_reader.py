"""modeltap/records/reader.py: the pseudo-session of the exchanges recorded without a session is
listed, counted, filtered, resolved and read like a session, so every exchange is reachable."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeltap.cli import main
from modeltap.records.query import SessionQuery
from modeltap.records.reader import NO_SESSION_ID, StoreReader
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
    with StoreReader(path) as reader:
        newest, oldest = reader.sessions()
        assert (newest["id"], newest["exchanges"], newest["errors"], oldest["id"]) == (
            NO_SESSION_ID,
            1,
            1,
            "s-1",
        )
        assert [row["id"] for row in reader.sessions(SessionQuery(errors=True))] == [NO_SESSION_ID]
        assert reader.sessions(SessionQuery(labels=(("task_id", "t1"),)))[0]["id"] == "s-1"
        assert [row["id"] for row in reader.sessions(SessionQuery(limit=1))] == [NO_SESSION_ID]
        assert reader.sessions(SessionQuery(since=600.0)) == [] and reader.count() == 2
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
