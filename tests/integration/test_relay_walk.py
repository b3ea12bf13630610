"""The walk of one request through the relay (tests/relay_walk.py): each stage does its work and
hands on, so a chat request returns to a relay module it already left at most 17 times (the stages'
hand-backs to relay.py, and no more). Before the relay was reworked to read a reply once, compute the
answer's headers once and hand the exchange over in one place, the same walk returned 26 times.

A stream's walk depends on how its bytes arrive (chunks coalesce), so only the whole answer is held to
a ceiling here; `python -m tests.relay_walk` reports the streamed ones too."""

from __future__ import annotations

from tests.relay_walk import CASES, walk

# The measured walk after the rework (and 26 before it): 13, plus one hand-back for each stage added
# since: the browser guard (browsers.py), the masking of the keys in the reply (keys.py, one pass over
# URL, headers and body), naming's question to the anonymous conversations (which sample a request
# echoes) and their note of the reply once it is answered (so the next turn can be told apart). A
# change that scatters a stage's work over more hand-backs fails here.
RELAY_RETURNS_MAX = 17


async def test_a_chat_request_walks_through_the_relay_in_one_pass() -> None:
    path, body, config = CASES["chat"]()
    relay = (await walk(path, body, config=config)).within("proxy/")
    assert relay.stays[0] == "proxy/relay.py" and relay.stays[-1] == "proxy/relay.py"
    # Every other relay module is entered once, except where a stage is asked twice of one place.
    assert relay.returns <= RELAY_RETURNS_MAX, relay.stays
    # The exchange reaches the observers once, after the answer was written.
    assert relay.stays.count("proxy/observers.py") == 1
    assert relay.stays.index("proxy/answers.py") < relay.stays.index("proxy/observers.py")
