"""The HTTP listener under the proxy app: aiohttp's runner as modeltap configures it.

Owns: what aiohttp answers by itself before any handler runs. A request aiohttp cannot parse (a URL
or header over 8,190 bytes, more than 128 headers, a smuggling attempt) gets a 400 in the OpenAI
error shape, without the request's bytes echoed back (they may hold a session token), and is logged
the same way, with its reason but none of its bytes. Request bodies reach the relay as sent, still
compressed, because inflating them is the relay's to decide (who asks, how big). Does not own: the
app (server.py) or what a handler answers (relay.py).

    runner = runner_for(app, keepalive_timeout_s=60.0, shutdown_timeout_s=10.0)
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from aiohttp import web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError

# aiohttp's log of the connections it serves, under modeltap's name. Not aiohttp.server, which echoes
# the bytes of a request it cannot parse.
HTTP_LOG = logging.getLogger("modeltap.proxy.http")
# Where aiohttp's parse error messages start quoting the request's bytes: a repr after a space, as
# `b'…'`, `'…'` or `bytearray(b'…')` (the quote in "can't" is not one).
_ECHO = re.compile(r"\s+(?:bytearray\()?b?['\"].*", re.S)


def reason_of(exc: BaseException) -> str:
    """A parse error's reason without the request bytes aiohttp quotes after it."""
    message = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
    return _ECHO.sub("", (message or "").partition("\n")[0]).rstrip(":") or type(exc).__name__


class _DropRequestEcho(logging.Filter):
    """Logs an unparsable request with the parser's reason but none of the request's bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = f"{record.getMessage()}: {type(exc).__name__} {exc.code}: {reason_of(exc)}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


HTTP_LOG.addFilter(_DropRequestEcho())


class _Handler(web_protocol.RequestHandler):
    """aiohttp's connection handler, answering what it cannot parse in the OpenAI error shape."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500 or exc is None:
            return super().handle_error(request, status, exc, message)
        self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent: no error can follow it")
        error = {
            "message": f"modeltap could not read this HTTP request: {reason_of(exc)}",
            "type": "invalid_request_error",
            "param": None,
            "code": "bad_http_request",
        }
        response = web.Response(
            status=status, body=json.dumps({"error": error}), content_type="application/json"
        )
        response.force_close()
        return response


class _Server(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _Server(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )


def runner_for(
    app: web.Application, *, keepalive_timeout_s: float, shutdown_timeout_s: float
) -> web.AppRunner:
    """The runner that serves `app`: running handlers cancelled when their client leaves (so the
    upstream request is cancelled too), no access log, bodies not inflated by aiohttp."""
    options: dict[str, Any] = {
        "handler_cancellation": True,
        "access_log": None,
        "shutdown_timeout": shutdown_timeout_s,
        # aiohttp arms this timer when a connection opens, so a client that never completes its
        # headers (slowloris) is dropped after it too, not only an idle keep-alive connection.
        "keepalive_timeout": keepalive_timeout_s,
        "logger": HTTP_LOG,
        "auto_decompress": False,
    }
    return _Runner(app, **options)
