"""A bounded fuzz pass (hypothesis) over request parsing and routing: modeltap/proxy/routes.py,
`presented_key` in modeltap/compat/clients.py, and the relay's reading of whole requests.

The pure properties run a few hundred examples each; the last test sends generated requests (method,
path with percent-encoding, credentials, content type, body) through a live proxy in front of the AReaL
stand-in. Paths are built from the words that matter here (the session prefix and token, `v1`, the
endpoints, AReaL's control routes, dot segments) so that the examples hit the interesting corners
instead of random noise. Bounded so the file runs in well under 30 s on a loaded 2-core machine.
"""

from __future__ import annotations

import gzip
import http.client
import io
import json
import logging
import re
import secrets
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from yarl import URL

from modeltap.compat.clients import presented_key
from modeltap.exporters.export import write_export
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.errors import Forbidden, NotFound
from modeltap.proxy.routes import Route, resolve, session_token
from modeltap.proxy.sessions import masked
from modeltap.records.reader import StoreReader
from tests.integration.conftest import ThreadedProxy
from tests.standins.areal import ArealStandIn

TOKEN = secrets.token_urlsafe(32)
PURE = settings(max_examples=400, deadline=timedelta(milliseconds=500))
# Each example is one loopback round trip or two; the deadline only catches a hang.
THROUGH_THE_PROXY = settings(
    max_examples=150,
    deadline=timedelta(seconds=5),
    suppress_health_check=[HealthCheck.too_slow],
)
HTTP_TIMEOUT_S = 10.0

SUFFIXES = (
    "chat/completions",
    "completions",
    "responses",
    "messages",
    "messages/count_tokens",
    "models",
    "embeddings",
)
CONTROL = (
    "rl/set_reward",
    "rl/start_session",
    "rl/end_session",
    "rl",
    "export_trajectories",
    "grant_capacity",
    "call",
    "configure",
    "create_engine",
    "set_env",
    "alloc_ports",
    "internal/wait_for_session",
)
# The token comes as `s/TOKEN`, where it is a credential, though not always at the start. A client can
# also put its token in a body or a model id on purpose; that is its data, forwarded like any other.
WORDS = [
    "s",
    "s/{T}",
    "v1",
    "..",
    ".",
    "",
    "chat",
    "completions",
    "messages",
    "count_tokens",
    "models",
    "responses",
    "embeddings",
    "rl",
    "set_reward",
    "start_session",
    "export_trajectories",
    "grant_capacity",
    "internal",
    "call",
    "RL",
    "Chat",
]
segment = st.sampled_from(WORDS) | st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="/"), max_size=6
)


@st.composite
def decoded_paths(draw: st.DrawFn, token: str = TOKEN) -> str:
    """A path as aiohttp hands it to modeltap: percent-decoded once, never normalised."""
    return "/" + "/".join(draw(st.lists(segment, max_size=7))).replace("{T}", token)


@st.composite
def wire_paths(draw: st.DrawFn, token: str) -> str:
    """A path as a client might send it: some characters percent-encoded, slashes included."""
    path = draw(decoded_paths(token))
    encode = draw(st.sets(st.integers(0, max(len(path) - 1, 0)), max_size=4))
    return "".join(
        f"%{ord(c):02X}" if i in encode and i > 0 and c.isascii() else quote(c, safe="/%-._~")
        for i, c in enumerate(path)
    )


def _routable(path: str, route: Route) -> bool:
    """Whether `path` has the shape a route may come from, by a rule written apart from routes.py."""
    prefix = rf"(s/{re.escape(route.session_token)}/)?" if route.session_token else ""
    endpoint = "|".join(re.escape(s) for s in SUFFIXES) + r"|models/[^/]+"
    return re.fullmatch(rf"{prefix}(v1/)*({endpoint})", path.strip("/")) is not None


@PURE
@given(path=decoded_paths())
@example(path="/models/..")
@example(path=f"/s/{TOKEN}/v1/models/.")
@example(path=f"/s/{TOKEN}/v1/chat/completions/../../rl/set_reward")
def test_resolve_routes_only_known_endpoints_and_raises_nothing_else(path: str) -> None:
    try:
        route = resolve(path)
    except (NotFound, Forbidden) as error:
        assert TOKEN not in str(error)  # the message goes back to the client and into the record
        return
    assert _routable(path, route), path
    segments = path.strip("/").split("/")[: -1 if route.item is not None else None]
    assert ".." not in segments and not any(c in segments for c in ("rl", "internal", "export_trajectories"))
    assert route.session_token == session_token(path)
    if route.item is not None:
        # Quoted as the relay sends it, the id stays one segment under /models whatever yarl normalises.
        sent = URL("http://upstream/v1/models/" + quote(route.item, safe=""))
        assert sent.raw_path.startswith("/v1/models/"), route.item


