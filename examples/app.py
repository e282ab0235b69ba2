"""The example Starlette app: connlist's middleware with the debug endpoint on.

Serve it as usual: the middleware turns the server integration (which the
headers timeout needs) on at the lifespan startup, and logs
``connlist: server integration on (uvicorn ..., httptools)``::

    python3 examples/serve.py
    # or: uvicorn examples.app:app

Try it: ``curl localhost:8000/``, ``curl -X POST -d hello localhost:8000/echo``,
``curl localhost:8000/_connections``; a client that connects and sends
nothing gets ``408 Request Timeout`` after ``CONNLIST_HEADERS_TIMEOUT`` seconds,
and the server's log says so (connlist's warning, then ``on_timeout``'s
line; serve.py configures both loggers).
"""

from __future__ import annotations

import logging
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware
from connlist.core.connections import Connection
from connlist.core.logs import format_address

logger = logging.getLogger("example")


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("Hello from connlist\n")


async def echo(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"received {len(body)} bytes\n")


def on_timeout(connection: Connection, kind: str) -> None:
    # Like Node's 'clientError': a place for metrics or a ban list.
    logger.info("on_timeout: cut off %s (%s timeout)", format_address(connection.client), kind)


app = Starlette(
    # Bodies are the app's to bound (connlist bounds the head, max_header_size): Starlette's own
    # limit answers a body over 1 MiB with 413.
    routes=[Route("/", hello), Route("/echo", echo, methods=["POST"], max_body_size=1024 * 1024)],
    middleware=[
        Middleware(
            ConnectionsMiddleware,
            headers_timeout=float(os.environ.get("CONNLIST_HEADERS_TIMEOUT", "10")),
            request_timeout=float(os.environ.get("CONNLIST_REQUEST_TIMEOUT", "30")),
            debug_path="/_connections",
            on_timeout=on_timeout,
        )
    ],
)
