"""OpenTelemetry export: one span per exchange, in the GenAI semantic conventions, to any OTLP/HTTP backend.

Owns: the `serve --otlp-endpoint` observer (`OtlpExport`), the span objects, resource and ids, and the
backfill of recorded exchanges (`export --format otlp`), all on OpenTelemetry's SDK (its batch span
processor and OTLP/HTTP protobuf exporter: the optional extra `modeltap[otlp]`). Does not own: what a
span says (genai.py, which holds every name the conventions fix), where spans go
(config.otlp_traces_endpoint), or the records (records/store.py): export never touches SQLite.

Nothing waits on the backend. On the event loop, `on_exchange` takes a light snapshot of the exchange
(`genai.Call`: the request's knobs, not its body, unless content is exported) and appends it to the
batch processor's queue, or counts it dropped when `capacity` spans already wait. The processor's worker
thread does the rest: parses the response, builds the span, serialises it, sends it, retries. A backend
that is down or slow costs the queue, never a request; losses are counted (`tally`) and logged at most
once a minute; `close` gives the last spans SHUTDOWN_TIMEOUT_S and leaves the rest.

    export = OtlpExport("http://collector:4318/v1/traces")
    async with Proxy(config, observers=[export]): ...   # `serve --otlp-endpoint` wires it itself
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from modeltap import __version__, dialects
from modeltap.exporters import genai
from modeltap.exporters.genai import Call
from modeltap.records.exchange import Exchange

INSTALL_HINT = "OpenTelemetry export needs its optional packages: pip install 'modeltap[otlp]'"
try:
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
except ImportError as exc:  # the optional extra is missing: say what to install (server.py, cli.py)
    raise ImportError(INSTALL_HINT, name=exc.name) from exc

log = logging.getLogger(__name__)

# Spans waiting for the backend, at most: the OTel SDK's own default queue. A waiting span holds its
# response (a few KB) but not its request, so a backend that is down costs a few MB, then drops.
QUEUE_SPANS = 2048
# With content a waiting span holds its request too (an agent's whole history, up to MBs), so fewer wait.
CONTENT_QUEUE_SPANS = 256
# Spans per export request with content: the exporter drops a request over 64 MiB whole, and a span may
# carry four content attributes of up to genai.CONTENT_ATTRIBUTE_MAX_CHARS each.
CONTENT_BATCH_SPANS = 32
# Spans a backfill sends per request: the SDK's default batch.
BACKFILL_BATCH_SPANS = 512
# How long a stopping `serve` gives the last spans: the SDK's flush blocks while the backend is down
# (its exporter retries for up to 10 s per batch), and a stop must not.
SHUTDOWN_TIMEOUT_S = 5.0
# Losses are logged at most this often, and so are the exporter's own warnings (one per failed retry).
REPORT_INTERVAL_S = 60.0
# The most of a backend's answer that is read. OTLP/HTTP answers an export with an
# ExportTraceServiceResponse of a few bytes (a partial success: a count and a message); a wrong
# --otlp-endpoint (a file server) may answer 200 with anything, and 600 MB read whole took serve from
# 52 MB to 1.27 GB.
ANSWER_MAX_BYTES = 64 * 1024
# The exporter's logger (opentelemetry-exporter-otlp-proto-http 1.45.2): the filter `_Quieter` sits on it.
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
_SCOPE = InstrumentationScope("modeltap", __version__)
# The batch processor reads only a waiting span's context, to see it is sampled; its ids come at mapping.
_WAITING_CONTEXT = SpanContext(1, 1, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def span_of(call: Call, resource: Resource, *, content: bool) -> ReadableSpan:
    """The exchange's span: kind CLIENT, at the exchange's times, with its attributes (genai.py) and the
    budget decision as an event."""
    trace_id, span_id = _ids(call.id)
    event = genai.budget_event(call)
    error = genai.error_description(call, content=content)
    return ReadableSpan(
        name=genai.span_name(dialects.of_record(call.endpoint), call),
        context=SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)),
        resource=resource,
        attributes=genai.attributes(call, content=content),
        events=[Event(genai.BUDGET_EVENT, event, _ns(call.started))] if event is not None else [],
        kind=SpanKind.CLIENT,
        status=Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET),
        start_time=_ns(call.started),
        end_time=_ns(call.ended if call.ended is not None else call.started),
        instrumentation_scope=_SCOPE,
    )


class BoundedSession(requests.Session):
    """The OTLP exporter's HTTP session: it reads at most ANSWER_MAX_BYTES of an answer and closes the
    connection on the rest. The exporter reads only the status, the reason and, logging a failure,
    the answer's text, so nothing it needs is lost."""

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        kwargs["stream"] = True  # not read whole by requests: read here, up to the bound
        response = super().send(request, **kwargs)
        try:
            response._content = response.raw.read(ANSWER_MAX_BYTES, decode_content=True)
        finally:
            response.close()  # what is left unread is never read: the connection goes, not the pool
        return response


