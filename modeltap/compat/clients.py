"""What the agent clients we know do differently, as data, and the small functions that read it.

Owns: the clients' quirks as measured in shared/reference/agent-clients.md (which path each appends
to its base URL, where its key travels, its retry header, Claude Code's connectivity check) and the
user-agent -> client-name mapping the records use. Does not own: routing (proxy/routes.py accepts
`/v1/v1/...` and ignores the query string) or what a presented key means (proxy/sessions.py).

    >>> client_name("claude-cli/2.1.332 (external, sdk-cli)")
    'claude-cli'
    >>> CLAUDE_CODE.path_for("/v1")
    '/v1/v1/messages?beta=true'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

# The Stainless-generated SDKs (openai-python, anthropic-python, and the TS SDK inside Claude Code)
# number their own retries in this header; the record keeps it to tell a retry from a new request.
RETRY_COUNT_HEADER = "x-stainless-retry-count"
# Claude Code probes its base URL with `HEAD /api/hello` unless CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC
# is set (agent-clients.md, "What reaches the internet without the flags"); a proxy must answer it.
CONNECTIVITY_CHECK_PATH = "/api/hello"


@dataclass(frozen=True, slots=True)
class Client:
    """One agent client's habits (agent-clients.md).

    `user_agent_prefixes`: how its User-Agent header starts.
    `appends`: what the client adds to its configured base URL for its main endpoint, query included.
    `base_url_suffix`: what to end the base URL with when handing it to this client, so that the path
    it builds is the canonical one. `key_header`: where its API key travels by default.
    `retry_count_meaningful`: whether RETRY_COUNT_HEADER counts its retries (Claude Code sends the
    header but it stays 0, because its own retry loop makes new requests).
    """

    name: str
    user_agent_prefixes: tuple[str, ...]
    dialect: Literal["openai", "anthropic"]
    appends: str
    key_header: Literal["authorization", "x-api-key"]
    retry_count_meaningful: bool

    @property
    def base_url_suffix(self) -> str:
        return "" if self.appends.startswith("/v1/") else "/v1"

    def path_for(self, base_path: str) -> str:
        """The path (and query) this client requests for its main endpoint, given its base URL's path.

        >>> OPENCODE.path_for("/v1/")
        '/v1/chat/completions'
        """
        return base_path.rstrip("/") + self.appends


# opencode 1.18.33: `baseURL` + `/chat/completions`, never adding `/v1`; Bearer.
OPENCODE = Client("opencode", ("opencode/",), "openai", "/chat/completions", "authorization", False)
# Claude Code 2.1.332: always `/v1/messages?beta=true`, so a base ending in /v1 gives /v1/v1/messages;
# `x-api-key` with ANTHROPIC_API_KEY (Bearer only with ANTHROPIC_AUTH_TOKEN).
CLAUDE_CODE = Client(
    "claude-cli", ("claude-cli/",), "anthropic", "/v1/messages?beta=true", "x-api-key", False
)
# openai 3.57.0: `/chat/completions` on the base as given; Bearer; lower-case x-stainless-* headers.
# The async client, which AReaL's agents use, says "AsyncOpenAI/Python" (checked in test_clients.py).
OPENAI_PYTHON = Client(
    "openai-python",
    ("OpenAI/Python", "AsyncOpenAI/Python"),
    "openai",
    "/chat/completions",
    "authorization",
    True,
)
# anthropic 2.14.0: `/v1/messages` (no ?beta=true); sends the key as Bearer for api_key= as well as
# auth_token=, not as x-api-key (agent-clients.md, "Official Python SDKs"); the async client's user
# agent and its counting retry header are checked in test_clients.py.
ANTHROPIC_PYTHON = Client(
    "anthropic-python",
    ("Anthropic/Python", "AsyncAnthropic/Python"),
    "anthropic",
    "/v1/messages",
    "authorization",
    True,
)

CLIENTS: tuple[Client, ...] = (OPENCODE, CLAUDE_CODE, OPENAI_PYTHON, ANTHROPIC_PYTHON)


def identify(user_agent: str | None) -> Client | None:
    """The known client that sent `user_agent`, or None.

    >>> identify("OpenAI/Python 3.57.0") is OPENAI_PYTHON
    True
    """
    if not user_agent:
        return None
    return next((c for c in CLIENTS if user_agent.startswith(c.user_agent_prefixes)), None)


def client_name(user_agent: str | None) -> str | None:
    """The short name the records show for a user agent: `opencode`, `claude-cli`, `openai-python`,
    `anthropic-python`, or None for anything else."""
    client = identify(user_agent)
    return client.name if client else None


def retry_count(headers: Mapping[str, str]) -> int | None:
    """The SDK's retry number from RETRY_COUNT_HEADER (0 on the first attempt), or None when the header
    is absent or not a non-negative integer. Header names are matched without regard to case, so a
    plain dict works as well as aiohttp's CIMultiDict."""
    value = _header(headers, RETRY_COUNT_HEADER)
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key a client presented: `Authorization: Bearer KEY` (scheme in any case), else
    `x-api-key: KEY`, the order AReaL's proxy reads them in (areal-proxy-protocol.md §1.1). Clients
    differ on which they send: Claude Code x-api-key, anthropic-python 2.14 and the rest Bearer."""
    authorization = _header(headers, "authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = (_header(headers, "x-api-key") or "").strip()
    return api_key or None


def is_connectivity_check(method: str, path: str) -> bool:
    """True for Claude Code's `HEAD /api/hello` probe, at the root or under a session prefix; the proxy
    answers it itself with 200 instead of forwarding it."""
    return method.upper() == "HEAD" and path.rstrip("/").endswith(CONNECTIVITY_CHECK_PATH)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)
