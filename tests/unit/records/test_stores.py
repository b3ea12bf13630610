"""modeltap/records/stores.py: several nodes' files as one set of sessions: globs and MODELTAP_STORE's
list, a session found by its first characters in whichever store has it, and a session id found in
two stores listed once per store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from modeltap.records.exchange import RolloutOutcome, SessionEvent
from modeltap.records.query import SessionQuery
from modeltap.records.stores import (
    Stores,
    expand,
    last_store,
    last_store_file,
    patterns_from,
    reader_patterns,
    remember_store,
)
from tests.factories import assistant, recorded, rollout


async def nodes(tmp_path: Path) -> list[Path]:
    """Two nodes' stores; both have a session `s-same`, and each has one of its own."""
    one = await recorded(
        tmp_path / "node1" / "records.db",
        *rollout("s-same", "t1", [assistant("a")], outcome=RolloutOutcome("scored", 1.0), started=1000.0),
        *rollout("s-abc1", "t1", [assistant("b")], outcome=RolloutOutcome("failed"), started=3000.0),
    )
    two = await recorded(
        tmp_path / "node2" / "records.db",
        *rollout("s-same", "t1", [assistant("c")] * 2, outcome=RolloutOutcome("scored", 0.0), started=2000.0),
        SessionEvent("opened", "s-xyz", {"task_id": "t2"}, at=4000.0),
    )
    return [one, two]


async def test_globs_and_the_environment_name_several_stores(tmp_path: Path) -> None:
    one, two = await nodes(tmp_path)
    pattern = str(tmp_path / "node*" / "records.db")
    assert expand([pattern]) == [one, two]
    assert expand([str(one), pattern, str(two)]) == [one, two]  # each file once
    assert expand([str(tmp_path / "missing.db")]) == [tmp_path / "missing.db"]  # a reader says it is missing
    with pytest.raises(FileNotFoundError, match="no records database matches"):
        expand([str(tmp_path / "none*" / "r.db")])
    env = {"MODELTAP_STORE": os.pathsep.join([str(one), pattern])}
    assert patterns_from(None, env, "default.db") == [str(one), pattern]
    assert patterns_from(["x.db"], env, "default.db") == ["x.db"]  # a flag wins
    assert patterns_from(None, {}, "default.db") == ["default.db"]


async def test_sessions_of_several_stores_are_one_list_each_row_naming_its_store(tmp_path: Path) -> None:
    one, two = await nodes(tmp_path)
    with Stores.open([str(one), str(two)]) as stores:
        assert stores.several
        rows = stores.sessions(SessionQuery())
        assert [(r["id"], r["store"]) for r in rows] == [
            ("s-xyz", str(two)),
            ("s-abc1", str(one)),
            ("s-same", str(two)),
            ("s-same", str(one)),
        ]
        assert [r["id"] for r in stores.sessions(SessionQuery(limit=2))] == ["s-xyz", "s-abc1"]
        assert [r["reward"] for r in stores.sessions(SessionQuery(outcome="scored"))] == [0.0, 1.0]
        [t1] = [g for g in stores.groups("task_id") if g["value"] == "t1"]
        assert (t1["sessions"], t1["mean_reward"], t1["outcomes"]) == (3, 0.5, {"failed": 1, "scored": 2})


async def test_a_session_is_found_in_whichever_store_has_it(tmp_path: Path) -> None:
    one, two = await nodes(tmp_path)
    with Stores.open([str(one), str(two)]) as stores:
        reader, session = stores.resolve("s-x")
        assert (reader.path, session) == (two, "s-xyz")
        reader, session = stores.resolve("s-abc")
        assert (reader.path, session) == (one, "s-abc1")
        for prefix in ("s-same", "s-sa"):
            with pytest.raises(ValueError, match=r"s-same is in 2 stores .*name one with --store"):
                stores.resolve(prefix)
        with pytest.raises(ValueError, match=r"names 4 sessions \(s-abc1 in .*give more of the id"):
            stores.resolve("s-")
        with pytest.raises(ValueError, match=r"no session 's-abd1' in .*; the closest: s-abc1$"):
            stores.resolve("s-abd1")
        with pytest.raises(
            ValueError, match=r"no session 'nope' in .*; the newest: s-xyz, s-abc1, s-same \("
        ):
            stores.resolve("nope")
    with Stores.open([str(two)]) as stores:
        assert not stores.several and stores.resolve("s-same")[1] == "s-same"


async def test_a_missing_store_is_an_error_unless_waited_for(tmp_path: Path) -> None:
    one, _ = await nodes(tmp_path)
    with pytest.raises(FileNotFoundError, match="--store PATH or set MODELTAP_STORE"):
        Stores.open([str(one), str(tmp_path / "late.db")])
    with Stores.open([str(one), str(tmp_path / "late*.db")], missing_ok=True) as stores:
        assert [r.path for r in stores.readers] == [one] and stores.missing == [tmp_path / "late*.db"]


def test_the_store_serve_last_wrote_is_found_when_nothing_else_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    assert last_store_file(env) == tmp_path / "state" / "modeltap" / "last-store"
    home = {"HOME": str(tmp_path / "home")}
    monkeypatch.setenv("HOME", home["HOME"])
    assert last_store_file(home) == tmp_path / "home" / ".local" / "state" / "modeltap" / "last-store"
    assert last_store(env) is None  # no serve yet
    store = tmp_path / "run" / "records.db"
    store.parent.mkdir()
    monkeypatch.chdir(store.parent)
    remember_store("records.db", env)  # serve's relative --store is noted absolute
    assert last_store(env) is None  # the store is not there (yet, or any more)
    store.write_bytes(b"")
    assert last_store(env) == store
    monkeypatch.chdir(tmp_path)  # a reader elsewhere, where the default is not
    assert reader_patterns(None, env, ".modeltap/records.db") == ([str(store)], store)
    assert reader_patterns(["x.db"], env, ".modeltap/records.db") == (["x.db"], None)  # a flag wins
    assert reader_patterns(None, env | {"MODELTAP_STORE": "y.db"}, ".modeltap/records.db") == (["y.db"], None)
    (tmp_path / ".modeltap").mkdir()
    (tmp_path / ".modeltap" / "records.db").write_bytes(b"")
    assert reader_patterns(None, env, ".modeltap/records.db") == ([".modeltap/records.db"], None)
    last_store_file(env).write_text("not/absolute.db\n")
    assert last_store(env) is None


async def test_a_store_with_no_sessions_says_so(tmp_path: Path) -> None:
    empty = await recorded(tmp_path / "r.db")
    with Stores.open([str(empty)]) as stores, pytest.raises(ValueError, match="holds no sessions yet"):
        stores.resolve("s-1")