def exporter_for(endpoint: str) -> OTLPSpanExporter:
    """The OTLP/HTTP span exporter modeltap sends with, to `endpoint`, reading bounded answers."""
    return OTLPSpanExporter(endpoint=endpoint, session=BoundedSession())


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _ids(exchange_id: str) -> tuple[int, int]:
    """Trace and span ids drawn from the exchange id: a backfill of an exchange already exported live
    sends the same span again, not a second one."""
    digest = hashlib.blake2b(exchange_id.encode(), digest_size=24).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1


def _resource() -> Resource:
    """service.name `modeltap`, its version and this host, under OTEL_SERVICE_NAME and
    OTEL_RESOURCE_ATTRIBUTES, which win."""
    ours = {SERVICE_NAME: "modeltap", "service.version": __version__, "host.name": socket.gethostname()}
    return Resource.create({**ours, **OTELResourceDetector().detect().attributes})


# -- the pipeline -------------------------------------------------------------------------------------------


class _Waiting(ReadableSpan):
    """A Call in the batch processor's queue. The processor looks only at its context; the worker
    thread turns it into the real span (`_Mapper`)."""

    def __init__(self, call: Call) -> None:
        super().__init__(name="", context=_WAITING_CONTEXT, resource=Resource.get_empty())
        self.call = call


@dataclass
class Tally:
    """Spans counted: `queued` and `dropped` (the queue was full) on the event loop; `done`,
    `exported` and `failed` (the backend did not take them) on the worker; `abandoned` (still unsent
    when the stop gave up) by the stop. A span is settled once, under `settling`: a batch the worker
    finishes after the stop gave up on it is already counted abandoned (or, sent after all, moves to
    exported), never failed as well."""

    queued: int = 0
    dropped: int = 0
    abandoned: int = 0
    done: int = 0
    exported: int = 0
    failed: int = 0
    given_up: bool = False
    settling: threading.Lock = field(default_factory=threading.Lock)
    _reported: tuple[int, ...] = (0, 0, 0, 0)
    _next_report: float = 0.0

    def settle(self, count: int, sent: bool) -> None:
        """On the worker: a batch of `count` spans was sent (or not)."""
        with self.settling:
            self.done += count
            if self.given_up:
                if sent:
                    self.exported += count
                    self.abandoned -= count
            elif sent:
                self.exported += count
            else:
                self.failed += count

    def give_up(self) -> int:
        """On the stop: count what is still waiting as abandoned; returns how many."""
        with self.settling:
            self.given_up = True
            self.abandoned = self.waiting
            return self.abandoned

    @property
    def waiting(self) -> int:
        return self.queued - self.done

    def report(self, *, final: bool = False) -> None:
        """Log the spans lost since the last report, at most once per REPORT_INTERVAL_S (and at the end)."""
        now = time.monotonic()
        if not final and now < self._next_report:
            return
        counts = (self.exported, self.dropped, self.failed, self.abandoned)
        exported, dropped, failed, abandoned = (a - b for a, b in zip(counts, self._reported, strict=True))
        if dropped or failed or abandoned:
            log.warning(
                "otlp: %d spans lost (%d dropped with the export queue full, %d not taken by the backend, "
                "%d unsent at stop), %d exported, in the last %s",
                dropped + failed + abandoned,
                dropped,
                failed,
                abandoned,
                exported,
                "run" if final else f"{REPORT_INTERVAL_S:g} s",
            )
        self._reported = counts
        self._next_report = now + REPORT_INTERVAL_S


class _Mapper(SpanExporter):
    """The batch processor's exporter, on its worker thread: maps each waiting Call to its span, then
    sends the batch with the OTLP exporter, and counts."""

    def __init__(self, exporter: SpanExporter, content: bool, tally: Tally) -> None:
        self._exporter, self._content, self._tally = exporter, content, tally
        self._resource = _resource()
        self._stopped = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            mapped = [
                span_of(s.call, self._resource, content=self._content) if isinstance(s, _Waiting) else s
                for s in spans
            ]
            result = self._exporter.export(mapped)
        # boundary: a bug in the mapping must not stop the worker thread; the batch is counted lost
        except Exception:
            log.exception("otlp: could not map or send %d spans", len(spans))
            result = SpanExportResult.FAILURE
        self._tally.settle(len(spans), result is SpanExportResult.SUCCESS)
        self._tally.report()
        return result

    def shutdown(self) -> None:
        """Stop the OTLP exporter (once, from whichever thread asks first): its retries end at once."""
        if self._stopped.acquire(blocking=False):
            self._exporter.shutdown()


