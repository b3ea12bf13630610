"""The keys a request went upstream with, masked in everything that comes back: the one place that
keeps an upstream from handing a key to the agent, the records, the log or an export.

Owns: which values count as keys sent (every credential header's value, and a credential in the
query: compat/clients.py names both), masking them in bytes, text and headers, and in a stream whose
key may be split across chunks (held back only as long as a chunk ends in what could begin a key).
Does not own: choosing the key (relay.py) or reading the reply (upstream.py, which applies the mask
as it reads, so that everything after it, translation and records included, sees masked bytes).

Gateways and debugging proxies quote the key they were sent in a 401 ("Incorrect API key provided:
sk-…"); modeltap sent that key, so it knows what to look for. Values shorter than MIN_KEY_CHARS are
not masked: they would match ordinary text, and are no secret worth the name.

    mask = KeyMask(["sk-live-0123456789"])
    mask.bytes(b'{"error": "bad key sk-live-0123456789"}')   # b'{"error": "bad key [masked key]"}'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from multidict import CIMultiDict

from modeltap.compat.clients import credential_values, query_credentials, redacted_path

# What a key is replaced with: ASCII (it may land in a header) and JSON-safe (it lands in bodies).
MASK = "[masked key]"
# Shorter credentials are left alone: masking a 3-character "key" would garble ordinary text.
MIN_KEY_CHARS = 8


class KeyMask:
    """Masks every occurrence of the given keys (longest first, so a key inside a longer one is
    masked whole)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.keys = sorted({k for k in keys if len(k) >= MIN_KEY_CHARS}, key=len, reverse=True)
        alternatives = "|".join(re.escape(k) for k in self.keys)
        self._text = re.compile(alternatives) if self.keys else None
        self._bytes = re.compile(alternatives.encode("utf-8", "surrogatepass")) if self.keys else None
        self._prefixes = {k.encode("utf-8", "surrogatepass")[:n] for k in self.keys for n in range(1, len(k))}
        self.longest = max((len(k.encode("utf-8", "surrogatepass")) for k in self.keys), default=0)

    @classmethod
    def sent(cls, headers: Mapping[str, str], query: str, more: Iterable[str] = ()) -> KeyMask:
        """The mask of what a request goes upstream with: its credential headers' values and the
        credentials in its query (`?key=`), plus `more`."""
        return _cached(frozenset([*credential_values(headers), *query_credentials(query), *more]))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def bytes(self, data: bytes) -> bytes:
        return data if self._bytes is None else self._bytes.sub(MASK.encode(), data)

    def text(self, text: str) -> str:
        return text if self._text is None else self._text.sub(MASK, text)

    def headers(self, headers: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
        """Headers with every key masked in their values."""
        return CIMultiDict((name, self.text(value)) for name, value in headers)

    def stream(self) -> StreamMask:
        """A mask for one stream, fed chunk by chunk."""
        return StreamMask(self)


class StreamMask:
    """Masks keys in a stream fed chunk by chunk: a key split across chunks is masked too. Only the
    end of a chunk that could be the start of a key is held back (usually nothing), until the next
    chunk or `flush` says what it was.

        stream = mask.stream()
        out = stream.feed(b"...sk-live-01") + stream.feed(b"23456789...") + stream.flush()
    """

    def __init__(self, mask: KeyMask) -> None:
        self._mask = mask
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What of `chunk` (after what was held back) can be passed on now, masked."""
        mask = self._mask
        if not mask:
            return chunk
        data = self._held + chunk
        matched_to = 0
        assert mask._bytes is not None
        for found in mask._bytes.finditer(data):
            matched_to = found.end()
        cut = len(data)
        for start in range(max(matched_to, len(data) - mask.longest + 1), len(data)):
            if data[start:] in mask._prefixes:
                cut = start
                break
        self._held = data[cut:]
        return mask.bytes(data[:cut])

    def flush(self) -> bytes:
        """What was held back at the end of the stream (it was no key after all)."""
        held, self._held = self._held, b""
        return self._mask.bytes(held)


# One mask per set of keys, not per request: a session sends the same key on every turn.
_cached = functools.lru_cache(maxsize=1024)(KeyMask)


@dataclass(frozen=True, slots=True)
class MaskedReply:
    """What of an upstream's reply goes on: its URL as records show it, its headers and (read whole)
    its body, each without the keys the request was sent with; `mask` for the rest of a stream."""

    mask: KeyMask
    url: str
    headers: CIMultiDict[str]
    body: bytes


def masked_reply(
    sent: Mapping[str, str],
    query: str,
    url: str,
    headers: Iterable[tuple[str, str]],
    body: bytes = b"",
) -> MaskedReply:
    """A reply to a request sent with the credential headers `sent` and the query `query`, masked
    in one pass: every key masked in the URL (whose credential parameters are redacted too), the
    headers and the body."""
    mask = KeyMask.sent(sent, query)
    return MaskedReply(mask, redacted_path(mask.text(url)), mask.headers(headers), mask.bytes(body))
