"""modeltap/proxy/sessions.py: tokens, base URLs, labels, close, the TTL, and what a session shows."""

from __future__ import annotations

import re

import pytest

from modeltap.proxy import sessions
from modeltap.proxy.sessions import Session, SessionRegistry

HOST = "http://127.0.0.1:8080"
CONTAINER = "http://172.17.0.1:8080"


def registry(ttl_s: float | None = None, container: str | None = CONTAINER) -> SessionRegistry:
    return SessionRegistry(lambda: (HOST, container), ttl_s=ttl_s)


def idle(session: Session, seconds: float) -> None:
    """Age a session's last use, as if it had sat idle for `seconds`."""
    session.last_used -= seconds


def test_open_returns_a_fresh_url_safe_token_and_both_base_urls() -> None:
    reg = registry()
    first, second = reg.open(), reg.open()
    assert first.token != second.token and first.id != second.id
    # 32 random bytes: 256 bits, over the minimum of 128, in URL-safe base64.
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first.token)
    assert first.host_base_url == f"{HOST}/s/{first.token}"
    assert first.container_base_url == f"{CONTAINER}/s/{first.token}"
    assert registry(container=None).open().container_base_url is None


def test_tokens_do_not_repeat() -> None:
    reg = registry()
    assert len({reg.open().token for _ in range(2000)}) == 2000


def test_labels_are_kept_as_strings_and_the_upstream_without_its_trailing_slash() -> None:
    session = registry().open(
        upstream="http://10.0.0.5:41235/", upstream_key="k", labels={"task_id": "t1", "sample_index": 3}
    )
    assert session.labels == {"task_id": "t1", "sample_index": "3"}
    assert (session.upstream, session.upstream_key) == ("http://10.0.0.5:41235", "k")


def test_a_session_id_is_unique_while_open() -> None:
    reg = registry()
    reg.open(session_id="default")
    with pytest.raises(ValueError, match="already open"):
        reg.open(session_id="default")
    reg.close("default")
    assert reg.open(session_id="default").id == "default"


def test_close_stops_the_token_at_once_and_is_remembered() -> None:
    reg = registry()
    session, other = reg.open(), reg.open()
    assert reg.by_token(session.token) is session
    assert reg.close(session.id) and not reg.close(session.id)
    assert reg.by_token(session.token) is None and reg.get(session.id) is None
    assert reg.was_closed(session.token) and not reg.was_closed(other.token)
    assert reg.by_token(other.token) is other and [s.id for s in reg] == [other.id] and len(reg) == 1


def test_closed_tokens_are_remembered_up_to_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions, "CLOSED_TOKENS_MAX", 3)
    reg = registry()
    closed = [reg.open() for _ in range(5)]
    for session in closed:
        reg.close(session.id)
    assert [reg.was_closed(s.token) for s in closed] == [False, False, True, True, True]


def test_on_change_hears_every_open_and_close() -> None:
    heard: list[tuple[str, bool]] = []
    reg = SessionRegistry(lambda: (HOST, None), lambda s, closed: heard.append((s.id, closed)), ttl_s=10)
    session = reg.open(session_id="a")
    reg.close("a")
    reg.close("a")
    idle(reg.open(session_id="b"), 60)
    reg.expire()
    assert heard == [("a", False), ("a", True), ("b", False), ("b", True)]
    assert session.id == "a"


def test_a_session_idle_past_the_ttl_is_closed_at_lookup() -> None:
    reg = registry(ttl_s=10)
    session = reg.open()
    idle(session, 9)
    assert reg.by_token(session.token) is session  # using it keeps it alive
    idle(session, 9)
    assert reg.by_token(session.token) is session
    idle(session, 11)
    assert reg.by_token(session.token) is None
    assert reg.get(session.id) is None and reg.was_closed(session.token)


def test_expire_closes_only_idle_sessions() -> None:
    reg = registry(ttl_s=10)
    stale, fresh = reg.open(), reg.open()
    idle(stale, 11)
    idle(fresh, 5)
    assert reg.expire() == [stale.id]
    assert [s.id for s in reg] == [fresh.id]


def test_without_a_ttl_nothing_expires() -> None:
    reg = registry(ttl_s=None)
    session = reg.open()
    idle(session, 10**9)
    assert reg.expire() == [] and reg.by_token(session.token) is session


def test_a_session_shows_neither_its_token_nor_its_key() -> None:
    session = registry().open(upstream_key="sk-upstream-secret", labels={"task_id": "t1"})
    shown = repr(session) + str(session)
    assert session.token not in shown and "sk-upstream-secret" not in shown
    assert "task_id" in shown and session.id in shown


def test_lookups_of_what_is_not_a_token() -> None:
    reg = registry()
    reg.open()
    for presented in ("", "Bearer", "A" * 43, "s/" + "A" * 43):
        assert reg.by_token(presented) is None and not reg.was_closed(presented)
