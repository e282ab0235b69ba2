"""The apps and protocols that ``benchmarks/e2e.py`` serves with uvicorn.

Every setup answers ``GET /`` with Starlette's ``PlainTextResponse("Hello, world!")``:

``bare``
    the hello world, nothing else (``--http httptools``);
``with_connlist``
    the same with ``ConnectionsMiddleware()`` at its defaults; served with
    ``--http connlist.uvicorn:HttpToolsProtocol`` (integration + middleware, by
    the flag) and with plain ``--http httptools`` (the integration turned on at
    the lifespan, as users serve it);
``with_connlist_off``
    the same with ``server_integration="off"``, served with plain ``--http
    httptools`` (ASGI-only mode);
``with_connlist_no_budget``
    ``with_connlist`` with ``max_connections=0``, no connection budget: the
    list alone, as a default budget far above the connections gives, where
    the descriptor limit cannot be raised (``scale.py --budget off``);
``with_asyncio_timeout``
    the same with ``AsyncioTimeoutMiddleware``, a pure-ASGI middleware that
    wraps each request in ``asyncio.timeout(300)`` (``asyncio.wait_for`` before
    Python 3.11): the common way people bolt a timeout on;
``CallLaterProtocol``
    a subclass of uvicorn's ``HttpToolsProtocol`` with one ``loop.call_later``
    deadline per connection, armed in ``connection_made``, re-armed at each
    ``on_message_begin`` and cancelled at ``on_message_complete`` and
    ``connection_lost``: the other way seen in the wild (served with ``bare``);
``PaddedProtocol``
    a control, not a protection: uvicorn's ``HttpToolsProtocol`` with a
    loop of Python arithmetic in ``connection_made`` of about connlist's own
    instruction count per connection (``PADDING``; ``per_request.py
    --setups padded --workloads close`` reads it), on a few local small
    integers, so its code and data stay in the CPU's caches.  End to end
    (``e2e.py --close --setups padded``) it shows what that many
    instructions cost a connection when they miss nothing (served with
    ``bare``).

Both alternatives are written in their cheapest form: they only close (or
cancel), they send no ``408``, log nothing and count nothing, so what they cost
is a floor for the approach.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from connlist import ConnectionsMiddleware

__all__ = [
    "AsyncioTimeoutMiddleware",
    "CallLaterProtocol",
    "PaddedProtocol",
    "bare",
    "with_asyncio_timeout",
    "with_connlist",
    "with_connlist_no_budget",
    "with_connlist_off",
]

REQUEST_TIMEOUT = 300.0
CONNECTION_DEADLINE = 60.0


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("Hello, world!")


ROUTES = [Route("/", hello)]


class AsyncioTimeoutMiddleware:
    """Each HTTP request runs under ``asyncio.timeout(timeout)``: the usual bolt-on."""

    def __init__(self, app: ASGIApp, timeout: float = REQUEST_TIMEOUT) -> None:
        self.app = app
        self.timeout = timeout

    if sys.version_info >= (3, 11):

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await self.app(scope, receive, send)
                return
            async with asyncio.timeout(self.timeout):
                await self.app(scope, receive, send)

    else:  # pragma: no cover - Python 3.10

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await self.app(scope, receive, send)
                return
            await asyncio.wait_for(self.app(scope, receive, send), self.timeout)


class NoKeepAliveTimerProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol without its keep-alive timer, and nothing in its place.

    A reference, not a server to run: it never closes an idle connection.
    Its ``on_response_complete`` is uvicorn's (0.45 and later) less the
    ``loop.call_later`` that arms the keep-alive timer after each response,
    so the two differ by what that timer costs a request.
    """

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)


# Iterations of PaddedProtocol's loop: a little more than connlist's own
# instruction count per connection (benchmarks/README.md, "CPU time end to end").
PADDING = 31


class PaddedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol and about connlist's instruction count of cache-friendly work."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        HttpToolsProtocol.connection_made(self, transport)
        n = 0
        for i in range(PADDING):
            n = (n + i) & 127  # small integers: no object made
        self._padded = n


class CallLaterProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a per-connection ``loop.call_later`` deadline."""

    deadline = CONNECTION_DEADLINE

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._deadline_timer = self.loop.call_later(self.deadline, self._deadline_expired)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_timer = self.loop.call_later(self.deadline, self._deadline_expired)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        super().connection_lost(exc)

    def _deadline_expired(self) -> None:
        self._deadline_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


bare = Starlette(routes=ROUTES)
with_connlist = Starlette(routes=ROUTES, middleware=[Middleware(ConnectionsMiddleware)])
with_connlist_no_budget = Starlette(
    routes=ROUTES, middleware=[Middleware(ConnectionsMiddleware, max_connections=0)]
)
with_connlist_off = Starlette(
    routes=ROUTES, middleware=[Middleware(ConnectionsMiddleware, server_integration="off")]
)
with_asyncio_timeout = Starlette(routes=ROUTES, middleware=[Middleware(AsyncioTimeoutMiddleware)])
