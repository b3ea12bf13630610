"""Tests for modeltap/compat/clients.py: the quirks table against the headers the real SDKs send.

The SDK tests run the real openai and anthropic clients against an aiohttp app on loopback that
fails the first attempt, so the retry header is seen counting; the CLI user agents are the ones
recorded in docs/agents.md §3.5 and §4.3.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from aiohttp import web
from multidict import CIMultiDict

from modeltap.compat.clients import presented_key, retry_count
from tests.factories import assistant, chat_completion, message, usage

# Tell the SDKs to retry at once instead of backing off for half a second.
FAST_RETRY = {"retry-after-ms": "1"}

CHAT_REPLY = chat_completion(assistant("42"), usage=usage(1, 1), created=0, model="m")
MESSAGE_REPLY = message(
    [{"type": "text", "text": "42"}], "end_turn", usage={"input_tokens": 1, "output_tokens": 1}, model="m"
)


@pytest.fixture
async def flaky_upstream(aiohttp_server):
    """An upstream that answers 500 to every first attempt and records every request's headers."""
    seen: list[tuple[str, CIMultiDict[str]]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path_qs, CIMultiDict(request.headers)))
        if len(seen) % 2 == 1:
            return web.json_response({"error": {"message": "try again"}}, status=500, headers=FAST_RETRY)
        reply = MESSAGE_REPLY if request.path.endswith("/messages") else CHAT_REPLY
        return web.json_response(reply)

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    server = await aiohttp_server(app)
    return server, seen


async def test_openai_python_is_identified_and_counts_its_retries(flaky_upstream):
    server, seen = flaky_upstream
    base = str(server.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base, api_key="sk-py", max_retries=1) as client:
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert [path for path, _ in seen] == ["/v1/chat/completions"] * 2
    assert all(h["User-Agent"].startswith("AsyncOpenAI/Python") for _, h in seen)
    assert [retry_count(h) for _, h in seen] == [0, 1]
    assert [presented_key(h) for _, h in seen] == ["sk-py"] * 2


async def test_anthropic_python_sends_bearer_and_counts_its_retries(flaky_upstream):
    server, seen = flaky_upstream
    base = str(server.make_url("/"))
    async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-py", max_retries=1) as client:
        await client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert [path for path, _ in seen] == ["/v1/messages"] * 2
    assert all(h["User-Agent"].startswith("AsyncAnthropic/Python") for _, h in seen)
    assert [retry_count(h) for _, h in seen] == [0, 1]
    # anthropic 2.14 puts api_key= in Authorization: Bearer, not in x-api-key (docs/agents.md §5)
    assert all("x-api-key" not in h for _, h in seen)
    assert [presented_key(h) for _, h in seen] == ["sk-ant-py"] * 2


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Stainless-Retry-Count": "0"}, 0),  # Claude Code's spelling
        ({"x-stainless-retry-count": "3"}, 3),  # openai-python's spelling
        ({"x-stainless-retry-count": " 2 "}, 2),
        ({"x-stainless-retry-count": "-1"}, None),
        ({"x-stainless-retry-count": "two"}, None),
        ({"x-stainless-retry-count": ""}, None),
        ({"x-stainless-retry-count": "²"}, None),  # a digit to str.isdigit, not to int()
        ({"x-stainless-retry-count": "٣"}, None),  # an Arabic-Indic three
        ({"x-stainless-retry-count": "9" * 4301}, None),  # past int()'s digit limit
        ({}, None),
    ],
)
def test_retry_count(headers, expected):
    assert retry_count(headers) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Authorization": "Bearer sk-test-opencode-123"}, "sk-test-opencode-123"),
        ({"authorization": "bearer tok-bearer-123"}, "tok-bearer-123"),
        ({"x-api-key": "sk-ant-test-claude-123"}, "sk-ant-test-claude-123"),
        # Bearer wins when both are present, as in AReaL's proxy
        ({"Authorization": "Bearer a", "x-api-key": "b"}, "a"),
        # a non-Bearer Authorization does not hide x-api-key
        ({"Authorization": "Basic dXNlcjpwdw==", "x-api-key": "b"}, "b"),
        ({"Authorization": "Bearer   "}, None),
        ({"x-api-key": "  "}, None),
        ({}, None),
    ],
)
def test_presented_key(headers, expected):
    assert presented_key(headers) == expected
    assert presented_key(CIMultiDict(headers)) == expected
