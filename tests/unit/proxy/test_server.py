"""modeltap/proxy/server.py: the Proxy's lifecycle, its observers in order (the record store first),
the health route, and the start-up report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy, startup_report
from modeltap.records.channel import RecordChannel
from modeltap.records.exchange import Exchange, SessionEvent


class Seen:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_exchange(self, ex: Exchange) -> None:
        self.events.append(ex)

    def on_session(self, event: SessionEvent) -> None:
        self.events.append(event)


def config(store_path: Path, **fields: Any) -> ProxyConfig:
    return ProxyConfig(**{"host": "127.0.0.1", "port": 0, "store": str(store_path)} | fields)


async def test_a_proxy_starts_once_stops_twice_and_reads_back_its_port(store_path: Path) -> None:
    proxy = Proxy(config(store_path))
    with pytest.raises(RuntimeError, match="not started"):
        proxy.host_base_url  # noqa: B018
    await proxy.start()
    try:
        assert proxy.port and proxy.host_base_url == f"http://127.0.0.1:{proxy.port}"
        assert proxy.container_base_url is None  # loopback: no container can reach it
        with pytest.raises(RuntimeError, match="starts once"):
            await proxy.start()
    finally:
        await proxy.stop()
    await proxy.stop()  # a second stop does nothing


async def test_the_store_comes_first_then_configured_then_given_observers(store_path: Path) -> None:
    given = Seen()
    spec = "tests.unit.proxy.test_server:Seen"
    async with Proxy(config(store_path, observers=[spec]), observers=[given]) as proxy:
        seam = proxy.context.observers
        order = [type(o).__name__ for o in seam._exchange]
        assert order == ["RecordChannel", "Seen", "Seen"] and seam._exchange[2] is given
        assert isinstance(seam._exchange[0], RecordChannel)
        session = proxy.sessions.open(labels={"task_id": "t"})
        proxy.sessions.close(session.id)
    assert [(e.kind, e.session_id) for e in given.events] == [("opened", session.id), ("closed", session.id)]


async def test_a_bad_observer_spec_fails_the_start_with_its_reason(store_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        await Proxy(config(store_path, observers=["no_such_module:X"])).start()


async def test_health_and_head(store_path: Path) -> None:
    async with Proxy(config(store_path)) as proxy, aiohttp.ClientSession() as http:
        async with http.get(proxy.host_base_url + "/_modeltap/health") as reply:
            assert await reply.json() == {
                "status": "ok",
                "worker": 0,
                "records_written": 0,
                "record_failures": 0,
                "observer_failures": 0,
            }
        async with http.head(proxy.host_base_url + "/api/hello") as reply:  # Claude Code's probe
            assert reply.status == 200


async def test_the_startup_report_names_the_store_the_layout_and_the_urls(store_path: Path) -> None:
    async with Proxy(config(store_path, upstream="http://up:1", layout="areal")) as proxy:
        report = startup_report(proxy, None)
    assert f"modeltap listening on 127.0.0.1:{proxy.port}" in report
    assert (
        "upstream  http://up:1" in report
        and "layout    areal (AReaL's agent proxy: chat and responses" in report
    )
    assert f"records   {store_path}" in report and "budget    off" in report
    assert f"http://127.0.0.1:{proxy.port}/v1" in report
    assert "a Docker container: unreachable (listening on loopback only" in report


async def test_the_report_prints_an_admin_key_only_when_modeltap_made_it_up(store_path: Path) -> None:
    async with Proxy(config(store_path)) as proxy:
        assert f"Bearer {proxy.admin_key}" in startup_report(proxy, None)
    async with Proxy(config(store_path, admin_key="operators-own-key")) as proxy:
        report = startup_report(proxy, None)
    assert "operators-own-key" not in report and "<the --admin-key you gave>" in report


def test_without_the_otlp_extra_the_flag_fails_and_the_variables_alone_only_warn(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from modeltap.proxy.server import build_app

    monkeypatch.setitem(sys.modules, "modeltap.exporters.otlp", None)  # as if the packages were absent
    with pytest.raises(ValueError, match="--otlp-endpoint: "):
        build_app(config(store_path, otlp_endpoint="http://127.0.0.1:9"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    app = build_app(config(store_path))
    assert len(app.cleanup_ctx) == 1  # the app's own lifecycle, and no export
    assert "not exporting spans to http://127.0.0.1:9/v1/traces" in caplog.text
