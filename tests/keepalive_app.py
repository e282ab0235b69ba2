"""Two apps for tests/test_keepalive.py: ``bare`` (no connlist) and ``app`` (with ConnectionsMiddleware).

The same routes: ``/`` answers at once, ``/slow`` after 1.5 s, ``/ws``
echoes websocket messages.
The keep-alive time is uvicorn's ``--timeout-keep-alive``, the other
timeouts long enough never to matter here.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from connlist import ConnectionsMiddleware


async def root(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def slow(request: object) -> PlainTextResponse:
    # Longer than the tests' keep-alive time.
    await asyncio.sleep(1.5)
    return PlainTextResponse("slow")


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    async for message in websocket.iter_text():
        await websocket.send_text(message)


ROUTES = [Route("/", root), Route("/slow", slow), WebSocketRoute("/ws", echo)]

bare = Starlette(routes=ROUTES)
app = Starlette(
    routes=ROUTES,
    middleware=[Middleware(ConnectionsMiddleware, headers_timeout=30, request_timeout=60)],  # type: ignore[arg-type]
)
