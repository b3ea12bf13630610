"""Tests for modeltap/compat/clients.py: the quirks table against the headers the real SDKs send.

The SDK tests run the real openai and anthropic clients against an aiohttp app on loopback that
fails the first attempt, so the retry header is seen counting; the CLI user agents are the ones
recorded in shared/reference/agent-clients.md.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
from aiohttp import web
from multidict import CIMultiDict

from modeltap.compat.clients import (
    ANTHROPIC_PYTHON,
    CLAUDE_CODE,
    CLIENTS,
    OPENAI_PYTHON,
    OPENCODE,
    client_name,
    identify,
    is_connectivity_check,
    presented_key,
    retry_count,
)
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
    assert [OPENAI_PYTHON.path_for("/v1")] == [seen[0][0]]
    assert [client_name(h["User-Agent"]) for _, h in seen] == ["openai-python"] * 2
    assert [retry_count(h) for _, h in seen] == [0, 1]
    assert [presented_key(h) for _, h in seen] == ["sk-py"] * 2


async def test_anthropic_python_sends_bearer_and_counts_its_retries(flaky_upstream):
    server, seen = flaky_upstream
    base = str(server.make_url("/"))
    async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-py", max_retries=1) as client:
        await client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert [path for path, _ in seen] == [ANTHROPIC_PYTHON.path_for("")] * 2
    assert [client_name(h["User-Agent"]) for _, h in seen] == ["anthropic-python"] * 2
    assert [retry_count(h) for _, h in seen] == [0, 1]
    # anthropic 2.14 puts api_key= in Authorization: Bearer, not in x-api-key (agent-clients.md)
    assert all("x-api-key" not in h for _, h in seen)
    assert [presented_key(h) for _, h in seen] == ["sk-ant-py"] * 2
    assert ANTHROPIC_PYTHON.key_header == "authorization"


@pytest.mark.parametrize(
    ("user_agent", "expected"),
    [
        ("opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14", OPENCODE),
        ("claude-cli/2.1.332 (external, sdk-cli)", CLAUDE_CODE),
        ("OpenAI/Python 3.57.0", OPENAI_PYTHON),
        ("AsyncOpenAI/Python 3.57.0", OPENAI_PYTHON),
        ("Anthropic/Python 2.14.0", ANTHROPIC_PYTHON),
        ("AsyncAnthropic/Python 2.14.0", ANTHROPIC_PYTHON),
        ("Bun/1.4.6", None),  # Claude Code's HEAD /api/hello probe
        ("npm/undefined node/v24.3.0 linux x64 workspaces/false", None),
        ("", None),
        (None, None),
    ],
)
def test_identify_by_user_agent(user_agent, expected):
    assert identify(user_agent) is expected
    assert client_name(user_agent) == (expected.name if expected else None)


@pytest.mark.parametrize(
    ("client", "base_path", "requested"),
    [
        # agent-clients.md, the "Paths, all tested" tables
        (CLAUDE_CODE, "", "/v1/messages?beta=true"),
        (CLAUDE_CODE, "/", "/v1/messages?beta=true"),
        (CLAUDE_CODE, "/v1", "/v1/v1/messages?beta=true"),
        (OPENCODE, "/v1", "/v1/chat/completions"),
        (OPENCODE, "/v1/", "/v1/chat/completions"),
        (OPENCODE, "", "/chat/completions"),
        (ANTHROPIC_PYTHON, "/v1", "/v1/v1/messages"),
    ],
)
def test_path_for_reproduces_the_measured_paths(client, base_path, requested):
    assert client.path_for(base_path) == requested


def test_base_url_suffix_gives_each_client_the_canonical_path():
    for client in CLIENTS:
        path = client.path_for(client.base_url_suffix).split("?")[0]
        assert path in ("/v1/chat/completions", "/v1/messages"), client.name


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"X-Stainless-Retry-Count": "0"}, 0),  # Claude Code's spelling
        ({"x-stainless-retry-count": "3"}, 3),  # openai-python's spelling
        ({"x-stainless-retry-count": " 2 "}, 2),
        ({"x-stainless-retry-count": "-1"}, None),
        ({"x-stainless-retry-count": "two"}, None),
        ({"x-stainless-retry-count": ""}, None),
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


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("HEAD", "/api/hello", True),
        ("head", "/api/hello/", True),
        ("HEAD", "/s/abcdefghijklmnopqrstuv/api/hello", True),
        ("GET", "/api/hello", False),
        ("HEAD", "/v1/messages", False),
    ],
)
def test_is_connectivity_check(method, path, expected):
    assert is_connectivity_check(method, path) is expected
