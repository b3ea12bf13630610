"""Upstream path layouts: where each endpoint lives on each kind of server.

Owns: the layout names (`areal`, `areal-gateway`, `openai`, `chat-only`, `auto`), the upstream path
of every endpoint under each (none, for an endpoint the layout does not serve: modeltap translates it
through chat or answers it itself), which layout an AReaL server's `/health` answer names, how a base
URL is joined with that path, and how to read an upstream's error body (every known shape) and
classify it for the record. Does not own: sending requests (proxy/upstream.py) or deciding when to
fall back (also upstream.py, which asks `is_route_level_404` here).

AReaL's v1 agent proxy, in every release (1.0.4, 2.0.0) and on main at cbff54d, serves chat and
responses at the bare path and Anthropic messages at `/v1/messages` (docs/areal.md §1.1.1, §2).
AReaL 2.0's v2 inference gateway (`rollout._version: v2`) serves chat at `/chat/completions` and
`/v1/chat/completions` and nothing else a client may use: its `/models` and `/v1/models` take the
admin key only (§9). vLLM, SGLang and OpenAI serve everything under `/v1`, and many vLLM and SGLang
deployments serve chat but neither Anthropic messages nor Responses (`chat-only`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Layout = Literal["areal", "areal-gateway", "openai", "chat-only", "auto"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
# What each layout says its upstream does, for `serve`'s start-up lines and the README.
LAYOUT_HELP: Mapping[Layout, str] = {
    "auto": "tries /v1/… first, then the bare path, and remembers per endpoint; an endpoint served at "
    "neither is translated through chat (where AReaL may be behind, its /health picks AReaL's layout)",
    "areal": "AReaL's agent proxy: chat and responses at the bare path, messages at /v1/messages",
    "areal-gateway": "AReaL's v2 gateway: chat under /v1, models answered here, the rest translated "
    "through chat",
    "openai": "everything under /v1",
    "chat-only": "chat under /v1, Anthropic messages and Responses translated through chat",
}
# Routes an upstream of the layout does not serve at all (so modeltap translates them through chat,
# or answers them itself); `None` stands for every route but the ones listed in _ONLY_SERVED.
_UNSERVED: Mapping[Layout, frozenset[str]] = {
    "chat-only": frozenset({"messages", "messages/count_tokens", "responses"}),
}
_ONLY_SERVED: Mapping[Layout, frozenset[str]] = {
    "areal-gateway": frozenset({"chat/completions"}),
}


def serves(layout: Layout, route: str) -> bool:
    """Whether an upstream of `layout` serves `route` at all (`auto` is taken to serve everything until
    it answers otherwise).

    >>> serves("chat-only", "messages"), serves("areal-gateway", "chat/completions")
    (False, True)
    """
    if layout in _ONLY_SERVED:
        return route in _ONLY_SERVED[layout]
    return route not in _UNSERVED.get(layout, frozenset())


def layout_from_health(health: object) -> Layout | None:
    """The layout of an AReaL server, told by its `/health` JSON; None for any other answer.

    AReaL's v2 gateway answers `{"status": "ok", "router_addr": ...}` (areal/v2/inference_service/
    gateway/app.py), its v1 agent proxy `{"status": "ok", "initialized": ...}`
    (areal/experimental/openai/proxy/proxy_rollout_server.py), in 2.0.0 and on main (docs/areal.md §9).

    >>> layout_from_health({"status": "ok", "router_addr": "http://10.0.0.2:8081"})
    'areal-gateway'
    >>> layout_from_health({"status": "ok", "initialized": True}), layout_from_health(None)
    ('areal', None)
    """
    if not isinstance(health, dict) or health.get("status") != "ok":
        return None
    if "router_addr" in health:
        return "areal-gateway"
    if "initialized" in health:
        return "areal"
    return None


def upstream_paths(
    layout: Layout,
    route: str,
    *,
    areal_v1: bool = False,
    base_has_v1: bool = False,
    auto_first: Literal["areal", "openai"] = "openai",
) -> list[str]:
    """The upstream paths to try for a format's `route` (the path after `/v1`), most likely first.

    `areal_v1`: AReaL serves the route under `/v1` rather than bare (its Anthropic routes). A base URL
    that already ends in `/v1` is joined as it is, so it has exactly one candidate. `auto` tries the
    `auto_first` layout's path first (compat/areal.py says `areal` where AReaL is installed).

    >>> upstream_paths("areal", "chat/completions")
    ['/chat/completions']
    >>> upstream_paths("auto", "chat/completions")
    ['/v1/chat/completions', '/chat/completions']
    >>> upstream_paths("auto", "chat/completions", auto_first="areal")
    ['/chat/completions', '/v1/chat/completions']
    >>> upstream_paths("chat-only", "responses")
    []
    """
    if not serves(layout, route):
        return []
    bare = "/" + route
    if base_has_v1:
        return [bare]
    v1 = "/v1" + bare
    if layout != "areal" and layout != "auto":
        return [v1]
    areal = v1 if areal_v1 else bare
    if layout == "areal":
        return [areal]
    if auto_first == "areal":
        return [areal, bare if areal == v1 else v1]
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
    except (ValueError, RecursionError):  # not JSON, or nested past what Python's parser reads
        return True
    if not isinstance(doc, dict):
        return True
    return not ("error" in doc or doc.get("object") == "error" or doc.get("type") == "error")


# --- Upstream error bodies --------------------------------------------------------------------------
#
# Every backend words and shapes its errors differently; the record wants one small value and one
# class per exchange. The shapes, as measured (docs/areal.md §1.1.4 for AReaL,
# docs/token-budgets.md §1.4, §2.3, §4.1, §4.2 for the rest):
#   FastAPI / AReaL     {"detail": "..."} or {"detail": [{"loc", "msg", "type"}, ...]}
#   SGLang, old vLLM    {"object": "error", "message", "type", "param", "code": 400}
#   vLLM, OpenAI        {"error": {"message", "type", "param", "code"}}
#   Anthropic           {"type": "error", "error": {"type", "message"}}

ErrorClass = Literal["model_fault", "upstream_error", "client_error"]


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """One upstream error, whatever shape it came in.

    `code` keeps the backend's own value: `"context_length_exceeded"` from OpenAI, the integer 400 from
    SGLang and vLLM, None where the shape has no code.
    """

    status: int
    message: str
    type: str | None
    code: str | int | None


# A context overflow, in every wording we know of, lower-cased. Each says the prompt (or prompt plus
# requested completion) outgrew the window: the conversation's fault, so the sample trains as reward 0
# instead of being rejected (docs/areal.md §4).
_OVERFLOW_PHRASES = (
    # LiteLLM's list (docs/token-budgets.md §6)
    "this model's maximum context length is",  # OpenAI §4.1; vLLM v0.9, v0.11, 0.20-0.25, 0.33 (§2.1-2.2)
    "requested token count exceeds the model's maximum context length",  # SGLang total check (§1.1)
    "is longer than the model's context length",  # SGLang, prompt alone (§1.1)
    "prompt is too long",  # Anthropic (§4.2); SGLang multimodal (§1.6)
    # not in LiteLLM's list
    "exceeds the maximum allowed length",  # SGLang scheduler, "Input length (N tokens) exceeds ..." (§1.1)
    "is longer than the maximum model length",  # vLLM 0.33 engine, "The decoder prompt ..." (§2.1)
    "exceeds model's maximum context length",  # vLLM 0.33 get_max_tokens (§2.1)
    "the model's context length is only",  # vLLM renderer era (§2.2)
    "exceed context limit",  # Anthropic "input length and `max_tokens` exceed context limit" (§4.2)
    "contextwindowexceedederror",  # a LiteLLM between us and the model (§6)
    # AReaL's 500 details (docs/areal.md §4.1; docs/token-budgets.md §3)
    "exceeds max_total_tokens",  # chat, messages; also inside "Streaming setup failed: 500: ..."
    "exceeds engine_max_tokens",  # /responses
    "is non-positive!",  # the hidden 32768 cap, "max_new_tokens (X) is non-positive!"
    "max_tokens must be greater than the number of prompt tokens",  # AReaL before 2025-12
)
_OVERFLOW_CODES = frozenset({"context_length_exceeded"})
# AReaL gives up on its backend after `request_retries` and reports "Failed after N retries each.
# Payload: {...}. Addr: .... Endpoint: /generate. Last error: ..." (docs/areal.md §4.1, which
# lists it among the prompt-too-long details: the backend's refusal of an over-long input is what
# exhausts the retries when engine_max_tokens exceeds the backend's window).
_AREAL_RETRIES_EXHAUSTED = re.compile(r"failed after .*?/generate", re.S)
# A 4xx the request did not cause: the upstream timed out or ran out of capacity (AReaL answers 429
# "No available capacity", docs/areal.md §1.1.5).
_UPSTREAM_SIDE_4XX = frozenset({408, 429})
# AReaL answers these malformed requests with 500, not 400 (docs/areal.md §10.5).
_AREAL_CLIENT_FAULT_500 = (
    "max_tokens and max_completion_tokens cannot be set at the same time",
    "messages cannot be empty",
    "n != 1 is not supported",
)


def parse_error(status: int, body: bytes | str | Mapping[str, Any] | None) -> ErrorInfo:
    """Read an upstream error body of any known shape into one ErrorInfo.

    A body that is not JSON (aiohttp's plain text, an HTML page, AReaL's gateway "Backend unreachable")
    becomes the message as it is.

    >>> parse_error(500, b'{"detail":"len of prompt tokens 609 exceeds max_total_tokens 256"}').message
    'len of prompt tokens 609 exceeds max_total_tokens 256'
    >>> parse_error(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "x"}}).type
    'invalid_request_error'
    """
    doc: object = body
    if isinstance(body, bytes | str):
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):  # not JSON, or nested past what Python's parser reads
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            return ErrorInfo(status, text.strip(), None, None)
    if isinstance(doc, str):
        return ErrorInfo(status, doc, None, None)
    if not isinstance(doc, Mapping):
        return ErrorInfo(status, "" if doc is None else json.dumps(doc), None, None)
    inner = doc.get("error")
    if isinstance(inner, Mapping):  # OpenAI, vLLM, Anthropic
        message = str(inner.get("message", ""))
        return ErrorInfo(status, message, _str_or_none(inner.get("type")), inner.get("code"))
    if isinstance(inner, str):
        return ErrorInfo(status, inner, _str_or_none(doc.get("type")), doc.get("code"))
    if "detail" in doc:  # FastAPI
        return _from_detail(status, doc["detail"])
    if "message" in doc:  # SGLang flat, old vLLM
        return ErrorInfo(status, str(doc["message"]), _str_or_none(doc.get("type")), doc.get("code"))
    return ErrorInfo(status, json.dumps(doc), None, None)


def _from_detail(status: int, detail: object) -> ErrorInfo:
    """FastAPI's `detail`: a string, or a list of pydantic validation items (the 422 bodies)."""
    if isinstance(detail, str):
        return ErrorInfo(status, detail, None, None)
    if isinstance(detail, list) and all(isinstance(item, Mapping) for item in detail):
        parts = [
            ".".join(str(p) for p in item.get("loc", ())) + ": " + str(item.get("msg", "")) for item in detail
        ]
        kind = _str_or_none(detail[0].get("type")) if detail else None
        return ErrorInfo(status, "; ".join(parts), kind, None)
    return ErrorInfo(status, json.dumps(detail), None, None)


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def is_context_overflow(error: ErrorInfo) -> bool:
    """True when `error` says the prompt, or prompt plus requested completion, did not fit the window.

    A request for more completion tokens than the whole window holds, whatever the prompt
    (vLLM "max_completion_tokens=M cannot be greater than max_model_len=C", SGLang
    "max_completion_tokens is too large"), is a client setting, not an overflow, and is not matched.
    """
    if error.code in _OVERFLOW_CODES:
        return True
    message = error.message.lower()
    return any(phrase in message for phrase in _OVERFLOW_PHRASES) or bool(
        _AREAL_RETRIES_EXHAUSTED.search(message)
    )


