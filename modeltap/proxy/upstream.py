"""One upstream: its base URL, pooled connections, path layout, and the translation of aiohttp's
client errors into modeltap's error tree (the only place that catches them).

Owns: choosing the upstream path for an endpoint (with `auto`, first asking the upstream's /health
whether it is AReaL's agent proxy or v2 gateway and taking their layout, else falling back once on a
route-level 404 and remembering the answer per format), knowing which formats go upstream
translated through chat (those the layout does not serve, and under `auto` those that answered a
route-level 404 on every path), sending, and reading or iterating the response with errors mapped.
Does not own: header rewriting or relaying to the client (relay.py), or the translation itself (translate.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from multidict import CIMultiDict

from modeltap.compat.layouts import Layout, is_route_level_404, layout_from_health, serves, upstream_paths
from modeltap.dialects.roles import Dialect, Streams, ThroughChat
from modeltap.proxy.config import DEFAULT_MAX_REPLY_BYTES
from modeltap.proxy.errors import NotFound, ProxyError, UpstreamTimeout, UpstreamUnreachable
from modeltap.proxy.keys import KeyMask, masked_reply

log = logging.getLogger(__name__)

# A route-level 404 body is a short FastAPI/aiohttp page; anything longer is not one worth parsing.
ROUTE_404_MAX_BYTES = 64 * 1024
# The most of an info route's answer read at discovery (`fetch_json`): a model list of a gateway that
# serves hundreds of models is about a megabyte; a wrong upstream (a file server) may answer anything.
INFO_MAX_BYTES = 8 * 1024 * 1024
# How long `auto` waits for the upstream's /health before taking it to be no AReaL server. AReaL
# answers it from memory; a server without the route answers 404 at once.
HEALTH_TIMEOUT_S = 5.0


def map_client_error(exc: BaseException, url: str) -> ProxyError:
    """The ProxyError for an aiohttp client exception raised while talking to `url`, most specific first."""
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(f"upstream {url} timed out ({exc.__class__.__name__})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"cannot connect to upstream {url}: {exc.os_error.strerror or exc}")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return UpstreamUnreachable(f"upstream {url} closed the connection")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return UpstreamUnreachable(f"upstream {url} sent a broken body: {exc}")
    return UpstreamUnreachable(f"upstream {url} failed: {exc.__class__.__name__}: {exc}")


@dataclass(slots=True)
class Reply:
    """An upstream response whose headers are read: `url` and `headers` with the keys the request
    was sent with masked (keys.py), as everything read from it is."""

    response: aiohttp.ClientResponse
    url: str
    path: str
    headers: CIMultiDict[str]
    mask: KeyMask


@dataclass(slots=True)
class WholeReply(Reply):
    """A response read whole: anything but a stream of a format that streams. Its (decoded) body was
    read once, by `Upstream.send`."""

    body: bytes


@dataclass(slots=True)
class StreamedReply(Reply):
    """A server-sent event stream of a format that streams (`dialect`), to be read as it arrives
    (`chunks`)."""

    dialect: Streams

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body chunk by chunk as it arrives (decoded), with errors mapped. Closes the response
        when the caller stops early, which ends the upstream request."""
        response, stream = self.response, self.mask.stream()
        try:
            async for chunk in response.content.iter_any():
                masked = stream.feed(chunk)
                if masked:
                    yield masked
            rest = stream.flush()
            if rest:
                yield rest
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise map_client_error(exc, self.url) from exc
        finally:
            if response.content.at_eof():
                response.release()
            else:
                response.close()


