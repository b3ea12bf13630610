"""The floor: the barest aiohttp relay that forwards a request and streams the answer back.

Owns: the lowest cost a Python aiohttp proxy can have on this machine, against which modeltap is
judged (its goal: added latency within 1.5x of this). Not: anything modeltap does besides relaying
(no path rewriting, no budget, no recording).

    python -m benchmarks.relay_floor --upstream http://127.0.0.1:9000 --port 9001
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

from aiohttp import ClientSession, TCPConnector, hdrs, web

from benchmarks.stand_in import LISTEN_BACKLOG, MAX_BODY_BYTES

# Hop-by-hop headers (RFC 9110 §7.6.1) plus the ones aiohttp sets itself for the new connection.
DROPPED = {hdrs.CONNECTION, hdrs.KEEP_ALIVE, hdrs.TRANSFER_ENCODING, hdrs.HOST, hdrs.CONTENT_LENGTH, "TE"}
UPSTREAM = web.AppKey("upstream", str)
CLIENT = web.AppKey("client", ClientSession)


async def relay(request: web.Request) -> web.StreamResponse:
    """Forward one request as it came; stream the upstream's body back chunk by chunk."""
    headers = {k: v for k, v in request.headers.items() if k.title() not in DROPPED}
    url = request.app[UPSTREAM] + request.rel_url.path_qs
    async with request.app[CLIENT].request(
        request.method, url, data=await request.read(), headers=headers
    ) as upstream:
        response = web.StreamResponse(
            status=upstream.status,
            headers={k: v for k, v in upstream.headers.items() if k.title() not in DROPPED},
        )
        await response.prepare(request)
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
        await response.write_eof()
        return response


async def _client(app: web.Application) -> AsyncIterator[None]:
    # Bytes pass through untouched, so nothing is decompressed; no pool cap, as the load sets the pace.
    async with ClientSession(connector=TCPConnector(limit=0), auto_decompress=False) as client:
        app[CLIENT] = client
        yield


def main() -> None:
    parser = argparse.ArgumentParser(description="bare aiohttp relay (the benchmark floor)")
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(_client)
    app.router.add_route("*", "/{tail:.*}", relay)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None, backlog=LISTEN_BACKLOG)


if __name__ == "__main__":
    main()
