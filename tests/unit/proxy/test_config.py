"""modeltap/proxy/config.py: defaults, validation, and flags over `MODELTAP_<OPTION>` over defaults."""

from __future__ import annotations

import dataclasses

import pytest

from modeltap.proxy.config import BUDGET_POLICIES, DEFAULT_STORE, ProxyConfig, otlp_traces_endpoint


def test_defaults() -> None:
    config = ProxyConfig()
    assert (config.host, config.port, config.layout, config.budget, config.store) == (
        "0.0.0.0",
        8840,
        "auto",
        "clamp",
        DEFAULT_STORE,
    )
    assert config.observers == [] and config.chat_template_kwargs == {}
    assert ProxyConfig().observers is not config.observers  # no shared mutable default
    assert BUDGET_POLICIES == ("clamp", "reject", "off")


def test_secrets_stay_out_of_the_repr() -> None:
    text = repr(ProxyConfig(upstream_key="sk-secret-1", admin_key="adm-secret-2"))
    assert "sk-secret-1" not in text and "adm-secret-2" not in text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"layout": "v2"}, "layout must be one of areal, areal-gateway, openai, chat-only, auto"),
        ({"budget": "truncate"}, "budget must be one of clamp, reject, off"),
        ({"upstream": "ftp://x"}, "upstream must be an http"),
        ({"port": 70000}, "port must be 0..65535"),
        ({"max_body_bytes": 10}, "at least 1024"),
        ({"otlp_endpoint": "collector:4318"}, "otlp_endpoint must be an http"),
    ],
)
def test_bad_values_are_refused_with_the_field_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProxyConfig(**fields)  # type: ignore[arg-type]


def test_the_upstream_loses_its_trailing_slash() -> None:
    assert ProxyConfig(upstream="http://up:8000/v1/").upstream == "http://up:8000/v1"


def test_a_flag_wins_over_the_environment_which_wins_over_the_default() -> None:
    env = {
        "MODELTAP_PORT": "8080",
        "MODELTAP_SYNC": "yes",
        "MODELTAP_READ_TIMEOUT_S": "2.5",
        "MODELTAP_CHAT_TEMPLATE_KWARGS": '{"enable_thinking": false}',
        "MODELTAP_OBSERVERS": "a.b:C,d.e:F",
        "MODELTAP_UPSTREAM": "http://from-env",
        "MODELTAP_TOKENIZER": "/models/q",
    }
    config = ProxyConfig.from_sources({"upstream": "http://from-flag", "tokenizer": None}, env)
    assert config.upstream == "http://from-flag"  # the flag
    assert config.tokenizer == "/models/q"  # a flag given as None counts as absent
    assert (config.port, config.sync, config.read_timeout_s) == (8080, True, 2.5)
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.observers == ["a.b:C", "d.e:F"]
    assert config.reserve == 0  # neither: the default


def test_every_field_has_help_for_its_flag() -> None:
    for field in dataclasses.fields(ProxyConfig):
        assert field.metadata["help"], field.name


BASE = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {}, None),
        ("http://c:4318", {}, "http://c:4318/v1/traces"),
        ("http://c:4318/", {}, "http://c:4318/v1/traces"),
        ("http://c:4318/v1/traces", {}, "http://c:4318/v1/traces"),
        (None, {BASE: "http://env:4318"}, "http://env:4318/v1/traces"),
        (None, {TRACES: "http://env:4318/custom"}, "http://env:4318/custom"),
        (None, {BASE: "http://base:4318", TRACES: "http://traces:4318/t"}, "http://traces:4318/t"),
        ("http://flag:4318", {BASE: "http://base", TRACES: "http://traces/t"}, "http://flag:4318/v1/traces"),
    ],
)
def test_spans_go_to_the_flag_else_to_opentelemetrys_own_variables(
    flag: str | None, env: dict[str, str], expected: str | None
) -> None:
    assert otlp_traces_endpoint(ProxyConfig(otlp_endpoint=flag), env) == expected