@PURE
@given(
    prefix=st.sampled_from(["", f"s/{TOKEN}/", "//", f"/s/{TOKEN}//"]),
    v1s=st.integers(0, 3),
    control=st.sampled_from(CONTROL),
    tail=st.sampled_from(["", "/", "/x", ".", "/../chat/completions", "?x=1"]),
)
def test_control_routes_are_refused_behind_any_prefix(prefix: str, v1s: int, control: str, tail: str) -> None:
    path = "/" + prefix + "v1/" * v1s + control + tail
    try:
        route = resolve(path)
    except Forbidden:
        return
    except NotFound:
        # Unroutable is as safe as refused; a plain control path behind a clean prefix must be refused.
        assert "//" in path.strip("/") or tail not in ("", "/"), path
        return
    raise AssertionError(f"{path} resolved to {route}")


@PURE
@given(before=st.lists(segment, max_size=3), after=st.lists(segment, max_size=3), upper=st.booleans())
def test_masked_paths_never_show_a_token(before: list[str], after: list[str], upper: bool) -> None:
    path = "/" + "/".join([*before, "S" if upper else "s", TOKEN, *after]).replace("{T}", TOKEN)
    shown = masked(path)
    assert TOKEN not in shown
    assert shown.count("/") == path.count("/")  # only the token went


@PURE
@given(
    authorization=st.none() | st.text(max_size=40),
    api_key=st.none() | st.text(max_size=40),
    scheme=st.sampled_from(["Bearer", "bearer", "BEARER", "Basic", ""]),
)
def test_presented_key_takes_bearer_then_x_api_key(
    authorization: str | None, api_key: str | None, scheme: str
) -> None:
    headers = {}
    if authorization is not None:
        headers["Authorization"] = f"{scheme} {authorization}" if scheme else authorization
    if api_key is not None:
        headers["x-api-key"] = api_key
    key = presented_key(headers)
    assert key is None or (key == key.strip() and key and any(key in v for v in headers.values()))
    if scheme.lower() == "bearer" and authorization is not None and authorization.strip():
        assert key == authorization.strip()
    elif api_key is not None and api_key.strip():
        assert key == api_key.strip()


# -- through a live proxy --------------------------------------------------------------------------

CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "application/vnd.api+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    None,
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Text as agents send it, lone surrogates included (a JavaScript agent cutting an emoji in half).
agent_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=10)
agent_messages = st.lists(
    st.fixed_dictionaries({"role": st.just("user"), "content": agent_text}), min_size=1, max_size=2
)
chat_bodies = st.fixed_dictionaries(
    {"model": agent_text, "messages": agent_messages},
    optional={"stream": st.booleans(), "max_tokens": st.integers(-5, 100), "extra": json_values},
)
bodies = st.one_of(
    chat_bodies.map(lambda d: json.dumps(d).encode()),
    st.dictionaries(agent_text, agent_text, max_size=2).map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(1, 600).map(
        lambda depth: b'{"model": "m", "prompt": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    ),
    st.just(b'{"model": "m", "messages": [{"role": "user", "content": "hi"'),
)
# Header values that odd clients send: digits of other scripts, huge numbers, bytes that are not
# UTF-8 (http.client writes a str header as latin-1), encodings modeltap inflates or refuses.
odd_headers = st.dictionaries(
    st.sampled_from(["x-stainless-retry-count", "User-Agent", "Content-Encoding", "X-Note"]),
    st.sampled_from(
        ["²".encode(), "٣".encode(), b"9" * 60, b"1", b"agent/1 \xff\xfe", b"gzip", b"br", b"zstd"]
    ),
    max_size=3,
)


@st.composite
def requests(draw: st.DrawFn, token: str) -> dict[str, Any]:
    return {
        "method": draw(st.sampled_from(["POST", "POST", "GET", "PUT", "DELETE"])),
        "path": draw(wire_paths(token)),
        "credentials": draw(st.sampled_from(["none", "bearer", "x-api-key", "other"])),
        "content_type": draw(st.sampled_from(CONTENT_TYPES)),
        "body": draw(bodies),
        "headers": draw(odd_headers),
        "compress": draw(st.sampled_from([None, "gzip", "deflate", "garbage"])),
    }


def _send(port: int, token: str, request: dict[str, Any]) -> tuple[int, str, bytes]:
    headers = {
        "bearer": {"Authorization": f"Bearer {token}"},
        "x-api-key": {"x-api-key": token},
        "other": {"Authorization": "Bearer sk-somebody-else"},
        "none": {},
    }[request["credentials"]]
    if request["content_type"] is not None:
        headers["Content-Type"] = request["content_type"]
    headers |= request["headers"]
    body = request["body"]
    if request["compress"] is not None:
        headers["Content-Encoding"] = "gzip" if request["compress"] != "deflate" else "deflate"
        body = {"gzip": gzip.compress, "deflate": zlib.compress, "garbage": lambda b: b"\x1f\x8b" + b}[
            request["compress"]
        ](body)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HTTP_TIMEOUT_S)
    try:
        conn.request(request["method"], request["path"], body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def _in_a_dialect(body: bytes) -> bool:
    doc = json.loads(body)
    openai_shaped = set(doc) == {"error"} and {"message", "type", "param", "code"} <= set(doc["error"])
    anthropic_shaped = doc.get("type") == "error" and {"type", "message"} <= set(doc.get("error", {}))
    return openai_shaped or anthropic_shaped


def _export(reader: StoreReader, session_id: str) -> str:
    out = io.StringIO()
    for fmt in ("har", "jsonl"):
        write_export(reader, session_id, fmt, out)
    return out.getvalue()


async def _open_session(proxy: Any, key: str) -> str:
    return str(proxy.sessions.open(upstream_key=key, labels={"task_id": "fuzz"}).token)


def test_fuzzed_requests_through_the_proxy(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever arrives (lone surrogates and bytes that are not UTF-8 anywhere, deep nesting, odd header
    values, compressed bodies): no 500 of the proxy's own, errors in a client's shape, no control route
    and no session token reaching the upstream, every request that reached the relay recorded once and
    whole, and no token or key in the store, the log or any export."""
    caplog.set_level(logging.DEBUG)
    store = tmp_path / "records.db"
    sent = unparsed = 0
    with ArealStandIn() as areal:
        upstream = areal.open_session("fuzz")
        config = ProxyConfig(upstream=areal.url, host="127.0.0.1", port=0, store=str(store), layout="areal")
        threaded = ThreadedProxy(config)
        with threaded as proxy:
            token = threaded.call(_open_session(proxy, upstream.api_key))
            assert proxy.port is not None

            @THROUGH_THE_PROXY
            @given(request=requests(token))
            def one(request: dict[str, Any]) -> None:
                nonlocal sent, unparsed
                before = len(areal.requests)
                status, content_type, body = _send(proxy.port, token, request)
                sent += 1
                # aiohttp's parser refused it before any route: answered in the OpenAI shape, unrecorded.
                unparsed += status == 400 and b'"bad_http_request"' in body
                forwarded = areal.requests[before:]
                assert content_type.startswith(("application/json", "text/event-stream")), (status, body)
                if not forwarded:
                    assert status in (200, 400, 401, 403, 404, 405, 413, 415), (status, body)
                    assert status == 200 or _in_a_dialect(body), body
                for call in forwarded:
                    assert not re.match(r"/(rl|internal|export_trajectories|grant_capacity)\b", call.path)
                    assert token not in call.path_qs and token.encode() not in call.raw
                    assert not any(token in value for value in call.headers.values())

            one()
            failures = proxy.context.store.failures
        assert [i.reward for i in upstream.interactions if i.reward is not None] == []
    assert failures == 0  # every record written in full
    with StoreReader(store) as reader:
        rows = reader.exchanges()
        exported = [
            _export(reader, session) for session in {r["session_id"] for r in rows if r["session_id"]}
        ]
    assert len(rows) == sent - unparsed
    for secret in (token, upstream.api_key):
        assert secret not in caplog.text and not any(secret in text for text in exported)
    assert [
        (r["path"], r["error_message"]) for r in rows if token in r["path"] + (r["error_message"] or "")
    ] == []
    assert sum(r["session_id"] is not None and r["labels"] == {"task_id": "fuzz"} for r in rows) > 0
