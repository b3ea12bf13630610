"""Anonymous traffic split into conversations: requests that bring no session token and no session
hint are grouped by the continuity of their message histories, not stitched into one session.

Owns: the rule. A conversation is known by how it starts (its format, its client, the peer it comes
from when that is not this host, its system prompt and first message), by where its last request
ended (the length of its history and its last message), and by what the reply to that request
carried (its ids: tool calls, messages, reasoning items; and its text). A request continues the
conversation whose history its own extends the furthest, holding that last message at that position;
when several alike conversations could be continued (the samples of one prompt all start alike), the
one whose reply the request echoes right after it is chosen. A request chained to an earlier
reply by its id (Responses' `previous_response_id`) continues that reply's. A request that extends no
conversation starts a new one, and so does the very same request sent again (another sample of the
prompt, the same script run again) unless it retries one that failed or says it is a retry
(`x-stainless-retry-count`). Bounded: the oldest conversations are forgotten. Does not own: sessions
with a token (sessions.py) or hints (naming.py).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from modeltap.dialects.roles import Dialect, ThroughChat

# Conversations remembered: an agent fleet's worth; past it the oldest conversation's next request
# starts a new session.
CONVERSATIONS_MAX = 4096
# Conversations kept per way of starting (a GRPO group's samples all start alike).
TAILS_PER_START = 64
# Replies remembered by the id a chained request names (Responses' `previous_response_id`).
REPLY_IDS_MAX = 4 * CONVERSATIONS_MAX
# A whole reply larger than this is not read for its ids (a reply carrying logprobs of every token can
# be megabytes); its conversation is then told apart by position and length alone.
REPLY_READ_MAX_BYTES = 1 << 20
# Ids kept of one reply: every tool call of a parallel turn, with room to spare; an id longer than
# any engine mints is none.
IDS_PER_REPLY = 64
ID_MAX_CHARS = 256
# The keys whose string values are a reply's ids and its text, in every format's reply and in the
# assistant message that echoes it (chat's tool_calls[].id, Messages' tool_use.id, Responses' items'
# id and call_id; content strings and text parts).
_ID_KEYS = frozenset({"id", "call_id"})
_TEXT_KEYS = frozenset({"text", "content"})


@dataclass(slots=True)
class _Tail:
    session: str
    length: int
    last: str
    # What the reply to the request that ended here carried (its ids, its text's digest); None until
    # it is noted.
    ids: frozenset[str] | None = None
    text: str | None = None
    failed: bool = False
    # Whether another conversation ended alike, so that this one's reply is read for its marks.
    wanted: bool = False
    # Whether the request that ended here awaits its reply: no request can echo that reply yet.
    pending: bool = True


@dataclass(slots=True)
class Conversation:
    """The conversation one request was named into: its session, and where to note the reply (with
    the request, which says whether the reply may be chained to)."""

    session: str
    _tail: _Tail
    _length: int
    _chain: tuple[ThroughChat, dict[str, Any], str] | None = None


class AnonymousConversations:
    """Names the conversation an anonymous request belongs to, and learns from its reply."""

    def __init__(self, prefix: str = "anon") -> None:
        self._prefix = prefix
        self._by_start: OrderedDict[str, list[_Tail]] = OrderedDict()
        self._by_reply: OrderedDict[str, _Tail] = OrderedDict()

    def claim(
        self,
        dialect: Dialect,
        body: dict[str, Any],
        client: str | None = None,
        *,
        peer: str | None = None,
        retry: bool = False,
    ) -> Conversation | None:
        """The conversation `body` continues or starts; None for a format without a conversation
        (completions, embeddings). Conversations of different formats, clients or peers (`peer`: the
        address of a caller not on this host) never share a session, however alike they start.
        `retry`: the client says this request repeats one it sent before."""
        chain = None
        if isinstance(dialect, ThroughChat):
            # A request chained to an earlier reply (Responses' previous_response_id) continues that
            # reply's conversation: its history is only what it adds.
            scope = f"{client}\0{peer}\0"
            previous = dialect.previous_id(body)
            chained = self._by_reply.get(scope + previous) if previous is not None else None
            if chained is not None:
                return Conversation(chained.session, chained, chained.length, (dialect, body, scope))
            # Whether a later request may chain to this one's reply (the format chains, and the
            # request did not say `store: false`): only then is its id kept.
            if dialect.reply_id(body, {"id": scope}) is not None:
                chain = (dialect, body, scope)
        history = dialect.history(body)
        if not history:
            return None
        system = body.get(dialect.system_field) if dialect.system_field else None
        start = _digest([dialect.name, client, peer, system, history[0]])
        tails = self._by_start.pop(start, [])
        self._by_start[start] = tails
        if len(self._by_start) > CONVERSATIONS_MAX:
            self._by_start.popitem(last=False)
        size = len(history)
        last = _digest(history[-1])
        # Digests by position, each made once: a GRPO group's tails mostly end at the same position,
        # and a digest (a sorted JSON dump and a hash) is this rule's whole cost per request.
        digests = {size - 1: last}
        # The longest tails this history continues, in one pass (no sort).
        candidates: list[_Tail] = []
        # Tails that ended where this request ends, as it ends: the same request again.
        alike: list[_Tail] = []
        for tail in tails:
            length = tail.length
            if length > size or (candidates and length < candidates[0].length):
                continue
            at = length - 1
            digest = digests.get(at)
            if digest is None:
                digest = digests[at] = _digest(history[at])
            if digest != tail.last:
                continue
            if length == size:
                alike.append(tail)
                # The same request again is another sample, unless it retries.
                if not (retry or tail.failed):
                    continue
            if candidates and length > candidates[0].length:
                candidates.clear()
            candidates.append(tail)
        best = candidates[0] if len(candidates) == 1 else _best(candidates, history) if candidates else None
        if best is None:
            # A name, not a credential: `random`'s generator (reseeded after fork) spares a getrandom
            # system call per new conversation.
            best = _Tail(f"{self._prefix}-{random.getrandbits(48):012x}", size, last)
            tails.append(best)
            del tails[:-TAILS_PER_START]
        elif best.length < size:
            best.length, best.last, best.ids, best.text, best.wanted = size, last, None, None, False
        best.failed, best.pending = False, True
        # Alike conversations are told apart by what their replies carry, so those replies are read;
        # a conversation with none alike never pays for it.
        for tail in alike:
            tail.wanted = best.wanted = True
        return Conversation(best.session, best, size, chain)

    def replied(self, conversation: Conversation, ok: bool, reply: dict[str, Any] | bytes | None) -> None:
        """Note the answer to the request `conversation` was claimed for: its ids and text when it
        succeeded and alike conversations are to be told apart (the next request of the conversation
        echoes them), the id a later request may chain to, or else that it failed (the same request
        sent again retries it). Nothing when the conversation has moved on since."""
        tail = conversation._tail
        if tail.length != conversation._length:
            return
        tail.failed, tail.pending = not ok, False
        if not ok or not (tail.wanted or conversation._chain):
            return
        parsed = _parsed(reply)
        if tail.wanted and parsed is not None:
            tail.ids, tail.text = _marks(parsed)
        if conversation._chain is not None and isinstance(parsed, dict):
            dialect, request, scope = conversation._chain
            reply_id = dialect.reply_id(request, parsed)
            if reply_id is not None:
                self._by_reply[scope + reply_id] = tail
                self._by_reply.move_to_end(scope + reply_id)
                if len(self._by_reply) > REPLY_IDS_MAX:
                    self._by_reply.popitem(last=False)


def _best(candidates: list[_Tail], history: list[Any]) -> _Tail:
    """Of alike candidates (all ending at one position), the one whose reply the history echoes right
    after it, then one whose request failed (a retry repeats it); the newest of equals."""
    at = candidates[0].length
    echo = _marks(history[at]) if at < len(history) else None
    best, best_key = candidates[0], (-2, False)
    for tail in candidates:
        key = (_echo_score(tail, echo), tail.failed)
        if key >= best_key:
            best, best_key = tail, key
    return best


def _echo_score(tail: _Tail, echo: tuple[frozenset[str], str | None] | None) -> int:
    """How surely the message after a tail's end echoes the tail's reply: 3 by ids and text, 2 by ids,
    1 by text; 0 when it cannot be told (the reply was not read, or the message holds nothing to
    compare); -1 when it is another reply (what it holds is not in the tail's reply), or the tail's
    reply has not come back yet."""
    if echo is None:
        return 0
    if tail.pending:
        return -1
    if tail.ids is None:
        return 0
    ids, text = echo
    hit = (2 if not ids.isdisjoint(tail.ids) else 0) + (1 if text is not None and text == tail.text else 0)
    # A reply's own id (chatcmpl-…) is never echoed, so ids on one side only tell nothing; a text
    # the reply did not hold, or tool-call ids it did not mint, do.
    return hit or (-1 if text is not None or (ids and tail.ids) else 0)


def _parsed(reply: dict[str, Any] | bytes | None) -> Any:
    if isinstance(reply, bytes):
        if len(reply) > REPLY_READ_MAX_BYTES:
            return None
        try:
            return json.loads(reply)
        except (ValueError, RecursionError):
            return None
    return reply


def _marks(value: Any) -> tuple[frozenset[str], str | None]:
    """The ids and the digest of the text (whitespace folded) a reply or a message holds, walked
    without recursion (a body may be nested deep)."""
    ids: list[str] = []
    texts: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, str):
                    if key in _ID_KEYS and len(ids) < IDS_PER_REPLY and len(item) <= ID_MAX_CHARS:
                        ids.append(item)
                    elif key in _TEXT_KEYS:
                        texts.append(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
        elif isinstance(node, list):
            stack.extend(reversed(node))
    text = " ".join(" ".join(texts).split())
    # A digest, not the text: a conversation is remembered long after its reply.
    return frozenset(ids), hashlib.blake2b(text.encode(), digest_size=16).hexdigest() if text else None


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
