"""Fixtures for the loopback tier: a modeltap Proxy on the test's loop, or on a thread of its own for
tests that block (the agent CLIs run as subprocesses)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from modeltap.proxy import network
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.records.reader import StoreReader
from tests.standins.areal import ArealStandIn

START_TIMEOUT_S = 10.0


@pytest.fixture
def areal() -> Iterator[ArealStandIn]:
    with ArealStandIn() as upstream:
        yield upstream


def _loopback_config(store_path: Path, overrides: dict[str, Any]) -> ProxyConfig:
    """A proxy on a free loopback port that records to `store_path`, unless `overrides` says otherwise."""
    return ProxyConfig(**({"host": "127.0.0.1", "port": 0, "store": str(store_path)} | overrides))


@pytest.fixture
def make_proxy(store_path: Path) -> Callable[..., Any]:
    """`async with make_proxy(upstream=URL, **config) as proxy:` on the test's loop (loopback listener)."""

    def make(**overrides: Any) -> Proxy:
        return Proxy(_loopback_config(store_path, overrides))

    return make


@pytest.fixture
async def areal_proxy(areal: ArealStandIn, make_proxy: Callable[..., Proxy]) -> AsyncIterator[Proxy]:
    async with make_proxy(upstream=areal.url) as proxy:
        yield proxy


class ThreadedProxy:
    """A Proxy serving from its own thread and loop, so the test's thread may block."""

    def __init__(self, config: ProxyConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxy = Proxy(config)
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-proxy", daemon=True)

    def call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(START_TIMEOUT_S)

    def __enter__(self) -> Proxy:
        self._thread.start()
        self.call(self.proxy.start())
        return self.proxy

    def __exit__(self, *exc: object) -> None:
        self.call(self.proxy.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self.loop.close()


@pytest.fixture
def threaded_proxy(store_path: Path) -> Callable[..., Any]:
    """`with threaded_proxy(upstream=URL) as proxy:` for tests that block."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[Proxy]:
        with ThreadedProxy(_loopback_config(store_path, overrides)) as proxy:
            yield proxy

    return start


def records(store_path: Path, session_id: str | None = None) -> list[dict[str, Any]]:
    with StoreReader(store_path) as reader:
        return reader.exchanges(session_id)


@pytest.fixture
def bridge_host() -> str:
    """dockerd's bridge address: a non-loopback address of this machine, so a test's own calls to a
    listener bound there come from a peer that is not loopback (another machine, to the proxy)."""
    gateway = network.bridge_gateway()
    if gateway is None:
        pytest.fail("no docker0 bridge: the network-listener tests listen on it (start dockerd: make setup)")
    return gateway
