"""modeltap/proxy/naming.py and anonymous.py: the session an exchange is recorded under, from a
token, the naming headers, an agent's own hint, or the continuity of anonymous histories; whom each
name is taken from (a loopback peer, a token's holder, or neither); and its labels, the client's
among them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap import dialects
from modeltap.proxy.anonymous import (
    REPLY_READ_MAX_BYTES,
    TAILS_PER_START,
    AnonymousConversations,
    Conversation,
)
from modeltap.proxy.naming import (
    ANONYMOUS_SESSION,
    LABELS_HEADER,
    SESSION_HEADER,
    SESSION_HINTS,
    Names,
    names_for,
)
from modeltap.proxy.sessions import Session, SessionRegistry

CHAT = dialects.named("chat")
SYSTEM = {"role": "system", "content": "be brief"}
ASK = {"role": "user", "content": "6*7?"}
LOOPBACK = "127.0.0.1"
REMOTE = "172.17.0.5"
# Every header naming reads, from the code: a header added there joins every table below.
NAMING_HEADERS = (SESSION_HEADER, LABELS_HEADER, *SESSION_HINTS)


def token_session() -> Session:
    return SessionRegistry(lambda: ("http://h", None)).open(session_id="s-1", labels={"task_id": "t"})


def names(
    headers: dict[str, str],
    *,
    token: bool = False,
    peer: str | None = LOOPBACK,
    body: Any = None,
    anonymous: AnonymousConversations | None = None,
) -> Names:
    return names_for(
        headers,
        token_session() if token else None,
        peer=peer,
        anonymous=anonymous or AnonymousConversations(),
        dialect=CHAT,
        body=body if body is not None else {"messages": [ASK]},
    )


def test_the_naming_headers_name_and_label_from_this_host() -> None:
    got = names(
        {"x-modeltap-session": "run-7", "x-modeltap-labels": "task_id=t1, try=2", "User-Agent": "opencode/1"}
    )
    assert got == Names("run-7", {"task_id": "t1", "try": "2", "client": "opencode"})


@pytest.mark.parametrize("peer", ["::1", "::ffff:127.0.0.1", "127.0.0.2"])
def test_every_loopback_address_is_this_host(peer: str) -> None:
    assert names({"x-modeltap-session": "run-7"}, peer=peer) == Names("run-7")


def test_beside_a_token_the_name_qualifies_the_tokens_session_and_its_labels_win() -> None:
    got = names({"x-modeltap-session": "side", "x-modeltap-labels": "task_id=mine"}, token=True, peer=REMOTE)
    assert got == Names("s-1:side", {"task_id": "t"})


# What each naming header does for each caller: (header, value) -> caller -> the session recorded,
# "refused" when the request is refused (and recorded in its anonymous conversation), "anon" when the
# header is not believed and the conversation names the session.
_VALUES = {SESSION_HEADER: "run-7", LABELS_HEADER: "k=v"} | dict.fromkeys(SESSION_HINTS, "ses_9")


def _expected(header: str, caller: str) -> str:
    if caller.endswith("token"):
        return "s-1:run-7" if header == SESSION_HEADER else "s-1"
    if header in (SESSION_HEADER, LABELS_HEADER):
        return "refused" if caller == "remote" else "run-7" if header == SESSION_HEADER else "anon"
    return "ses_9" if caller == "loopback" else "anon"


@pytest.mark.parametrize("caller", ["loopback", "remote", "loopback+token", "remote+token"])
@pytest.mark.parametrize("header", NAMING_HEADERS)
def test_every_naming_header_for_every_caller(header: str, caller: str) -> None:
    got = names(
        {header: _VALUES[header]}, token="token" in caller, peer=REMOTE if "remote" in caller else LOOPBACK
    )
    expected = _expected(header, caller)
    if expected == "refused":
        assert got.refused is not None and "taken from this host" in got.refused and REMOTE in got.refused
        assert got.session_id.startswith("anon-")
        return
    assert got.refused is None
    assert got.session_id.startswith("anon-") if expected == "anon" else got.session_id == expected
    assert ("k" in got.labels) == (header == LABELS_HEADER)


def test_codex_claude_code_and_opencode_hints_are_all_read() -> None:
    # Codex sends thread-id and session-id (the same id), Claude Code its own header, opencode
    # x-session-id (docs/agents.md §9.2).
    assert {"x-claude-code-session-id", "thread-id", "session-id", "x-session-id"} <= set(SESSION_HINTS)
    codex = {"session-id": "019a-uuid", "thread-id": "019a-uuid", "User-Agent": "codex_exec/0.169.0"}
    assert names(codex).session_id == "019a-uuid"


def test_a_remote_neighbour_cannot_write_into_a_token_session_by_its_id() -> None:
    for header in NAMING_HEADERS:
        got = names({header: "s-1"}, peer=REMOTE)
        assert got.session_id != "s-1" and got.session_id.startswith("anon-")


@pytest.mark.parametrize(
    "headers",
    [{"x-modeltap-session": "has space"}, {"x-modeltap-labels": "novalue"}, {"x-modeltap-labels": "a=b=c"}],
)
def test_malformed_naming_headers_are_refused(headers: dict[str, str]) -> None:
    got = names(headers)
    assert got.refused is not None and got.session_id.startswith("anon-")


@pytest.mark.parametrize(
    ("headers", "session"),
    [
        ({"x-claude-code-session-id": "abc-123"}, "abc-123"),
        ({"x-session-id": "ses_9"}, "ses_9"),  # recorded as itself, whatever client sent it
        ({"x-session-id": "has space"}, None),
        ({"x-claude-code-session-id": "has space", "x-session-id": "ses_9"}, "ses_9"),
    ],
)
def test_an_agents_own_session_hint_is_the_session(headers: dict[str, str], session: str | None) -> None:
    got = names(headers).session_id
    assert got == session if session else got.startswith("anon-")


def test_traffic_without_a_history_is_anonymous() -> None:
    assert names({}, body={"prompt": "2+2="}).session_id == ANONYMOUS_SESSION


# -- the rule, fuzzed: header sets x peer trust x token ---------------------------------------------

_PEERS = st.sampled_from(
    [LOOPBACK, "::1", "::ffff:127.0.0.1", REMOTE, "10.1.2.3", "::ffff:10.0.0.1", "fe80::1", None]
)
_HEADER_VALUES = st.sampled_from(
    ["s-1", "s-1:x", "run-7", "ses_9", "has space", "k=v", "a=b=c", "", "x" * 129]
)


@settings(max_examples=600, deadline=None)
@given(
    headers=st.dictionaries(st.sampled_from(NAMING_HEADERS), _HEADER_VALUES, max_size=len(NAMING_HEADERS)),
    peer=_PEERS,
    token=st.booleans(),
)
def test_who_may_name_what(headers: dict[str, str], peer: str | None, token: bool) -> None:
    got = names(headers, token=token, peer=peer)
    local = peer is not None and peer.replace("::ffff:", "") in (LOOPBACK, "::1")
    explicit = SESSION_HEADER in headers or LABELS_HEADER in headers
    if token:
        # A token's holder is recorded in its session, wherever it is, and the session's labels win.
        assert got.session_id == "s-1" or got.session_id.startswith("s-1:")
        assert got.labels["task_id"] == "t"
        return
    if not local:
        # Nothing a caller neither here nor holding a token sends names its session or labels it.
        assert got.session_id.startswith("anon-")
        assert got.labels == {}
        assert (got.refused is not None) == explicit
        return
    # From this host: a well-formed x-modeltap-session, else the first well-formed hint, else the
    # conversation; a malformed naming header is refused, and the rest still name the exchange.
    named = headers.get(SESSION_HEADER)
    hints = [v for h in SESSION_HINTS if (v := headers.get(h)) and re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", v)]
    if got.refused is None and named is not None:
        assert got.session_id == named
    elif hints:
        assert got.session_id == hints[0]
    else:
        assert got.session_id.startswith("anon-")


# -- anonymous conversations ------------------------------------------------------------------------


def claim(tracker: AnonymousConversations, messages: list[Any], **options: Any) -> Conversation:
    got = tracker.claim(CHAT, {"messages": messages}, **options)
    assert got is not None
    return got


def tool_turn(call_id: str) -> list[dict[str, Any]]:
    """The assistant's tool call as the client echoes it, and its result."""
    function = {"name": "bash", "arguments": '{"command":"echo 42"}'}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "42"},
    ]


