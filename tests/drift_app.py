"""The app the drift suite serves (tests/test_uvicorn_drift.py): echo_app behind the middleware, 1 s timeouts.

``/uvicorn`` answers the path of the uvicorn package the server imported, so
the test can tell that the changed copy is the one in use.
"""

from __future__ import annotations

import json
import os
from typing import Any

import uvicorn

from connlist import ConnectionsMiddleware
from tests.servers import echo_app

HEADERS_TIMEOUT = 1.0
REQUEST_TIMEOUT = 1.0


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http" and scope["path"] == "/uvicorn":
        body = f"{uvicorn.__version__} {uvicorn.__file__}".encode()
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await echo_app(scope, receive, send)


# CONNLIST_TEST_OPTIONS (JSON): more options, for the refusals (server_integration="required").
app = ConnectionsMiddleware(
    _app,
    headers_timeout=HEADERS_TIMEOUT,
    request_timeout=REQUEST_TIMEOUT,
    **json.loads(os.environ.get("CONNLIST_TEST_OPTIONS", "{}")),
)
