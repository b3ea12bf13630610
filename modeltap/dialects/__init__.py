"""The wire formats modeltap speaks, one module each, and the registry that finds them.

    >>> from modeltap import dialects
    >>> dialects.named("chat").route
    'chat/completions'
    >>> dialects.for_route("messages")
    (<dialect messages>, None)

To add a format, write its module (see modeltap/dialects/base.py) and add its DIALECT to DIALECTS.
"""

from __future__ import annotations

from modeltap.dialects import (
    anthropic_count_tokens,
    anthropic_messages,
    openai_chat,
    openai_completions,
    openai_embeddings,
    openai_models,
    openai_responses,
    sglang_generate,
)
from modeltap.dialects.roles import ROLES, Dialect, GeneratesNothing, OpenAIShaped


class Unrouted(OpenAIShaped, GeneratesNothing, declines=ROLES):
    """What a recorded exchange that was never routed (or of a format this modeltap no longer knows)
    is read as: a format of nothing, which reads no reply and plays no role."""

    name = ""
    route = ""


DIALECTS: tuple[Dialect, ...] = (
    openai_chat.DIALECT,
    openai_completions.DIALECT,
    openai_responses.DIALECT,
    openai_embeddings.DIALECT,
    openai_models.DIALECT,
    anthropic_messages.DIALECT,
    anthropic_count_tokens.DIALECT,
)
# Formats modeltap speaks to an engine and no agent calls (`serve --tokens exact`): known by name, for
# the records, and routed nowhere.
ENGINE_DIALECTS: tuple[Dialect, ...] = (sglang_generate.DIALECT,)
_BY_NAME = {dialect.name: dialect for dialect in (*DIALECTS, *ENGINE_DIALECTS)}
_UNROUTED = Unrouted()
_BY_ROUTE = {dialect.route: dialect for dialect in DIALECTS}


def named(name: str) -> Dialect:
    """The dialect recorded as `name` (an exchange's `endpoint`). Raises ValueError for no such format."""
    dialect = _BY_NAME.get(name)
    if dialect is None:
        raise ValueError(f"no dialect {name!r}; modeltap speaks {', '.join(_BY_NAME)}")
    return dialect


def of_record(endpoint: str | None) -> Dialect:
    """The dialect of a recorded exchange's `endpoint`; for an exchange that was never routed (or of a
    format this modeltap no longer knows) a dialect that reads nothing."""
    return _BY_NAME.get(endpoint or "", _UNROUTED)


def for_route(route: str) -> tuple[Dialect, str | None] | None:
    """(dialect, item id) for a route (the path after `/v1`: `base.route_suffix`), or None when no
    format serves it.

    >>> for_route("models/m1")
    (<dialect models>, 'm1')
    """
    dialect = _BY_ROUTE.get(route)
    if dialect is not None:
        return dialect, None
    parent, _, item = route.rpartition("/")
    dialect = _BY_ROUTE.get(parent)
    if dialect is not None and dialect.item_route and item:
        return dialect, item
    return None


def for_error(path: str) -> Dialect:
    """The dialect to answer an unroutable `path` in: Anthropic's shape for anything that looks like
    `messages`, OpenAI's otherwise (the shape a client of such a path parses)."""
    return anthropic_messages.DIALECT if "/messages" in path else openai_chat.DIALECT


def routes() -> list[str]:
    """Every route modeltap serves, for error messages."""
    return [dialect.route for dialect in DIALECTS]


__all__ = ["DIALECTS", "Dialect", "for_error", "for_route", "named", "of_record", "routes"]
