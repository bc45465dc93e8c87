"""The bare-handler ceiling `goqueue bench` measures beside GoQueue: aiohttp + uvloop +
msgspec answering POST /jobs by decoding the job, keeping it in a dict and answering 201
(no queue, no workers). Run as `python -m benchmarks.ceiling PORT`.

It is the same handler as the shared peer harness's `ceiling_server.py`, without the Redis
counter: the most an HTTP queue can reach with a given producer, and the CPU one request
costs on this machine, to which the supervisor's CPU per job is compared.
"""

from __future__ import annotations

import sys

import msgspec
import uvloop
from aiohttp import web

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def make_app() -> web.Application:
    """The bare app: POST /jobs, GET /health."""
    store: dict[str, object] = {}

    async def post(request: web.Request) -> web.Response:
        job = _decode(await request.read())
        job_id = str(len(store))
        store[job_id] = job
        body = _encode({"id": job_id, "status": "pending"})
        return web.Response(body=body, status=201, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/jobs", post)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", health)
    return app


if __name__ == "__main__":
    uvloop.install()
    web.run_app(make_app(), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
