"""A Starlette app behind ConnectionsMiddleware, for tests that run uvicorn as a real process.

The middleware's options come from ``CONNLIST_OPTIONS`` (a JSON object).
``POST /upload`` awaits ``request.body()``, as most handlers do, so a client
cut off mid-body makes Starlette raise ``ClientDisconnect`` in the handler.
"""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def upload(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"received {len(body)}")


app = Starlette(
    routes=[Route("/", hello), Route("/upload", upload, methods=["POST"])],
    middleware=[Middleware(ConnectionsMiddleware, **json.loads(os.environ.get("CONNLIST_OPTIONS", "{}")))],
)
