"""A Starlette app behind ConnectionsMiddleware, for the connection budget's tests (real uvicorn processes).

The middleware's options come from ``CONNLIST_OPTIONS`` (a JSON object).
``GET /`` answers at once; ``GET /busy?for=S`` is a request being served
for S seconds (real work, as far as the budget can tell).
"""

from __future__ import annotations

import asyncio
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


async def busy(request: Request) -> PlainTextResponse:
    await asyncio.sleep(float(request.query_params.get("for", "1")))
    return PlainTextResponse("served")


app = Starlette(
    routes=[Route("/", hello), Route("/busy", busy)],
    middleware=[Middleware(ConnectionsMiddleware, **json.loads(os.environ.get("CONNLIST_OPTIONS", "{}")))],
)
