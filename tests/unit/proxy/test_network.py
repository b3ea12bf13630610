"""modeltap/proxy/network.py: which listeners are loopback-only, and the URLs a host process and a
container dial."""

from __future__ import annotations

import pytest

from modeltap.proxy import network


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert network.is_loopback(host) is loopback


def test_host_address_dials_loopback_for_a_wildcard_bind() -> None:
    assert network.host_address("0.0.0.0") == "127.0.0.1"
    assert network.host_address("::") == "127.0.0.1"
    assert network.host_address("10.0.0.5") == "10.0.0.5"


def test_container_address(monkeypatch: pytest.MonkeyPatch) -> None:
    assert network.container_address("127.0.0.1") is None  # a container's loopback is its own
    assert network.container_address("10.0.0.5") == "10.0.0.5"
    monkeypatch.setattr(network, "bridge_gateway", lambda interface=network.BRIDGE_INTERFACE: "172.17.0.1")
    assert network.container_address("0.0.0.0") == "172.17.0.1"
    monkeypatch.setattr(network, "bridge_gateway", lambda interface=network.BRIDGE_INTERFACE: None)
    assert network.container_address("0.0.0.0") == network.HOST_GATEWAY_NAME


def test_bridge_gateway_of_an_interface_that_does_not_exist_is_none() -> None:
    assert network.bridge_gateway("nosuchif0") is None
    assert network.bridge_gateway("lo") == "127.0.0.1"


def test_url_brackets_ipv6() -> None:
    assert network.url("127.0.0.1", 80) == "http://127.0.0.1:80"
    assert network.url("::1", 8080) == "http://[::1]:8080"
