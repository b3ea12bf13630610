"""The holes an adversarial pass found, each reproduced against a live proxy in front of the AReaL
stand-in: nothing a served request held is lost, no session token or key leaks, and every refusal is in
the client's shape and recorded."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modeltap.exporters.export import write_export
from modeltap.proxy.server import Proxy
from modeltap.readers.show import turn_text
from modeltap.records.jsontext import pretty
from modeltap.records.reader import StoreReader
from modeltap.records.turns import turns
from tests.factories import ASK
from tests.integration.conftest import records
from tests.integration.test_hostile import http_request, open_session, send_raw
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn

CHAT: dict[str, Any] = {"model": "policy", "messages": [ASK], "max_tokens": 16}
HALF_EMOJI = "\ud83d"
# What a gzip bomb inflates to: past the limit the test sets, far below what would hurt the machine.
BOMB_BYTES = 256 * 1024 * 1024
LIMIT_BYTES = 1024 * 1024


def json_bytes(body: Any) -> bytes:
    """JSON as a JavaScript agent sends it: lone surrogates written as `\\uXXXX` escapes."""
    return json.dumps(body).encode()


async def post(url: str, data: bytes, **headers: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(auto_decompress=True) as http,
        http.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as reply,
    ):
        return reply.status, await reply.json(content_type=None)


def health(proxy: Proxy) -> dict[str, Any]:
    """The store's counters; read after the proxy stopped, when every record is flushed."""
    store = proxy.context.store
    return {"written": store.written, "failures": store.failures}


# -- 1. a served request always leaves a record --------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"model": "policy", "messages": [{"role": "user", "content": "cut " + HALF_EMOJI}]},
        {"model": HALF_EMOJI, "messages": [ASK]},
        {"model": "policy", "messages": [{**ASK, HALF_EMOJI: "x"}]},
    ],
    ids=["content", "model", "key"],
)
async def test_a_lone_surrogate_is_answered_and_recorded_as_sent(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, body: dict[str, Any]
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        status, _ = await post(session.host_base_url + "/chat/completions", json_bytes(body))
    assert status == 200 and health(proxy) == {"written": 1, "failures": 0}
    [row] = records(store_path)
    assert row["request"] == body


async def test_a_header_that_is_not_utf8_and_a_label_with_a_lone_surrogate_are_recorded(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        upstream = areal.open_session("odd")
        session = proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "\ud800"})
        target = f"/s/{session.token}/chat/completions"
        reply = await send_raw(
            proxy.port, http_request(target, b"User-Agent: agent/1 \xff\xfe", body=json_bytes(CHAT))
        )
        again = await send_raw(proxy.port, http_request(target, body=json_bytes(CHAT)))
    assert (reply.status, again.status, health(proxy)) == (200, 200, {"written": 2, "failures": 0})
    first, second = records(store_path)
    assert first["user_agent"] == "agent/1 \\udcff\\udcfe" and first["labels"] == {"task_id": "\ud800"}
    assert second["labels"] == {"task_id": "\ud800"}


# -- 2. a hang-up keeps what was said ---------------------------------------------------------------


async def test_a_client_hanging_up_mid_stream_keeps_the_part_it_was_sent(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    areal.control.chunk_delay_s = 0.2
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        async with aiohttp.ClientSession() as http:
            url = session.host_base_url + "/chat/completions"
            async with http.post(url, json={**CHAT, "stream": True}) as reply:
                assert await reply.content.readuntil(b"\n\n")  # the first event arrived: now leave
        await asyncio.sleep(0.5)
    [row] = records(store_path)
    assert (row["status"], row["error_class"], row["stream_complete"]) == (200, "client_disconnect", False)
    assert row["response"] is not None and row["response"]["choices"], row["response"]


# -- 3. compressed request bodies ---------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_body_reaches_the_upstream_decoded_and_unlabelled(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, encoding: str
) -> None:
    raw = json_bytes(CHAT)
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    async with make_proxy(upstream=areal.url, host="0.0.0.0") as proxy:
        session, _ = open_session(proxy, areal)
        status, _ = await post(
            session.host_base_url + "/chat/completions", packed, **{"Content-Encoding": encoding}
        )
    assert status == 200
    [sent] = areal.model_requests
    assert sent.body == CHAT and "Content-Encoding" not in sent.headers
    assert records(store_path)[0]["request"] == CHAT


