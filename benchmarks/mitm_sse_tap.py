"""mitmdump addon: relay SSE as it arrives and still keep its bytes in the recorded flow.

Owns: the recording half of the mitmproxy configuration. mitmproxy buffers SSE unless a response is
streamed, and a streamed body "will not be stored in any way"; passing a callable to
``flow.response.stream`` tees the chunks (docs/peers.md §4.1 and §10, the pattern
of mitmproxy issue #7010). Loaded by ``mitmdump -s``; runs in the mitmproxy venv, not ours.
"""

from __future__ import annotations

from typing import Any


def responseheaders(flow: Any) -> None:
    """Stream event-stream responses through a tap that saves them in ``flow.metadata['sse_body']``."""
    if "text/event-stream" not in flow.response.headers.get("content-type", ""):
        return
    chunks: list[bytes] = []

    def tap(data: bytes) -> bytes:
        chunks.append(data)
        if not data:  # mitmproxy calls the tap with b"" at the end of the stream
            flow.metadata["sse_body"] = b"".join(chunks)
        return data

    flow.response.stream = tap
