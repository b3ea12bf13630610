"""What `serve` finds when it asks its upstream once at start: whether it answers, whether it takes the
key, and which models it lists, said in the banner so that a mistake shows before the first request.

Owns: the one check (GET the models route, through the layout's paths, within CHECK_TIMEOUT_S) and its
sentence. Does not own: refusing an upstream URL that names an endpoint or holds a password (config.py,
at parse time) or relaying (relay.py). Nothing here fails a start: an upstream that is down now may be
up by the first request, which is tried as every request is.

    print(await upstream_found(proxy.context))   # "answers; lists 1 model: Qwen3-8B"
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from modeltap import dialects
from modeltap.compat.layouts import parse_error
from modeltap.proxy.context import ProxyContext
from modeltap.proxy.errors import NotFound, ProxyError
from modeltap.proxy.upstream import StreamedReply

# Long enough for a server on the same host or LAN to answer a model list; short enough that a start
# against an address that drops packets is not held up (the banner says it had no answer yet).
CHECK_TIMEOUT_S = 2.0
# Models named in the banner; the rest are counted.
SHOWN_MODELS = 5
_MODELS = dialects.named("models")


async def upstream_found(ctx: ProxyContext) -> str:
    """One sentence on what the default upstream answered to GET models at start, with the key
    serve sends (never failing: a dead upstream is said to be so)."""
    upstream, config = ctx.default_upstream, ctx.config
    if upstream is None:
        return "not checked (no --upstream)"
    headers = {"Authorization": f"Bearer {config.upstream_key}"} if config.upstream_key else {}
    later = "each request tries it again"
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            reply = await upstream.send(_MODELS, "GET", "", headers, None)
    except TimeoutError:
        return f"no answer within {CHECK_TIMEOUT_S:g} s ({later})"
    except NotFound:
        return "answers, but lists no models (no models route); " + _served(config.model)
    except ProxyError as err:
        return f"not reachable yet: {err.message} ({later})"
    if isinstance(reply, StreamedReply):  # a model list is never a stream; read it as one body
        reply.response.release()
        return f"answers GET {reply.path} with a stream, not a model list"
    status = reply.response.status
    if status in (401, 403):
        why = parse_error(status, reply.body).message
        return f"answers, but refuses the key ({status}: {why[:200]}): check --upstream-key"
    if status != 200:
        return f"answers GET {reply.path} with {status}; " + _served(config.model)
    names = _model_ids(reply.body)
    if not names:
        return f"answers, with no models at {reply.path}; " + _served(config.model)
    more = len(names) - SHOWN_MODELS
    shown = ", ".join(names[:SHOWN_MODELS]) + (f" and {more} more" if more > 0 else "")
    note = (
        f" (--model {config.model} is not among them)" if config.model and config.model not in names else ""
    )
    return f"answers; lists {len(names)} model{'s' if len(names) > 1 else ''}: {shown}{note}"


def _served(model: str | None) -> str:
    if model:
        return f"GET /v1/models lists --model {model}"
    return "GET /v1/models answers an empty list: give --model NAME for clients that pick from it"


def _model_ids(body: bytes) -> list[str]:
    """The ids of an OpenAI (or Anthropic) model list, or [] for anything else."""
    try:
        doc: Any = json.loads(body)
    except ValueError:
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return []
    ids = [card["id"] for card in data if isinstance(card, dict) and isinstance(card.get("id"), str)]
    # Printed on the operator's terminal: an id with control characters is shown escaped.
    return [name if name.isprintable() else ascii(name) for name in ids]
