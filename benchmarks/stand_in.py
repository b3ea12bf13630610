"""A fast stand-in upstream: an OpenAI-style chat completions server that answers at once.

Owns: the upstream every benchmark configuration talks to, so that what is measured is the proxy in
front of it. Not: realism (the test suite has the backend look-alikes with their errors and quirks).

Answers ``POST /v1/chat/completions`` and ``POST /chat/completions``, and vLLM's ``POST
/v1/completions`` with the prompt as ids (what ``serve --tokens exact`` sends: the prompt's ids back,
and the canned reply's ids in Qwen3's format, ``REPLY_TEXT``). Non-streamed: one canned
``chat.completion``. Streamed: the first chunk at once, then ``STREAM_CONTENT_CHUNKS - 1`` more
``STREAM_GAP_S`` apart, a finish chunk, a usage chunk and ``data: [DONE]``. With vLLM's
``return_token_ids`` it answers as vLLM does (docs/engines.md §1.2, §1.3): the prompt's ids (one per
``BYTES_PER_TOKEN`` bytes of the body, so they grow with the conversation) and each chunk's own ids.

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
# The stand-in's prompt "ids" with return_token_ids: one per four bytes of the request body, about what
# a BPE tokenizer makes of English and code, each taken from the body so that prompts sharing a
# beginning share their ids' beginning too, as a real engine's do.
BYTES_PER_TOKEN = 4
# The id of each content chunk's token, and of the end-of-turn token on the finish chunk (ChatML's).
CONTENT_ID = 9707
END_OF_TURN_ID = 151645


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
FINISH_CHUNK = _chunk({}, "stop")
AFTER_FINISH = b"data: " + json.dumps(USAGE_EVENT).encode() + b"\n\n" + b"data: [DONE]\n\n"
STREAM_TAIL = FINISH_CHUNK + AFTER_FINISH


def _with_ids(event: bytes, ids: list[int], prompt: list[int] | None = None) -> bytes:
    """A chunk of the canned stream with vLLM's `token_ids` (and `prompt_token_ids`) added."""
    chunk = json.loads(event[len(b"data: ") :])
    chunk["choices"][0]["token_ids"] = ids
    if prompt is not None:
        chunk["prompt_token_ids"] = prompt
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _prompt_ids(raw: bytes) -> list[int]:
    return list(raw[::BYTES_PER_TOKEN])


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Answer one chat completion, streamed when the body asks for it, with ids when asked."""
    raw = await request.read()
    body = json.loads(raw)
    ids = body.get("return_token_ids") is True
    if not body.get("stream"):
        if not ids:
            return web.Response(body=COMPLETION, content_type="application/json")
        answer = json.loads(COMPLETION)
        answer["prompt_token_ids"] = _prompt_ids(raw)
        answer["choices"][0]["token_ids"] = [CONTENT_ID] * STREAM_CONTENT_CHUNKS + [END_OF_TURN_ID]
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
    response = web.StreamResponse(
        headers={hdrs.CONTENT_TYPE: "text/event-stream", hdrs.CACHE_CONTROL: "no-cache"}
    )
    await response.prepare(request)
    await response.write(_with_ids(FIRST_CHUNK, [CONTENT_ID], _prompt_ids(raw)) if ids else FIRST_CHUNK)
    following = _with_ids(NEXT_CHUNK, [CONTENT_ID]) if ids else NEXT_CHUNK
    for _ in range(STREAM_CONTENT_CHUNKS - 1):
        await asyncio.sleep(STREAM_GAP_S)
        await response.write(following)
    await response.write(_with_ids(FINISH_CHUNK, [END_OF_TURN_ID]) + AFTER_FINISH if ids else STREAM_TAIL)
    await response.write_eof()
    return response


# What the canned model writes for a prompt of ids, in Qwen3's format: reasoning, then the marker.
REPLY_TEXT = f"<think>\nok\n</think>\n\n{CONTENT_MARKER}"
_REPLY_IDS: list[int] = []


def _reply_ids() -> list[int]:
    """`REPLY_TEXT`'s ids in the Qwen vocabulary the benchmarks serve, then the end of turn."""
    if not _REPLY_IDS:
        from tokenizers import Tokenizer  # with modeltap's budget extra, in the bench's venv

        from benchmarks.configs import qwen_tokenizer_dir

        tokenizer = Tokenizer.from_file(str(qwen_tokenizer_dir() / "tokenizer.json"))
        _REPLY_IDS.extend([*tokenizer.encode(REPLY_TEXT, add_special_tokens=False).ids, END_OF_TURN_ID])
    return _REPLY_IDS


async def completions(request: web.Request) -> web.StreamResponse:
    """vLLM's completions route for a prompt of ids: the prompt's ids, the canned reply's ids and text
    (without its end of turn), streamed a few ids a chunk when asked, with usage and `[DONE]`."""
    body = json.loads(await request.read())
    prompt = body["prompt"] if isinstance(body.get("prompt"), list) else []
    ids = _reply_ids()
    usage = {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "total_tokens": len(prompt) + len(ids),
    }

    def choice(piece: list[int], text: str, finish: str | None) -> dict[str, object]:
        return {"index": 0, "text": text, "token_ids": piece, "logprobs": None, "finish_reason": finish}

    if not body.get("stream"):
        answer = {"id": "cmpl-bench", "object": "text_completion", "model": MODEL, "usage": usage}
        answer["choices"] = [{**choice(ids, REPLY_TEXT, "stop"), "prompt_token_ids": prompt}]
        return web.Response(body=json.dumps(answer).encode(), content_type="application/json")
    response = web.StreamResponse(headers={hdrs.CONTENT_TYPE: "text/event-stream"})
    await response.prepare(request)
    pieces = [ids[i : i + 4] for i in range(0, len(ids), 4)]
    for n, piece in enumerate(pieces):
        streamed = choice(piece, "", "stop" if n == len(pieces) - 1 else None)
        if n == 0:
            streamed["prompt_token_ids"] = prompt
        await response.write(
            b"data: " + json.dumps({"id": "cmpl-bench", "choices": [streamed]}).encode() + b"\n\n"
        )
    tail = {"id": "cmpl-bench", "choices": [], "usage": usage}
    await response.write(b"data: " + json.dumps(tail).encode() + b"\n\ndata: [DONE]\n\n")
    await response.write_eof()
    return response


def build_app() -> web.Application:
    """The stand-in's routes: chat completions with and without the ``/v1`` prefix, and ``/health``."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    # vLLM's liveness route: rLLM's gateway takes a worker that fails it three times for dead.
    app.router.add_get("/health", health)
    return app


async def health(request: web.Request) -> web.Response:
    return web.Response()


def main() -> None:
    parser = argparse.ArgumentParser(description="fast stand-in OpenAI-style upstream for benchmarks")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    web.run_app(
        build_app(), host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=LISTEN_BACKLOG
    )


if __name__ == "__main__":
    main()
