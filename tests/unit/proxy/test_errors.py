"""modeltap/proxy/errors.py: each proxy-made error has its status and its class in the record, and is
shaped by the dialect of the route it answers."""

from __future__ import annotations

import json

import pytest

from modeltap import dialects
from modeltap.proxy import errors
from modeltap.proxy.errors import ProxyError

TREE = [
    (errors.InternalError, 500, "proxy_error"),
    (errors.BadRequest, 400, "client_error"),
    (errors.OverBudget, 400, "model_fault"),
    (errors.Unauthorized, 401, "client_error"),
    (errors.Forbidden, 403, "client_error"),
    (errors.NotFound, 404, "client_error"),
    (errors.MethodNotAllowed, 405, "client_error"),
    (errors.ClientTooSlow, 408, "client_error"),
    (errors.PayloadTooLarge, 413, "client_error"),
    (errors.UnsupportedMediaType, 415, "client_error"),
    (errors.MisdirectedRequest, 421, "client_error"),
    (errors.NotImplemented_, 501, "proxy_error"),
    (errors.UpstreamUnreachable, 502, "upstream_error"),
    (errors.UpstreamTimeout, 504, "upstream_error"),
]


def test_the_tree_is_complete() -> None:
    """Every subclass is in TREE, so a new one gets its status and shapes checked."""
    found: set[type[ProxyError]] = set()
    pending: list[type[ProxyError]] = [ProxyError]
    while pending:
        for sub in pending.pop().__subclasses__():
            found.add(sub)
            pending.append(sub)
    assert found == {kind for kind, _, _ in TREE}


@pytest.mark.parametrize(("kind", "status", "error_class"), TREE)
def test_each_error_in_each_shape(kind: type[ProxyError], status: int, error_class: str) -> None:
    err = kind("what went wrong", param="messages")
    assert (err.status, err.error_class) == (status, error_class)
    openai = json.loads(errors.error_bytes(err, dialects.named("chat")))
    assert openai == {
        "error": {
            "message": "what went wrong",
            "type": err.openai_type,
            "param": "messages",
            "code": err.code,
        }
    }
    anthropic = json.loads(errors.error_bytes(err, dialects.named("count_tokens")))
    assert anthropic == {"type": "error", "error": {"type": err.anthropic_type, "message": "what went wrong"}}


def test_over_budget_takes_the_dialects_wording() -> None:
    refusal = dialects.named("chat").context_overflow(990, 16, 999, 983)
    err = errors.OverBudget.from_api_error(refusal)
    assert (err.code, err.param, err.status) == ("context_length_exceeded", "messages", 400)
    assert err.message.startswith("This model's maximum context length is 999 tokens.")
