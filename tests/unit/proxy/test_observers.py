"""modeltap/proxy/observers.py: every observer gets every event once, in order; a failing one is logged
with its name and changes nothing for the others; a hang-up while waiting loses no event."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from modeltap.proxy import observers
from modeltap.proxy.observers import Observers
from modeltap.records.exchange import Exchange, SessionEvent
from modeltap.testing import exchange


class Recorder:
    """Notes every event it gets, in a list shared with the test."""

    def __init__(self, seen: list[tuple[str, Any]], name: str = "recorder") -> None:
        self.seen, self.name = seen, name

    def on_exchange(self, ex: Exchange) -> None:
        self.seen.append((self.name, ex.id))

    def on_session(self, event: SessionEvent) -> None:
        self.seen.append((self.name, event.kind))


class Failing:
    def on_exchange(self, ex: Exchange) -> None:
        raise RuntimeError("observer bug")


def failing() -> Failing:
    """A factory, as `--observer MODULE:ATTR` may name one."""
    return Failing()


class Waiting:
    """Hands back an awaitable, as the record store does when its queue is full."""

    def __init__(self, gate: asyncio.Event, seen: list[tuple[str, Any]]) -> None:
        self.gate, self.seen = gate, seen

    def on_exchange(self, ex: Exchange) -> Any:
        self.seen.append(("waiting", ex.id))
        return self.gate.wait()


async def test_each_observer_gets_each_exchange_once_in_order() -> None:
    seen: list[tuple[str, Any]] = []
    seam = Observers([Recorder(seen, "first"), Recorder(seen, "second")])
    one, two = exchange({}, {}), exchange({}, {})
    await seam.exchange(one)
    await seam.exchange(two)
    assert seen == [("first", one.id), ("second", one.id), ("first", two.id), ("second", two.id)]
    seam.session(SessionEvent("opened", "s1"))
    assert seen[-2:] == [("first", "opened"), ("second", "opened")]


async def test_a_failing_observer_is_logged_by_name_once_per_exchange_and_isolated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, Any]] = []
    seam = Observers([Failing(), Recorder(seen)])
    exchanges = [exchange({}, {}) for _ in range(3)]
    with caplog.at_level(logging.ERROR, "modeltap.proxy.observers"):
        for ex in exchanges:
            await seam.exchange(ex)
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 3 and seam.failures == 3
    assert all("test_observers.Failing" in f and "RuntimeError: observer bug" in f for f in failures)
    assert [ex_id for _, ex_id in seen] == [ex.id for ex in exchanges]


async def test_every_observer_is_called_before_any_wait_and_a_cancelled_wait_loses_nothing() -> None:
    seen: list[tuple[str, Any]] = []
    gate = asyncio.Event()
    seam = Observers([Waiting(gate, seen), Recorder(seen)])
    ex = exchange({}, {})
    delivery = asyncio.ensure_future(seam.exchange(ex))
    await asyncio.sleep(0)
    assert seen == [("waiting", ex.id), ("recorder", ex.id)]  # both have it while the first still waits
    assert not delivery.done()
    delivery.cancel()  # the client hung up: only the waiting is cancelled, not the delivery
    with pytest.raises(asyncio.CancelledError):
        await delivery


async def test_an_awaited_observer_holds_the_delivery_until_it_is_done() -> None:
    gate = asyncio.Event()
    seam = Observers([Waiting(gate, [])])
    delivery = asyncio.ensure_future(seam.exchange(exchange({}, {})))
    await asyncio.sleep(0.01)
    assert not delivery.done()
    gate.set()
    await asyncio.wait_for(delivery, 1)


def test_an_object_that_observes_nothing_is_refused() -> None:
    with pytest.raises(TypeError, match="observes nothing"):
        Observers([object()])


def test_load_calls_the_named_class_or_factory() -> None:
    # pytest imports this file under another module name, so the class is compared by name.
    assert type(observers.load("tests.unit.proxy.test_observers:Failing")).__qualname__ == "Failing"
    assert type(observers.load("tests.unit.proxy.test_observers:failing")).__qualname__ == "Failing"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "give MODULE:ATTR"),
        (":Failing", "give MODULE:ATTR"),
        ("tests.unit.proxy.test_observers:", "give MODULE:ATTR"),
        ("no.such.module:X", "cannot import no.such.module"),
        ("tests.unit.proxy.test_observers:Missing", "has no class or factory 'Missing'"),
    ],
)
def test_load_says_what_is_wrong_with_a_spec(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        observers.load(spec)
