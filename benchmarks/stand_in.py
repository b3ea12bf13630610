"""A fast stand-in upstream: an OpenAI-style chat completions server that answers at once.

Owns: the upstream every benchmark configuration talks to, so that what is measured is the proxy in
front of it. Not: realism (the test suite has the backend look-alikes with their errors and quirks).

Answers ``POST /v1/chat/completions`` and ``POST /chat/completions``. Non-streamed: one canned
``chat.completion``. Streamed: the first chunk at once, then ``STREAM_CONTENT_CHUNKS - 1`` more
``STREAM_GAP_S`` apart, a finish chunk, a usage chunk and ``data: [DONE]``.

    python -m benchmarks.stand_in --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import json

from aiohttp import hdrs, web

MODEL = "fake-model"
# Eight content chunks, as in the peer measurements of docs/peers.md §1.
STREAM_CONTENT_CHUNKS = 8
# A gap between chunks makes a proxy that buffers the stream show up in time to first byte (LiteLLM
# buffers SGLang streams: docs/peers.md §3.3); 1 ms keeps stream totals short.
STREAM_GAP_S = 0.001
# The marker load.py looks for, so a proxy that answers 200 with the wrong body counts as an error.
CONTENT_MARKER = "bench-ok"
# The sessions benchmark opens 1,000 connections within 0.1 s; aiohttp's default listen backlog (128)
# would drop some of them and time them as a SYN retry, not as the proxy's cost.
LISTEN_BACKLOG = 2048
# The scale benchmark sends 100k-token prompts (~0.5 MB), over aiohttp's 1 MiB default with room to spare.
MAX_BODY_BYTES = 64 * 1024 * 1024
USAGE = {"prompt_tokens": 200, "completion_tokens": STREAM_CONTENT_CHUNKS, "total_tokens": 208}


def _chunk(delta: dict[str, str], finish_reason: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    event = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [choice],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": f"{CONTENT_MARKER} " * STREAM_CONTENT_CHUNKS},
            }
        ],
        "usage": USAGE,
    }
).encode()
FIRST_CHUNK = _chunk({"role": "assistant", "content": f"{CONTENT_MARKER} "})
NEXT_CHUNK = _chunk({"content": f"{CONTENT_MARKER} "})
USAGE_EVENT = {
    "id": "chatcmpl-bench",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": MODEL,
    "choices": [],
    "usage": USAGE,
}
STREAM_TAIL = (
    _chunk({}, "stop") + b"data: " + json.dumps(USAGE_EVENT).encode() + b"\n\n" + b"data: [DONE]\n\n"
)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer one chat completion, streamed when the body asks for it."""
    body = json.loads(await request.read())
    if not body.get("stream"):
        return web.Response(body=COMPLETION, content_type="application/json")
    response = web.StreamResponse(
        headers={hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache"}
    )
    await response.prepare(request)
    await response.write(FIRST_CHUNK)
    for _ in range(STREAM_CONTENT_CHUNKS - 1):
        await asyncio.sleep(STREAM_GAP_S)
        await response.write(NEXT_CHUNK)
    await response.write(STREAM_TAIL)
    await response.write_eof()
    return response


def build_app() -> web.Application:
    """The stand-in's routes: chat completions with and without the ``/v1`` prefix."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="fast stand-in OpenAI-style upstream for benchmarks")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(
        build_app(), host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=LISTEN_BACKLOG
    )


if __name__ == "__main__":
    main()
