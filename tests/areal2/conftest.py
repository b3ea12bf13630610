"""Fixtures of the AReaL 2.0 tier: AReaL's v2 router, data proxy and gateway (v2_services.py) in front of
a stand-in SGLang, and the v2 controller's own workflow resolution.

This tier runs in its own venv with AReaL 2.0.0 or main installed from source (`make areal2-test`, which
runs it once per tree, after the same tree's run of tests/areal for the v1 proxy). Run from anywhere else
it fails at once and says so; it never skips.
"""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

if importlib.util.find_spec("areal") is None or importlib.util.find_spec("areal.v2") is None:
    raise pytest.UsageError(
        "tests/areal2 needs AReaL 2.0.0 or main (areal.v2) and the tier's pinned set, which live in "
        ".venv-areal2: run `make areal2-test`"
    )

from v2_services import V2Service, fake_sglang

from tests.areal.tokenizer_files import qwen_tokenizer_files
from tests.store_guard import default_store_untouched  # noqa: F401  # a session fixture, used by name

# As the 1.0.4 tier: room for the agents' prompts with their tool schemas.
ENGINE_MAX_TOKENS = 32768
ADMIN_KEY = "modeltap-areal2-tier-" + secrets.token_urlsafe(16)


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    return qwen_tokenizer_files()


@pytest.fixture(scope="session")
def v2_service(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: str) -> Iterator[V2Service]:
    """AReaL's v2 router, data proxy and gateway, for the session, with the stand-in SGLang behind."""
    from transformers import AutoTokenizer

    with fake_sglang(AutoTokenizer.from_pretrained(tokenizer_path)) as backend:
        service = V2Service.start(
            tmp_path_factory.mktemp("areal-v2"),
            backend.url,
            tokenizer_path,
            admin_key=ADMIN_KEY,
            engine_max_tokens=ENGINE_MAX_TOKENS,
        )
        yield service
        service.stop()


@pytest.fixture
def controller(v2_service: V2Service, tokenizer_path: str) -> Any:
    """A `RolloutControllerV2` as `rollout._version: v2` builds it, past `initialize`: its gateway is the
    running one. Only its workflow resolution is used, so its scheduler says one GPU per node and no
    worker is launched."""
    from areal.api.cli_args import AgentConfig, InferenceEngineConfig
    from areal.v2.inference_service.controller.controller import RolloutControllerV2

    config = InferenceEngineConfig(
        experiment_name="modeltap",
        trial_name="areal2-tier",
        tokenizer_path=tokenizer_path,
        _version="v2",
        backend="sglang:d1",
        model="policy",
        admin_api_key=v2_service.admin_key,
        agent=AgentConfig(
            agent_cls_path="areal.experimental.openai.proxy.online_agent._OnlineAgent",
            admin_api_key=v2_service.admin_key,
            turn_discount=0.5,
        ),
    )
    controller = RolloutControllerV2(config, SimpleNamespace(n_gpus_per_node=1))
    # What initialize() sets once it has launched the gateway.
    controller._gateway_addr = v2_service.gateway_url
    return controller


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "records.db"
