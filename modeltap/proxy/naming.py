"""Which session an exchange is recorded under, and the labels it carries.

Owns: the names a request brings or earns, and whom each is taken from. The rule, by caller:

- a caller holding a session token (sessions.py) is recorded in its session, from anywhere; beside
  the token, `x-modeltap-session: NAME` qualifies it (`SESSION:NAME`) and `x-modeltap-labels: k=v,k=v`
  adds labels (the session's own win), and an agent's session hint is ignored;
- a caller on this host (a loopback peer, whatever address the listener binds) names its session with
  `x-modeltap-session` and labels it with `x-modeltap-labels`; without them, a session hint its agent
  sends (`SESSION_HINTS`) is the session as it is;
- any other caller is refused the two headers (400, in its client's shape, recorded), and its agent's
  hints are not believed: a neighbour could name another's session with them.

Without a name, the history's continuity splits anonymous traffic into conversations (anonymous.py),
a remote peer's kept apart from every other peer's. Every exchange is labelled with the client its
User-Agent names. Does not own: credentials and who may use the upstream key (relay.py), or what a
session holds (sessions.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modeltap.compat.clients import client_of
from modeltap.compat.hosts import is_loopback
from modeltap.dialects.roles import Dialect
from modeltap.proxy.anonymous import AnonymousConversations, Conversation
from modeltap.proxy.sessions import Session

SESSION_HEADER = "x-modeltap-session"
LABELS_HEADER = "x-modeltap-labels"
# Session hints agents send on their own, in the order they are believed (docs/agents.md §9.2): Claude
# Code's; Codex's `thread-id` and `session-id` (one id in both from `codex exec`), and the `session_id`
# older Codex releases sent; opencode's generic `x-session-id`.
SESSION_HINTS = ("x-claude-code-session-id", "thread-id", "session-id", "session_id", "x-session-id")
# Traffic that names no session and holds no conversation (legacy completions, embeddings).
ANONYMOUS_SESSION = "anonymous"
# The rule in one line, as the serve banner prints it.
RULE = (
    f"{SESSION_HEADER} and {LABELS_HEADER}, and agents' own session headers, are taken from this host "
    "and beside a session token; from elsewhere the first two are refused (400), the others ignored"
)
# What a name or a label may be: they go in every record and in file names of exports.
_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_LABEL = re.compile(r"([A-Za-z0-9_.-]{1,64})=([^,=]{0,256})")
MAX_HEADER_LABELS = 32


class NamingError(ValueError):
    """A naming header that cannot be honoured, said in words the client can act on."""


@dataclass(frozen=True, slots=True)
class Names:
    """The session an exchange is recorded under and its labels; `refused` says why a naming header
    it sent was not honoured (the exchange is then refused, and recorded under these names);
    `conversation` is the anonymous conversation it was named into, whose reply is noted there."""

    session_id: str
    labels: dict[str, str] = field(default_factory=dict)
    refused: str | None = None
    conversation: Conversation | None = None


def names_for(
    headers: Mapping[str, str],
    session: Session | None,
    *,
    peer: str | None,
    anonymous: AnonymousConversations,
    dialect: Dialect,
    body: dict[str, Any] | None,
    retry: bool = False,
) -> Names:
    """The names of one request from `peer` (the caller's address) with the token of `session`, if
    any. A malformed naming header, or one from a caller not trusted with it, is not honoured: the
    names are then those the request has without it, with `refused` saying why."""
    local = peer is not None and is_loopback(peer)
    labels = client_labels(headers)
    named, extra, refused = _naming_headers(headers, trusted=session is not None or local, peer=peer)
    labels |= extra
    if session is not None:
        return Names(f"{session.id}:{named}" if named else session.id, labels | session.labels, refused)
    if named is not None:
        return Names(named, labels, refused)
    if local:
        hint = next((v for h in SESSION_HINTS if (v := headers.get(h)) and _NAME.fullmatch(v)), None)
        if hint is not None:
            return Names(hint, labels, refused)
    conversation = None
    if body is not None:
        client = labels.get("client")
        conversation = anonymous.claim(dialect, body, client, peer=None if local else peer, retry=retry)
    return Names(conversation.session if conversation else ANONYMOUS_SESSION, labels, refused, conversation)


def _naming_headers(
    headers: Mapping[str, str], *, trusted: bool, peer: str | None
) -> tuple[str | None, dict[str, str], str | None]:
    """The name and labels the naming headers give, or (None, {}, why) when they are not honoured."""
    named, labelled = headers.get(SESSION_HEADER), headers.get(LABELS_HEADER)
    if named is None and labelled is None:
        return None, {}, None
    if not trusted:
        why = (
            f"{SESSION_HEADER} and {LABELS_HEADER} are taken from this host (a loopback peer) or beside "
            f"a session token (…/s/TOKEN); this request came from {peer or 'an unknown peer'} without "
            "one: send it with its session's token, or without these headers"
        )
        return None, {}, why
    try:
        if named is not None and not _NAME.fullmatch(named):
            raise NamingError(f"{SESSION_HEADER} must be 1 to 128 of A-Z a-z 0-9 . _ : -")
        return named, _header_labels(labelled) if labelled is not None else {}, None
    except NamingError as exc:
        return None, {}, str(exc)


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
