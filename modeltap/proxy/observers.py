"""The seam after each exchange: observers, and how the proxy hands each one every exchange.

Owns: the Observer protocol, loading `serve --observer MODULE:ATTR`, and delivering an event to each
observer in order, each failure isolated. Does not own: what an observer does (the record store is one,
modeltap.records.store; the adapter's fault watch another).

An observer is any object with `on_exchange(exchange)` and/or `on_session(event)`. Each is called once
per event, on the event loop, in the order the observers were given (the record store first); the
call takes the event and must not block the loop. It may return an awaitable that only waits: the
store returns one that waits for room in its queue, or with `--sync` for the commit, which is how
back-pressure reaches the relay. The calls all happen before any wait, so an event is never lost to
a client that hangs up during one. An observer that raises is logged with its name and the error,
and nothing else changes: the other observers still get the event, and the client's answer was
settled before.

    class Printer:
        def on_exchange(self, exchange: Exchange) -> None:
            print(exchange.endpoint, exchange.status)

    async with Proxy(config, observers=[Printer()]) as proxy: ...
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Protocol, runtime_checkable

from modeltap.records.exchange import Exchange, SessionEvent

log = logging.getLogger(__name__)

_EVENTS = ("on_exchange", "on_session")


@runtime_checkable
class ExchangeObserver(Protocol):
    """An observer of exchanges (it may observe sessions too)."""

    def on_exchange(self, exchange: Exchange) -> Awaitable[None] | None: ...


@runtime_checkable
class SessionObserver(Protocol):
    """An observer of sessions opening and closing. Sessions open rarely and from synchronous code
    (`proxy.sessions.open()`), so this call returns nothing to wait for."""

    def on_session(self, event: SessionEvent) -> None: ...


class Observers:
    """The proxy's observers, in order, and the delivery of events to them."""

    def __init__(self, observers: Sequence[object]) -> None:
        for observer in observers:
            if not any(callable(getattr(observer, event, None)) for event in _EVENTS):
                raise TypeError(f"{_name(observer)} observes nothing: give it on_exchange() or on_session()")
        self._exchange = [o for o in observers if isinstance(o, ExchangeObserver)]
        self._session = [o for o in observers if isinstance(o, SessionObserver)]
        self.failures = 0

    async def exchange(self, exchange: Exchange) -> None:
        """Hand a sealed exchange to each exchange observer, then await what they wait for."""
        await self.hand_over(exchange)

    def hand_over(self, exchange: Exchange) -> Coroutine[Any, Any, None]:
        """Hand a sealed exchange to each exchange observer now; return the waiting for what they
        wait for. For a handler being cancelled: the exchange is the observers' before this returns,
        so a task that awaits the rest can be cancelled (a stop) without losing it."""
        return self._waits(self._calls([(o, o.on_exchange) for o in self._exchange], exchange), exchange)

    def session(self, event: SessionEvent) -> None:
        """Hand a session event to each session observer."""
        for observer in self._session:
            try:
                observer.on_session(event)
            except Exception as exc:  # boundary: as for exchanges
                self._failed(observer, event, exc)

    def _calls(
        self, calls: list[tuple[object, Callable[[Any], Any]]], event: object
    ) -> list[tuple[object, Awaitable[Any]]]:
        waits: list[tuple[object, Awaitable[Any]]] = []
        for observer, method in calls:
            try:
                result = method(event)
            except Exception as exc:  # boundary: an observer's bug must not reach the relay or the others
                self._failed(observer, event, exc)
            else:
                if inspect.isawaitable(result):
                    waits.append((observer, result))
        return waits

    async def _waits(self, waits: list[tuple[object, Awaitable[Any]]], event: object) -> None:
        try:
            for observer, wait in waits:
                try:
                    await wait
                except Exception as exc:  # the same boundary, for what it awaited
                    self._failed(observer, event, exc)
        finally:
            for _, wait in waits:  # a hang-up cancelled the waiting: close what was never awaited
                if inspect.iscoroutine(wait):
                    wait.close()

    def _failed(self, observer: object, event: object, exc: Exception) -> None:
        self.failures += 1
        log.error(
            "observer %s failed on %s: %s: %s", _name(observer), _describe(event), type(exc).__name__, exc
        )


def load(spec: str) -> object:
    """The observer `MODULE:ATTR` names: ATTR (a class or a factory) called without arguments.

    >>> load("modeltap.records.jsonl_log:JsonLinesLog")  # doctest: +SKIP
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"--observer {spec!r}: give MODULE:ATTR, e.g. mypackage.observers:Printer")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--observer {spec!r}: cannot import {module_name}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--observer {spec!r}: {module_name} has no class or factory {attr!r}")
    return factory()


def _name(observer: object) -> str:
    kind = type(observer)
    return f"{kind.__module__}.{kind.__qualname__}"


def _describe(event: object) -> str:
    if isinstance(event, Exchange):
        return f"exchange {event.id} ({event.endpoint or event.path})"
    if isinstance(event, SessionEvent):
        return f"session {event.session_id} {event.kind}"
    return type(event).__name__
