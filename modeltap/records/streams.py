"""A recorded response as the stream that carried it, for the HAR export and the mock upstream.

Owns: `stream_events`: the raw SSE bytes when `serve --keep-raw-sse` kept them, else the events the
exchange's dialect synthesises from the assembled body (the shapes the clients accept:
docs/agents.md §2.1, §2.2). Synthesised streams carry each text, each tool call's arguments and each block in
one event: the original chunk boundaries exist only in raw SSE. Does not own: the formats' events
(modeltap.dialects) or the export formats (modeltap/exporters).
"""

from __future__ import annotations

from typing import Any

from modeltap import dialects
from modeltap.dialects.roles import Streams
from modeltap.dialects.sse import split_events


def asks_usage(request: Any) -> bool:
    """Whether a request asks for a usage chunk at the end of an OpenAI stream (`stream_options` may be
    anything a client sent: only an object saying `include_usage: true` asks)."""
    options = request.get("stream_options") if isinstance(request, dict) else None
    return isinstance(options, dict) and options.get("include_usage") is True


def stream_events(ex: dict[str, Any], raw: bytes | None, *, include_usage: bool | None = None) -> list[bytes]:
    """The recorded response of `ex` as SSE events, each ending in its blank line: `raw` split at event
    boundaries when it was kept, else synthesised from the assembled body. `include_usage` (default:
    what the recorded request asked for) says whether an OpenAI stream ends with a usage chunk. A
    stream that was cut short is synthesised without its final event, as it happened."""
    if raw is not None:
        return split_events(raw)
    request = ex.get("request")
    if not isinstance(request, dict):
        request = {}
    if include_usage is None:
        include_usage = asks_usage(request)
    dialect = dialects.of_record(ex["endpoint"])
    if not isinstance(dialect, Streams):
        return []
    events = dialect.synthesise(ex.get("response") or {}, include_usage)
    return events if ex.get("stream_complete") is not False else events[:-1]
