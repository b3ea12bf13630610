"""A plain OTLP/HTTP traces receiver, built from opentelemetry-proto, for tests that read the exact spans
modeltap exports (resource included, which Phoenix drops).

Owns: decoding an `ExportTraceServiceRequest` into one flat dict per span (attribute keys dotted, as
sent), and a loopback receiver on the test's event loop that can also play a failing backend: one that
answers an error status, or one that never answers. Does not own: what a test expects of the spans.

    async with Receiver() as backend:
        ... serve with otlp_endpoint=backend.url ...
    backend.spans[0]["attributes"]["gen_ai.operation.name"]
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

PROTOBUF = "application/x-protobuf"


def value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    return getattr(v, kind)  # string_value, bool_value, int_value, double_value, bytes_value


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


def span_dicts(body: bytes) -> list[dict[str, Any]]:
    """An ExportTraceServiceRequest's spans, one flat dict each."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return [
        _span(span, attributes(group.resource.attributes), scope.scope)
        for group in request.resource_spans
        for scope in group.scope_spans
        for span in scope.spans
    ]


def _span(s: Any, resource: dict[str, Any], scope: Any) -> dict[str, Any]:
    return {
        "name": s.name,
        "trace_id": s.trace_id.hex(),
        "span_id": s.span_id.hex(),
        "parent_span_id": s.parent_span_id.hex() or None,
        "kind": Span.SpanKind.Name(s.kind),
        "start_time_unix_nano": s.start_time_unix_nano,
        "end_time_unix_nano": s.end_time_unix_nano,
        "attributes": attributes(s.attributes),
        "events": [
            {"name": e.name, "time_unix_nano": e.time_unix_nano, "attributes": attributes(e.attributes)}
            for e in s.events
        ],
        "status": {"code": Status.StatusCode.Name(s.status.code), "message": s.status.message},
        "resource": resource,
        "scope": {"name": scope.name, "version": scope.version},
    }


class Receiver:
    """A receiver on 127.0.0.1, on the running loop. `status` other than 200 answers every export with
    it (a failing backend); `hold` never answers (a backend that hangs)."""

    def __init__(self, status: int = 200, hold: bool = False) -> None:
        self.status, self.hold = status, hold
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.headers: list[dict[str, str]] = []
        self._released = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        # A held request must not hold up the receiver's own stop.
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)

    @property
    def url(self) -> str:
        """The base URL to give `--otlp-endpoint` (modeltap appends /v1/traces)."""
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aenter__(self) -> Receiver:
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._released.set()
        await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests += 1
        self.headers.append(dict(request.headers))
        if self.hold:
            await self._released.wait()
        if self.status != 200:
            return web.Response(status=self.status, text="unavailable")
        # aiohttp has already undone a gzip Content-Encoding.
        self.spans.extend(span_dicts(await request.read()))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)
