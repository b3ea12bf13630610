"""Incoming path -> Route: which wire format a request speaks, and the session token in its path.

Owns: which paths an agent may call. Every format answers at the bare path, at `/v1/...`, at
`/v1/v1/...` (Claude Code and the anthropic SDK append `/v1` to a base that already ends in it:
docs/agents.md §4.3) and under a session prefix `/s/TOKEN/...`; AReaL's control routes are refused
whatever the token. Does not own: the formats' routes (modeltap.dialects), where the upstream serves
them (compat/layouts.py), who the caller is or masking tokens (sessions.py).

Pure functions over strings: no aiohttp here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modeltap import dialects
from modeltap.dialects.base import route_suffix
from modeltap.dialects.roles import Dialect
from modeltap.proxy.errors import Forbidden, NotFound
from modeltap.proxy.sessions import masked

# AReaL's control routes (docs/areal.md §1.1.2, §1.2). Forwarding any of them would let an agent set its
# own reward or reconfigure the trainer, so they are refused even for a valid session token.
_CONTROL_ROOTS = (
    "rl",
    "export_trajectories",
    "grant_capacity",
    "call",
    "configure",
    "create_engine",
    "set_env",
    "alloc_ports",
    "internal",
)
_CONTROL = re.compile(rf"^({'|'.join(_CONTROL_ROOTS)})(/.*)?$")


@dataclass(frozen=True, slots=True)
class Route:
    """Where an incoming request goes: its format, the token of its `/s/TOKEN/` prefix if any, and
    the item a format's item route names (`GET /v1/models/{id}`)."""

    dialect: Dialect
    session_token: str | None = None
    item: str | None = None


def resolve(path: str) -> Route:
    """Map an incoming path (no query string) to its Route.

    Raises NotFound for an unknown path and Forbidden for AReaL's control routes.

    >>> resolve("/v1/v1/messages").dialect.name
    'messages'
    """
    token, rest = route_suffix(path)
    if ".." in rest.split("/") or "//" in rest:
        raise NotFound(f"no such endpoint: {masked(path)}")
    if _CONTROL.match(rest):
        raise Forbidden(
            f"modeltap never forwards the trainer's control route {masked('/' + rest)}: an agent must "
            "not be able to set its own reward or reconfigure the trainer"
        )
    found = dialects.for_route(rest)
    if found is None:
        raise NotFound(
            f"no such endpoint: {masked(path)}. modeltap serves {', '.join(dialects.routes())}, "
            "each with or without /v1"
        )
    return Route(found[0], token, found[1])


def names_a_control_route(path: str) -> bool:
    """Whether any segment of `path` starts one of AReaL's control routes: an upstream URL that does is
    refused, so that no session can aim the relay at one.

    >>> names_a_control_route("/v1/rl"), names_a_control_route("/v1")
    (True, False)
    """
    return any(segment in _CONTROL_ROOTS for segment in path.split("/"))


def session_token(path: str) -> str | None:
    """The token of an `/s/TOKEN/` prefix of `path`, or None. Known before the path is routed, so that
    a request that cannot be routed is still masked in its record and tagged with its session.

    >>> session_token("/s/" + "A" * 43 + "/rl/set_reward") == "A" * 43
    True
    """
    return route_suffix(path)[0]
