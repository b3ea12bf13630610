"""pytest fixtures for the stand-in upstreams (register with `pytest_plugins = ["tests.standins.fixtures"]`).

Each fixture starts a fresh stand-in for one test and stops it afterwards. `standin_factory` starts
any number, with options:

    def test_sglang_window(standin_factory):
        upstream = standin_factory(OpenAILikeStandIn, flavor="sglang", max_model_len=512)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.standins.anthropic_like import AnthropicLikeStandIn
from tests.standins.areal import ArealStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.server import StandIn

S = TypeVar("S", bound=StandIn)


@pytest.fixture
def standin_factory() -> Iterator[Callable[..., Any]]:
    """Start stand-ins of any kind with options; every one is stopped when the test ends."""
    started: list[StandIn] = []

    def start(kind: type[S], **options: Any) -> S:
        standin = kind(**options).start()
        started.append(standin)
        return standin

    yield start
    for standin in reversed(started):
        standin.stop()


@pytest.fixture
def areal_standin(standin_factory: Callable[..., ArealStandIn]) -> ArealStandIn:
    """An AReaL proxy stand-in with no length cap (AReaL's `engine_max_tokens=None`)."""
    return standin_factory(ArealStandIn)


@pytest.fixture
def vllm_standin(standin_factory: Callable[..., OpenAILikeStandIn]) -> OpenAILikeStandIn:
    """A vLLM stand-in serving `standin-model` with a 32768-token window."""
    return standin_factory(OpenAILikeStandIn, flavor="vllm")


@pytest.fixture
def sglang_standin(standin_factory: Callable[..., OpenAILikeStandIn]) -> OpenAILikeStandIn:
    """An SGLang stand-in serving `standin-model` with a 32768-token window."""
    return standin_factory(OpenAILikeStandIn, flavor="sglang")


@pytest.fixture
def anthropic_standin(standin_factory: Callable[..., AnthropicLikeStandIn]) -> AnthropicLikeStandIn:
    """An Anthropic Messages stand-in with a 200k-token window and no key check."""
    return standin_factory(AnthropicLikeStandIn)
