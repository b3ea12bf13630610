"""modeltap/proxy/upstream.py: layouts, the auto fallback on route-level 404s only, error mapping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from modeltap import dialects
from modeltap.proxy.errors import NotFound, UpstreamTimeout, UpstreamUnreachable
from modeltap.proxy.upstream import INFO_MAX_BYTES, Upstream, map_client_error

CHAT = dialects.named("chat")


def upstream_app(log: list[str]) -> web.Application:
    """Bare chat (AReaL-like, FastAPI 404 elsewhere), and an OpenAI-shaped 404 on /v1/embeddings."""

    async def any_path(request: web.Request) -> web.Response:
        log.append(request.path_qs)
        if request.path == "/chat/completions":
            return web.json_response({"ok": True})
        if request.path == "/v1/embeddings":
            return web.json_response(
                {"error": {"message": "no model", "code": "model_not_found"}}, status=404
            )
        if request.path.startswith("/slow"):
            await asyncio.sleep(5)
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", any_path)
    return app


@pytest.fixture
async def served(aiohttp_server) -> AsyncIterator[tuple[str, list[str]]]:
    log: list[str] = []
    server = await aiohttp_server(upstream_app(log))
    yield str(server.make_url("")).rstrip("/"), log


async def test_auto_falls_back_once_and_remembers(served: tuple[str, list[str]]) -> None:
    base, log = served
    async with aiohttp.ClientSession() as client:
        up = Upstream(base, "auto", client)
        for _ in range(3):
            reply = await up.send(CHAT, "POST", "beta=true", {}, b"{}")
            assert reply.response.status == 200 and reply.path == "/chat/completions"
            reply.response.release()
    assert log == ["/v1/chat/completions?beta=true", "/chat/completions?beta=true",
                   "/chat/completions?beta=true", "/chat/completions?beta=true"]  # fmt: skip


async def test_api_shaped_404_is_not_a_missing_route(served: tuple[str, list[str]]) -> None:
    base, log = served
    async with aiohttp.ClientSession() as client:
        reply = await Upstream(base, "auto", client).send(dialects.named("embeddings"), "POST", "", {}, b"{}")
    assert reply.response.status == 404 and b"model_not_found" in (reply.body or b"")
    assert log == ["/v1/embeddings"]  # never tried the bare path


async def test_missing_everywhere_is_not_found(served: tuple[str, list[str]]) -> None:
    base, _ = served
    async with aiohttp.ClientSession() as client:
        with pytest.raises(NotFound, match="tried /v1/models, /models"):
            await Upstream(base, "auto", client).send(dialects.named("models"), "GET", "", {}, None)


@pytest.mark.parametrize(
    ("layout", "base_suffix", "expected"),
    [
        ("areal", "", "/chat/completions"),
        ("openai", "", "/v1/chat/completions"),
        ("areal", "/v1", "/v1/chat/completions"),
    ],
)
async def test_fixed_layouts(
    served: tuple[str, list[str]], layout: str, base_suffix: str, expected: str
) -> None:
    base, log = served
    async with aiohttp.ClientSession() as client:
        try:
            await Upstream(base + base_suffix, layout, client).send(CHAT, "POST", "", {}, b"{}")  # type: ignore[arg-type]
        except NotFound:
            pass
    assert log == [expected]


async def test_unreachable_and_timeout_map_to_502_and_504(served: tuple[str, list[str]]) -> None:
    base, _ = served
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=0.2)) as client:
        with pytest.raises(UpstreamUnreachable, match="cannot connect"):
            await Upstream("http://127.0.0.1:1", "openai", client).send(CHAT, "POST", "", {}, b"{}")
        with pytest.raises(UpstreamTimeout, match="timed out"):
            await Upstream(base + "/slow", "areal", client).send(CHAT, "POST", "", {}, b"{}")


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (TimeoutError(), 504),
        (aiohttp.ServerTimeoutError("read"), 504),
        (aiohttp.ConnectionTimeoutError("connect"), 504),
        (aiohttp.ServerDisconnectedError(), 502),
        (aiohttp.ClientPayloadError("truncated"), 502),
        (aiohttp.ClientOSError(104, "reset"), 502),
    ],
)
def test_client_exceptions_map(exc: BaseException, status: int) -> None:
    assert map_client_error(exc, "http://u").status == status


async def test_auto_tries_the_bare_path_first_where_areal_is_installed(served: tuple[str, list[str]]) -> None:
    base, log = served
    async with aiohttp.ClientSession() as client:
        reply = await Upstream(base, "auto", client, auto_first="areal").send(CHAT, "POST", "", {}, b"{}")
        reply.response.release()
    assert log == ["/chat/completions"]


@pytest.mark.parametrize(
    ("layout", "translated"),
    [
        ("areal", []),
        ("openai", []),
        ("auto", []),
        ("areal-gateway", ["responses", "messages"]),
        ("chat-only", ["responses", "messages"]),
    ],
)
async def test_a_layout_says_which_formats_go_upstream_as_chat(layout: str, translated: list[str]) -> None:
    async with aiohttp.ClientSession() as client:
        upstream = Upstream("http://127.0.0.1:1", layout, client)  # type: ignore[arg-type]
        assert [d.name for d in dialects.DIALECTS if upstream.translates(d)] == translated


async def test_auto_translates_a_format_served_nowhere_from_then_on_and_says_so_once(
    served: tuple[str, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    base, _ = served
    messages, models = dialects.named("messages"), dialects.named("models")
    async with aiohttp.ClientSession() as client:
        upstream = Upstream(base, "auto", client)
        assert not upstream.translates(messages)
        with caplog.at_level(logging.WARNING, logger="modeltap.proxy.upstream"):
            assert upstream.translate_from_now_on(messages)
            # A request sent as it is before the first 404 came back is retried through chat too.
            assert upstream.translate_from_now_on(messages)
        assert upstream.translates(messages)
        assert not upstream.translate_from_now_on(models)  # models cannot go as chat
        fixed = Upstream(base, "openai", client)
        assert not fixed.translate_from_now_on(messages)  # a fixed layout says what it serves
    said = [r.getMessage() for r in caplog.records if "translates" in r.getMessage()]
    assert said == [
        f"upstream {base} serves no messages endpoint: "
        "modeltap translates messages requests through chat from now on"
    ]


async def test_an_info_route_answering_a_huge_or_deep_body_is_read_bounded(aiohttp_server) -> None:
    # A wrong upstream (a file server) may answer discovery with anything: at most INFO_MAX_BYTES is
    # read, and a body nested past Python's JSON parser is "not here" too.
    total, sent = 16 * INFO_MAX_BYTES, [0]

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        piece = b" " * (1024 * 1024)
        try:
            while sent[0] < total:
                await response.write(piece)
                sent[0] += len(piece)
        except (ConnectionError, RuntimeError):
            pass  # the client hung up
        return response

    async def deep(request: web.Request) -> web.Response:
        return web.Response(body=b"[" * 1200, content_type="application/json")

    app = web.Application()
    app.router.add_get("/v1/models", huge)
    app.router.add_get("/server_info", deep)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as client:
        upstream = Upstream(str(server.make_url("")).rstrip("/"), "openai", client)
        assert await upstream.fetch_json("/v1/models", {}, 30) is None
        assert await upstream.fetch_json("/server_info", {}, 30) is None
    assert sent[0] < total // 2
