"""The walk of one request through modeltap's modules: which source files run it, in order.

A call trace (`sys.setprofile`) of one request through a real Proxy in this process: at each call and
return, the innermost frame that belongs to the modeltap package says which file ("room") the request
is in. Consecutive events in one file are one stay. A stay in a file the walk was in before, and
left, is a return: `returns = stays - rooms`. A relay whose stages each finish their work before the
next begins returns rarely; one whose work is scattered (the body read in three branches, the answer
headers rebuilt in five places, the exchange delivered from three) returns often.

    python -m tests.relay_walk     # the figures of a chat, a streamed chat and a translated Messages
                                   # stream, over every file and within the relay's (proxy/), and
                                   # each walk within proxy/

Runs against whatever `modeltap` imports (run from an older checkout to measure it the same way).
"""

from __future__ import annotations

import asyncio
import dis
import inspect
import json
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

import modeltap
from modeltap import Proxy, ProxyConfig

PACKAGE = str(Path(modeltap.__file__).parent)
_SUSPENDABLE = (
    inspect.CO_COROUTINE | inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
)
_YIELD_VALUE = dis.opmap["YIELD_VALUE"]

REPLY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "42"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
}


def _chunks() -> bytes:
    deltas = [{"role": "assistant", "content": ""}, {"content": "4"}, {"content": "2"}]
    events = [
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": d}]} for d in deltas
    ]
    events.append(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
    )
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


async def _chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("stream"):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_chunks())
        await response.write_eof()
        return response
    return web.json_response(REPLY)


@dataclass(frozen=True)
class Walk:
    """The files one request ran in, a stay each, in order."""

    stays: list[str]

    @property
    def rooms(self) -> int:
        return len(set(self.stays))

    @property
    def returns(self) -> int:
        return len(self.stays) - self.rooms

    def within(self, folder: str) -> Walk:
        """The walk through one folder's files only (`proxy/`: the relay's own modules)."""
        inside = [room for room in self.stays if room.startswith(folder)]
        return Walk([room for n, room in enumerate(inside) if n == 0 or inside[n - 1] != room])

    def describe(self) -> str:
        return f"{len(self.stays)} stays in {self.rooms} files, {self.returns} returns to a file already left"


def _suspends_or_resumes(frame: types.FrameType, event: str) -> bool:
    """Whether the event is a coroutine pausing at an await (a `return` at a yield) or taking up
    again (a `call` into a frame already under way): the request stays where it was, waiting."""
    if not frame.f_code.co_flags & _SUSPENDABLE:
        return False
    if event == "call":
        return frame.f_lasti > 0
    return frame.f_code.co_code[frame.f_lasti] == _YIELD_VALUE


@contextmanager
def traced() -> Iterator[list[str]]:
    """The modeltap files run while inside, one entry per stay (this thread only)."""
    stays: list[str] = []

    def innermost(frame: types.FrameType | None) -> str | None:
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(PACKAGE):
                return name[len(PACKAGE) + 1 :]
            frame = frame.f_back
        return None

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return") or _suspends_or_resumes(frame, event):
            return
        room = innermost(frame if event == "call" else frame.f_back)
        if room is not None and (not stays or stays[-1] != room):
            stays.append(room)

    sys.setprofile(profile)
    try:
        yield stays
    finally:
        sys.setprofile(None)


async def walk(path: str, body: dict[str, Any], *, config: dict[str, Any] | None = None) -> Walk:
    """The walk of one request of `body` to `path` through a Proxy in front of a chat-only upstream,
    after one request of the same kind warmed it (pools, first-use caches)."""
    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", _chat)
    runner = web.AppRunner(upstream)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "upstream": f"http://127.0.0.1:{port}/v1",
            "layout": "openai",
            "port": 0,
            "store": f"{tmp}/r.db",
        }
        async with (
            Proxy(ProxyConfig(**(settings | (config or {})))) as proxy,
            aiohttp.ClientSession() as client,
        ):
            url = f"http://127.0.0.1:{proxy.port}{path}"
            for attempt in range(2):
                with traced() if attempt else _untraced() as stays:
                    async with client.post(url, json=body) as response:
                        await response.read()
    await runner.cleanup()
    return Walk(stays)


@contextmanager
def _untraced() -> Iterator[list[str]]:
    yield []


CASES: dict[str, Callable[[], tuple[str, dict[str, Any], dict[str, Any]]]] = {
    "chat": lambda: (
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        {},
    ),
    "chat, streamed": lambda: (
        "/v1/chat/completions",
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        {},
    ),
    "messages, streamed, translated": lambda: (
        "/v1/messages",
        {"model": "m", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "hi"}]},
        {"layout": "chat-only"},
    ),
}


async def main() -> None:
    for name, case in CASES.items():
        path, body, config = case()
        found = await walk(path, body, config=config)
        relay = found.within("proxy/")
        print(f"{name}: {found.describe()}; within proxy/: {relay.describe()}")
        print("   " + " > ".join(relay.stays))


if __name__ == "__main__":
    asyncio.run(main())
