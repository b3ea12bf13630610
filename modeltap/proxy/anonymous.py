"""Anonymous traffic split into conversations: requests that bring no session token and no session
hint are grouped by the continuity of their message histories, not stitched into one session.

Owns: the rule. A conversation is known by how it starts (its format, its client, its system prompt and
first message) and by where its last request ended (the length of its history and its last message). A
request whose history starts the same way and holds that last message at that position continues it;
any other starts a new one. Two runs of one client that send the very same first request share a
session until they part, which is all their bytes allow. Bounded: the oldest conversations are
forgotten. Does not own: sessions with a token (sessions.py) or hints (naming.py).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from modeltap.dialects.roles import Dialect

# Conversations remembered: an agent fleet's worth; past it the oldest conversation's next request
# starts a new session.
CONVERSATIONS_MAX = 4096
# Conversations kept per way of starting (a GRPO group's samples all start alike).
TAILS_PER_START = 64


@dataclass(slots=True)
class _Tail:
    session: str
    length: int
    last: str


class AnonymousConversations:
    """Names the conversation an anonymous request belongs to."""

    def __init__(self, prefix: str = "anon") -> None:
        self._prefix = prefix
        self._by_start: OrderedDict[str, list[_Tail]] = OrderedDict()

    def session_of(self, dialect: Dialect, body: dict[str, Any], client: str | None = None) -> str | None:
        """The session of the conversation `body` continues or starts; None for a format without a
        conversation (completions, embeddings). Conversations of different formats or different
        clients never share a session, however alike they start."""
        history = dialect.history(body)
        if not history:
            return None
        system = body.get(dialect.system_field) if dialect.system_field else None
        start = _digest([dialect.name, client, system, history[0]])
        tails = self._by_start.pop(start, [])
        self._by_start[start] = tails
        if len(self._by_start) > CONVERSATIONS_MAX:
            self._by_start.popitem(last=False)
        last = _digest(history[-1])
        # Digests by position, each made once: a GRPO group's tails mostly end at the same position,
        # and a digest (a sorted JSON dump and a hash) is this rule's whole cost per request.
        digests = {len(history) - 1: last}
        # The longest tail this history continues, the first kept of equals: one pass, no sort.
        best: _Tail | None = None
        for tail in tails:
            if tail.length > len(history) or (best is not None and tail.length <= best.length):
                continue
            at = tail.length - 1
            digest = digests.get(at)
            if digest is None:
                digest = digests[at] = _digest(history[at])
            if digest == tail.last:
                best = tail
        if best is not None:
            best.length, best.last = len(history), last
            return best.session
        # A name, not a credential: `random`'s generator (reseeded after fork) spares a getrandom
        # system call per new conversation.
        session = f"{self._prefix}-{random.getrandbits(48):012x}"
        tails.append(_Tail(session, len(history), last))
        del tails[:-TAILS_PER_START]
        return session


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
