"""modeltap/records/frames.py: exchanges and session events as frames and back, split anywhere."""

from __future__ import annotations

import dataclasses

import pytest

from modeltap.dialects.token_ids import TokenIds
from modeltap.records import frames
from modeltap.records.exchange import Exchange, RolloutOutcome, SessionEvent
from tests.factories import assistant, chat_completion, exchange, usage


def _full_exchange() -> Exchange:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \udcff"}], "stream": True}
    return dataclasses.replace(
        exchange(
            body, chat_completion(assistant("hi"), "stop", usage=usage(3, 1)), session_id="s-1", ended=2.0
        ),
        labels={"task_id": "t"},
        response_body=b"\x00\xffbytes as they came",
        raw_sse=b"data: {}\n\n",
        budget={"prompt_tokens": 3},
        sent={"model": "m", "max_tokens": 5},
        token_ids=TokenIds(prompt=[1, 2], completion=[3], source="rendered"),
        error_class="upstream_error",
        error_message="boom",
        retry_count=2,
    )


def test_an_exchange_crosses_whole_and_the_request_is_parsed_again_on_the_other_side() -> None:
    sent = _full_exchange()
    [frame] = frames.FrameReader().feed(frames.encode(41, sent, frames.WAIT))
    got = frame.item()
    assert (frame.kind, frame.flags, frame.seq) == (frames.EXCHANGE, frames.WAIT, 41)
    assert got == sent  # the request's bytes go, and are parsed again there
    assert got.request == sent.request and got.request_json == sent.request_json


def test_frames_split_at_every_byte_are_read_the_same() -> None:
    event = SessionEvent("outcome", "s-1", {"a": "b"}, outcome=RolloutOutcome("scored", reward=1.0))
    data = (
        frames.encode(1, _full_exchange())
        + frames.encode(2, event)
        + frames.encode_minimal(3, _full_exchange(), "why")
        + frames.encode_flush(4)
    )
    whole = frames.FrameReader().feed(data)
    assert [(f.kind, f.seq) for f in whole] == [
        (frames.EXCHANGE, 1),
        (frames.SESSION, 2),
        (frames.EXCHANGE, 3),
        (frames.FLUSH, 4),
    ]
    for cut in range(1, len(data)):
        reader = frames.FrameReader()
        assert reader.feed(data[:cut]) + reader.feed(data[cut:]) == whole
    assert whole[1].item() == event


def test_a_minimal_frame_carries_what_a_minimal_record_needs_and_why() -> None:
    sent = _full_exchange()
    data = frames.encode_minimal(9, sent, "the writer died on it", frames.REPLAY)
    [frame] = frames.FrameReader().feed(data)
    got = frame.item()
    assert frame.flags == frames.MINIMAL | frames.REPLAY and frame.reason() == "the writer died on it"
    assert (got.id, got.session_id, got.status, got.started, got.error_class) == (
        sent.id,
        sent.session_id,
        sent.status,
        sent.started,
        sent.error_class,
    )
    assert got.request == b"" and got.labels == {}


def test_flags_are_added_to_a_frame_without_touching_the_rest() -> None:
    data = frames.encode(5, _full_exchange(), frames.WAIT)
    [frame] = frames.FrameReader().feed(frames.with_flags(data, frames.REPLAY))
    assert frame.flags == frames.WAIT | frames.REPLAY
    assert frames.FrameReader().feed(data)[0].payload == frame.payload


def test_acknowledgements_are_read_in_pieces() -> None:
    acks = [frames.Ack(3, 2, ((2, "TypeError: no"),)), frames.Ack(9, 6)]
    data = b"".join(frames.encode_ack(a) for a in acks)
    reader = frames.AckReader()
    assert reader.feed(data[:7]) + reader.feed(data[7:]) == acks


def test_what_is_not_a_frame_is_refused() -> None:
    with pytest.raises(frames.FrameError, match="unknown frame kind"):
        frames.FrameReader().feed(b"\x00\x00\x00\x0a" + bytes([9, 0]) + bytes(8))
    with pytest.raises(frames.FrameError, match="shorter than its header"):
        frames.FrameReader().feed(b"\x00\x00\x00\x02ab")
    with pytest.raises(frames.FrameError, match="not an acknowledgement"):
        frames.AckReader().feed(frames.encode_ack("nope"))  # type: ignore[arg-type]
    assert frames.FrameReader().feed(frames.encode(1, _full_exchange())[:-1]) == []  # not complete yet
