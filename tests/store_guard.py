"""A session fixture both conftests use: no test may write the working copy's default store
(`.modeltap/records.db`, where `modeltap serve` records when a user runs it from the checkout)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

DEFAULT_STORE = Path(__file__).resolve().parents[1] / ".modeltap" / "records.db"


def _stamp() -> float | None:
    return DEFAULT_STORE.stat().st_mtime if DEFAULT_STORE.exists() else None


@pytest.fixture(scope="session", autouse=True)
def default_store_untouched() -> Iterator[None]:
    before = _stamp()
    yield
    if _stamp() != before:
        pytest.fail(f"a test wrote {DEFAULT_STORE}: give it a store under tmp_path")
