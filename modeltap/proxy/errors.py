"""The errors the proxy itself produces, and their bodies in each client's dialect.

    ProxyError                500  base
    ├── InternalError         500  anything the relay did not expect, caught at its boundary
    ├── BadRequest            400  malformed JSON, a body that is not an object, wrong content type
    │   └── OverBudget        400  prompt + completion over the context window (context_length_exceeded)
    ├── Unauthorized          401  no usable credentials, or a closed/unknown session token
    ├── Forbidden             403  a trainer control route (/rl/*, /export_trajectories, ...)
    ├── NotFound              404  unknown path, or an endpoint the upstream does not serve
    ├── MethodNotAllowed      405  a known endpoint called with the wrong method
    ├── ClientTooSlow         408  the request body did not arrive within the client timeout
    ├── PayloadTooLarge       413  request body over the configured limit (inflated, if compressed)
    ├── MisdirectedRequest    421  a Host that is not the listener's own name or address (DNS rebinding)
    ├── UnsupportedMediaType  415  a body encoding modeltap does not inflate (br, zstd)
    ├── NotImplemented_       501  an endpoint modeltap cannot answer in this configuration
    ├── UpstreamUnreachable   502  connection refused, reset, or a broken response before the status
    └── UpstreamTimeout       504  connect or read timeout

Upstream errors are not ProxyErrors: they pass through unchanged. aiohttp client exceptions are
translated into this tree in one place, upstream.py. Each error is shaped by the dialect of the route
it answers (modeltap.dialects: OpenAI's nested error, Anthropic's typed one).
"""

from __future__ import annotations

import json
from typing import ClassVar

from modeltap.dialects.base import ApiError
from modeltap.dialects.roles import Dialect


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

    @property
    def api_error(self) -> ApiError:
        """The error before a dialect shapes it."""
        return ApiError(self.message, self.openai_type, self.anthropic_type, self.code, self.param)


class InternalError(ProxyError):
    """Something the relay did not expect: answered 500 in the client's shape and recorded, with its
    traceback in the serve log, while the server keeps serving."""

    code = "internal_error"


class BadRequest(ProxyError):
    """The request cannot be relayed as sent: malformed JSON, not an object, wrong content type."""

    status = 400
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    error_class = "client_error"


class OverBudget(BadRequest):
    """Prompt plus requested completion do not fit the context window (docs/token-budgets.md §0)."""

    code = "context_length_exceeded"
    error_class = "model_fault"

    @classmethod
    def from_api_error(cls, error: ApiError) -> OverBudget:
        """The refusal as a dialect words it (`Dialect.context_overflow`)."""
        return cls(error.message, param=error.param)


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


class MisdirectedRequest(ProxyError):
    """The request names a Host that is not the listener's own: a web page may be behind it, its name
    rebound to this machine (compat/hosts.py)."""

    status = 421
    openai_type = "invalid_request_error"
    anthropic_type = "permission_error"
    code = "misdirected_request"
    error_class = "client_error"


class UnsupportedMediaType(ProxyError):
    """The request body is encoded in a way modeltap does not inflate."""

    status = 415
    openai_type = "invalid_request_error"
    anthropic_type = "invalid_request_error"
    code = "unsupported_content_encoding"
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


def error_bytes(err: ProxyError, dialect: Dialect) -> bytes:
    """The JSON body of `err` in the shape `dialect`'s clients parse."""
    return json.dumps(dialect.error_body(err.api_error)).encode()
