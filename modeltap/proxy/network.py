"""Bind addresses, and the URL a caller should use to reach the proxy.

Owns: whether a listener is loopback-only, the address a host process should dial, and the address
a Docker container on the default bridge should dial (the bridge gateway, docker0's IPv4 address).
Does not own: binding (server.py).

AReaL's own proxy binds the host's primary IP only (docs/areal.md §6), which a container
on the bridge cannot reach; modeltap binds all interfaces and points containers at the gateway.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

BRIDGE_INTERFACE = "docker0"
# Where Docker publishes the host when run with --add-host=host.docker.internal:host-gateway; the
# fallback when this host has no docker0 (Docker Desktop, rootless, or no Docker at all).
HOST_GATEWAY_NAME = "host.docker.internal"
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


def is_loopback(host: str) -> bool:
    """True when `host` is reachable only from this machine: a bind address, or a peer's (an IPv4
    peer of a dual-stack socket is seen as `::ffff:127.0.0.1`)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def host_address(bind_host: str) -> str:
    """The address a process on this host dials to reach a listener bound to `bind_host`."""
    return "127.0.0.1" if is_wildcard(bind_host) else bind_host


def bridge_gateway(interface: str = BRIDGE_INTERFACE) -> str | None:
    """docker0's IPv4 address (usually 172.17.0.1), or None when there is no such interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def container_address(bind_host: str) -> str | None:
    """The address a container on the default bridge dials, or None when the listener is loopback-only
    (a container's 127.0.0.1 is the container itself)."""
    if is_loopback(bind_host):
        return None
    if not is_wildcard(bind_host):
        return bind_host
    return bridge_gateway() or HOST_GATEWAY_NAME


def url(address: str, port: int) -> str:
    """`http://address:port`, bracketing IPv6 literals."""
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"
