"""SessionRegistry: local session tokens -> (upstream, upstream key, labels).

Owns: issuing and revoking session tokens and looking them up. A session is what lets modeltap hand
an agent a credential of its own instead of the upstream's key: the agent presents the token (in the
path as `/s/TOKEN/`, or as `Authorization: Bearer` / `x-api-key`), modeltap swaps in the upstream key,
and every record of the session carries its labels. Also masking tokens in paths and text for
records, errors and logs. Does not own: the HTTP admin API (admin.py) or the rules of who may use the
configured key (relay.py).

The token is never logged, stored or sent upstream; records carry the session id instead.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# 32 random bytes: 256 bits, URL-safe, 43 characters; 128 bits would already be beyond guessing.
TOKEN_BYTES = 32
TOKEN_CHARS = 43
# Tokens of closed sessions are remembered, so that one presented later as an API key gets a closed
# session's 401 instead of passing upstream as if it were the client's own key. At ~170 bytes each
# (measured with tracemalloc) this bounds the memory to ~11 MB; a token older than that many closes
# falls back to the anonymous rules.
CLOSED_TOKENS_MAX = 65536
# A run of the characters a token is made of, long enough to be one: what `mask` looks up.
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_-]{16,}")
# An `s/TOKEN` pair of segments anywhere in a path, `S` too: a base URL joined the wrong way round
# (`/v1/s/TOKEN/...`) or mistyped carries a token, though it is not routed as one.
# Masked whatever follows it (`/s/TOKEN./`, `/s/TOKEN;x=1/`): a near-miss path still carries the token.
_SESSION_SEGMENTS = re.compile(r"(?<![^/])[sS]/([A-Za-z0-9_-]{16,128})(?![A-Za-z0-9_-])")


@dataclass(slots=True)
class Session:
    """One agent's session. `host_base_url` and `container_base_url` end in `/s/TOKEN`; OpenAI-style
    clients add `/v1`, Anthropic-style clients use them as they are."""

    id: str
    token: str = field(repr=False)
    upstream: str | None
    upstream_key: str | None = field(repr=False)
    labels: dict[str, str]
    # The URLs hold the token, so a session logged with %r must not show them either.
    host_base_url: str = field(repr=False)
    container_base_url: str | None = field(repr=False)
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)


class SessionRegistry:
    """In-process registry of open sessions.

    >>> registry = SessionRegistry(lambda: ("http://127.0.0.1:8080", None))
    >>> s = registry.open(upstream="http://127.0.0.1:9000", upstream_key="k", labels={"task_id": "t1"})
    >>> registry.by_token(s.token) is s
    True
    """

    def __init__(
        self,
        base_urls: Callable[[], tuple[str, str | None]],
        on_change: Callable[[Session, bool], None] | None = None,
        ttl_s: float | None = None,
    ) -> None:
        self._base_urls = base_urls
        self.ttl_s = ttl_s
        self._on_change = on_change
        self._by_token: dict[str, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._closed_tokens: OrderedDict[str, None] = OrderedDict()
        self._listeners: list[Callable[[Session, bool], None]] = []

    def open(
        self,
        upstream: str | None = None,
        upstream_key: str | None = None,
        labels: dict[str, str] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Open a session and return it with its token and base URLs."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        sid = session_id or "s-" + secrets.token_hex(6)
        if sid in self._by_id:
            raise ValueError(f"session {sid!r} is already open")
        host, container = self._base_urls()
        session = Session(
            id=sid,
            token=token,
            upstream=upstream.rstrip("/") if upstream else None,
            upstream_key=upstream_key,
            labels={str(k): str(v) for k, v in (labels or {}).items()},
            host_base_url=f"{host}/s/{token}",
            container_base_url=f"{container}/s/{token}" if container else None,
        )
        self.adopt(session)
        if self._on_change is not None:
            self._on_change(session, False)
        return session

    def adopt(self, session: Session) -> None:
        """Hold a session opened elsewhere (another worker of `serve --workers`: workers.py), token
        and all. Its opening is told to the listeners, not to `on_change`: it was recorded where it opened."""
        self._by_token[session.token] = session
        self._by_id[session.id] = session
        for listener in self._listeners:
            listener(session, False)

    def add_listener(self, listener: Callable[[Session, bool], None]) -> None:
        """Call `listener(session, closed)` after every opening and closing, after `on_change`."""
        self._listeners.append(listener)

    def close(self, session_id: str) -> bool:
        """Close a session; its token stops working at once. False if it was not open."""
        session = self._by_id.pop(session_id, None)
        if session is None:
            return False
        del self._by_token[session.token]
        self._closed_tokens[session.token] = None
        if len(self._closed_tokens) > CLOSED_TOKENS_MAX:
            self._closed_tokens.popitem(last=False)
        if self._on_change is not None:
            self._on_change(session, True)
        for listener in self._listeners:
            listener(session, True)
        return True

    def closed_tokens(self) -> list[str]:
        """The tokens of closed sessions still remembered, oldest first."""
        return list(self._closed_tokens)

    def remember_closed(self, tokens: list[str]) -> None:
        """Remember `tokens` as those of sessions closed elsewhere (another worker)."""
        for token in tokens:
            self._closed_tokens[token] = None
        while len(self._closed_tokens) > CLOSED_TOKENS_MAX:
            self._closed_tokens.popitem(last=False)

    def by_token(self, token: str) -> Session | None:
        """The open session of `token`, or None. Using a session keeps it alive; one idle past the
        TTL is closed here, at once, rather than at the next sweep."""
        session = self._by_token.get(token)
        if session is None:
            return None
        now = time.monotonic()
        if self.ttl_s is not None and now - session.last_used > self.ttl_s:
            self.close(session.id)
            return None
        session.last_used = now
        return session

    def is_known(self, token: str) -> bool:
        """Whether `token` is the token of a session open now or closed before."""
        return token in self._by_token or token in self._closed_tokens

    def mask(self, text: str) -> str:
        """`text` with every known token in it (open or closed, wherever it stands: a path, a query, a
        near-miss like `/s/TOKEN./`) replaced by `…`."""
        if not self._by_token and not self._closed_tokens:
            return text
        return _TOKEN_RUN.sub(lambda m: _masked_run(m.group(), self.is_known), text)

    def masked_path(self, path: str) -> str:
        """`path` for a record, an error or a log: the token of every `s/TOKEN` masked, known or not
        (`masked`), and every known token wherever else it stands (`mask`)."""
        return self.mask(masked(path))

    def was_closed(self, token: str) -> bool:
        """Whether `token` was the token of a session that has since closed or expired."""
        return token in self._closed_tokens

    def expire(self) -> list[str]:
        """Close every session idle longer than the TTL; return their ids."""
        if self.ttl_s is None:
            return []
        cutoff = time.monotonic() - self.ttl_s
        idle = [s.id for s in self._by_id.values() if s.last_used < cutoff]
        for session_id in idle:
            self.close(session_id)
        return idle

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_id.values()))

    def __len__(self) -> int:
        return len(self._by_id)


def _masked_run(run: str, known: Callable[[str], bool]) -> str:
    """A run of token characters with any known token inside it masked (a token may be glued to more
    such characters, as in `TOKEN-x`)."""
    if known(run):
        return "…"
    size = TOKEN_CHARS
    for start in range(len(run) - size + 1):
        if known(run[start : start + size]):
            return run[:start] + "…" + _masked_run(run[start + size :], known)
    return run


def masked(path: str) -> str:
    """`path` with the token of every `s/TOKEN` masked, wherever else it appears too, for records, error
    messages and logs.

    >>> masked("/v1/s/" + "A" * 43 + "/models/" + "A" * 43)
    '/v1/s/…/models/…'
    """
    for token in {match.group(1) for match in _SESSION_SEGMENTS.finditer(path)}:
        path = path.replace(token, "…")
    return path
