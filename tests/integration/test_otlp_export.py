"""OpenTelemetry export against a plain OTLP/HTTP receiver (tests/otlp_receiver.py): the real openai and
anthropic SDKs through modeltap give spans with exactly the attributes docs/otel.md lists, no secret in
any of them; a backend that is down, failing or hanging costs no request, no record and no more than a
bounded stop; a backfill sends what live export sent; OpenTelemetry's variables are honoured; and
without the optional packages the flag says what to install."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from modeltap.cli import main
from modeltap.exporters import otlp
from modeltap.proxy.server import Proxy
from modeltap.testing import exchange
from tests.factories import ASK, BASH_TOOL, recorded
from tests.integration.conftest import records
from tests.integration.test_proxy_sdks import BASH_ANTHROPIC
from tests.otlp_receiver import Receiver
from tests.standins.areal import ArealStandIn

OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)
# Far above otlp.SHUTDOWN_TIMEOUT_S: a stop that waited on the backend would blow it.
STOP_BOUND_S = 60.0


@pytest.fixture(autouse=True)
def no_ambient_otel(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def sdk_turns(base_url: str, key: str, headers: dict[str, str] | None = None) -> None:
    """A chat completion and a stream with the openai SDK, then a message and a stream with anthropic's."""
    async with openai.AsyncOpenAI(
        base_url=base_url + "/v1", api_key=key, max_retries=0, default_headers=headers
    ) as client:
        await client.chat.completions.create(
            model="policy", messages=[ASK], tools=[BASH_TOOL], temperature=0.2
        )
        stream = await client.chat.completions.create(model="policy", messages=[ASK], stream=True)
        [chunk async for chunk in stream]
    async with anthropic.AsyncAnthropic(
        base_url=base_url, api_key=key, max_retries=0, default_headers=headers
    ) as client:
        kwargs: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 256,
            "messages": [ASK],
            "tools": [BASH_ANTHROPIC],
        }
        await client.messages.create(**kwargs)
        async with client.messages.stream(**kwargs) as events:
            await events.get_final_message()


def by_exchange(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {span["attributes"]["modeltap.exchange.id"]: span for span in spans}


async def test_sdk_traffic_arrives_as_spans_with_exact_attributes(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with Receiver() as backend:
        async with make_proxy(upstream=areal.url, otlp_endpoint=backend.url) as proxy:
            upstream = areal.open_session("t1")
            session = proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "t1"})
            await sdk_turns(session.host_base_url, "unused")
    rows = records(store_path, session.id)
    spans = by_exchange(backend.spans)
    assert len(rows) == len(spans) == 4
    port = int(areal.url.rsplit(":", 1)[1])
    for row, (provider, model, finish, usage) in zip(
        rows,
        [
            ("openai", "policy", "tool_calls", (65, 8)),
            ("openai", "policy", "stop", (20, 6)),
            ("anthropic", "claude-x", "tool_use", (58, 8)),
            ("anthropic", "claude-x", "tool_use", (58, 8)),
        ],
        strict=True,
    ):
        span = spans[row["id"]]
        streamed = row["streamed"]
        assert (span["name"], span["kind"], span["parent_span_id"]) == (
            f"chat {model}",
            "SPAN_KIND_CLIENT",
            None,
        )
        assert (span["start_time_unix_nano"], span["end_time_unix_nano"]) == (
            int(row["started"] * 1e9),
            int(row["ended"] * 1e9),
        )
        assert span["status"] == {"code": "STATUS_CODE_UNSET", "message": ""} and span["events"] == []
        assert span["scope"] == {"name": "modeltap", "version": "0.1.0"}
        assert (
            span["resource"]["service.name"] == "modeltap"
            and span["resource"]["host.name"] == socket.gethostname()
        )
        expected = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model,
            "gen_ai.request.stream": streamed,
            "gen_ai.response.model": model,
            "gen_ai.response.id": row["response"]["id"],
            "gen_ai.response.finish_reasons": [finish],
            "gen_ai.usage.input_tokens": usage[0],
            "gen_ai.usage.output_tokens": usage[1],
            "gen_ai.conversation.id": session.id,
            "session.id": session.id,
            "http.response.status_code": 200,
            "user_agent.original": row["user_agent"],
            "modeltap.exchange.id": row["id"],
            "modeltap.endpoint": row["endpoint"],
            "server.address": "127.0.0.1",
            "server.port": port,
            "modeltap.label.task_id": "t1",
            "modeltap.label.client": f"{provider}-python",
            "openinference.span.kind": "LLM",
            "llm.model_name": model,
            "llm.token_count.prompt": usage[0],
            "llm.token_count.completion": usage[1],
            "llm.token_count.total": sum(usage),
        }
        if provider == "anthropic":
            expected["gen_ai.request.max_tokens"] = 256
        if row["id"] == rows[0]["id"]:
            expected["gen_ai.request.temperature"] = 0.2
        if streamed:
            expected["gen_ai.response.time_to_first_chunk"] = round(row["first_byte"] - row["started"], 6)
            expected["modeltap.stream.complete"] = True
        assert span["attributes"] == expected, row["endpoint"]


