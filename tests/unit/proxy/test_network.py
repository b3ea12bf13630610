"""modeltap/proxy/network.py: the URLs a host process and a container dial."""

from __future__ import annotations

import pytest

from modeltap.compat.hosts import DOCKER_HOST_NAME
from modeltap.proxy import network


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
    assert network.container_address("0.0.0.0") == DOCKER_HOST_NAME


def test_bridge_gateway_of_an_interface_that_does_not_exist_is_none() -> None:
    assert network.bridge_gateway("nosuchif0") is None
    assert network.bridge_gateway("lo") == "127.0.0.1"


def test_url_brackets_ipv6() -> None:
    assert network.url("127.0.0.1", 80) == "http://127.0.0.1:80"
    assert network.url("::1", 8080) == "http://[::1]:8080"
