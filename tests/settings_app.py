"""A Starlette app whose ConnectionsMiddleware takes its options from ``CONNLIST_TEST_OPTIONS`` (JSON).

For the start-up tests (tests/test_startup_errors.py): a server given a bad
option must stop at start, naming it.
"""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware


async def hello(request: object) -> PlainTextResponse:
    return PlainTextResponse("hello\n")


app = Starlette(
    routes=[Route("/", hello)],
    middleware=[
        Middleware(ConnectionsMiddleware, **json.loads(os.environ.get("CONNLIST_TEST_OPTIONS", "{}")))
    ],
)
