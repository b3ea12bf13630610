"""What the agent clients send that the proxy reads: their retry count and where their key travels.

Owns: the Stainless SDKs' retry header and reading a client's presented API key, the two header facts
the relay relies on (docs/agents.md §9 has each client's measured habits). Does not own: routing
(proxy/routes.py accepts `/v1/v1/...` and ignores the query string) or what a presented key means
(proxy/sessions.py).

    >>> retry_count({"x-stainless-retry-count": "2"})
    2
    >>> presented_key({"x-api-key": "sk-ant"})
    'sk-ant'
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from urllib.parse import parse_qsl, unquote_plus

# The Stainless-generated SDKs (openai-python, anthropic-python, and the TS SDK inside Claude Code)
# number their own retries in this header; the record keeps it to tell a retry from a new request.
RETRY_COUNT_HEADER = "x-stainless-retry-count"
# No SDK retries more than a handful of times; a longer number is not a retry count.
RETRY_COUNT_MAX_DIGITS = 6


def retry_count(headers: Mapping[str, str]) -> int | None:
    """The SDK's retry number from RETRY_COUNT_HEADER (0 on the first attempt), or None when the header
    is absent or not a short non-negative integer in ASCII digits. Header names are matched without
    regard to case, so a plain dict works as well as aiohttp's CIMultiDict."""
    value = (_header(headers, RETRY_COUNT_HEADER) or "").strip()
    if not (value.isascii() and value.isdigit() and len(value) <= RETRY_COUNT_MAX_DIGITS):
        return None
    return int(value)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key a client presented: `Authorization: Bearer KEY` (scheme in any case), else
    `x-api-key: KEY`, the order AReaL's proxy reads them in (docs/areal.md §1.1.3). Clients differ on
    which they send: Claude Code x-api-key, anthropic-python 2.14 and the rest Bearer."""
    authorization = _header(headers, "authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = (_header(headers, "x-api-key") or "").strip()
    return api_key or None


# How each client we know names itself in User-Agent (docs/agents.md §3-§7), most specific first: the
# records label each exchange with the client, so traffic can be told apart without a session.
_USER_AGENTS = (
    ("opencode/", "opencode"),
    ("claude-cli/", "claude-code"),
    ("codex_exec/", "codex"),
    ("QwenCode/", "qwen-code"),
    ("AsyncOpenAI/Python", "openai-python"),
    ("OpenAI/Python", "openai-python"),
    ("AsyncAnthropic/Python", "anthropic-python"),
    ("Anthropic/Python", "anthropic-python"),
)


def client_of(user_agent: str | None) -> str | None:
    """The name of the known client that sent `user_agent`, or None.

    >>> client_of("opencode/1.18.33 ai-sdk/provider-utils/4.0.23"), client_of("curl/8.0")
    ('opencode', None)
    """
    if not user_agent:
        return None
    return next((name for prefix, name in _USER_AGENTS if user_agent.startswith(prefix)), None)


# Every header a client may carry an API key in: the relay looks at each for a session token.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key", "x-goog-api-key")


# Query parameters clients carry a key in: Gemini's `?key=`, Azure OpenAI's `?api-key=`, and the
# spellings of the same idea (https://ai.google.dev/api#api-keys). Treated as the headers are: kept out
# of records, not sent on by replay, replaced by the upstream's key.
CREDENTIAL_PARAMS = frozenset(("key", "api-key", "api_key", "apikey", "x-api-key", "access_token"))
# What a credential in a recorded query reads as.
REDACTED = "[redacted]"


def query_credentials(query: str) -> list[str]:
    """The values of the credential parameters in a query string (as sent, or decoded).

    >>> query_credentials("alt=sse&key=AIza0123")
    ['AIza0123']
    """
    return [v for k, v in parse_qsl(query, keep_blank_values=True) if k.lower() in CREDENTIAL_PARAMS and v]


def without_query_credentials(query: str, replacement: str | None = None) -> str:
    """A query string (as sent) without its credential parameters, or with their values replaced by
    `replacement`; the other parameters as they were, byte for byte.

    >>> without_query_credentials("alt=sse&key=AIza0123")
    'alt=sse'
    >>> without_query_credentials("key=AIza0123&alt=sse", REDACTED)
    'key=[redacted]&alt=sse'
    """
    kept = []
    for part in query.split("&"):
        name = unquote_plus(part.partition("=")[0])
        if name.lower() not in CREDENTIAL_PARAMS:
            kept.append(part)
        elif replacement is not None:
            kept.append(f"{part.partition('=')[0]}={replacement}")
    return "&".join(kept)


def redacted_path(path: str) -> str:
    """A path with its query, for a record or a log: each credential parameter's value REDACTED."""
    base, mark, query = path.partition("?")
    return base + mark + without_query_credentials(query, REDACTED) if mark else path


# Headers whose values are secrets in either direction: the credential headers, cookies, and a proxy's
# credentials. A record keeps their names, never their values.
SECRET_HEADERS = frozenset((*CREDENTIAL_HEADERS, "cookie", "set-cookie", "proxy-authorization"))


def redacted_headers(
    headers: Iterable[tuple[str, str]], mask: Callable[[str], str] = str
) -> tuple[tuple[str, str], ...]:
    """Headers for a record: every SECRET_HEADERS value REDACTED (an Authorization keeps its scheme,
    so `Bearer` and `Basic` can be told apart), and `mask` applied to the others (the session tokens
    a caller knows).

    >>> redacted_headers([("Authorization", "Bearer sk-1"), ("User-Agent", "opencode/1")])
    (('Authorization', 'Bearer [redacted]'), ('User-Agent', 'opencode/1'))
    """
    out = []
    for name, value in headers:
        if name.lower() in SECRET_HEADERS:
            scheme, space, _ = value.strip().partition(" ")
            keep = name.lower() == "authorization" and space and scheme.isalpha()
            value = f"{scheme} {REDACTED}" if keep else REDACTED
        else:
            value = mask(value)
        out.append((name, value))
    return tuple(out)


def recorded_request(
    path: str,
    headers: Iterable[tuple[str, str]],
    *,
    masked_path: Callable[[str], str] = str,
    mask: Callable[[str], str] = str,
) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What a record keeps of a request's path (with its query) and headers: the path through
    `masked_path` with its query's credentials redacted (`redacted_path`), the headers through
    `redacted_headers` with `mask`.

    >>> recorded_request("/v1/models?key=AIza0123", [("x-api-key", "sk-1")])
    ('/v1/models?key=[redacted]', (('x-api-key', '[redacted]'),))
    """
    return redacted_path(masked_path(path)), redacted_headers(headers, mask)


def credential_values(headers: Mapping[str, str]) -> list[str]:
    """Every credential a request carries, in the order `presented_key` prefers them: an
    Authorization value after its scheme (any scheme: `Bearer`, `Token`, …) and as a whole, then the
    API-key headers. Empty values are left out.

    >>> credential_values({"Authorization": "Token abc", "x-api-key": "def"})
    ['abc', 'Token abc', 'def']
    """
    values: list[str] = []
    for name in CREDENTIAL_HEADERS:
        value = (_header(headers, name) or "").strip()
        if not value:
            continue
        if name == "authorization":
            _, _, token = value.partition(" ")
            values += [token.strip()] if token.strip() else []
        values.append(value)
    return values


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)
