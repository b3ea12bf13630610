"""vLLM 0.33.0's own answers (tests/fixtures/parsers/vllm-0.33.0.json) as test parameters: a test that
takes `vector` runs once per golden case of the families its module names in `VECTOR_PARSERS`
(pairs of vLLM flag values; every case when the module names none), and `golden` is that case ready
to parse."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from modeltap.compat.parsers import ParsedCall, ParsedReply, ReplyContext, ReplyParser, ToolSpec, reply_parser

FIXTURE = Path(__file__).parents[3] / "fixtures" / "parsers" / "vllm-0.33.0.json"
VECTORS: list[dict[str, Any]] = json.loads(FIXTURE.read_text())["vectors"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "vector" not in metafunc.fixturenames:
        return
    wanted = getattr(metafunc.module, "VECTOR_PARSERS", None)
    chosen = [v for v in VECTORS if wanted is None or (v["tool_parser"], v["reasoning_parser"]) in wanted]
    assert chosen, f"no golden vector for {wanted}"
    metafunc.parametrize(
        "vector",
        chosen,
        ids=[
            f"{v['tool_parser']}+{v['reasoning_parser']}:{v['chat_template_kwargs']}:{v['case']}"
            for v in chosen
        ],
    )


@pytest.fixture
def vectors() -> list[dict[str, Any]]:
    """Every golden case."""
    return VECTORS


class Golden(NamedTuple):
    """One golden case: the parser pair, the request, the generated text and vLLM's answer."""

    parser: ReplyParser
    context: ReplyContext
    text: str
    expected: ParsedReply
    tools_called: bool
    finish_reason: str
    vllm_stream: dict[str, Any]


@pytest.fixture
def golden(vector: dict[str, Any]) -> Golden:
    expected = vector["expected"]
    return Golden(
        parser=reply_parser(vector["tool_parser"], vector["reasoning_parser"]),
        context=ReplyContext(
            tools=ToolSpec.from_chat(vector["tools"]),
            chat_template_kwargs=vector["chat_template_kwargs"] or {},
        ),
        text=vector["text"],
        expected=ParsedReply(
            content=expected["content"],
            reasoning=expected["reasoning"],
            tool_calls=tuple(ParsedCall(c["name"], c["arguments"]) for c in expected["tool_calls"]),
        ),
        tools_called=expected["tools_called"],
        finish_reason=expected["finish_reason_if_engine_stop"],
        vllm_stream=vector["vllm_stream"],
    )