def classify(status: int, body: bytes | str | Mapping[str, Any] | None) -> ErrorClass:
    """The record's error class of an upstream error response (docs/areal.md §4).

    `model_fault`: a context overflow in any known wording, whatever the status (AReaL reports it as a
    500). `client_error`: any other 4xx except 408 and 429, plus AReaL's 500s for malformed requests.
    `upstream_error`: everything else.

    >>> classify(500, b'{"detail":"len of prompt tokens 609 exceeds max_total_tokens 256"}')
    'model_fault'
    >>> classify(429, b'{"detail":"No available capacity to start a new session"}')
    'upstream_error'
    """
    error = parse_error(status, body)
    if is_context_overflow(error):
        return "model_fault"
    if 400 <= status < 500 and status not in _UPSTREAM_SIDE_4XX:
        return "client_error"
    if status == 500 and any(phrase in error.message for phrase in _AREAL_CLIENT_FAULT_500):
        return "client_error"
    return "upstream_error"


# The token counts an overflow message states, as (pattern, group of the prompt tokens, group of the
# limit), in the wordings of _OVERFLOW_PHRASES that carry numbers. A translated client gets its own
# format's refusal with these numbers (Claude Code reads "prompt is too long: P tokens > L maximum").
_OVERFLOW_NUMBERS = (
    (
        re.compile(r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens \((\d+) in"),
        2,
        1,
    ),
    (re.compile(r"maximum context length is (\d+) tokens\. However, your messages resulted in (\d+)"), 2, 1),
    (re.compile(r"maximum context length is (\d+) tokens\. However, your prompt contains (\d+)"), 2, 1),
    (
        re.compile(r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"),
        1,
        2,
    ),
    (
        re.compile(r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+)"),
        2,
        1,
    ),
    (re.compile(r"len of prompt tokens (\d+) exceeds (?:max_total_tokens|engine_max_tokens) (\d+)"), 1, 2),
    (re.compile(r"prompt is too long: (\d+) tokens > (\d+) maximum"), 1, 2),
)


def overflow_tokens(message: str) -> tuple[int, int] | None:
    """(prompt tokens, limit) stated by a context-overflow message, or None when it states neither.

    >>> overflow_tokens("len of prompt tokens 609 exceeds max_total_tokens 256")
    (609, 256)
    """
    for pattern, prompt, limit in _OVERFLOW_NUMBERS:
        match = pattern.search(message)
        if match:
            return int(match.group(prompt)), int(match.group(limit))
    return None