def chat_reply(message: dict[str, Any]) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def test_anonymous_histories_are_split_by_continuity() -> None:
    tracker = AnonymousConversations()
    reply = {"role": "assistant", "content": "42"}
    first = claim(tracker, [SYSTEM, ASK])
    tracker.replied(first, True, chat_reply(reply))
    assert claim(tracker, [SYSTEM, ASK, reply, {"role": "user", "content": "more"}]).session == first.session
    assert claim(tracker, [SYSTEM, {"role": "user", "content": "another task"}]).session != first.session


def test_the_samples_of_one_prompt_are_told_apart_by_the_tool_calls_they_echo() -> None:
    """Four samples send the same first request, at once, then each its tool call's turn: four
    sessions of two requests each, whatever order the second turns come in."""
    tracker = AnonymousConversations()
    firsts = [claim(tracker, [SYSTEM, ASK]) for _ in range(4)]
    for n, first in enumerate(firsts):
        tracker.replied(first, True, chat_reply(tool_turn(f"call_{n}")[0]))
    seconds = {n: claim(tracker, [SYSTEM, ASK, *tool_turn(f"call_{n}")]) for n in (2, 0, 3, 1)}
    assert len({first.session for first in firsts}) == 4
    assert all(seconds[n].session == firsts[n].session for n in range(4))


