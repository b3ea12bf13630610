"""modeltap/records/exchange.py: a draft takes every change until it is sealed; a sealed Exchange, or
one built directly, raises on every assignment."""

from __future__ import annotations

import dataclasses

import pytest

from modeltap.records.exchange import Exchange, ExchangeDraft, SessionEvent


def test_a_draft_changes_freely_and_seals_in_place() -> None:
    draft = ExchangeDraft(method="GET", path="/v1/models")
    draft.status = 200
    draft.fail("upstream_error", "first")
    draft.fail("client_disconnect", "second")  # the first failure is the one kept
    sealed = draft.seal()
    assert sealed is draft and isinstance(sealed, Exchange)
    assert (sealed.status, sealed.error_class, sealed.error_message) == (200, "upstream_error", "first")
    assert sealed.ended is not None and sealed.ended >= sealed.started


def test_a_sealed_exchange_refuses_every_change() -> None:
    sealed = ExchangeDraft().seal()
    with pytest.raises(dataclasses.FrozenInstanceError):
        sealed.status = 500
    with pytest.raises(dataclasses.FrozenInstanceError):
        del sealed.path
    with pytest.raises(dataclasses.FrozenInstanceError):
        sealed.fail("proxy_error", "too late")


def test_an_exchange_built_directly_is_sealed_and_replace_makes_another() -> None:
    built = Exchange(method="POST", path="/chat/completions", status=201)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = 200
    changed = dataclasses.replace(built, status=200)
    assert (changed.status, built.status, type(changed)) == (200, 201, Exchange)
    with pytest.raises(dataclasses.FrozenInstanceError):
        changed.status = 1


def test_sealing_keeps_an_end_time_already_set() -> None:
    draft = ExchangeDraft(started=1.0, ended=2.5)
    assert draft.seal().ended == 2.5


def test_session_events_are_frozen() -> None:
    event = SessionEvent("opened", "s1", {"task_id": "t"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.kind = "closed"  # type: ignore[misc]
