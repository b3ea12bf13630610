"""Incoming path -> Endpoint.

Owns: which paths an agent may call and what they mean. Every endpoint answers at the bare path, at
`/v1/...`, at `/v1/v1/...` (Claude Code and the anthropic SDK append `/v1` to a base that already ends
in it: shared/reference/agent-clients.md) and under a session prefix `/s/TOKEN/...`. Does not own:
where the upstream serves the endpoint (compat/layouts.py) or who the caller is (sessions.py).

Pure functions over strings: no aiohttp here.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from modeltap.proxy.errors import Forbidden, NotFound


class Dialect(enum.Enum):
    """The error shape a client of an endpoint expects."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"


class Endpoint(enum.Enum):
    """The API endpoints modeltap relays. The value is the name compat/layouts.py knows."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    MESSAGES = "messages"
    COUNT_TOKENS = "count_tokens"
    MODELS = "models"
    EMBEDDINGS = "embeddings"

    @property
    def dialect(self) -> Dialect:
        if self in (Endpoint.MESSAGES, Endpoint.COUNT_TOKENS):
            return Dialect.ANTHROPIC
        return Dialect.OPENAI

    @property
    def method(self) -> str:
        return "GET" if self is Endpoint.MODELS else "POST"

    @property
    def budgeted(self) -> bool:
        """Whether the endpoint generates tokens, and so has a token budget."""
        return self in (Endpoint.CHAT, Endpoint.COMPLETIONS, Endpoint.RESPONSES, Endpoint.MESSAGES)


_SUFFIXES = {
    "chat/completions": Endpoint.CHAT,
    "completions": Endpoint.COMPLETIONS,
    "responses": Endpoint.RESPONSES,
    "messages": Endpoint.MESSAGES,
    "messages/count_tokens": Endpoint.COUNT_TOKENS,
    "models": Endpoint.MODELS,
    "embeddings": Endpoint.EMBEDDINGS,
}

# AReaL's control routes (shared/reference/areal-proxy-protocol.md §1.1, §1.2). Forwarding any of them
# would let an agent set its own reward or reconfigure the trainer, so they are refused even for a
# valid session token.
_CONTROL = re.compile(
    r"^(rl(/.*)?|export_trajectories|grant_capacity|call|configure|create_engine|set_env|alloc_ports"
    r"|internal(/.*)?)$"
)
_SESSION_PREFIX = re.compile(r"^s/([A-Za-z0-9_-]{16,128})(?:/(.*))?$")
# An `s/TOKEN` pair of segments anywhere in a path, `S` too: a base URL joined the wrong way round
# (`/v1/s/TOKEN/...`) or mistyped carries a token, though it is not routed as one.
_SESSION_SEGMENTS = re.compile(r"(?<![^/])[sS]/([A-Za-z0-9_-]{16,128})(?![^/])")


@dataclass(frozen=True, slots=True)
class Route:
    """Where an incoming request goes.

    `session_token` is the token from an `/s/TOKEN/` prefix, if any; `model_id` is set for
    `GET /v1/models/{id}`.
    """

    endpoint: Endpoint
    session_token: str | None = None
    model_id: str | None = None


def dialect_for_path(path: str) -> Dialect:
    """The error dialect to answer in when a path cannot be routed: Anthropic for anything that
    looks like `messages`, OpenAI otherwise."""
    return Dialect.ANTHROPIC if "/messages" in path else Dialect.OPENAI


def resolve(path: str) -> Route:
    """Map an incoming path (no query string) to its Route.

    Raises NotFound for an unknown path and Forbidden for AReaL's control routes.

    >>> resolve("/v1/v1/messages").endpoint
    <Endpoint.MESSAGES: 'messages'>
    """
    rest = path.strip("/")
    token = None
    match = _SESSION_PREFIX.match(rest)
    if match:
        token, rest = match.group(1), match.group(2) or ""
    while rest == "v1" or rest.startswith("v1/"):
        rest = rest[3:]
    if ".." in rest.split("/") or "//" in rest:
        raise NotFound(f"no such endpoint: {masked(path)}")
    if _CONTROL.match(rest):
        raise Forbidden(
            f"modeltap never forwards the trainer's control route {masked('/' + rest)}: an agent must "
            "not be able to set its own reward or reconfigure the trainer"
        )
    endpoint = _SUFFIXES.get(rest)
    if endpoint is not None:
        return Route(endpoint, token)
    if rest.startswith("models/") and rest.count("/") == 1:
        return Route(Endpoint.MODELS, token, model_id=rest[len("models/") :])
    raise NotFound(
        f"no such endpoint: {masked(path)}. modeltap serves chat/completions, completions, "
        "responses, messages, messages/count_tokens, models and embeddings, each with or without /v1"
    )


def session_token(path: str) -> str | None:
    """The token of an `/s/TOKEN/` prefix of `path`, or None. Known before the path is routed, so that
    a request that cannot be routed is still masked in its record and tagged with its session.

    >>> session_token("/s/" + "A" * 43 + "/rl/set_reward") == "A" * 43
    True
    """
    match = _SESSION_PREFIX.match(path.strip("/"))
    return match.group(1) if match else None


def masked(path: str) -> str:
    """`path` with the token of every `s/TOKEN` masked, wherever else it appears too, for records, error
    messages and logs.

    >>> masked("/v1/s/" + "A" * 43 + "/models/" + "A" * 43)
    '/v1/s/…/models/…'
    """
    for token in {match.group(1) for match in _SESSION_SEGMENTS.finditer(path)}:
        path = path.replace(token, "…")
    return path
