"""ProxyContext: the state one proxy app shares between its handlers.

Owns: the typed app key, the pooled upstreams (one `aiohttp.ClientSession` per upstream base URL,
created on first use and closed with the app), and references to the registry, the observers (the
record store first), the budget, the token-id recorder and the conversations kept for translated
Responses.
Does not own: building the app (server.py) or handling requests (relay.py).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import aiohttp
from aiohttp import web

from modeltap.compat.areal import auto_first as areal_auto_first
from modeltap.proxy.anonymous import AnonymousConversations
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.observers import Observers
from modeltap.proxy.sessions import SessionRegistry
from modeltap.proxy.tasks import Tasks
from modeltap.proxy.translate import ResponseChains
from modeltap.proxy.upstream import Upstream
from modeltap.records.channel import RecordChannel
from modeltap.records.store import RecordStore
from modeltap.records.writer_process import WriterProcess

if TYPE_CHECKING:
    from modeltap.counting.ids import IdRenderer
    from modeltap.proxy.budget import Budget
    from modeltap.proxy.exact import ExactMode
    from modeltap.proxy.token_recorder import TokenIdRecorder
    from modeltap.proxy.workers import LocalSharing, ReplicaSharing, WorkerSetup

# Connections kept per upstream: one per concurrent rollout, and AReaL runs hundreds at once.
UPSTREAM_CONNECTIONS = 1024
# What a writer process calls, with the tokenizer folder, to decode token ids around a break.
FOLDER_DECODER = "modeltap.counting.ids:folder_decoder"


@dataclass
class ProxyContext:
    """Everything a handler needs, reached through `request.app[CONTEXT]`."""

    config: ProxyConfig
    sessions: SessionRegistry
    store: RecordStore | RecordChannel
    observers: Observers
    loopback_only: bool
    writer: WriterProcess | None = None
    sharing: LocalSharing | ReplicaSharing | None = None
    setup: WorkerSetup | None = None
    admin_key: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)
    budget: Budget | None = None
    budget_report: str = "off"
    token_ids: TokenIdRecorder | None = None
    token_ids_report: str = "off"
    exact: ExactMode | None = None
    tasks: Tasks = field(default_factory=lambda: Tasks("modeltap"))
    anonymous: AnonymousConversations = field(default_factory=AnonymousConversations)
    started: float = field(default_factory=time.time)
    chains: ResponseChains = field(default_factory=ResponseChains)
    # Where AReaL is installed (the adapter runs inside it), its bare path is the likely one.
    auto_first: Literal["areal", "openai"] = field(default_factory=areal_auto_first)
    # The configured upstream (`--upstream`), pooled at start: most requests go there.
    default_upstream: Upstream | None = None
    _upstreams: dict[str, Upstream] = field(default_factory=dict)
    _clients: list[aiohttp.ClientSession] = field(default_factory=list)

    @property
    def may_be_areal(self) -> bool:
        """Whether an upstream may be one of AReaL's servers, so that `auto` asks its /health: AReaL is
        installed here, or sessions name their own upstreams, as AReaL hands the adapter its proxy's or
        gateway's address for each sample. A `--upstream` elsewhere is probed by path alone."""
        return self.auto_first == "areal" or self.config.upstream is None

    def upstream(self, base_url: str) -> Upstream:
        """The pooled Upstream for `base_url`, created on first use."""
        upstream = self._upstreams.get(base_url)
        if upstream is None:
            client = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=UPSTREAM_CONNECTIONS, limit_per_host=0),
                # No total: a long generation is legitimate; silence longer than sock_read is not.
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=self.config.connect_timeout_s, sock_read=self.config.read_timeout_s
                ),
                auto_decompress=True,
                skip_auto_headers=(aiohttp.hdrs.USER_AGENT,),
            )
            self._clients.append(client)
            upstream = self._upstreams[base_url] = Upstream(
                base_url,
                self.config.layout,
                client,
                self.auto_first,
                self.may_be_areal,
                max_reply_bytes=self.config.max_reply_bytes,
            )
        return upstream

    async def start_records(self) -> None:
        """Start the writer process (when records are written by one) and the store's side of it."""
        if isinstance(self.store, RecordStore):
            self.store.start()
            return
        if self.writer is not None:
            await self.writer.start()
        try:
            await self.store.start()
        except BaseException:
            if self.writer is not None:
                await self.writer.stop()
            raise

    async def close_records(self) -> None:
        """Flush every record, then stop the writer process."""
        try:
            await self.store.close()
        finally:
            if self.writer is not None:
                await self.writer.stop()

    def decode_ids_with(self, renderer: IdRenderer, turn_ends: frozenset[int]) -> None:
        """Decode the ids around a token-history break with the served tokenizer, and tell a stop id
        rendered as another by its `turn_ends`: `renderer`'s decoder, in this process; the same
        tokenizer folder, loaded on its first break, in a writer process."""
        if isinstance(self.store, RecordStore):
            self.store.tokens.decoder = renderer.decode_each
            self.store.tokens.turn_ends = turn_ends
        else:  # the options the writer process starts with, and this process's fallback
            self.store.options.decoder = FOLDER_DECODER
            self.store.options.decoder_arg = str(renderer.folder)
            self.store.options.turn_ends = sorted(turn_ends)

    async def close(self) -> None:
        await self.tasks.close()
        for client in self._clients:
            await client.close()
        self._clients.clear()
        self._upstreams.clear()


CONTEXT = web.AppKey("modeltap.context", ProxyContext)
