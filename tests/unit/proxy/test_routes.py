"""modeltap/proxy/routes.py: every endpoint at every prefix, control routes refused, unknown paths 404."""

import pytest

from modeltap import dialects
from modeltap.proxy.errors import Forbidden, NotFound
from modeltap.proxy.routes import resolve, session_token
from modeltap.proxy.sessions import masked
from tests.factories import CONTROL_PATHS

TOKEN = "A" * 43

SUFFIXES = {
    "chat/completions": "chat",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
    "messages/count_tokens": "count_tokens",
    "models": "models",
    "embeddings": "embeddings",
}
PREFIXES = ["", "/v1", "/v1/v1", f"/s/{TOKEN}", f"/s/{TOKEN}/v1", f"/s/{TOKEN}/v1/v1"]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("suffix", list(SUFFIXES))
def test_every_endpoint_at_every_prefix(prefix: str, suffix: str) -> None:
    route = resolve(f"{prefix}/{suffix}")
    assert route.dialect is dialects.named(SUFFIXES[suffix])
    assert route.session_token == (TOKEN if prefix.startswith("/s/") else None)


def test_trailing_slash_and_model_id() -> None:
    assert resolve("/v1/chat/completions/").dialect is dialects.named("chat")
    route = resolve("/v1/models/qwen-7b")
    assert (route.dialect, route.item) == (dialects.named("models"), "qwen-7b")


@pytest.mark.parametrize(
    "path",
    [*CONTROL_PATHS, "/v1/rl/set_reward", f"/s/{TOKEN}/rl/set_reward", f"/s/{TOKEN}/v1/rl/end_session"],
)
def test_control_routes_are_forbidden(path: str) -> None:
    with pytest.raises(Forbidden, match="never forwards"):
        resolve(path)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v2/chat/completions",
        "/chat",
        "/v1/chat/completions/../rl/set_reward",
        "/s/short/chat/completions",
        "/v1//chat/completions",
        "/models/a/b",
    ],
)
def test_unknown_paths_are_not_found(path: str) -> None:
    with pytest.raises(NotFound):
        resolve(path)


def test_token_is_masked_in_not_found_message() -> None:
    with pytest.raises(NotFound) as info:
        resolve(f"/s/{TOKEN}/nope")
    assert TOKEN not in str(info.value)


def test_session_token_and_masking() -> None:
    assert session_token(f"/s/{TOKEN}/v1/chat/completions") == TOKEN
    assert session_token("/v1/chat/completions") is None
    assert masked(f"/v1/s/{TOKEN}/x/{TOKEN}") == "/v1/s/…/x/…"
    assert masked(f"/S/{TOKEN}") == "/S/…"
