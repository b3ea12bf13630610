"""modeltap/compat/hosts.py: which Host headers name a listener's own names and addresses (a page that
rebound its name to this machine names its own), fuzzed over any header value; loopback binds; JSON
media types; what a browser says of a cross-site request."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.hosts import (
    DOCKER_HOST_NAME,
    cross_site,
    host_name,
    is_json_type,
    is_loopback,
    own_host,
)

# What a rebinding page's requests say: its own name, any port, any case, a trailing dot.
_LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
_PAGE_NAMES = st.builds(
    lambda labels, tld: ".".join([*labels, tld]), st.lists(_LABEL, min_size=1, max_size=3), _LABEL
).filter(lambda n: n != "localhost" and not n.endswith(".localhost") and n != DOCKER_HOST_NAME)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.0.0.5", False), ("example.org", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("header", "name"),
    [("localhost:8840", "localhost"), ("LOCALHOST.", "localhost"), ("[::1]:80", "::1"),
     ("127.0.0.1", "127.0.0.1"), ("a.b:99999", None), ("", None), ("user@host", None), ("/x", None),
     ("[::1", None), ("[zz]", None), ("h:", None), ("h p", None)],
)  # fmt: skip
def test_host_name(header: str, name: str | None) -> None:
    assert host_name(header) == name


@pytest.mark.parametrize(
    "header", ["127.0.0.1:8840", "localhost:8840", "LocalHost", "[::1]:8840", "127.0.0.2", "app.localhost:1"]
)
def test_a_loopback_listener_answers_its_own_names_and_addresses(header: str) -> None:
    assert own_host(header, "127.0.0.1")


@pytest.mark.parametrize(
    "header", [None, "", "evil.example:8840", "10.0.0.5:8840", "localhost.evil.example", "127.0.0.1.nip.io"]
)
def test_a_loopback_listener_refuses_any_other(header: str | None) -> None:
    assert not own_host(header, "127.0.0.1")


def test_a_listener_beyond_loopback_answers_its_addresses_and_this_machine_s_names() -> None:
    for header in ("172.17.0.1:8840", f"{DOCKER_HOST_NAME}:8840", socket.gethostname(), "[fe80::1]"):
        assert own_host(header, "0.0.0.0"), header
    assert own_host("gpu-box:8840", "gpu-box")
    assert not own_host("evil.example", "0.0.0.0")


def test_the_operator_allows_more_names() -> None:
    assert own_host("proxy.internal:443", "127.0.0.1", ["Proxy.Internal."])
    assert own_host("anything", "127.0.0.1", ["*"])
    assert not own_host("other.internal", "127.0.0.1", ["proxy.internal"])


@given(st.text(max_size=60))
def test_any_host_header_is_own_only_if_it_names_loopback(header: str) -> None:
    """Whatever a client writes in Host, a loopback listener answers it only when it names loopback
    (an address, or localhost and the names below it, which no page can rebind)."""
    if own_host(header, "127.0.0.1"):
        name = host_name(header)
        assert name is not None
        assert is_loopback(name) or name.endswith(".localhost")


@given(_PAGE_NAMES, st.integers(0, 65535), st.booleans(), st.sampled_from(["127.0.0.1", "::1", "0.0.0.0"]))
def test_a_rebinding_page_s_name_is_refused(name: str, port: int, upper: bool, bind: str) -> None:
    if name == socket.gethostname().lower():
        return
    header = f"{name.upper() if upper else name}{'.' if port % 2 else ''}:{port}"
    assert not own_host(header, bind)


@pytest.mark.parametrize(
    ("media_type", "json"),
    [("application/json", True), ("application/vnd.api+json", True), ("text/plain", False),
     ("application/x-www-form-urlencoded", False), ("multipart/form-data", False), ("text/x+json", False),
     ("application/octet-stream", False)],
)  # fmt: skip
def test_is_json_type(media_type: str, json: bool) -> None:
    assert is_json_type(media_type) is json


def test_cross_site() -> None:
    assert cross_site("http://evil.example", None)
    assert cross_site(None, "cross-site") and cross_site(None, "Same-Site")
    assert not cross_site(None, "same-origin") and not cross_site(None, "none") and not cross_site(None, None)
