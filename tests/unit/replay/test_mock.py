"""modeltap/replay/mock.py: the mock upstream's matching, the words for how it matched, strict mode
and its answers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient

from modeltap import dialects
from modeltap.dialects.sse import StreamAssembler
from modeltap.proxy.config import DEFAULT_MAX_BODY_BYTES
from modeltap.records.exchange import Exchange
from modeltap.replay import mock as mock_module
from modeltap.replay.mock import Mock, body_digest, divergence, load_mock, mock_app, route_key
from modeltap.testing import exchange
from tests.factories import assistant, chat_completion, recorded, usage

ClientFactory = Callable[..., Any]


def reply(text: str) -> dict[str, Any]:
    return chat_completion(assistant(text), usage=usage(5, 1), id=f"chatcmpl-{text}", created=1, model="m")


def chat(session: str, ask: str, answer: str, **fields: Any) -> Exchange:
    request = {"model": "m", "messages": [{"role": "user", "content": ask}], **fields.pop("extra", {})}
    return exchange(
        request,
        reply(answer),
        path="/s/…/v1/chat/completions",
        session_id=session,
        started=10.0,
        first_byte=10.1,
        ended=10.2,
        **fields,
    )


def ask(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def test_route_key_and_body_digest_ignore_what_varies_between_runs() -> None:
    assert {
        route_key(p) for p in ("/s/…/v1/chat/completions", "/chat/completions", "/v1/v1/chat/completions?x")
    } == {"chat/completions"}
    assert route_key("/v1/messages?beta=true") == "messages"
    body = {"model": "m", "messages": [1], "stream": True, "stream_options": {"include_usage": True}}
    same = {"messages": [1], "model": "m", "metadata": {"user_id": "run-2"}}
    assert body_digest(body) == body_digest(same) != body_digest({**same, "model": "other"})


async def test_mock_prefers_exact_bodies_then_turn_order_then_starts_over(tmp_path: Path) -> None:
    path = await recorded(
        tmp_path / "r.db",
        chat("s1", "turn one", "A"),
        chat("s1", "a title please", "TITLE"),
        chat("s1", "turn two", "B"),
        chat("s2", "turn one", "OTHER"),
    )
    mock = load_mock(path, session="s1")
    url = "/v1/chat/completions"

    def answer(body: Any) -> str | None:
        found = mock.match("POST", url, body).entry
        return None if found is None else found.exchange["response"]["choices"][0]["message"]["content"]

    # The title request arrives first (sent beside turn one), yet gets its own recorded answer.
    assert answer(ask("a title please", stream=True)) == "TITLE"
    assert answer(ask("turn one, with a timestamp that changed")) == "A"  # turn order
    assert answer(ask("turn two, changed too")) == "B"
    assert answer(ask("a fourth request: a new run")) == "A"  # every turn served: start over
    mock.reset()
    assert answer(ask("turn two")) == "B"  # exact still wins over order
    assert mock.match("GET", "/v1/models", None).entry is None  # nothing recorded on that route

    everything = load_mock(path)  # no session: exact bodies only, never order
    assert everything.match("POST", url, ask("changed")).entry is None
    assert everything.match("POST", url, ask("turn one")).entry
    assert everything.ordered is False and len(everything.recorded) == 4
    with pytest.raises(ValueError, match="no recorded exchanges in session s3"):
        load_mock(path, session="s3")


async def test_turn_order_prefers_a_recorded_turn_of_the_same_kind(tmp_path: Path) -> None:
    tools = {"tools": [{"type": "function", "function": {"name": "bash"}}]}
    path = await recorded(
        tmp_path / "r.db",
        chat("s1", "turn one in /tmp/a", "CALL", extra=tools),
        chat("s1", "title for: turn one in /tmp/a", "TITLE"),
        chat("s1", "turn two in /tmp/a", "ANSWER", extra=tools),
    )
    mock = load_mock(path, session="s1")

    def answer(text: str, **extra: Any) -> str:
        found = mock.match("POST", "/v1/chat/completions", ask(text, **extra)).entry
        assert found is not None
        return str(found.exchange["response"]["choices"][0]["message"]["content"])

    # A new run in another folder: no body matches, and the title request (no tools) races ahead.
    assert answer("title for: turn one in /tmp/b") == "TITLE"
    assert answer("turn one in /tmp/b", **tools) == "CALL"
    assert answer("turn two in /tmp/b", **tools) == "ANSWER"


async def test_mock_answers_json_streams_and_errors_in_the_clients_shape(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    streamed = chat("s1", "stream it", "streamed!", streamed=True, stream_complete=True, raw_sse=None)
    failed = dataclasses.replace(
        chat("s1", "too long", "x"),
        status=400,
        response={"error": {"message": "too long", "code": "context_length_exceeded"}},
    )
    path = await recorded(tmp_path / "r.db", chat("s1", "hi", "hello"), streamed, failed)
    client: TestClient = await aiohttp_client(mock_app(load_mock(path, session="s1"), DEFAULT_MAX_BODY_BYTES))

    plain = await client.post("/v1/chat/completions", json=ask("hi"))
    assert plain.status == 200 and (await plain.json()) == reply("hello")
    assert (plain.headers["x-modeltap-mock-turn"], plain.headers["Content-Type"].split(";")[0]) == (
        "1",
        "application/json",
    )

    stream = await client.post("/chat/completions", json=ask("stream it", stream=True))
    assert stream.headers["Content-Type"] == "text/event-stream"
    assembler = StreamAssembler(dialects.named("chat"))
    chunks = []
    async for chunk in stream.content.iter_any():
        chunks.append(chunk)
        assembler.feed(chunk)
    result = assembler.result()
    assert result.complete and result.body is not None
    [choice] = result.body["choices"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("streamed!", "stop")
    assert b'"usage"' not in b"".join(chunks)  # the request did not ask for usage

    # The same recorded stream, asked for without streaming, is its assembled body.
    await client.post("/_modeltap/mock/reset")
    await client.post("/v1/chat/completions", json=ask("hi"))
    whole = await client.post("/v1/chat/completions", json=ask("stream it"))
    assert (await whole.json())["choices"][0]["message"]["content"] == "streamed!"

    error = await client.post("/v1/chat/completions", json=ask("too long", stream=True))
    assert error.status == 400 and (await error.json())["error"]["code"] == "context_length_exceeded"

    status = await (await client.get("/_modeltap/mock")).json()
    assert status == {"exchanges": 3, "served": [1, 2, 3], "ordered": True, "strict": False}

    # Unmatched requests get a 404 each client understands: Anthropic's shape on /v1/messages.
    missing = await client.post("/v1/messages", json={"model": "c", "messages": []})
    assert missing.status == 404
    assert (await missing.json())["error"]["type"] == "not_found_error"
    missing = await client.get("/v1/models/other")
    assert missing.status == 404 and (await missing.json())["error"]["code"] == "no_recorded_exchange"


async def test_mock_replays_raw_sse_byte_for_byte_event_by_event(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    raw = b': keep-alive\n\ndata: {"choices": [{"index": 0, "delta": {"content": "4"}}]}\r\n\r\n'
    raw += b"data: [DONE]\n\n"
    ex = chat("s1", "hi", "4", streamed=True, stream_complete=True, raw_sse=raw)
    path = await recorded(tmp_path / "r.db", ex, keep_raw_sse=True)
    client: TestClient = await aiohttp_client(mock_app(load_mock(path, session="s1"), DEFAULT_MAX_BODY_BYTES))
    response = await client.post("/v1/chat/completions", json=ask("other words", stream=True))
    assert await response.read() == raw


async def test_realtime_mock_keeps_the_recorded_pace(
    tmp_path: Path, aiohttp_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = dataclasses.replace(
        chat("s1", "hi", "4", streamed=True, stream_complete=True), started=10.0, first_byte=10.3, ended=10.6
    )
    path = await recorded(tmp_path / "r.db", ex)
    client: TestClient = await aiohttp_client(
        mock_app(load_mock(path, session="s1", realtime=True), DEFAULT_MAX_BODY_BYTES)
    )
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(mock_module.asyncio, "sleep", sleep)
    response = await client.post("/v1/chat/completions", json=ask("hi", stream=True))
    body = await response.read()
    monkeypatch.undo()
    # The first byte after the recorded 0.3 s, then the recorded 0.3 s spread evenly over the events.
    events = body.count(b"\n\n")
    assert delays[0] == pytest.approx(0.3) and len(delays) == 1 + events
    assert sum(delays[1:]) == pytest.approx(0.3)


def test_a_mock_with_nothing_recorded_on_a_route_matches_nothing() -> None:
    assert Mock([], ordered=True).match("POST", "/v1/chat/completions", ask("hi")).entry is None


async def test_each_match_says_how_and_where_the_request_diverged(tmp_path: Path) -> None:
    path = await recorded(
        tmp_path / "r.db",
        chat("s1", "turn one", "A"),
        chat("s1", "turn two", "B"),
    )
    mock = load_mock(path, session="s1")
    url = "/v1/chat/completions"
    assert mock.match("POST", url, ask("turn one")).how == "exact #1"
    assert mock.match("POST", url, ask("turn two, edited")).how == (
        "next in order #2 (diverged at message 1 (user), character 9: recorded 'turn two', "
        "sent 'turn two, edited')"
    )
    assert mock.match("POST", url, ask("turn one")).how == "exact #1"  # a new run: served again


def test_divergence_names_the_first_differing_message_or_field() -> None:
    recorded_chat = {"endpoint": "chat", "request": ask("hi", temperature=0)}
    longer = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}
    assert (
        divergence(recorded_chat, longer | {"model": "m"}) == "diverged after message 1: recorded 1, sent 2"
    )
    assert divergence(recorded_chat, ask("hi", temperature=1)) == "diverged in temperature"
    assert divergence(recorded_chat, ask("x" * 100)).endswith(
        f"character 1: recorded 'hi', sent '{'x' * 60}…'"
    )
    assert divergence(recorded_chat, "not json") == "diverged: the body is not the recorded JSON object"
    tool_result = {"role": "user", "content": [{"type": "tool_result", "content": "ok"}]}
    anthropic = {"endpoint": "messages", "request": {"messages": [tool_result]}}
    assert divergence(anthropic, {"messages": [{"role": "user", "content": "typed"}]}) == (
        "diverged at message 1 (user), character 1: "
        + 'recorded \'[{"type": "tool_result", "content": "ok"}]\', sent \'typed\''
    )


async def test_strict_serves_exact_matches_and_refuses_an_off_script_request_with_a_409(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    messages = {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "hello"}]}
    anthropic = exchange(
        messages,
        {"type": "message", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"},
        path="/v1/messages",
        endpoint="messages",
        session_id="s1",
    )
    path = await recorded(tmp_path / "r.db", chat("s1", "turn one", "A"), anthropic)
    lines: list[str] = []
    app = mock_app(load_mock(path, session="s1", strict=True), DEFAULT_MAX_BODY_BYTES, lines.append)
    client: TestClient = await aiohttp_client(app)

    good = await client.post("/v1/chat/completions", json=ask("turn one"))
    assert good.status == 200 and good.headers["x-modeltap-mock-match"] == "exact #1"
    again = await client.post("/v1/chat/completions", json=ask("turn one"))
    assert again.status == 200 and again.headers["x-modeltap-mock-match"] == "exact #1, again"

    off = await client.post("/v1/chat/completions", json=ask("something else"))
    error = (await off.json())["error"]
    assert off.status == 409 and error["code"] == "mock_off_script"
    assert "off script: turn #1 is next" in error["message"] and "sent 'something else'" in error["message"]
    # The refusal is in the client's own shape: Anthropic's on /v1/messages.
    off = await client.post("/v1/messages", json=messages | {"max_tokens": 6})
    body = await off.json()
    assert off.status == 409 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "diverged in max_tokens" in body["error"]["message"]
    nothing = await client.get("/v1/models/other")  # no turn recorded on the route: off script too
    assert nothing.status == 409
    listed = await client.get("/v1/models")  # the models the recorded requests name: never off script
    assert listed.status == 200 and {m["id"] for m in (await listed.json())["data"]} == {"m", "c"}
    assert (await (await client.get("/_modeltap/mock")).json())["strict"] is True
    assert lines == [
        "POST /v1/chat/completions  exact #1",
        "POST /v1/chat/completions  exact #1, again",
        "POST /v1/chat/completions  off script: turn #1 is next, and the request diverged at message 1 "
        "(user), character 1: recorded 'turn one', sent 'something else'",
        "POST /v1/messages  off script: turn #2 is next, and the request diverged in max_tokens",
        "GET /v1/models/other  no match: nothing recorded on GET models/other has this body",
        "GET /v1/models  not recorded: the models the recorded requests name",
    ]


def test_a_divergence_quotes_where_the_texts_part_not_their_shared_start() -> None:
    shared = "You are a coding agent. " * 10
    recorded_ = {
        "endpoint": "chat",
        "request": {"messages": [{"role": "system", "content": shared + "Use bash."}]},
    }
    sent = {"messages": [{"role": "system", "content": shared + "Use zsh."}]}
    note = divergence(recorded_, sent)
    assert note.startswith(f"diverged at message 1 (system), character {len(shared) + 5}: ")
    assert "Use bash." in note and "Use zsh." in note, note
    # Same content, another field (a tool call's arguments): the first differing field is quoted.
    call = assistant(None, {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "ls"}})
    other = assistant(None, {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "pwd"}})
    note = divergence({"endpoint": "chat", "request": {"messages": [call]}}, {"messages": [other]})
    assert '"ls"' in note and '"pwd"' in note, note


async def test_strict_409_tells_the_sdks_not_to_retry_and_models_are_listed(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    path = await recorded(tmp_path / "r.db", chat("s1", "hi", "hello"))
    client: TestClient = await aiohttp_client(
        mock_app(load_mock(path, session="s1", strict=True), DEFAULT_MAX_BODY_BYTES)
    )
    refused = await client.post("/v1/chat/completions", json=ask("off script"))
    # The openai and anthropic SDKs retry a 409 unless the answer says not to (x-should-retry).
    assert refused.status == 409 and refused.headers["x-should-retry"] == "false"
    for where in ("/v1/models", "/models"):
        listed = await client.get(where)
        assert listed.status == 200 and [m["id"] for m in (await listed.json())["data"]] == ["m"]
    assert (await (await client.get("/v1/models/m")).json())["id"] == "m"
    assert (await client.get("/v1/models/other")).status == 409  # strict: no such model is off script


async def test_the_openai_sdk_sends_an_off_script_request_once(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    path = await recorded(tmp_path / "r.db", chat("s1", "hi", "hello"))
    mock = load_mock(path, session="s1", strict=True)
    lines: list[str] = []
    client: TestClient = await aiohttp_client(mock_app(mock, DEFAULT_MAX_BODY_BYTES, lines.append))
    sdk = openai.AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="k", max_retries=2)
    with pytest.raises(openai.ConflictError):
        await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "off"}])
    await sdk.close()
    assert len(lines) == 1, lines


@pytest.mark.parametrize(
    "body",
    [
        ask("hi", stream=True, stream_options=["include_usage"]),
        ask("hi", stream=True, stream_options="yes"),
        b"[" * 5000 + b"]" * 5000,
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": '
        + b"[" * 990
        + b"]" * 990
        + b"}",
    ],
    ids=["stream_options-list", "stream_options-text", "deep-json", "nested-field"],
)
async def test_odd_requests_get_an_answer_in_shape(
    tmp_path: Path, aiohttp_client: ClientFactory, body: Any
) -> None:
    path = await recorded(tmp_path / "r.db", chat("s1", "hi", "hello", streamed=True, stream_complete=True))
    client: TestClient = await aiohttp_client(mock_app(load_mock(path, session="s1"), DEFAULT_MAX_BODY_BYTES))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = await client.post(
        "/v1/chat/completions", data=data, headers={"content-type": "application/json"}
    )
    assert answer.content_type in ("application/json", "text/event-stream"), await answer.text()
    if answer.content_type == "application/json":
        doc = await answer.json()
        assert "choices" in doc or "message" in doc["error"], doc
    else:
        assert (await answer.text()).rstrip().endswith("data: [DONE]")


async def test_a_recorded_reply_with_a_lone_surrogate_streams_whole(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    odd = exchange(
        ask("hi"),
        reply("bad \ud800 half"),
        path="/v1/chat/completions",
        session_id="s1",
        streamed=True,
        stream_complete=True,
    )
    path = await recorded(tmp_path / "r.db", odd)
    client: TestClient = await aiohttp_client(mock_app(load_mock(path, session="s1"), DEFAULT_MAX_BODY_BYTES))
    streamed = await client.post("/v1/chat/completions", json=ask("hi", stream=True))
    assert streamed.status == 200 and streamed.content_type == "text/event-stream"
    text = await streamed.text()
    assert text.rstrip().endswith("data: [DONE]") and "\\ud800" in text
    whole = await client.post("/v1/chat/completions", json=ask("hi"))
    assert whole.status == 200 and "\\ud800" in await whole.text()


async def test_on_loopback_the_mock_answers_only_its_own_names(
    tmp_path: Path, aiohttp_client: ClientFactory
) -> None:
    """It serves recorded replies: a page whose name was rebound to 127.0.0.1 reads none of them."""
    path = await recorded(tmp_path / "r.db", chat("s1", "hi", "hello"))
    client: TestClient = await aiohttp_client(mock_app(load_mock(path, session="s1"), DEFAULT_MAX_BODY_BYTES))
    refused = await client.post(
        "/v1/chat/completions", json=ask("hi"), headers={"Host": "rebound.example:80"}
    )
    assert refused.status == 421 and "hello" not in await refused.text()
    assert (await refused.json())["error"]["code"] == "misdirected_request"
    served = await client.post("/v1/chat/completions", json=ask("hi"), headers={"Host": "localhost:80"})
    assert served.status == 200
