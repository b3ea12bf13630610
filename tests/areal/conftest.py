"""Fixtures of the AReaL tier: AReaL's real v1 proxy server with a fake engine, and its tokenizer.

This tier runs only in its own venvs: `make areal-test` builds `.venv-areal` with AReaL 1.0.4, and
`make areal2-test` runs the same tests in `.venv-areal2` with AReaL 2.0.0 and with main (docs/areal.md
§11). AReaL pins what the main venv must not have. Run from anywhere else, it fails at once and says
so; it never skips.
"""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

if importlib.util.find_spec("areal") is None:
    raise pytest.UsageError(
        "tests/areal needs AReaL 1.0.4 and its pinned set, which live in .venv-areal: run `make areal-test`"
    )

from areal_server import ArealProxyServer
from tokenizer_files import qwen_tokenizer_files

from tests.store_guard import default_store_untouched  # noqa: F401  # a session fixture, used by name

# Large enough for the agents' prompts with their tool schemas (measured with this template: opencode
# 7.3k tokens, Claude Code 11.8k), small enough that a test can build a prompt over it cheaply.
# AReaL applies it as the cap on prompt + completion (docs/areal.md §4.1).
ENGINE_MAX_TOKENS = 32768
# Any key but AReaL's public default "areal-admin-key", which later AReaL versions refuse off loopback.
ADMIN_KEY = "modeltap-areal-tier-" + secrets.token_urlsafe(16)


@pytest.fixture(scope="session")
def tokenizer_path() -> str:
    """Where the served model's tokenizer lives (AReaL's `tokenizer_path`, modeltap's `--tokenizer`)."""
    return qwen_tokenizer_files()


@pytest.fixture(scope="session")
def qwen_tokenizer(tokenizer_path: str):  # -> PreTrainedTokenizerFast
    """The tokenizer AReaL's proxy templates and encodes with, loaded the same way."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path)


@pytest.fixture(scope="session")
def areal_server(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: str) -> Iterator[ArealProxyServer]:
    """AReaL's real proxy rollout server on loopback, engine created and initialized, for the session."""
    workdir: Path = tmp_path_factory.mktemp("areal-proxy")
    server = ArealProxyServer.start(
        workdir, tokenizer_path, admin_key=ADMIN_KEY, engine_max_tokens=ENGINE_MAX_TOKENS
    )
    yield server
    server.stop()
