"""The app that ``benchmarks/attacks.py`` serves to ``slowhttptest``.

One Starlette app, three routes, one per attack mode:

``GET /``
    ``"Hello, world!"``: what the ordinary client (the probe) asks for, and
    the target of the slow-headers mode (``-H``), which never finishes its
    request anyway;
``GET /large``
    ``CONNLIST_ATTACK_LARGE`` bytes (default 2 MiB) in one body message, a
    fresh one per response: the target of the slow-read mode (``-X``, three
    pipelined requests per connection).  Together they must be more than
    the kernel queues for a socket (Linux's ``tcp_wmem`` maximum, 4 MiB by
    default; about 1.6 MB was queued on loopback here), so that a client
    that stops reading leaves the rest waiting in the server;
``POST /upload``
    awaits ``request.body()`` and answers its length: the target of the
    slow-body mode (``-B``);
``/ws``
    a websocket that echoes every text message until the client closes:
    the target of ``benchmarks/flood.py``'s websocket flood.

``bare`` is the app alone (served by bare uvicorn and hypercorn);
``with_connlist`` is the same wrapped in ``ConnectionsMiddleware``, with the
options read from the environment when the process starts:

=============================  ====================
``CONNLIST_HEADERS_TIMEOUT``   ``headers_timeout``
``CONNLIST_REQUEST_TIMEOUT``   ``request_timeout``
``CONNLIST_SEND_TIMEOUT``      ``send_timeout``
``CONNLIST_BODY_MIN_RATE``     ``body_min_rate``
``CONNLIST_BODY_GRACE``        ``body_grace``
=============================  ====================

Only the variables that are set are passed, so the middleware's own
defaults apply to the rest, and a connlist that does not know an option
yet is only asked for it by a run that sets it.
"""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from connlist import ConnectionsMiddleware

__all__ = ["OPTION_ENV", "bare", "connlist_options", "with_connlist"]

HELLO = b"Hello, world!"
LARGE_SIZE = int(os.environ.get("CONNLIST_ATTACK_LARGE", str(2 * 1024 * 1024)))

# ConnectionsMiddleware option -> the environment variable that sets it.
OPTION_ENV = {
    "headers_timeout": "CONNLIST_HEADERS_TIMEOUT",
    "request_timeout": "CONNLIST_REQUEST_TIMEOUT",
    "send_timeout": "CONNLIST_SEND_TIMEOUT",
    "body_min_rate": "CONNLIST_BODY_MIN_RATE",
    "body_grace": "CONNLIST_BODY_GRACE",
}


async def hello(request: Request) -> Response:
    return Response(HELLO, media_type="text/plain")


async def large(request: Request) -> Response:
    # A body of its own per response, as an app that renders or reads it has:
    # one shared bytes object would be queued by reference (uvloop does not
    # copy it), and a server holding unsent responses would seem to cost nothing.
    return Response(b"x" * LARGE_SIZE, media_type="application/octet-stream")


async def upload(request: Request) -> Response:
    body = await request.body()
    return PlainTextResponse(str(len(body)))


async def echo(websocket: WebSocket) -> None:
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass


def connlist_options(environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, float]:
    """The ConnectionsMiddleware options set in ``environ``, as floats."""
    options: dict[str, float] = {}
    for option, name in OPTION_ENV.items():
        value = environ.get(name)
        if value is not None and value != "":
            options[option] = float(value)
    return options


ROUTES = [
    Route("/", hello),
    Route("/large", large),
    Route("/upload", upload, methods=["POST"]),
    WebSocketRoute("/ws", echo),
]

bare = Starlette(routes=ROUTES)
with_connlist = Starlette(routes=ROUTES, middleware=[Middleware(ConnectionsMiddleware, **connlist_options())])