class _Quieter(logging.Filter):
    """Lets the exporter's own log records (a warning per failed retry) through once per interval."""

    def __init__(self) -> None:
        super().__init__()
        self._next = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + REPORT_INTERVAL_S
        return True


class OtlpExport:
    """The observer that exports every exchange as a span to `endpoint` (an OTLP/HTTP traces URL). It
    runs between `start()` and `await close()`; `lifecycle` does both for an aiohttp app."""

    def __init__(self, endpoint: str, *, content: bool = False) -> None:
        self.endpoint, self.content = endpoint, content
        self.capacity = CONTENT_QUEUE_SPANS if content else QUEUE_SPANS
        self.tally = Tally()
        self._processor: SpanProcessor | None = None
        self._mapper: _Mapper | None = None
        self._quieter = _Quieter()

    def start(self) -> None:
        """Start the batch processor's worker thread."""
        self._mapper = _Mapper(exporter_for(self.endpoint), self.content, self.tally)
        batch = CONTENT_BATCH_SPANS if self.content else None
        self._processor = BatchSpanProcessor(
            self._mapper, max_queue_size=self.capacity, max_export_batch_size=batch
        )
        logging.getLogger(_EXPORTER_LOGGER).addFilter(self._quieter)

    async def lifecycle(self, app: web.Application) -> AsyncIterator[None]:
        """For `app.cleanup_ctx`: export while the app runs."""
        self.start()
        try:
            yield
        finally:
            await self.close()

    def on_exchange(self, exchange: Exchange) -> None:
        """Queue the exchange's span, or count it dropped when the queue is full or export stopped."""
        processor = self._processor
        if processor is None or self.tally.waiting >= self.capacity:
            self.tally.dropped += 1
            return
        waiting = _Waiting(Call.of_exchange(exchange, content=self.content))
        self.tally.queued += 1
        processor.on_end(waiting)

    async def close(self) -> None:
        """Stop taking spans and send those waiting, for at most SHUTDOWN_TIMEOUT_S: the processor's
        shutdown blocks while the backend is down, so it runs on a daemon thread, left behind if late."""
        processor, mapper = self._processor, self._mapper
        self._processor = self._mapper = None
        if processor is None or mapper is None:
            return
        stopped: Future[None] = Future()
        thread = threading.Thread(
            target=_shut_down, args=(processor, stopped), name="modeltap-otlp-stop", daemon=True
        )
        thread.start()
        try:
            await asyncio.wait_for(asyncio.wrap_future(stopped), SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            abandoned = self.tally.give_up()
            mapper.shutdown()  # the worker gives up its retries instead of outliving the stop
            log.warning(
                "otlp: %s did not take the last %d spans in %g s",
                self.endpoint,
                abandoned,
                SHUTDOWN_TIMEOUT_S,
            )
        self.tally.report(final=True)
        logging.getLogger(_EXPORTER_LOGGER).removeFilter(self._quieter)


def _shut_down(processor: SpanProcessor, stopped: Future[None]) -> None:
    stopped.set_running_or_notify_cancel()  # a waiter that gave up can no longer cancel it
    processor.shutdown()
    stopped.set_result(None)


def backfill(rows: Iterable[Mapping[str, Any]], endpoint: str, *, content: bool = False) -> int:
    """Send recorded exchanges (StoreReader rows with bodies) as spans with their original times, to
    `endpoint`; returns how many. Raises RuntimeError when the backend does not take a batch."""
    exporter: SpanExporter = exporter_for(endpoint)
    resource = _resource()
    sent: list[ReadableSpan] = []
    batch: list[ReadableSpan] = []

    def send() -> None:
        if exporter.export(batch) is not SpanExportResult.SUCCESS:
            first = len(sent) + 1
            raise RuntimeError(
                f"{endpoint} did not take spans {first}-{first + len(batch) - 1} (see the log)"
            )
        sent.extend(batch)
        batch.clear()

    try:
        for row in rows:
            batch.append(span_of(Call.of_record(row, content=content), resource, content=content))
            if len(batch) == BACKFILL_BATCH_SPANS:
                send()
        if batch:
            send()
    finally:
        exporter.shutdown()
    return len(sent)
