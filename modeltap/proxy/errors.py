"""The errors the proxy itself produces, and their bodies in each client's dialect.

    ProxyError                500  base; anything unexpected at the relay boundary
    ├── BadRequest            400  malformed JSON, a body that is not an object, wrong content type
    │   └── OverBudget        400  prompt + completion over the context window (context_length_exceeded)
    ├── Unauthorized          401  no usable credentials, or a closed/unknown session token
    ├── Forbidden             403  a trainer control route (/rl/*, /export_trajectories, ...)
    ├── NotFound              404  unknown path, or an endpoint the upstream does not serve
    ├── MethodNotAllowed      405  a known endpoint called with the wrong method
    ├── ClientTooSlow         408  the request body did not arrive within the client timeout
    ├── PayloadTooLarge       413  request body over the configured limit
    ├── NotImplemented_       501  an endpoint modeltap cannot answer in this configuration
    ├── UpstreamUnreachable   502  connection refused, reset, or a broken response before the status
    └── UpstreamTimeout       504  connect or read timeout

Upstream errors are not ProxyErrors: they pass through unchanged (DESIGN §3.4). aiohttp client
exceptions are translated into this tree in one place, upstream.py.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


class ProxyError(Exception):
    """Base of every error the proxy answers itself. `status` is the HTTP status; `openai_type`,
    `anthropic_type` and `code` fill the two dialects' error bodies."""

    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    anthropic_type: ClassVar[str] = "api_error"
    code: ClassVar[str | None] = None
    error_class: ClassVar[str] = "proxy_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(ProxyError):
    """The request cannot be relayed as sent: malformed JSON, not an object, wrong content type."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    error_class = "client_error"


class OverBudget(BadRequest):
    """Prompt plus requested completion do not fit the context window (DESIGN §4)."""

    code = "context_length_exceeded"
    error_class = "model_fault"


class Unauthorized(ProxyError):
    """No usable credentials, or a session token that is unknown or closed."""

    status = 401
    openai_type = "invalid_request_error"
    anthropic_type = "authentication_error"
    code = "invalid_api_key"
    error_class = "client_error"


class Forbidden(ProxyError):
    """A route modeltap refuses to forward, such as the trainer's reward route."""

    status = 403
    openai_type = "invalid_request_error"
    anthropic_type = "permission_error"
    code = "forbidden"
    error_class = "client_error"


class NotFound(ProxyError):
    """No such endpoint here, or the upstream serves it at none of the paths its layout allows."""

    status = 404
    openai_type = "invalid_request_error"
    anthropic_type = "not_found_error"
    code = "unknown_url"
    error_class = "client_error"


class MethodNotAllowed(ProxyError):
    """A known endpoint called with the wrong HTTP method."""

    status = 405
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "method_not_allowed"
    error_class = "client_error"


class ClientTooSlow(ProxyError):
    """The client took longer than the client timeout to send its body (a slowloris, or a dead peer)."""

    status = 408
    openai_type = "invalid_request_error"
    anthropic_type = "timeout_error"
    code = "request_timeout"
    error_class = "client_error"


class PayloadTooLarge(ProxyError):
    """The request body is over the configured limit."""

    status = 413
    openai_type = "invalid_request_error"
    anthropic_type = "request_too_large"
    code = "request_too_large"
    error_class = "client_error"


class NotImplemented_(ProxyError):
    """An endpoint modeltap cannot answer in this configuration."""

    status = 501
    code = "not_implemented"


class UpstreamUnreachable(ProxyError):
    """The upstream refused or dropped the connection before a response began."""

    status = 502
    error_class = "upstream_error"
    code = "upstream_unreachable"


class UpstreamTimeout(ProxyError):
    """The upstream did not connect, or went silent for longer than the read timeout."""

    status = 504
    anthropic_type = "timeout_error"
    error_class = "upstream_error"
    code = "upstream_timeout"


def openai_error_body(err: ProxyError) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`, as the openai SDK and opencode parse it."""
    return {"error": {"message": err.message, "type": err.openai_type, "param": err.param, "code": err.code}}


def anthropic_error_body(err: ProxyError) -> dict[str, Any]:
    """`{"type": "error", "error": {"type", "message"}}`, as the anthropic SDK and Claude Code parse it."""
    return {"type": "error", "error": {"type": err.anthropic_type, "message": err.message}}


def error_bytes(err: ProxyError, anthropic: bool) -> bytes:
    """The JSON body of `err` in the chosen dialect."""
    body = anthropic_error_body(err) if anthropic else openai_error_body(err)
    return json.dumps(body).encode()
