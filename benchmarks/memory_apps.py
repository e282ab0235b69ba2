"""The app that ``benchmarks/memory.py`` serves to the clients that try to take a worker's memory.

One Starlette app, two routes:

``GET /``
    ``"Hello, world!"``: what the readiness check and the ordinary client
    (the probe) ask for, and the target of the head attacks, which never
    finish their request anyway;
``POST /slow``
    reads the body, sleeps 50 ms, then answers ``slept``: the target of the
    pipelining attack, an endpoint slower than a client can pipeline.

``bare`` is the app alone; ``with_connlist`` is the same wrapped in
``ConnectionsMiddleware()`` with its defaults and no option at all: what a
user who adds the middleware and nothing else runs.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from connlist import ConnectionsMiddleware

__all__ = ["HELLO", "SLEEP", "SLEPT", "bare", "with_connlist"]

HELLO = b"Hello, world!"
SLEPT = b"slept"
# How long POST /slow takes: what a pipelining client waits for per request.
SLEEP = 0.050


async def hello(request: Request) -> Response:
    return Response(HELLO, media_type="text/plain")


async def slow(request: Request) -> Response:
    await request.body()
    await asyncio.sleep(SLEEP)
    return Response(SLEPT, media_type="text/plain")


ROUTES = [Route("/", hello), Route("/slow", slow, methods=["POST"])]

bare = Starlette(routes=ROUTES)
with_connlist = Starlette(routes=ROUTES, middleware=[Middleware(ConnectionsMiddleware)])
