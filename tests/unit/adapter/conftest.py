"""Fixtures of the adapter's unit tier: the process's background loop is stopped after every test, so
each test gets a fresh proxy, store and sandbox provider."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from modeltap.adapter import shutdown


@pytest.fixture(autouse=True)
def fresh_background_loop() -> Iterator[None]:
    yield
    shutdown()
