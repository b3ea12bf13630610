"""modeltap/proxy/naming.py and anonymous.py: the session an exchange is recorded under, from a
token, the naming headers, an agent's own hint, or the continuity of anonymous histories; and its
labels, the client's among them."""

from __future__ import annotations

from typing import Any

import pytest

from modeltap import dialects
from modeltap.proxy.anonymous import AnonymousConversations
from modeltap.proxy.naming import ANONYMOUS_SESSION, Names, NamingError, names_for
from modeltap.proxy.sessions import SessionRegistry

CHAT = dialects.named("chat")
SYSTEM = {"role": "system", "content": "be brief"}
ASK = {"role": "user", "content": "6*7?"}


def names(headers: dict[str, str], *, token: bool = False, loopback: bool = True, body: Any = None) -> Names:
    session = None
    if token:
        session = SessionRegistry(lambda: ("http://h", None)).open(session_id="s-1", labels={"task_id": "t"})
    return names_for(
        headers,
        session,
        loopback_only=loopback,
        anonymous=AnonymousConversations(),
        dialect=CHAT,
        body=body if body is not None else {"messages": [ASK]},
    )


def test_the_naming_headers_name_and_label_on_loopback() -> None:
    got = names(
        {"x-modeltap-session": "run-7", "x-modeltap-labels": "task_id=t1, try=2", "User-Agent": "opencode/1"}
    )
    assert got == Names("run-7", {"task_id": "t1", "try": "2", "client": "opencode"})


def test_beside_a_token_the_name_qualifies_the_tokens_session_and_its_labels_win() -> None:
    got = names(
        {"x-modeltap-session": "side", "x-modeltap-labels": "task_id=mine"}, token=True, loopback=False
    )
    assert got == Names("s-1:side", {"task_id": "t"})


def test_on_a_network_listener_the_naming_headers_need_a_token() -> None:
    with pytest.raises(NamingError, match="need a session token"):
        names({"x-modeltap-labels": "a=b"}, loopback=False)
    assert names({"x-session-id": "ses_1"}, loopback=False).session_id == "ses_1"  # a hint is fine


@pytest.mark.parametrize(
    "headers",
    [{"x-modeltap-session": "has space"}, {"x-modeltap-labels": "novalue"}, {"x-modeltap-labels": "a=b=c"}],
)
def test_malformed_naming_headers_are_refused(headers: dict[str, str]) -> None:
    with pytest.raises(NamingError):
        names(headers)


@pytest.mark.parametrize(
    ("headers", "session"),
    [
        ({"x-claude-code-session-id": "abc-123"}, "abc-123"),
        ({"x-session-id": "ses_9"}, "ses_9"),  # recorded as itself, whatever client sent it
        ({"x-session-id": "has space"}, None),
    ],
)
def test_an_agents_own_session_hint_is_the_session(headers: dict[str, str], session: str | None) -> None:
    got = names(headers).session_id
    assert got == session if session else got.startswith("anon-")


def test_traffic_without_a_history_is_anonymous() -> None:
    assert names({}, body={"prompt": "2+2="}).session_id == ANONYMOUS_SESSION


def test_anonymous_histories_are_split_by_continuity() -> None:
    tracker = AnonymousConversations()
    reply = {"role": "assistant", "content": "42"}
    first = tracker.session_of(CHAT, {"messages": [SYSTEM, ASK]})
    assert (
        tracker.session_of(CHAT, {"messages": [SYSTEM, ASK, reply, {"role": "user", "content": "more"}]})
        == first
    )
    other = tracker.session_of(CHAT, {"messages": [SYSTEM, {"role": "user", "content": "another task"}]})
    assert other not in (None, first)
    # The same first request again, once the first run has moved on, is another run.
    again = tracker.session_of(CHAT, {"messages": [SYSTEM, ASK]})
    assert again not in (None, first, other)
    went_on = {"messages": [SYSTEM, ASK, {"role": "assistant", "content": "41"}, ASK]}
    assert tracker.session_of(CHAT, went_on) == again


def test_alike_conversations_of_other_formats_or_clients_never_share_a_session() -> None:
    tracker = AnonymousConversations()
    say_hi = {"messages": [{"role": "user", "content": "Say hi"}]}
    by_format = {d.name: tracker.session_of(d, say_hi, "sdk") for d in (CHAT, dialects.named("messages"))}
    by_client = tracker.session_of(CHAT, say_hi, "other-sdk")
    assert len({*by_format.values(), by_client}) == 3
