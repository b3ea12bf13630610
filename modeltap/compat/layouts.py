"""Upstream path layouts: where each endpoint lives on each kind of server.

Owns: the layout names (`areal`, `openai`, `auto`), the upstream path of every endpoint under each,
and how a base URL is joined with that path. Does not own: sending requests (proxy/upstream.py) or
deciding when to fall back (also upstream.py, which asks `is_route_level_404` here).

AReaL <= 2.1.0 serves chat and responses at the bare path and Anthropic messages at `/v1/messages`
(shared/reference/areal-proxy-protocol.md §1.1, §2); vLLM, SGLang and OpenAI serve everything under
`/v1`.
"""

from __future__ import annotations

import json
from typing import Literal

Layout = Literal["areal", "openai", "auto"]
LAYOUTS: tuple[Layout, ...] = ("areal", "openai", "auto")

# The endpoint names are the values of modeltap.proxy.routes.Endpoint; compat imports nothing of ours,
# so they are spelled out here.
_BARE = {
    "chat": "chat/completions",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
    "count_tokens": "messages/count_tokens",
    "models": "models",
    "embeddings": "embeddings",
}
# AReaL registers its Anthropic route as "/v1/messages" and everything else bare (PRS routes, §1.1).
_AREAL_V1 = {"messages", "count_tokens"}


def upstream_paths(layout: Layout, endpoint: str, base_has_v1: bool) -> list[str]:
    """The upstream paths to try for `endpoint`, most likely first.

    A base URL that already ends in `/v1` is joined as it is, so it has exactly one candidate.

    >>> upstream_paths("areal", "chat", False)
    ['/chat/completions']
    >>> upstream_paths("auto", "chat", False)
    ['/v1/chat/completions', '/chat/completions']
    """
    bare = "/" + _BARE[endpoint]
    if base_has_v1:
        return [bare]
    v1 = "/v1" + bare
    if layout == "openai":
        return [v1]
    if layout == "areal":
        return [v1 if endpoint in _AREAL_V1 else bare]
    return [v1, bare]


def is_route_level_404(status: int, body: bytes) -> bool:
    """True when a 404 means "no such route", not an API answer such as `model_not_found`.

    FastAPI (AReaL) answers an unknown path with `{"detail": "Not Found"}`; aiohttp and most servers
    with plain text or HTML. An OpenAI-shaped (`{"error": {...}}`), SGLang flat (`{"object": "error"}`)
    or Anthropic-shaped (`{"type": "error"}`) 404 is the API speaking, and must pass through.
    """
    if status != 404:
        return False
    try:
        doc = json.loads(body)
    except ValueError:
        return True
    if not isinstance(doc, dict):
        return True
    return not ("error" in doc or doc.get("object") == "error" or doc.get("type") == "error")
