"""modeltap/dialects/roles.py: every format plays or declines each optional role, says so when it is
defined, and must provide each abstract method of the roles it plays."""

from __future__ import annotations

import pytest

from modeltap import dialects
from modeltap.dialects.roles import (
    ROLES,
    AsChat,
    CountsPrompt,
    GeneratesNothing,
    OpenAIShaped,
    ReturnsTokenIds,
    Streams,
    ThroughChat,
    TokenEndpoint,
)

# What each format plays, stated here rather than read from the classes.
PLAYS = {
    "chat": {Streams, AsChat, ReturnsTokenIds},
    "completions": {Streams, ReturnsTokenIds, TokenEndpoint},
    "responses": {Streams, ThroughChat, AsChat},
    "embeddings": set(),
    "models": set(),
    "messages": {Streams, ThroughChat, AsChat},
    "count_tokens": {CountsPrompt},
}


@pytest.mark.parametrize("dialect", dialects.DIALECTS, ids=lambda d: d.name)
def test_each_format_plays_what_it_should_and_declines_the_rest(dialect: dialects.Dialect) -> None:
    played = {role for role in ROLES if isinstance(dialect, role)}
    assert played == PLAYS[dialect.name]
    assert dialect.declined == set(ROLES) - played


def test_a_format_that_neither_plays_nor_declines_a_role_is_refused_when_defined() -> None:
    with pytest.raises(TypeError, match="neither plays nor declines the Streams role"):

        class Forgetful(
            OpenAIShaped, GeneratesNothing, declines=(AsChat, ThroughChat, ReturnsTokenIds, CountsPrompt)
        ):
            name, route = "forgetful", "forgetful"

    with pytest.raises(TypeError, match="both plays and declines the CountsPrompt role"):

        class Confused(OpenAIShaped, GeneratesNothing, CountsPrompt, declines=ROLES):
            name, route = "confused", "confused"

            def count_answer(self, prompt_tokens: int) -> dict[str, int]:
                return {}


def test_a_role_played_must_be_provided_whole() -> None:
    class HalfStream(
        OpenAIShaped, GeneratesNothing, Streams, declines=(AsChat, ThroughChat, ReturnsTokenIds, CountsPrompt)
    ):
        name, route = "half", "half"

        def assembler(self):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    with pytest.raises(TypeError, match="abstract method"):
        HalfStream()  # type: ignore[abstract]


def test_an_engine_format_is_known_by_name_and_routed_nowhere() -> None:
    generate = dialects.named("generate")
    assert {role for role in ROLES if isinstance(generate, role)} == {Streams, ReturnsTokenIds, TokenEndpoint}
    assert generate not in dialects.DIALECTS and dialects.for_route("generate") is None


def test_an_unrouted_exchange_reads_as_a_format_of_nothing() -> None:
    unrouted = dialects.of_record("no such format")
    assert not any(isinstance(unrouted, role) for role in ROLES)
    assert unrouted.summary({"model": "m"}, {"usage": {"prompt_tokens": 3}}).prompt_tokens == 3
    assert unrouted.completion_field({}) is None
