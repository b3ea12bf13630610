"""modeltap/proxy/keys.py: a key the request was sent with never survives masking, wherever it stands
in a body, a header or a stream cut at any points; what is not a key passes byte for byte."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from modeltap.proxy.keys import MASK, MIN_KEY_CHARS, KeyMask

KEY = "sk-live-0123456789abcdef"
keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=MIN_KEY_CHARS, max_size=40)
around = st.binary(max_size=60)


def test_masks_every_key_sent_and_no_short_value() -> None:
    mask = KeyMask.sent({"Authorization": f"Bearer {KEY}", "x-api-key": "short"}, "alt=sse&key=AIzaSyA-1234")
    body = f'{{"error": "Incorrect API key provided: {KEY}; also AIzaSyA-1234", "k": "short"}}'.encode()
    assert (
        mask.bytes(body)
        == f'{{"error": "Incorrect API key provided: {MASK}; also {MASK}", "k": "short"}}'.encode()
    )
    assert mask.text(f"Bearer {KEY}") == MASK  # the whole header value, scheme and all
    assert dict(mask.headers([("WWW-Authenticate", f'Bearer error="invalid", key="{KEY}"')])) == {
        "WWW-Authenticate": f'Bearer error="invalid", key="{MASK}"'
    }


def test_no_keys_no_change() -> None:
    assert not KeyMask() and KeyMask().bytes(b"x") == b"x"
    stream = KeyMask().stream()
    assert stream.feed(b"abc") == b"abc" and stream.flush() == b""


@given(key=keys, before=around, after=around, copies=st.integers(1, 3))
def test_a_key_anywhere_in_a_body_is_masked(key: str, before: bytes, after: bytes, copies: int) -> None:
    mask = KeyMask([key])
    out = mask.bytes(before + key.encode() * copies + after)
    assert key.encode() not in out


@given(
    key=keys,
    before=around,
    after=around,
    cuts=st.lists(st.integers(0, 200), max_size=8),
)
def test_a_key_split_across_chunks_is_masked_and_the_rest_passes_as_it_was(
    key: str, before: bytes, after: bytes, cuts: list[int]
) -> None:
    mask = KeyMask([key, "another-key-12345"])
    data = before + key.encode() + after
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    stream = mask.stream()
    out = b"".join(stream.feed(chunk) for chunk in chunks) + stream.flush()
    assert out == mask.bytes(data)
    assert key.encode() not in out


def test_a_stream_holds_back_only_what_could_begin_a_key() -> None:
    stream = KeyMask([KEY]).stream()
    assert stream.feed(b'data: {"a": 1}\n\n') == b'data: {"a": 1}\n\n'  # nothing held
    assert stream.feed(b"data: sk-li") == b"data: "
    assert stream.feed(b"ve-0123456789abcdef!") == MASK.encode() + b"!"
    assert stream.feed(b"sk-") == b"" and stream.flush() == b"sk-"
