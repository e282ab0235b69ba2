"""A Starlette app with a websocket echo route behind ConnectionsMiddleware (real server processes).

The middleware's options come from ``CONNLIST_OPTIONS`` (a JSON object).
``GET /`` answers at once; ``/ws`` is a websocket that echoes every text
message until the client closes; ``GET /ws-handled`` says how many times
the websocket handler ran in this worker (a refused upgrade never runs it).
"""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from connlist import ConnectionsMiddleware

handled = 0


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def ws_handled(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(handled))


async def echo(websocket: WebSocket) -> None:
    global handled
    handled += 1
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass


app = Starlette(
    routes=[Route("/", hello), Route("/ws-handled", ws_handled), WebSocketRoute("/ws", echo)],
    middleware=[Middleware(ConnectionsMiddleware, **json.loads(os.environ.get("CONNLIST_OPTIONS", "{}")))],
)
