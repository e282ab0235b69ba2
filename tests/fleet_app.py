"""tests/test_fleet.py's servers' app: connlist's middleware and /metrics, set from the environment.

``CONNLIST_HEADERS_TIMEOUT`` and ``CONNLIST_METRICS_INTERVAL`` as in
``examples/fastapi_app.py``.  ``CONNLIST_FLEET_INTEGRATION=off`` makes a
server whose integration is off (``server_integration="off"``).
"""

from __future__ import annotations

import os
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware
from connlist.prometheus import MetricsMiddleware


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("hello")


options: dict[str, Any] = {
    "headers_timeout": float(os.environ.get("CONNLIST_HEADERS_TIMEOUT", "10")),
    "debug_path": "/_connections",
}
if os.environ.get("CONNLIST_FLEET_INTEGRATION") == "off":
    options["server_integration"] = "off"

app = Starlette(
    routes=[Route("/", hello)],
    middleware=[
        Middleware(ConnectionsMiddleware, **options),
        Middleware(MetricsMiddleware, interval=float(os.environ.get("CONNLIST_METRICS_INTERVAL", "1"))),
    ],
)
