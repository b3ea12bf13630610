"""What a browser can make a local server do, and the checks that stop it: the Host a request names,
its Origin, and whether its content type is one a page may send without asking first.

Owns: reading a Host header, which names and addresses are a listener's own, and the Fetch standard's
facts about cross-origin requests (https://fetch.spec.whatwg.org/#cors-safelisted-request-header).
Does not own: what a refused request is answered (the proxy's relay, the viewer's middleware).

A web page the operator opens can send requests to a server on loopback. Two doors, two checks:

- DNS rebinding: a page at `http://evil.example:8840` whose name then resolves to 127.0.0.1 talks to
  the local server as its own origin, and reads the answers. Its requests carry `Host: evil.example`,
  so a server that answers only its own names and addresses is out of reach
  (https://en.wikipedia.org/wiki/DNS_rebinding#Protection).
- Cross-origin requests: a page may send a POST whose content type is form or plain text, with no
  preflight (`fetch(url, {mode: "no-cors", method: "POST", body})`); it cannot read the answer, but
  the request is made. A JSON content type, or any other header such as Authorization, needs a
  preflight (OPTIONS) first, which the server answers or refuses.

    >>> own_host("localhost:8840", "127.0.0.1")
    True
    >>> own_host("evil.example:8840", "127.0.0.1")
    False
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable

# Names every resolver maps to loopback by itself (RFC 6761 §6.3: `localhost` and `*.localhost`, which
# Chromium and Firefox answer without asking DNS), so a page cannot rebind them.
LOOPBACK_NAME = "localhost"
# Where Docker publishes the host to containers started with --add-host=host.docker.internal:host-gateway.
DOCKER_HOST_NAME = "host.docker.internal"
# `name` or `name:port`, or `[v6]` or `[v6]:port`: RFC 9110 §7.2 (uri-host [":" port]).
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^\[\]:/@\s]+))(?::(?P<port>[0-9]{1,5}))?")


def is_loopback(host: str) -> bool:
    """True when `host` (an address or `localhost`) is reachable only from this machine: a bind address,
    or a peer's (an IPv4 peer of a dual-stack socket is seen as `::ffff:127.0.0.1`)."""
    if host == LOOPBACK_NAME:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback


def host_name(header: str) -> str | None:
    """The name or address a Host header names, lower-cased and without its port, brackets or
    trailing dot; None when it is no host at all (empty, a path, user info, a bad port)."""
    found = _HOST.fullmatch(header.strip())
    if found is None or (found["port"] is not None and int(found["port"]) > 65535):
        return None
    name = (found["v6"] or found["name"]).lower()
    if found["v6"] is not None:
        try:
            return str(ipaddress.IPv6Address(name))
        except ValueError:
            return None
    return name[:-1] if name.endswith(".") and len(name) > 1 else name


def own_host(header: str | None, bind_host: str, names: Iterable[str] = ()) -> bool:
    """Whether a request whose Host header is `header` was addressed to a listener bound to
    `bind_host` by one of its own names, so that no DNS rebinding can have brought it: an address
    (a loopback one, for a loopback listener: no name resolved it), `localhost` or a name below it,
    the bind name, and for a listener beyond loopback this machine's name and Docker's name for the
    host; plus `names` the operator allows (`*` allows any)."""
    allowed = {n.strip().lower().rstrip(".") for n in names}
    if "*" in allowed:
        return True
    host = host_name(header or "")
    if host is None:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return address.is_loopback or not is_loopback(bind_host) or host in allowed
    if host == LOOPBACK_NAME or host.endswith("." + LOOPBACK_NAME) or host in allowed:
        return True
    if is_loopback(bind_host):
        return False
    return host in {bind_host.lower(), _this_host(), DOCKER_HOST_NAME}


@functools.cache
def _this_host() -> str:
    """This machine's name, asked of the system once (own_host runs on every request it guards)."""
    return socket.gethostname().lower()


def is_json_type(content_type: str) -> bool:
    """Whether a media type (no parameters, lower case) is JSON: one no page can send cross-origin
    without a preflight (only form and text types are CORS-safelisted)."""
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def cross_site(origin: str | None, fetch_site: str | None) -> bool:
    """Whether a browser says a request comes from a page of another origin: it carries an `Origin`
    (browsers send one on every cross-origin request but a plain GET), or `Sec-Fetch-Site` says
    `cross-site` or `same-site` (a GET from a page on another port of this host)."""
    return origin is not None or (fetch_site or "").strip().lower() in ("cross-site", "same-site")
