"""Which session an exchange is recorded under, and the labels it carries.

Owns: the names a request brings or earns. A session token names its session (sessions.py). Any
client may also name its conversation and label it with two headers, `x-modeltap-session: NAME` and
`x-modeltap-labels: k=v,k=v`: honoured on a loopback listener, and on a network listener only beside a
session token (so they never stand in for one), where the name qualifies the token's session
(`SESSION:NAME`). Without either, a session hint the agent sends (Claude Code's
`x-claude-code-session-id`, a generic `x-session-id`) is the session as it is; without any, the
history's continuity splits anonymous traffic into conversations (anonymous.py). Every exchange is
labelled with the client its User-Agent names. Does not own: credentials and who may use the
upstream key (relay.py), or what a session holds (sessions.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modeltap.compat.clients import client_of
from modeltap.dialects.roles import Dialect
from modeltap.proxy.anonymous import AnonymousConversations
from modeltap.proxy.sessions import Session

SESSION_HEADER = "x-modeltap-session"
LABELS_HEADER = "x-modeltap-labels"
# Session hints agents send on their own, in the order they are believed (docs/peers.md §6).
SESSION_HINTS = ("x-claude-code-session-id", "x-session-id")
# Traffic that names no session and holds no conversation (legacy completions, embeddings).
ANONYMOUS_SESSION = "anonymous"
# What a name or a label may be: they go in every record and in file names of exports.
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LABEL = re.compile(r"([A-Za-z0-9_.-]{1,64})=([^,=]{0,256})")
MAX_HEADER_LABELS = 32


class NamingError(ValueError):
    """A naming header that cannot be honoured, said in words the client can act on."""


@dataclass(frozen=True, slots=True)
class Names:
    """The session an exchange is recorded under and its labels."""

    session_id: str
    labels: dict[str, str] = field(default_factory=dict)


def names_for(
    headers: Mapping[str, str],
    session: Session | None,
    *,
    loopback_only: bool,
    anonymous: AnonymousConversations,
    dialect: Dialect,
    body: dict[str, Any] | None,
) -> Names:
    """The names of one request. Raises NamingError for a naming header that is malformed, or sent
    on a network listener without a session token."""
    named, labelled = headers.get(SESSION_HEADER), headers.get(LABELS_HEADER)
    if (named is not None or labelled is not None) and session is None and not loopback_only:
        raise NamingError(
            f"{SESSION_HEADER} and {LABELS_HEADER} need a session token on a network listener "
            "(…/s/TOKEN): they name a conversation, they do not open one"
        )
    labels = client_labels(headers) | (_header_labels(labelled) if labelled is not None else {})
    if named is not None and not _NAME.fullmatch(named):
        raise NamingError(f"{SESSION_HEADER} must be 1 to 128 of A-Z a-z 0-9 . _ : -")
    if session is not None:
        return Names(f"{session.id}:{named}" if named else session.id, labels | session.labels)
    if named is not None:
        return Names(named, labels)
    hint = next((v for h in SESSION_HINTS if (v := headers.get(h)) and _NAME.fullmatch(v)), None)
    if hint is not None:
        return Names(hint, labels)
    client = labels.get("client")
    conversation = anonymous.session_of(dialect, body, client) if body is not None else None
    return Names(conversation or ANONYMOUS_SESSION, labels)


def client_labels(headers: Mapping[str, str]) -> dict[str, str]:
    """`{"client": NAME}` for a client its User-Agent names (compat/clients.py), else {}: every record
    carries it, a request refused before it was named too."""
    client = client_of(headers.get("User-Agent"))
    return {"client": client} if client is not None else {}


def _header_labels(text: str) -> dict[str, str]:
    pairs = [part.strip() for part in text.split(",") if part.strip()]
    if len(pairs) > MAX_HEADER_LABELS:
        raise NamingError(f"{LABELS_HEADER} holds at most {MAX_HEADER_LABELS} labels")
    labels = {}
    for pair in pairs:
        match = _LABEL.fullmatch(pair)
        if match is None or not match.group(2).isprintable():
            raise NamingError(f"{LABELS_HEADER} takes k=v pairs separated by commas, not {pair!r}")
        labels[match.group(1)] = match.group(2).strip()
    return labels