def test_samples_with_text_replies_are_told_apart_by_the_text_they_echo() -> None:
    tracker = AnonymousConversations()
    firsts = [claim(tracker, [ASK]) for _ in range(3)]
    for n, first in enumerate(firsts):
        tracker.replied(first, True, chat_reply({"role": "assistant", "content": f"answer  {n}\n"}))
    for n in (1, 2, 0):
        # Echoed as content parts, with the whitespace folded: the text is what is compared.
        echo = {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"}]}
        assert claim(tracker, [ASK, echo, {"role": "user", "content": "and?"}]).session == firsts[n].session


def test_the_same_request_again_is_another_run_unless_it_retries() -> None:
    tracker = AnonymousConversations()
    once = claim(tracker, [ASK])
    tracker.replied(once, True, chat_reply({"role": "assistant", "content": "42"}))
    again = claim(tracker, [ASK])  # the same one-shot script, run again
    assert again.session != once.session
    tracker.replied(again, False, None)  # it failed: the same request next retries it
    assert claim(tracker, [ASK]).session == again.session
    assert claim(tracker, [ASK], retry=True).session == again.session  # x-stainless-retry-count: 1


def test_a_conversation_whose_reply_is_not_noted_yet_beats_one_whose_reply_differs() -> None:
    tracker = AnonymousConversations()
    a, b = claim(tracker, [ASK]), claim(tracker, [ASK])
    tracker.replied(a, True, chat_reply(tool_turn("call_a")[0]))
    assert claim(tracker, [ASK, *tool_turn("call_b")]).session == b.session  # b's reply is on its way


def test_a_late_reply_of_a_conversation_that_moved_on_is_not_noted() -> None:
    tracker = AnonymousConversations()
    first = claim(tracker, [ASK])
    tracker.replied(first, True, chat_reply(tool_turn("call_1")[0]))
    second = claim(tracker, [ASK, *tool_turn("call_1")])
    assert second.session == first.session
    tracker.replied(first, False, None)  # the first request's late news: the conversation is past it
    assert claim(tracker, [ASK, *tool_turn("call_1")]).session != first.session


def test_a_whole_reply_is_read_from_its_bytes_and_a_deep_one_does_not_break_it() -> None:
    tracker = AnonymousConversations()
    deep, plain = claim(tracker, [ASK]), claim(tracker, [ASK])
    tracker.replied(deep, True, b'{"a":' * 5000 + b"1" + b"}" * 5000)
    tracker.replied(plain, True, b'{"choices":[{"message":{"tool_calls":[{"id":"call_x"}]}}]}')
    assert claim(tracker, [ASK, *tool_turn("call_x")]).session == plain.session


def test_alike_conversations_of_other_formats_clients_or_peers_never_share_a_session() -> None:
    tracker = AnonymousConversations()
    say_hi = [{"role": "user", "content": "Say hi"}]

    def session(dialect: Any, client: str, peer: str | None) -> str:
        got = tracker.claim(dialect, {"messages": say_hi}, client, peer=peer)
        assert got is not None
        tracker.replied(got, True, chat_reply({"role": "assistant", "content": "hi"}))
        return got.session

    by_format = {session(d, "sdk", None) for d in (CHAT, dialects.named("messages"))}
    by_client = session(CHAT, "other-sdk", None)
    by_peer = {session(CHAT, "sdk", peer) for peer in ("172.17.0.2", "172.17.0.3")}
    assert len({*by_format, by_client, *by_peer}) == 5
    # A remote peer's conversation is continued by that peer only.
    echo = [*say_hi, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]
    assert claim(tracker, echo, client="sdk", peer="172.17.0.9").session not in by_peer
    assert claim(tracker, echo, client="sdk", peer="172.17.0.2").session in by_peer


def test_a_group_of_samples_fits_in_what_is_kept_per_start() -> None:
    tracker = AnonymousConversations()
    firsts = [claim(tracker, [ASK]) for _ in range(TAILS_PER_START)]
    for n, first in enumerate(firsts):
        tracker.replied(first, True, chat_reply(tool_turn(f"call_{n}")[0]))
    for n in range(TAILS_PER_START):
        assert claim(tracker, [ASK, *tool_turn(f"call_{n}")]).session == firsts[n].session


def test_a_request_chained_to_an_earlier_reply_continues_its_conversation() -> None:
    tracker, responses = AnonymousConversations(), dialects.named("responses")
    first = tracker.claim(responses, {"input": "Say hi"}, "sdk")
    assert first is not None
    tracker.replied(first, True, {"id": "resp_1", "object": "response", "output": []})
    chained = {"input": "again", "previous_response_id": "resp_1"}
    second = tracker.claim(responses, chained, "sdk")
    assert second is not None and second.session == first.session
    tracker.replied(second, True, {"id": "resp_2", "object": "response", "output": []})
    third = tracker.claim(responses, {"input": "more", "previous_response_id": "resp_2"}, "sdk")
    assert third is not None and third.session == first.session
    # Another peer naming the id continues nothing of it; a reply kept with `store: false` is not chained.
    elsewhere = tracker.claim(responses, chained, "sdk", peer="172.17.0.2")
    assert elsewhere is not None and elsewhere.session != first.session
    unkept = tracker.claim(responses, {"input": "x", "store": False}, "sdk")
    assert unkept is not None
    tracker.replied(unkept, True, {"id": "resp_3", "object": "response", "output": []})
    after = tracker.claim(responses, {"input": "y", "previous_response_id": "resp_3"}, "sdk")
    assert after is not None and after.session != unkept.session


def test_samples_started_one_after_another_are_told_apart_too() -> None:
    """The first sample's reply came back before the second sample started: it was read for nothing
    then (no conversation was alike), and the samples are still told apart."""
    tracker = AnonymousConversations()
    firsts = []
    for n in range(3):
        firsts.append(claim(tracker, [ASK]))
        tracker.replied(firsts[n], True, chat_reply(tool_turn(f"call_{n}")[0]))
    for n in (2, 0, 1):
        assert claim(tracker, [ASK, *tool_turn(f"call_{n}")]).session == firsts[n].session


@st.composite
def _interleavings(draw: st.DrawFn) -> tuple[list[int], list[bool], int]:
    """k samples of `turns` requests each, every request a claim then its reply, merged in any order
    that keeps each sample's own order; whether each sample's replies are tool calls or text."""
    k, turns = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    left = [2 * turns] * k
    order = []
    while any(left):
        sample = draw(st.sampled_from([n for n in range(k) if left[n]]))
        order.append(sample)
        left[sample] -= 1
    return order, draw(st.lists(st.booleans(), min_size=k, max_size=k)), turns


@settings(max_examples=300, deadline=None)
@given(_interleavings())
def test_samples_of_one_prompt_in_any_interleaving_are_one_session_each(
    plan: tuple[list[int], list[bool], int],
) -> None:
    order, by_tools, _ = plan
    tracker = AnonymousConversations()
    history: dict[int, list[Any]] = {n: [SYSTEM, ASK] for n in set(order)}
    pending: dict[int, Conversation] = {}
    sessions: dict[int, set[str]] = {n: set() for n in history}
    step: dict[int, int] = dict.fromkeys(history, 0)
    for sample in order:
        if sample not in pending:
            pending[sample] = claim(tracker, history[sample])
            sessions[sample].add(pending[sample].session)
            continue
        turn = step[sample] = step[sample] + 1
        if by_tools[sample]:
            call, result = tool_turn(f"call_{sample}_{turn}")
            tracker.replied(pending.pop(sample), True, chat_reply(call))
            history[sample] = [*history[sample], call, result]
        else:
            said = {"role": "assistant", "content": f"answer {sample}.{turn}"}
            tracker.replied(pending.pop(sample), True, chat_reply(said))
            history[sample] = [*history[sample], said, {"role": "user", "content": "go on"}]
    assert all(len(names) == 1 for names in sessions.values()), sessions
    assert len({next(iter(names)) for names in sessions.values()}) == len(sessions)


def test_a_reply_too_large_to_read_leaves_its_conversation_untold_not_lost() -> None:
    tracker = AnonymousConversations()
    big, small = claim(tracker, [ASK]), claim(tracker, [ASK])
    padding = "x" * REPLY_READ_MAX_BYTES
    tracker.replied(big, True, json.dumps(chat_reply(tool_turn("call_big")[0]) | {"pad": padding}).encode())
    tracker.replied(small, True, chat_reply(tool_turn("call_small")[0]))
    # The large reply was not read: its conversation cannot be told by it, but is not taken for another.
    assert claim(tracker, [ASK, *tool_turn("call_big")]).session == big.session
