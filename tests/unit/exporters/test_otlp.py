"""modeltap/exporters/otlp.py without a backend: the span object a call becomes, the resource, and how
losses are counted and reported. The pipeline against live, failing and hanging backends is
tests/integration/test_otlp_export.py."""

from __future__ import annotations

import http.server
import logging
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from modeltap.exporters import otlp
from modeltap.exporters.genai import Call
from modeltap.records.exchange import BudgetRecord
from modeltap.testing import exchange
from tests.factories import ASK

STARTED = 1764457200.0


def span(**fields: Any) -> Any:
    settings = {"started": STARTED, "ended": STARTED + 0.5, "session_id": "s-1"}
    ex = exchange({"model": "policy", "messages": [ASK]}, None, **(settings | fields))
    return otlp.span_of(Call.of_exchange(ex, content=False), otlp._resource(), content=False)


def test_a_span_is_a_client_span_at_the_exchanges_times_with_ids_drawn_from_its_id() -> None:
    first = span(id="a" * 32, budget=BudgetRecord("passed 12+1<=100", "pass", prompt_tokens=12))
    assert (first.name, first.kind, first.start_time, first.end_time) == (
        "chat policy",
        SpanKind.CLIENT,
        1764457200_000000000,
        1764457200_500000000,
    )
    assert first.status.status_code is StatusCode.UNSET and first.parent is None
    (event,) = first.events
    assert (event.name, event.timestamp, dict(event.attributes or {})) == (
        "modeltap.budget",
        first.start_time,
        {
            "modeltap.budget.summary": "passed 12+1<=100",
            "modeltap.budget.action": "pass",
            "modeltap.budget.prompt_tokens": 12,
        },
    )
    again, other = span(id="a" * 32), span(id="b" * 32)
    assert (again.context.trace_id, again.context.span_id) == (first.context.trace_id, first.context.span_id)
    assert other.context.trace_id != first.context.trace_id and other.context.span_id != first.context.span_id


def test_a_failed_exchange_has_an_error_status_naming_its_class() -> None:
    failed = span(status=502, error_class="upstream_error", error_message="connection refused")
    assert (failed.status.status_code, failed.status.description) == (StatusCode.ERROR, "upstream_error")


def test_the_resource_names_modeltap_and_the_host_unless_the_otel_variables_say_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    plain = otlp._resource().attributes
    assert plain["service.name"] == "modeltap" and plain["service.version"] and plain["host.name"]
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rollouts")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=node-7,run=r42")
    named = otlp._resource().attributes
    assert (named["service.name"], named["host.name"], named["run"]) == ("rollouts", "node-7", "r42")


