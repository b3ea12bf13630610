"""modeltap/proxy/headers.py: what goes upstream has no hop-by-hop headers and the upstream's
credentials, never the client's session token; without an upstream key the client's pass untouched."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from modeltap import dialects
from modeltap.proxy.flow import Target
from modeltap.proxy.headers import UPSTREAM_ACCEPT_ENCODING, upstream_headers


def test_upstream_headers_drop_hop_by_hop_and_swap_the_credentials() -> None:
    request = make_mocked_request(
        "POST",
        "/v1/messages",
        headers={
            "Authorization": "Bearer session-token",
            "x-api-key": "session-token",
            "Connection": "keep-alive",
            "Accept-Encoding": "br, zstd",
            "anthropic-version": "2023-06-01",
            "Content-Length": "10",
        },
    )
    target = Target(upstream=None, key="sk-upstream", pass_client_credentials=False, session=None)  # type: ignore[arg-type]
    out = upstream_headers(request, target, dialects.named("messages"))
    assert out["Authorization"] == "Bearer sk-upstream" and out["x-api-key"] == "sk-upstream"
    assert "Connection" not in out and "Content-Length" not in out
    assert out["Accept-Encoding"] == UPSTREAM_ACCEPT_ENCODING
    assert out["anthropic-version"] == "2023-06-01"
    chat = upstream_headers(request, target, dialects.named("chat"))
    assert "x-api-key" not in chat and chat["Authorization"] == "Bearer sk-upstream"


def test_without_a_key_the_clients_credentials_pass_untouched() -> None:
    request = make_mocked_request("POST", "/v1/chat/completions", headers={"Authorization": "Bearer own"})
    target = Target(upstream=None, key=None, pass_client_credentials=True, session=None)  # type: ignore[arg-type]
    assert upstream_headers(request, target, dialects.named("chat"))["Authorization"] == "Bearer own"
