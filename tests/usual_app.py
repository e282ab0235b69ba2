"""A FastAPI app that adds ConnectionsMiddleware and nothing else, served the ways its users serve it.

For tests/test_serve_as_usual.py: ``fastapi run``, ``uvicorn``, gunicorn's
usual worker.  The options come from ``CONNLIST_TEST_OPTIONS`` (JSON) over
short timeouts.  ``OwnProtocol`` is a user's own subclass of uvicorn's
protocol, which connlist must leave alone.
"""

from __future__ import annotations

import json
import os

from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from connlist import ConnectionsMiddleware

HEADERS_TIMEOUT = 1.0
REQUEST_TIMEOUT = 2.0

app = FastAPI()
app.add_middleware(
    ConnectionsMiddleware,
    **{
        "headers_timeout": HEADERS_TIMEOUT,
        "request_timeout": REQUEST_TIMEOUT,
        **json.loads(os.environ.get("CONNLIST_TEST_OPTIONS", "{}")),
    },
)


@app.get("/")
def root() -> dict[str, str]:
    return {"hello": "world"}


class OwnProtocol(HttpToolsProtocol):
    """A user's own protocol, built on uvicorn's."""
