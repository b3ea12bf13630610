"""Translation fuzzed both ways (hypothesis), through a live proxy in front of a scripted chat-only
upstream: modeltap/proxy/translate.py, answers.py's translated answers, and the conversions of
modeltap/dialects/anthropic_messages.py and openai_responses.py.

A Messages or Responses request of any shape goes in (content blocks, tools and items that are not
objects, lone surrogates); the upstream answers with anything a chat server might (a completion with
odd parts, deep tool-call arguments and lone surrogates, whole or streamed, cut short or not; a JSON
value that is no completion; an HTML page; an error status). Every request gets either a well-formed
answer in the client's format (a stream that ends in its terminal event or its error event) or an
error in the client's shape, never a 500 of modeltap's own; and each is recorded once, a failure as a
failure, with what the upstream said. Bounded to run in seconds.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modeltap.proxy.config import ProxyConfig
from modeltap.records.reader import StoreReader
from tests.integration.conftest import ThreadedProxy

# Each example is one loopback round trip through the proxy and one to the upstream, a few ms.
FUZZ = settings(
    max_examples=400, deadline=timedelta(seconds=10), suppress_health_check=[HealthCheck.too_slow]
)
HTTP_TIMEOUT_S = 10.0
# Deeper than Python's JSON reads (its recursion limit): a degenerate policy at its token limit.
DEEP = "[" * 1200
# A streamed tool call whose arguments no JSON parser of Python's reads.
DEEP_CALL_EVENTS = [
    json.dumps(
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "c1", "function": {"name": "bash", "arguments": DEEP}}
                        ]
                    },
                }
            ],
        }
    ),
    json.dumps({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    "[DONE]",
]
TERMINAL = {
    "messages": {"message_stop", "error"},
    "responses": {"response.completed", "response.incomplete", "response.failed", "error"},
}

# -- what the client sends ---------------------------------------------------------------------------

# Text as agents send it, lone surrogates included (JSON escapes, which json.dumps writes).
text = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
odd = st.none() | st.booleans() | st.integers(-3, 3) | text | st.just([1]) | st.just({"x": 1})
block = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, text),
    st.builds(lambda i: {"type": "tool_use", "id": "t1", "name": "bash", "input": i}, odd),
    st.builds(lambda c: {"type": "tool_result", "tool_use_id": "t1", "content": c}, odd),
    st.fixed_dictionaries({"type": st.sampled_from(["image", "thinking", "x"])}),
    odd,
)
anthropic_message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant"]) | odd,
        "content": text | st.lists(block, max_size=3) | odd,
    }
)
tool = st.just({"name": "bash", "input_schema": {"type": "object"}}) | st.just({"type": "web_search"}) | odd
messages_bodies = st.fixed_dictionaries(
    {"max_tokens": st.just(16), "messages": st.lists(anthropic_message, min_size=1, max_size=3)},
    optional={"system": text | st.lists(block, max_size=2) | odd, "tools": st.lists(tool, max_size=2) | odd},
)
item = st.one_of(
    st.builds(
        lambda r, c: {"type": "message", "role": r, "content": c},
        st.sampled_from(["user", "developer"]),
        text,
    ),
    st.builds(lambda a: {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": a}, text),
    st.builds(lambda o: {"type": "function_call_output", "call_id": "c1", "output": o}, odd),
    st.builds(lambda c: {"role": "user", "content": c}, st.lists(odd, max_size=2)),
    odd,
)
responses_bodies = st.fixed_dictionaries(
    {"input": text | st.lists(item, min_size=1, max_size=3)},
    optional={
        "instructions": text | odd,
        "tools": st.lists(st.just({"type": "function", "name": "bash", "parameters": {}}) | odd, max_size=2),
        "store": st.booleans(),
    },
)

# -- what the upstream answers -----------------------------------------------------------------------

arguments = text | st.just(DEEP) | st.just('{"command": "ls"}') | st.just('{"a": ')
call = st.fixed_dictionaries(
    {
        "id": st.just("call_1") | odd,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": st.just("bash") | odd, "arguments": arguments}),
    }
)
chat_message = st.fixed_dictionaries(
    {"role": st.just("assistant")},
    optional={
        "content": text | st.none(),
        "reasoning_content": text,
        "tool_calls": st.lists(call, max_size=2),
    },
)
finish = st.sampled_from(["stop", "length", "tool_calls", "content_filter"]) | odd
completions = st.builds(
    lambda message, reason, usage: {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": usage,
    },
    chat_message,
    finish,
    st.just({"prompt_tokens": 3, "completion_tokens": 2}) | odd,
)
not_completions = (
    odd | st.just({"choices": []}) | st.just({"detail": "ok"}) | st.just({"choices": [{"x": 1}]})
)


def _chunks(completion: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks a chat server streams `completion` as (role, reasoning, text, each call, finish)."""
    choice = completion["choices"][0]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    deltas += [{key: message[key]} for key in ("reasoning_content", "content") if message.get(key)]
    deltas += [{"tool_calls": [{"index": n, **c}]} for n, c in enumerate(message.get("tool_calls", []))]
    out = [{"id": "chatcmpl-1", "choices": [{"index": 0, "delta": d}]} for d in deltas]
    out.append(
        {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    )
    return [*out, {"id": "chatcmpl-1", "choices": [], "usage": completion["usage"]}]


@st.composite
def answers(draw: st.DrawFn) -> dict[str, Any]:
    """How the upstream answers: `kind` and what it sends (`status`, `content_type`, `body` bytes, or
    `events` to stream, the ones after `cut` left out)."""
    kind = draw(st.sampled_from(["completion", "completion", "no completion", "html", "deep", "error"]))
    if kind == "completion":
        completion = draw(completions)
        events = [json.dumps(c) for c in _chunks(completion)] + ["[DONE]"]
        cut = draw(st.none() | st.integers(0, len(events) - 1))
        return {
            "kind": kind,
            "json": json.dumps(completion),
            "events": events[:cut],
            "stream": draw(st.booleans()),
        }
    if kind == "no completion":
        value = json.dumps(draw(not_completions))
        return {"kind": kind, "json": value, "events": [value, "[DONE]"], "stream": draw(st.booleans())}
    if kind == "html":
        return {
            "kind": kind,
            "status": 200,
            "content_type": "text/html",
            "body": b"<html><h1>Gateway</h1></html>",
        }
    if kind == "deep":
        return {"kind": kind, "status": 200, "content_type": "application/json", "body": DEEP.encode()}
    status = draw(st.sampled_from([400, 404, 429, 500, 503]))
    body = draw(st.sampled_from([b'{"error": {"message": "no", "type": "x"}}', b"busy", DEEP.encode()]))
    return {"kind": kind, "status": status, "content_type": "application/json", "body": body}


class Upstream:
    """A chat-only server, on a loop of its own, answering each request as the current example says
    (`answer`); `calls` counts the requests that reached it, `said` whether it wrote a body to the
    last."""

    def __init__(self) -> None:
        self.answer: dict[str, Any] = {}
        self.calls = 0
        self.said = False
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chat-upstream", daemon=True)
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)

    def __enter__(self) -> Upstream:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(HTTP_TIMEOUT_S)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(HTTP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(HTTP_TIMEOUT_S)
        self._loop.close()

    async def _start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        asked = await request.json()
        answer = self.answer
        self.said = True
        if "events" not in answer:
            return web.Response(
                status=answer["status"], body=answer["body"], content_type=answer["content_type"]
            )
        if asked.get("stream") is not True or not answer["stream"]:
            return web.Response(body=answer["json"].encode(), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self.said = bool(answer["events"])
        await response.prepare(request)
        for data in answer["events"]:
            await response.write(f"data: {data}\n\n".encode())
        await response.write_eof()
        return response


def _send(port: int, endpoint: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    try:
        headers = {"Content-Type": "application/json", "x-api-key": "k"}
        conn.request("POST", f"/v1/{endpoint}", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def _events(raw: bytes) -> list[dict[str, Any]]:
    """Each event's JSON; every `data:` line must be one."""
    return [json.loads(line[5:]) for line in raw.decode().splitlines() if line.startswith("data:")]


def _client_shaped(endpoint: str, status: int, raw: bytes) -> None:
    doc = json.loads(raw)
    if endpoint == "messages":
        assert doc["type"] == "error" and {"type", "message"} <= set(doc["error"]), doc
        if status == 400:
            assert doc["error"]["type"] == "invalid_request_error", doc
    else:
        assert set(doc) == {"error"} and {"message", "type", "param", "code"} <= set(doc["error"]), doc


def _well_formed(endpoint: str, streamed: bool, content_type: str, raw: bytes) -> bool:
    """Whether a 200 answer is whole in the client's format; False when it ends in the format's error."""
    if streamed:
        assert content_type.startswith("text/event-stream"), (content_type, raw[:200])
        events = _events(raw)
        assert events and events[-1]["type"] in TERMINAL[endpoint], raw[-300:]
        whole = events[-1]["type"] in ("message_stop", "response.completed", "response.incomplete")
        assert not whole or events[0]["type"] in ("message_start", "response.created"), raw[:300]
        return whole
    doc = json.loads(raw)
    if endpoint == "messages":
        assert doc["type"] == "message" and isinstance(doc["content"], list), doc
    else:
        assert doc["object"] == "response" and isinstance(doc["output"], list), doc
    return True


def test_every_translated_exchange_ends_in_shape_and_is_recorded(tmp_path: Path) -> None:
    store = tmp_path / "records.db"
    # Per request: whether it was answered in full, and whether the upstream answered it 200 or with
    # something that is no chat answer (so the record must keep what it said).
    expected: list[tuple[bool, bool]] = []
    with Upstream() as upstream:
        upstream_url = f"http://127.0.0.1:{upstream.port}"
        config = ProxyConfig(
            upstream=upstream_url, host="127.0.0.1", port=0, store=str(store), layout="chat-only"
        )
        with ThreadedProxy(config) as proxy:
            port = proxy.port
            assert port is not None

            @FUZZ
            @given(
                endpoint=st.sampled_from(["messages", "responses"]),
                messages=messages_bodies,
                responses=responses_bodies,
                stream=st.booleans(),
                answer=answers(),
            )
            @example(
                endpoint="messages",
                messages={"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
                responses={"input": "hi"},
                stream=True,
                answer={"kind": "completion", "stream": True, "json": "{}", "events": DEEP_CALL_EVENTS},
            )
            def one(
                endpoint: str,
                messages: dict[str, Any],
                responses: dict[str, Any],
                stream: bool,
                answer: dict[str, Any],
            ) -> None:
                body = {"model": "m", **(messages if endpoint == "messages" else responses), "stream": stream}
                upstream.answer = answer
                before = upstream.calls
                status, content_type, raw = _send(port, endpoint, body)
                said = upstream.calls > before and upstream.said and answer["kind"] != "error"
                if status == 200:
                    expected.append((_well_formed(endpoint, stream, content_type, raw), said))
                else:
                    assert content_type.startswith("application/json"), (status, raw)
                    _client_shaped(endpoint, status, raw)
                    expected.append((False, said))

            one()
    with StoreReader(store) as reader:
        rows = reader.exchanges()
    assert len(rows) == len(expected)
    for row, (whole, said) in zip(rows, expected, strict=True):
        assert row["error_class"] != "proxy_error", row["error_message"]
        # A failure is recorded as one, and what the upstream said is kept.
        assert (row["error_class"] is None) == whole, (
            row["status"],
            row["error_class"],
            row["error_message"],
        )
        assert row["received"] is not None or not said, row


@pytest.mark.parametrize(
    ("content_type", "page"),
    [("text/html", b"<html><h1>502 Bad Gateway</h1></html>"), ("application/json", b'{"detail": "ok"}')],
)
@pytest.mark.parametrize("endpoint", ["messages", "responses"])
def test_a_200_that_is_no_chat_answer_is_a_502_in_the_clients_shape_and_recorded(
    tmp_path: Path, endpoint: str, content_type: str, page: bytes
) -> None:
    store = tmp_path / "records.db"
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], "input": "hi"}
    with Upstream() as upstream:
        upstream.answer = {"kind": "page", "status": 200, "content_type": content_type, "body": page}
        config = ProxyConfig(
            upstream=f"http://127.0.0.1:{upstream.port}", port=0, store=str(store), layout="chat-only"
        )
        with ThreadedProxy(config) as proxy:
            assert proxy.port is not None
            answers = [_send(proxy.port, endpoint, {**body, "stream": stream}) for stream in (False, True)]
    for status, _, raw in answers:
        assert status == 502
        _client_shaped(endpoint, status, raw)
    with StoreReader(store) as reader:
        rows = reader.exchanges()
    kept = json.loads(page) if content_type == "application/json" else {"text": page.decode()}
    assert [(r["status"], r["error_class"], r["received"]) for r in rows] == [
        (502, "upstream_error", kept)
    ] * 2


@pytest.mark.parametrize(
    "odd",
    [
        {"messages": [{"role": "user", "content": [1, {"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "user", "content": {"type": "text"}}]},
        {"tools": [1]},
        {"tools": {"name": "bash"}},
    ],
)
def test_a_messages_request_of_the_wrong_shape_is_a_400_the_sdk_does_not_retry(
    tmp_path: Path, odd: dict[str, Any]
) -> None:
    body = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **odd}
    with Upstream() as upstream:
        config = ProxyConfig(
            upstream=f"http://127.0.0.1:{upstream.port}",
            port=0,
            store=str(tmp_path / "r.db"),
            layout="chat-only",
        )
        with ThreadedProxy(config) as proxy:
            assert proxy.port is not None
            status, _, raw = _send(proxy.port, "messages", body)
    assert status == 400, raw
    _client_shaped("messages", status, raw)
    assert upstream.calls == 0
