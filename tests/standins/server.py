"""Plumbing shared by the stand-in upstreams: the request log, error injection, writers, and a runner.

Owns: `StandIn` (an aiohttp app served on 127.0.0.1, port 0, from a thread of its own), the
`Control` every stand-in app carries (request log, injected faults, chunk delay), the middleware
that logs each request, applies faults and answers a handler's `BackendError`, `with_state` (handlers
that take the app's state), and `send_json` / `send_sse`, which honour the faults that act on the body
(broken SSE, reset, truncation, gzip). Does not own: any backend's routes or bodies (areal.py,
openai_like.py, anthropic_like.py).

Why a thread: tests drive the stand-ins with blocking clients (the sync SDKs, agent CLIs run with
`subprocess.run`) as often as with async ones. A stand-in with its own event loop answers whatever
the test's thread is doing. An app can still be served on the test's loop instead:
`await aiohttp_server(areal.build_app(areal.ArealState()))`.

    with start_areal() as upstream:
        session = upstream.open_session("task")
        upstream.inject("500", times=2, retry_after_ms=100)
        ...
        assert [r.path for r in upstream.requests] == ["/chat/completions"] * 3
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self, TypeVar, get_args

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from tests.standins.wire import dumps

FaultKind = Literal[
    "404", "400ctx", "401", "429", "500", "badsse", "stall", "linger", "reset", "truncate", "gzip"
]
# Faults that replace the answer with an error status and the backend's error body.
ERROR_FAULTS: frozenset[FaultKind] = frozenset({"404", "400ctx", "401", "429", "500"})

# Agents paste whole files and long histories; aiohttp's 1 MiB default would answer them 413, which no
# real backend does at that size.
MAX_BODY_BYTES = 64 * 1024 * 1024
# A stalled handler is cancelled when its stand-in stops; the stop should not wait for it.
SHUTDOWN_TIMEOUT_S = 0.5
START_TIMEOUT_S = 10.0
# Long enough to trip any client or proxy read timeout a test sets, short enough not to hang CI.
DEFAULT_STALL_S = 60.0
# The SSE response headers every backend sends; AReaL adds its own two (areal.py).
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class LoggedRequest:
    """One request as a stand-in received it (every request, faulted or not, model call or not)."""

    method: str
    path_qs: str
    path: str
    query: Mapping[str, str]
    headers: CIMultiDictProxy[str]
    raw: bytes
    body: Any
    received_at: float


@dataclass
class Fault:
    """An injected fault: applies to the next `times` model calls (None: until cleared)."""

    kind: FaultKind
    times: int | None = 1
    retry_after_ms: int | None = None
    stall_s: float = DEFAULT_STALL_S

    def applies_to(self, streamed: bool) -> bool:
        """Broken SSE needs a stream; the others apply to any model call."""
        return streamed or self.kind != "badsse"


@dataclass(frozen=True)
class Dialect:
    """What the shared plumbing needs to know about one backend.

    `model_paths`: paths that are model calls, where faults apply. `route_error(status)`: the body of
    the router's own 404 / 405. `fault_error(kind, body)`: status and body for an error fault.
    `broken_sse`: the bytes a `badsse` fault sends instead of the stream.
    """

    name: str
    model_paths: frozenset[str]
    route_error: Callable[[int], Any]
    fault_error: Callable[[FaultKind, Any], tuple[int, Any]]
    broken_sse: bytes


@dataclass
class Control:
    """A stand-in's test-facing state, safe to use from the test's thread while the app serves."""

    dialect: Dialect
    chunk_delay_s: float = 0.0
    _requests: list[LoggedRequest] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def model_requests(self) -> list[LoggedRequest]:
        """The requests to the backend's model paths (chat, responses, messages, ...)."""
        return [r for r in self.requests if r.path in self.dialect.model_paths]

    def inject(
        self,
        kind: FaultKind,
        *,
        times: int | None = 1,
        retry_after_ms: int | None = None,
        stall_s: float = DEFAULT_STALL_S,
    ) -> None:
        """Queue a fault for the next `times` model calls (None: every call until `clear_faults`).

        Error faults answer with the backend's own error body; `retry_after_ms` adds the
        `retry-after-ms` / `retry-after` headers that opencode honours (docs/agents.md §3.6).
        `stall` waits `stall_s` before sending headers; `linger` waits `stall_s` after a stream's last
        event before ending it; `reset` sends half the body then a TCP RST;
        `truncate` sends half the body then closes; `badsse` sends a broken stream; `gzip` compresses.
        """
        if kind not in get_args(FaultKind):
            raise ValueError(f"unknown fault {kind!r}; one of {', '.join(get_args(FaultKind))}")
        with self._lock:
            self._faults.append(Fault(kind, times, retry_after_ms, stall_s))

    def clear_faults(self) -> None:
        """Drop every queued fault."""
        with self._lock:
            self._faults.clear()

    def clear(self) -> None:
        """Forget the logged requests and the queued faults."""
        with self._lock:
            self._requests.clear()
            self._faults.clear()

    def _log(self, request: LoggedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _take_fault(self, streamed: bool) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.applies_to(streamed):
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self._faults.remove(fault)
                    return fault
        return None


CONTROL = web.AppKey("standin_control", Control)
_FAULT = web.RequestKey("standin_fault", Fault)
_BODY = web.RequestKey("standin_body", object)
_RAW = web.RequestKey("standin_raw", bytes)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
State = TypeVar("State")
StateHandler = Callable[[web.Request, State], Awaitable[web.StreamResponse]]


class BackendError(Exception):
    """An error a backend answers with `status` and its own JSON `body`; raise it from any handler."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


def with_state(
    key: web.AppKey[State], check: Callable[[web.Request, State], None] | None = None
) -> Callable[[StateHandler[State]], Handler]:
    """Adapts handlers that take the app's `key` state (a config, AReaL's sessions) as their second
    argument; `check` runs first on every request (a backend's key check)."""

    def route(handler: StateHandler[State]) -> Handler:
        async def run(request: web.Request) -> web.StreamResponse:
            state = request.app[key]
            if check is not None:
                check(request, state)
            return await handler(request, state)

        return run

    return route


def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON response in compact encoding, as the real servers write it."""
    return web.Response(body=dumps(body), status=status, headers=headers, content_type="application/json")


def request_body(request: web.Request) -> Any:
    """The request's JSON body as the middleware parsed it (None when empty or not JSON)."""
    return request.get(_BODY)


def request_raw(request: web.Request) -> bytes:
    """The request's raw body, as the middleware read it."""
    return request.get(_RAW, b"")


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


@web.middleware
async def _tap(request: web.Request, handler: Handler) -> web.StreamResponse:
    control = request.app[CONTROL]
    dialect = control.dialect
    raw = await request.read()
    body = _parse(raw)
    request[_BODY] = body
    request[_RAW] = raw
    control._log(
        LoggedRequest(
            method=request.method,
            path_qs=request.path_qs,
            path=request.path,
            query=dict(request.query),
            headers=CIMultiDictProxy(CIMultiDict(request.headers)),
            raw=raw,
            body=body,
            received_at=time.time(),
        )
    )
    try:
        if request.path in dialect.model_paths and request.method == "POST":
            streamed = isinstance(body, dict) and body.get("stream") is True
            fault = control._take_fault(streamed)
            if fault is not None:
                if fault.kind in ERROR_FAULTS:
                    status, error_body = dialect.fault_error(fault.kind, body)
                    return json_response(error_body, status, _retry_headers(fault))
                if fault.kind == "stall":
                    await asyncio.sleep(fault.stall_s)
                else:
                    request[_FAULT] = fault
        return await handler(request)
    except BackendError as error:
        return json_response(error.body, error.status)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as route_error:
        return json_response(dialect.route_error(route_error.status), route_error.status)


def _retry_headers(fault: Fault) -> dict[str, str]:
    if fault.retry_after_ms is None:
        return {}
    return {"retry-after-ms": str(fault.retry_after_ms), "retry-after": str(fault.retry_after_ms // 1000)}


def build_app(dialect: Dialect, routes: Iterable[web.AbstractRouteDef]) -> web.Application:
    """An aiohttp app for one backend: its routes, the logging/fault middleware, and a `Control`."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_tap])
    app[CONTROL] = Control(dialect)
    app.add_routes(list(routes))
    return app


def _cut(request: web.Request, fault: Fault) -> None:
    """End the connection mid-body: RST for `reset` (SO_LINGER 0, then abort), FIN for `truncate`."""
    transport = request.transport
    if transport is None:
        return
    if fault.kind == "reset":
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()


async def send_json(request: web.Request, body: Any, status: int = 200) -> web.StreamResponse:
    """Answer with JSON, honouring the body faults (reset, truncate, gzip) injected for this request."""
    fault = request.get(_FAULT)
    if fault is None or fault.kind == "badsse":
        return json_response(body, status)
    data = dumps(body)
    response = web.StreamResponse(status=status)
    response.content_type = "application/json"
    if fault.kind == "gzip":
        response.enable_compression(force=web.ContentCoding.gzip)
        await response.prepare(request)
        await response.write(data)
        await response.write_eof()
        return response
    response.content_length = len(data)
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    _cut(request, fault)
    return response


async def send_sse(
    request: web.Request, events: Iterable[bytes], headers: Mapping[str, str]
) -> web.StreamResponse:
    """Stream `events` one write each (after the Control's chunk delay), honouring the body faults."""
    fault = request.get(_FAULT)
    control = request.app[CONTROL]
    response = web.StreamResponse(headers=headers)
    if fault is not None and fault.kind == "gzip":
        response.enable_compression(force=web.ContentCoding.gzip)
    await response.prepare(request)
    if fault is not None and fault.kind == "badsse":
        await response.write(control.dialect.broken_sse)
        await response.write_eof()
        return response
    chunks = list(events)
    cut_at = len(chunks) // 2 if fault is not None and fault.kind in ("reset", "truncate") else None
    for index, chunk in enumerate(chunks):
        if index == cut_at and fault is not None:
            _cut(request, fault)
            return response
        if control.chunk_delay_s:
            await asyncio.sleep(control.chunk_delay_s)
        await response.write(chunk)
    if fault is not None and fault.kind == "linger":
        await asyncio.sleep(fault.stall_s)
    await response.write_eof()
    return response


class StandIn:
    """A stand-in upstream served on 127.0.0.1 (port 0) by a thread with its own event loop.

    Use it as a context manager, or call `start()` / `stop()`. The request log and fault injection
    are the app's `Control`, exposed here directly.
    """

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.control = app[CONTROL]
        self.inject = self.control.inject
        self.clear = self.control.clear
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The base URL: `http://127.0.0.1:PORT`, no trailing slash."""
        if not self.port:
            raise RuntimeError(f"{self.control.dialect.name} stand-in is not running")
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[LoggedRequest]:
        """Every request received so far, oldest first."""
        return self.control.requests

    @property
    def model_requests(self) -> list[LoggedRequest]:
        """The model calls received so far, oldest first."""
        return self.control.model_requests

    def start(self, port: int = 0) -> Self:
        """Serve the app on `port` (0: a free one); returns once the port is bound. A second start
        raises."""
        if self._thread is not None:
            raise RuntimeError("stand-in already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"standin-{self.control.dialect.name}", daemon=True
        )
        self._thread.start()
        try:
            serving = asyncio.run_coroutine_threadsafe(self._serve(port), self._loop)
            self.port = serving.result(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self

    async def _serve(self, port: int) -> int:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def _shutdown(self) -> None:
        """Close the listener, then cancel what is still running on this loop: aiohttp lets a handler run
        on after its client has gone (a stalled one would outlive the stand-in), and every task on the
        stand-in's own loop is the stand-in's."""
        if self._runner is not None:
            await self._runner.cleanup()
        leftovers = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)

    def stop(self) -> None:
        """Stop serving and end the thread. A second stop does nothing."""
        if self._loop is None or self._thread is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(START_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_TIMEOUT_S)
        self._loop.close()
        self._loop = self._thread = self._runner = None
        self.port = 0

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