def test_losses_are_logged_at_most_once_per_interval_and_at_the_end(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    monkeypatch.setattr(otlp.time, "monotonic", lambda: now[0])
    tally = otlp.Tally()
    with caplog.at_level(logging.WARNING, logger=otlp.__name__):
        tally.exported, tally.dropped = 10, 3
        tally.report()
        tally.failed = 5
        now[0] += otlp.REPORT_INTERVAL_S / 2
        tally.report()  # too soon: held
        now[0] += otlp.REPORT_INTERVAL_S / 2
        tally.report()
        tally.report(final=True)  # nothing new: nothing to say
    assert [r.getMessage() for r in caplog.records] == [
        "otlp: 3 spans lost (3 dropped with the export queue full, 0 not taken by the backend, "
        "0 unsent at stop), 10 exported, in the last 60 s",
        "otlp: 5 spans lost (0 dropped with the export queue full, 5 not taken by the backend, "
        "0 unsent at stop), 0 exported, in the last 60 s",
    ]


@pytest.mark.parametrize(
    ("order", "counts"),
    [
        # (exported, failed, abandoned) for 10 spans queued, whichever comes first: the worker
        # finishing the batch, or the stop giving up on it.
        (("fail", "give up"), (0, 10, 0)),
        (("give up", "fail"), (0, 0, 10)),
        (("give up", "send"), (10, 0, 0)),
        (("send", "give up"), (10, 0, 0)),
    ],
)
def test_a_span_is_counted_once_whether_the_worker_or_the_stop_settles_it_first(
    order: tuple[str, str], counts: tuple[int, int, int]
) -> None:
    tally = otlp.Tally(queued=10)
    for step in order:
        if step == "give up":
            tally.give_up()
        else:
            tally.settle(10, sent=step == "send")
    assert (tally.exported, tally.failed, tally.abandoned) == counts and tally.waiting == 0


def test_an_exchange_before_start_or_after_close_is_counted_dropped() -> None:
    export = otlp.OtlpExport("http://127.0.0.1:9/v1/traces")
    export.on_exchange(exchange({"model": "m", "messages": [ASK]}, None))
    assert (export.tally.dropped, export.tally.queued) == (1, 0)


def test_the_exporters_own_warnings_pass_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(otlp.time, "monotonic", lambda: now[0])
    quieter = otlp._Quieter()
    record = logging.LogRecord(otlp._EXPORTER_LOGGER, logging.WARNING, __file__, 1, "retrying", None, None)
    passed = [quieter.filter(record)]
    now[0] += otlp.REPORT_INTERVAL_S - 1
    passed.append(quieter.filter(record))
    now[0] += 1
    passed.append(quieter.filter(record))
    assert passed == [True, False, True]


class _Flood(http.server.BaseHTTPRequestHandler):
    """A wrong --otlp-endpoint (a file server, a collector gone wrong): every POST answered 200 with a
    body of FLOOD_BYTES, written until the client hangs up; `sent` counts what went out."""

    sent = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(FLOOD_BYTES))
        self.end_headers()
        piece = b"\0" * (1024 * 1024)
        try:
            for _ in range(FLOOD_BYTES // len(piece)):
                self.wfile.write(piece)
                type(self).sent += len(piece)
        except OSError:
            pass  # the client hung up: what it left unread is never sent

    def log_message(self, *args: Any) -> None:
        pass


FLOOD_BYTES = 128 * 1024 * 1024


def test_a_backend_answering_a_huge_body_costs_at_most_a_small_bounded_read() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flood)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        answer = otlp.BoundedSession().post(url, data=b"spans", timeout=10)
        assert answer.status_code == 200 and 0 < len(answer.content) <= otlp.ANSWER_MAX_BYTES
        assert otlp.exporter_for(url).export([span()]) is SpanExportResult.SUCCESS
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    # What was left unread stayed unsent, but for what the sockets' buffers took.
    assert _Flood.sent < FLOOD_BYTES // 4


# Values as JSON and headers carry them: any integer (2**64 and past), 400-digit numbers, text with
# lone surrogates (a JavaScript agent cutting an emoji in half, a header byte that is not UTF-8).
_any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=6)
_numbers = st.integers() | st.floats(allow_nan=False) | st.integers(300, 400).map(lambda n: int("9" * n))
_values = st.none() | _numbers | _any_text


@settings(max_examples=150, deadline=None)
@given(
    model=_values,
    max_tokens=_values,
    temperature=_values,
    usage=st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens"]), _values),
    arguments=_any_text | st.just("[" * 1200),
    text=_any_text,
    label=_any_text,
    content=st.booleans(),
)
def test_no_value_of_an_exchange_costs_its_span(
    model: Any,
    max_tokens: Any,
    temperature: Any,
    usage: dict[str, Any],
    arguments: str,
    text: str,
    label: str,
    content: bool,
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": arguments}}
    reply = {
        "model": model,
        "choices": [{"message": {"content": text, "tool_calls": [call]}, "finish_reason": text}],
        "usage": usage,
    }
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "messages": [ASK]}
    fields = {
        "user_agent": text,
        "labels": {"task": label},
        "error_class": "upstream_error",
        "error_message": text,
    }
    ex = exchange(body, reply, session_id=label or None, **fields)
    made = otlp.span_of(Call.of_exchange(ex, content=content), otlp._resource(), content=content)
    sent = ExportTraceServiceRequest.FromString(encode_spans([made]).SerializePartialToString())
    [received] = sent.resource_spans[0].scope_spans[0].spans
    keys = {kv.key for kv in received.attributes}
    assert "modeltap.exchange.id" in keys and "modeltap.label.task" in keys
    assert ("gen_ai.usage.input_tokens" in keys) == (
        isinstance(usage.get("prompt_tokens"), int) and -(2**63) <= usage["prompt_tokens"] < 2**63
    )
