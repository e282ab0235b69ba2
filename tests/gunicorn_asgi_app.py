"""Apps for tests/test_gunicorn_asgi.py, served by gunicorn's own ASGI worker (``gunicorn -k asgi``).

``app`` has ConnectionsMiddleware, its options from ``CONNLIST_OPTIONS`` (a
JSON object) and the debug endpoint at ``/_connections``; ``bare`` is the
same routes without connlist; ``echo`` is ``tests.servers.echo_app`` with
ConnectionsMiddleware so configured (``tests.targets``: the scenarios shared
with uvicorn).  ``/`` answers at once, ``/slow`` after
1.5 s, ``POST /upload`` reads the whole body, ``/big`` streams 16 MiB, and
``/ws`` echoes websocket messages.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from connlist import ConnectionsMiddleware
from tests.servers import echo_app

CHUNK = b"x" * 65536
BIG = 16 * 1024 * 1024


async def root(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def slow(request: Request) -> PlainTextResponse:
    await asyncio.sleep(1.5)
    return PlainTextResponse("slow")


async def upload(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"received {len(body)}")


async def big(request: Request) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(BIG // len(CHUNK)):
            yield CHUNK

    return StreamingResponse(chunks(), headers={"content-length": str(BIG)})


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async for message in websocket.iter_text():
        await websocket.send_text(message)


ROUTES = [
    Route("/", root),
    Route("/slow", slow),
    Route("/upload", upload, methods=["POST"]),
    Route("/big", big),
    WebSocketRoute("/ws", echo),
]

OPTIONS = json.loads(os.environ.get("CONNLIST_OPTIONS", "{}"))

bare = Starlette(routes=ROUTES)
app = Starlette(
    routes=ROUTES,
    middleware=[Middleware(ConnectionsMiddleware, debug_path="/_connections", **OPTIONS)],  # type: ignore[arg-type]
)
echo = ConnectionsMiddleware(echo_app, debug_path="/_connections", **OPTIONS)
