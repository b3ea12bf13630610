"""An OTLP/HTTP traces sink for the export benchmark: a backend that takes every batch at once.

Owns: answering ``POST /v1/traces`` with an empty ``ExportTraceServiceResponse`` (whose protobuf encoding
is zero bytes) and counting the requests and bytes it took, shown at ``GET /stats``. Not: decoding
spans (the tests' receiver does that: tests/otlp_receiver.py).

    python -m benchmarks.otlp_sink --port 4318
"""

from __future__ import annotations

import argparse

from aiohttp import web

from benchmarks.processes import HOST

STATS = web.AppKey("stats", dict[str, int])


async def _traces(request: web.Request) -> web.Response:
    stats = request.app[STATS]
    stats["requests"] += 1
    stats["bytes"] += len(await request.read())
    return web.Response(body=b"", content_type="application/x-protobuf")


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATS])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = web.Application()
    app[STATS] = {"requests": 0, "bytes": 0}
    app.router.add_post("/v1/traces", _traces)
    app.router.add_get("/stats", _stats)
    web.run_app(app, host=HOST, port=args.port, print=None)


if __name__ == "__main__":
    main()