async def read(
    response: aiohttp.ClientResponse, limit: int = -1, shown: Callable[[], str] | None = None
) -> bytes:
    """The whole (decoded) body of `response`, or its first `limit` bytes, with errors mapped (naming
    the URL as `shown` says: with no key in it)."""
    try:
        if limit < 0:
            return await response.content.read()
        # `read(limit)` would return only what has arrived so far.
        chunks: list[bytes] = []
        size = 0
        while size < limit and (chunk := await response.content.read(limit - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise map_client_error(exc, shown() if shown is not None else str(response.url)) from exc
    finally:
        response.release()


_AREAL_SERVERS = {"areal": "agent proxy", "areal-gateway": "v2 inference gateway"}


class Upstream:
    """An upstream server at `base_url`, spoken to through one pooled `aiohttp.ClientSession`."""

    def __init__(
        self,
        base_url: str,
        layout: Layout,
        client: aiohttp.ClientSession,
        auto_first: Literal["areal", "openai"] = "openai",
        ask_health: bool = False,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_reply_bytes = max_reply_bytes
        self.layout = layout
        self.auto_first = auto_first
        self._client = client
        # Whether this upstream is taken to be AReaL: `--layout areal` or `areal-gateway`, or `auto`
        # where AReaL is installed (the adapter runs inside AReaL's workers).
        self.areal_like = layout in ("areal", "areal-gateway") or (layout == "auto" and auto_first == "areal")
        self._has_v1 = self.base_url.endswith("/v1")
        self._chosen: dict[str, str] = {}
        self._translated: set[str] = set()
        self._settled = layout != "auto" or not ask_health
        self._settling = asyncio.Lock()

    async def settle(self) -> None:
        """Under `auto` with `ask_health` (ProxyContext says where AReaL may be behind), ask the
        upstream once what it is: AReaL's v2 gateway and v1 agent proxy say so
        on /health (compat/layouts.py `layout_from_health`), and then get their own layout, so that
        Anthropic and Responses requests to the gateway go through chat at once and its admin-only
        /v1/models is answered here. Any other answer, or none, leaves `auto` as it is."""
        if self._settled:
            return
        async with self._settling:
            if self._settled:
                return
            layout = layout_from_health(await self.fetch_json("/health", {}, HEALTH_TIMEOUT_S))
            if layout is not None:
                log.info(
                    "upstream %s is AReaL's %s: layout %s", self.base_url, _AREAL_SERVERS[layout], layout
                )
                self.layout, self.areal_like = layout, True
            self._settled = True

    def translates(self, dialect: Dialect) -> bool:
        """Whether requests of this format go upstream translated through chat: the layout does not
        serve it, or (`auto`) it answered a route-level 404 on every path."""
        return isinstance(dialect, ThroughChat) and (
            not serves(self.layout, dialect.route) or dialect.name in self._translated
        )

    def translate_from_now_on(self, dialect: Dialect) -> bool:
        """Under `auto`, take a format the upstream does not serve at any path (send raised NotFound)
        to be translated through chat from now on, and say so in the log, once. True for every request
        that was sent as it is meanwhile (the samples of one prompt start at once): each is retried
        through chat. False when the layout is fixed or the format cannot be translated."""
        if self.layout != "auto" or not isinstance(dialect, ThroughChat):
            return False
        if dialect.name not in self._translated:
            self._translated.add(dialect.name)
            log.warning(
                "upstream %s serves no %s endpoint: modeltap translates %s requests through chat from now on",
                self.base_url,
                dialect.route,
                dialect.name,
            )
        return True

    def candidates(self, dialect: Dialect) -> list[str]:
        """Upstream paths to try for a format, the one that worked before first."""
        paths = upstream_paths(
            self.layout,
            dialect.route,
            areal_v1=dialect.areal_v1,
            base_has_v1=self._has_v1,
            auto_first=self.auto_first,
        )
        known = self._chosen.get(dialect.name)
        return [known] if known in paths else paths

    async def send(
        self,
        dialect: Dialect,
        method: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes | None,
        suffix: str = "",
        paths: Sequence[str] | None = None,
    ) -> WholeReply | StreamedReply:
        """Send one request and return the response: read whole, unless it is a stream of a format that
        streams (only the generating formats stream; anything else that claims to is read whole).
        `suffix` extends the format's path (`/MODEL_ID` for `GET /v1/models/{id}`). `paths`, from the
        server's root, replace the layout's candidates (an engine's own endpoint: `--tokens exact`).

        Raises NotFound when every candidate path answered a route-level 404, and the mapped
        ProxyError when the upstream cannot be reached.
        """
        base = self.root if paths is not None else self.base_url
        paths = list(paths) if paths is not None else self.candidates(dialect)
        for path in paths:
            url = base + path + suffix + (f"?{query}" if query else "")

            # The URL as an error shows it: no key in it, wherever the client put one.
            def shown(url: str = url) -> str:
                return masked_reply(headers, query, url, ()).url

            try:
                response = await self._client.request(method, url, headers=headers, data=body)
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise map_client_error(exc, shown()) from exc
            if response.status != 404:
                self._chosen.setdefault(dialect.name, path)
                # An error answered as a stream is read whole: its client is told of it in one piece.
                if (
                    response.status < 400
                    and isinstance(dialect, Streams)
                    and response.content_type == "text/event-stream"
                ):
                    seen = masked_reply(headers, query, url, response.headers.items())
                    return StreamedReply(response, seen.url, path, seen.headers, seen.mask, dialect)
                raw = await read(response, limit=self.max_reply_bytes + 1, shown=shown)
                if len(raw) > self.max_reply_bytes:
                    raise UpstreamUnreachable(
                        f"upstream {shown()} answered more than {self.max_reply_bytes} bytes in one "
                        "piece (--max-reply-bytes; a streamed answer has no such limit)"
                    )
                seen = masked_reply(headers, query, url, response.headers.items(), raw)
                return WholeReply(response, seen.url, path, seen.headers, seen.mask, seen.body)
            head = await read(response, limit=ROUTE_404_MAX_BYTES, shown=shown)
            if not is_route_level_404(404, head):
                # The API's own 404, e.g. model_not_found.
                seen = masked_reply(headers, query, url, response.headers.items(), head)
                return WholeReply(response, seen.url, path, seen.headers, seen.mask, seen.body)
            log.debug("upstream %s has no route %s", self.base_url, path)
        tried = ", ".join(paths)
        raise NotFound(f"the upstream {self.base_url} does not serve {dialect.name} (tried {tried})")

    @property
    def root(self) -> str:
        """The base URL without a trailing `/v1`: where servers put their info routes."""
        return self.base_url.removesuffix("/v1")

    async def fetch_json(self, path: str, headers: Mapping[str, str], timeout_s: float) -> Any:
        """GET `root + path` as JSON, or None when it does not answer 200 with JSON of at most
        INFO_MAX_BYTES in time. Best effort, for discovery at start: any failure just means "not here"."""
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client.get(self.root + path, headers=headers, timeout=timeout) as response:
                if response.status != 200:
                    return None
                raw = await response.content.read(INFO_MAX_BYTES + 1)
                return json.loads(raw) if len(raw) <= INFO_MAX_BYTES else None
        except (TimeoutError, aiohttp.ClientError, ValueError, RecursionError):
            return None