async def test_a_gzip_bomb_stops_at_the_limit_and_others_are_served_meanwhile(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    bomb = gzip.compress(b"[" + b" " * BOMB_BYTES, compresslevel=9)
    async with make_proxy(upstream=areal.url, max_body_bytes=LIMIT_BYTES) as proxy:
        session, _ = open_session(proxy, areal)
        url = session.host_base_url + "/chat/completions"
        bombs = [post(url, bomb, **{"Content-Encoding": "gzip"}) for _ in range(4)]
        served = post(url, json_bytes(CHAT))
        results = await asyncio.gather(*bombs, served)
    assert [status for status, _ in results] == [413, 413, 413, 413, 200]
    assert all("inflates past the limit" in body["error"]["message"] for _, body in results[:4])
    assert sorted(row["status"] for row in records(store_path)) == [200, 413, 413, 413, 413]


async def test_a_remote_callers_compressed_body_without_a_token_is_refused_before_it_is_inflated(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bridge_host: str,
) -> None:
    from modeltap.proxy import request_body

    inflated: list[int] = []
    monkeypatch.setattr(request_body, "inflate", lambda *args: inflated.append(1) or b"{}")
    async with make_proxy(upstream=areal.url, host=bridge_host) as proxy:
        status, body = await post(
            proxy.host_base_url + "/v1/chat/completions",
            gzip.compress(json_bytes(CHAT)),
            **{"Content-Encoding": "gzip"},
        )
    assert status == 401 and "from another machine needs a session token" in body["error"]["message"]
    assert inflated == [] and areal.requests == []
    assert records(store_path)[0]["status"] == 401


async def test_a_compressed_body_from_this_host_is_inflated_whatever_the_listener_binds(
    make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    # The rule naming follows (README): a loopback peer is this host's, also on `serve`'s 0.0.0.0.
    chat = CHAT | {"model": "standin-model"}
    with OpenAILikeStandIn() as vllm:
        async with make_proxy(upstream=vllm.url, host="0.0.0.0") as proxy:
            status, _ = await post(
                proxy.host_base_url + "/v1/chat/completions",
                gzip.compress(json_bytes(chat)),
                **{"Content-Encoding": "gzip"},
            )
        assert status == 200 and vllm.requests[-1].body == chat
    assert records(store_path)[0]["request"] == chat


@pytest.mark.parametrize(
    ("encoding", "data", "status", "words"),
    [
        ("gzip", b"\x1f\x8b\x08\x00not gzip at all", 400, "not valid gzip"),
        ("gzip", gzip.compress(json_bytes(CHAT))[:-12], 400, "ends before its stream does"),
        ("br", b"\x0b\x02\x80{}", 415, "'br' is not accepted"),
        ("zstd", b"(\xb5/\xfd{}", 415, "'zstd' is not accepted"),
    ],
)
async def test_bad_or_unknown_encodings_are_refused_in_the_clients_shape_and_recorded(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    encoding: str,
    data: bytes,
    status: int,
    words: str,
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        got, body = await post(session.host_base_url + "/v1/messages", data, **{"Content-Encoding": encoding})
    assert got == status and body["type"] == "error" and words in body["error"]["message"]
    assert records(store_path)[0]["status"] == status and areal.requests == []


# -- 4. every error in the client's shape, decided where the input is read ----------------------------


@pytest.mark.parametrize("value", ["²", "٣", "9" * 4301])
async def test_an_odd_retry_count_is_no_error(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, value: str
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        status, _ = await post(
            session.host_base_url + "/chat/completions",
            json_bytes(CHAT),
            **{"x-stainless-retry-count": value},
        )
    assert status == 200 and records(store_path)[0]["retry_count"] is None


@pytest.mark.parametrize("messages", [[1], [None], ["s"], [[]]])
async def test_messages_that_are_no_objects_are_a_400_for_anthropic_clients(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, messages: list[Any]
) -> None:
    async with make_proxy(upstream=areal.url, layout="areal") as proxy:
        session, _ = open_session(proxy, areal)
        body = {"model": "claude-x", "max_tokens": 8, "messages": messages}
        status, answer = await post(session.host_base_url + "/v1/messages", json_bytes(body))
    assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert "messages[0] must be an object" in answer["error"]["message"]
    assert records(store_path)[0]["error_class"] == "client_error"


async def test_a_completions_prompt_nested_600_deep_is_a_400_with_the_budget_on(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, qwen_dir: str
) -> None:
    prompt: Any = "x"
    for _ in range(600):
        prompt = [prompt]
    body = {"model": "policy", "prompt": prompt, "max_tokens": 4}
    async with make_proxy(upstream=areal.url, tokenizer=qwen_dir, context_length=4096) as proxy:
        session, _ = open_session(proxy, areal)
        status, answer = await post(session.host_base_url + "/completions", json_bytes(body))
    assert status == 400 and "prompt must be text" in answer["error"]["message"]
    assert records(store_path)[0]["status"] == 400


# -- 5. no secret in a log, a record or an export -----------------------------------------------------


async def test_a_token_in_the_query_is_masked_everywhere_and_never_forwarded(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        url = f"{session.host_base_url}/chat/completions?key={session.token}&keep=1"
        status, _ = await post(url, json_bytes(CHAT))
    assert status == 200
    [sent] = areal.model_requests
    assert session.token not in sent.path_qs and sent.query == {"keep": "1"}
    assert_no_token(store_path, session.token, caplog.text)


@pytest.mark.parametrize("glue", [".", ";x=1", "%20", "-x"])
async def test_a_near_miss_session_path_is_masked_in_its_record(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, glue: str
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        reply = await send_raw(
            proxy.port, http_request(f"/s/{session.token}{glue}/v1/chat/completions", body=json_bytes(CHAT))
        )
    assert reply.status in (401, 404) and session.token.encode() not in reply.body
    assert_no_token(store_path, session.token, "")


@pytest.mark.parametrize(
    "credentials",
    [
        {"x-api-key": "{token}", "Authorization": "Bearer somebody-elses-key"},
        {"Authorization": "Token {token}"},
        {"Authorization": "{token}"},
        {"api-key": "{token}"},
    ],
)
async def test_a_session_token_in_any_credential_header_is_ours_and_never_forwarded(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], credentials: dict[str, str]
) -> None:
    async with make_proxy(upstream=areal.url) as proxy:  # no --upstream-key: credentials pass through
        session, _ = open_session(proxy, areal)
        headers = {k: v.format(token=session.token) for k, v in credentials.items()}
        await post(proxy.host_base_url + "/chat/completions", json_bytes(CHAT), **headers)
        proxy.sessions.close(session.id)
        closed, _ = await post(proxy.host_base_url + "/chat/completions", json_bytes(CHAT), **headers)
    assert closed == 401
    assert all(session.token not in str(dict(r.headers)) for r in areal.requests)


async def test_an_overlong_request_line_logs_no_token_and_echoes_nothing(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        line = f"/s/{session.token}/chat/completions?pad=" + "a" * 9000
        reply = await send_raw(proxy.port, http_request(line, body=json_bytes(CHAT)))
        headers = [f"X-Pad-{i}: {session.token}".encode() for i in range(130)]
        crowded = await send_raw(proxy.port, http_request("/chat/completions", *headers, body=b"{}"))
    for answer in (reply, crowded):
        assert answer.status == 400 and answer.headers["content-type"].startswith("application/json")
        assert answer.error()["type"] == "invalid_request_error"
        assert session.token.encode() not in answer.body
    assert session.token not in caplog.text


def assert_no_token(store_path: Path, token: str, log: str) -> None:
    """The token is in no record, no export of any format, no `show --full`, and not in `log`."""
    with StoreReader(store_path) as reader:
        rows = reader.exchanges()
        texts = [pretty(rows)]
        for session_id in {row["session_id"] for row in rows if row["session_id"]}:
            for fmt in ("har", "jsonl"):
                out = _Text()
                write_export(reader, session_id, fmt, out)
                texts.append(out.text)
    texts += [turn_text(turn) for turn in turns(rows, full=True)]
    assert not [t for t in [*texts, log] if token in t]


class _Text:
    def __init__(self) -> None:
        self.text = ""

    def write(self, piece: str) -> int:
        self.text += piece
        return len(piece)


# -- 6. headers that should not cross ------------------------------------------------------------------


async def test_headers_named_by_connection_and_path_overrides_and_credentials_stay_behind(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    upstream = areal.open_session("hdr")
    async with make_proxy(upstream=areal.url, upstream_key=upstream.api_key) as proxy:
        await post(
            proxy.host_base_url + "/chat/completions",
            json_bytes(CHAT),
            **{
                "Connection": "keep-alive, X-Secret-Hop",
                "X-Secret-Hop": "1",
                "X-Original-URL": "/rl/set_reward",
                "X-Rewrite-URL": "/rl/set_reward",
                "Cookie": "sid=abc",
                "api-key": "client-key-1",
                "x-goog-api-key": "client-key-2",
                "X-Kept": "yes",
            },
        )
    [sent] = areal.model_requests
    for name in ("X-Secret-Hop", "X-Original-URL", "X-Rewrite-URL", "Cookie", "api-key", "x-goog-api-key"):
        assert name not in sent.headers, name
    assert sent.headers["X-Kept"] == "yes" and sent.headers["Authorization"] == f"Bearer {upstream.api_key}"


# -- 7. readers that survive what was recorded -----------------------------------------------------------


async def test_every_reader_survives_turns_nested_hundreds_deep(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, tmp_path: Path
) -> None:
    deep: Any = "bottom"
    for _ in range(250):  # a list and an object each time: 500 levels
        deep = [{"type": "text", "text": "level", "content": deep}]
    messages = [{"role": "user", "content": deep}]
    async with make_proxy(upstream=areal.url) as proxy:
        session, _ = open_session(proxy, areal)
        for turn in (messages, [*messages, {"role": "assistant", "content": "ok"}, ASK]):
            status, _ = await post(
                session.host_base_url + "/chat/completions", json_bytes({**CHAT, "messages": turn})
            )
            assert status == 200
    with StoreReader(store_path) as reader:
        rows = reader.exchanges(session.id)
        for fmt in ("har", "jsonl", "messages"):
            write_export(reader, session.id, fmt, _Text())
    listed = turns(rows, full=True)
    assert (
        len(listed) == 2 and all(turn_text(turn) for turn in listed) and pretty([t.as_json() for t in listed])
    )


# -- the whole class under load --------------------------------------------------------------------------


async def test_a_hundred_good_requests_among_fifty_hostile_ones(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Good and hostile requests at once: exactly the good ones are served and recorded whole, every
    hostile one is refused in its client's shape and recorded, and no secret is anywhere."""
    caplog.set_level(logging.DEBUG)
    upstream = areal.open_session("load")
    hostile: list[tuple[str, bytes, dict[str, str]]] = [
        ("/chat/completions", b"{not json", {}),
        ("/chat/completions", json_bytes({"model": "m", "messages": "not a list"}), {}),
        ("/v1/messages", json_bytes({"model": "m", "max_tokens": 1, "messages": [1]}), {}),
        ("/chat/completions", b"\x1f\x8bnot gzip", {"Content-Encoding": "gzip"}),
        ("/chat/completions", json_bytes(CHAT), {"Content-Encoding": "br"}),
    ]
    async with make_proxy(upstream=areal.url, upstream_key=upstream.api_key, host="0.0.0.0") as proxy:
        session = proxy.sessions.open(labels={"task_id": "load"})
        base = session.host_base_url
        good = [post(base + "/chat/completions", json_bytes(CHAT)) for _ in range(100)]
        bad = [post(base + path, data, **headers) for path, data, headers in hostile * 10]
        results = await asyncio.gather(*good, *bad)
    statuses = [status for status, _ in results]
    assert statuses[:100] == [200] * 100 and all(400 <= status < 500 for status in statuses[100:])
    assert all(
        body["type"] == "error" if "messages" in path else set(body) == {"error"}
        for (path, _, _), (_, body) in zip(hostile * 10, results[100:], strict=True)
    )
    rows = records(store_path)
    assert len(rows) == 150 and health(proxy)["failures"] == 0
    assert sum(row["status"] == 200 and row["error_class"] is None for row in rows) == 100
    assert sum(row["error_class"] == "client_error" for row in rows) == 50
    for secret in (session.token, upstream.api_key):
        assert_no_token(store_path, secret, caplog.text)