async def test_no_key_token_authorization_or_cookie_reaches_any_span(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy]
) -> None:
    cookie = "sid=cookie-secret-5b1e9d"
    extra_key = "sk-client-header-secret-77f0"
    async with Receiver() as backend:
        async with make_proxy(
            upstream=areal.url, otlp_endpoint=backend.url, otlp_content=True, admin_key="admin-secret-c3a1"
        ) as proxy:
            upstream = areal.open_session("t2")
            session = proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "t2"})
            # The token as the API key (Authorization: Bearer and x-api-key), a cookie, another key header.
            headers = {"Cookie": cookie, "api-key": extra_key}
            await sdk_turns(proxy.host_base_url, session.token, headers)
            admin_key = proxy.admin_key
    assert len(backend.spans) == 4 and all("gen_ai.input.messages" in s["attributes"] for s in backend.spans)
    exported = json.dumps(backend.spans)
    for secret in (session.token, upstream.api_key, admin_key, cookie, extra_key, "Bearer", "x-api-key"):
        assert secret not in exported, secret


@pytest.mark.parametrize("backend_fails", ["refuses connections", "answers 503", "never answers"])
async def test_a_backend_that_fails_costs_no_request_no_record_and_no_long_stop(
    areal: ArealStandIn,
    make_proxy: Callable[..., Proxy],
    store_path: Path,
    caplog: pytest.LogCaptureFixture,
    backend_fails: str,
) -> None:
    async with Receiver(status=503, hold=backend_fails == "never answers") as backend:
        url = f"http://127.0.0.1:{unused_port()}" if backend_fails == "refuses connections" else backend.url
        proxy = await make_proxy(upstream=areal.url, otlp_endpoint=url).start()
        upstream = areal.open_session("t3")
        session = proxy.sessions.open(upstream_key=upstream.api_key)
        async with openai.AsyncOpenAI(
            base_url=session.host_base_url + "/v1", api_key="k", max_retries=0
        ) as client:
            replies = await asyncio.gather(
                *(client.chat.completions.create(model="policy", messages=[ASK]) for _ in range(10))
            )
        with caplog.at_level(logging.WARNING, logger=otlp.__name__):
            await asyncio.wait_for(proxy.stop(), STOP_BOUND_S)
    assert len(replies) == 10 and all(reply.choices[0].finish_reason == "stop" for reply in replies)
    assert len(records(store_path, session.id)) == 10
    assert any(r.getMessage().startswith("otlp: 10 spans lost") for r in caplog.records), caplog.text


async def test_a_full_queue_drops_and_counts_what_does_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otlp, "SHUTDOWN_TIMEOUT_S", 0.5)
    async with Receiver(hold=True) as backend:
        export = otlp.OtlpExport(backend.url + "/v1/traces")
        export.start()
        for _ in range(export.capacity + 7):
            export.on_exchange(exchange({"model": "m", "messages": [ASK]}, None))
        assert (export.tally.queued, export.tally.dropped) == (export.capacity, 7)
        await export.close()  # the backend still holds the first batch: everything is lost, and counted
        tally = export.tally
        assert (tally.dropped, tally.abandoned, tally.exported) == (7, export.capacity, 0)


async def test_a_backfill_sends_the_spans_live_export_sent(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], store_path: Path
) -> None:
    async with Receiver() as live, Receiver() as later:
        async with make_proxy(upstream=areal.url, otlp_endpoint=live.url) as proxy:
            upstream = areal.open_session("t4")
            session = proxy.sessions.open(upstream_key=upstream.api_key, labels={"task_id": "t4"})
            await sdk_turns(session.host_base_url, "unused")
        argv = [
            "export",
            "--all",
            "--format",
            "otlp",
            "--otlp-endpoint",
            later.url,
            "--store",
            str(store_path),
        ]
        assert await asyncio.to_thread(main, argv) == 0

    def comparable(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        without_instance = [s | {"resource": s["resource"] | {"service.instance.id": None}} for s in spans]
        return sorted(without_instance, key=lambda s: s["span_id"])

    assert len(live.spans) == 4 and comparable(later.spans) == comparable(live.spans)


async def test_opentelemetry_variables_are_honoured_and_the_flag_wins(
    areal: ArealStandIn, make_proxy: Callable[..., Proxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-project-name=run-42")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "rollout-node")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "run=42")
    async with Receiver() as by_variable, Receiver() as by_flag:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", by_variable.url)
        for flag in (None, by_flag.url):
            async with make_proxy(upstream=areal.url, otlp_endpoint=flag) as proxy:
                session = proxy.sessions.open(upstream_key=areal.open_session("t5").api_key)
                async with openai.AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="k") as client:
                    await client.chat.completions.create(model="policy", messages=[ASK])
    for backend in (by_variable, by_flag):
        [span] = backend.spans
        assert (span["resource"]["service.name"], span["resource"]["run"]) == ("rollout-node", "42")
        assert backend.headers[0]["x-project-name"] == "run-42"


@pytest.mark.parametrize(
    "argv",
    [
        [
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--host",
            "127.0.0.1",
            "--otlp-endpoint",
            "http://127.0.0.1:9",
        ],
        ["export", "--all", "--format", "otlp", "--otlp-endpoint", "http://127.0.0.1:9"],
    ],
)
def test_without_the_optional_packages_the_flag_says_what_to_install(tmp_path: Path, argv: list[str]) -> None:
    store = tmp_path / "records.db"
    if argv[0] == "export":
        asyncio.run(recorded(store))  # an empty store to read
    # `None` in sys.modules makes every `import opentelemetry...` fail, as on a machine without them.
    code = (
        "import sys; sys.modules['opentelemetry'] = None; from modeltap.cli import main; "
        f"raise SystemExit(main({[*argv, '--store', str(store)]!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "OpenTelemetry export needs its optional packages: pip install 'modeltap[otlp]'" in done.stderr
