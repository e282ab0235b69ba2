"""ASGI-only mode's feeder: what the middleware puts in the list when no connlist protocol serves it.

Without the server integration (plain uvicorn, hypercorn, granian...) the
middleware sees a request only once its headers are parsed, and never sees
its connection, so each request stands for a connection of its own, from the
scope's arrival until the app returns.  ``connlist.servers.uvicorn.protocols`` is the other
feeder, at the protocol level; ``docs/how-it-works.md`` ("ASGI-only mode")
says what each mode can enforce.

* A request without a body has nothing left to receive, so nothing to time.
  It is an entry in the list's table of requests received whole
  (``ConnectionsList.received``), from its arrival until the app returns;
  the list hands it to the view as a record in the ``handling`` state, and
  counts it like any other connection.  ``AsgiOnly.__call__`` writes the
  entry itself, with no call into the list: it runs for most requests.
* A request with a body (``Content-Length`` other than 0, or
  ``Transfer-Encoding``) is a record of its own, active, and
  timed, until its last chunk arrives: ``serve_with_body`` wraps the app's
  ``receive`` and ``send``.  When it expires, its handle (``AsgiRequest``)
  answers ``408`` with ``Connection: close`` if the response has not started
  (the server then closes the connection and the app's pending ``receive()``
  returns ``http.disconnect``), drops what the app sends after that, and
  swallows the app's ``ClientDisconnect``.  If the response had started, it
  cannot close the connection: the app's next ``receive()`` returns
  ``http.disconnect``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connlist.core.connections import ConnectionsList
from connlist.core.enforcer import Enforcer
from connlist.core.logs import logger
from connlist.core.records import Address, Connection

__all__ = ["AsgiOnly", "AsgiRequest", "serve_with_body"]

_DISCONNECT: Message = {"type": "http.disconnect"}
_408_START: Message = {
    "type": "http.response.start",
    "status": 408,
    "headers": [
        (b"connection", b"close"),
        (b"content-length", b"0"),
    ],
}
_408_BODY: Message = {"type": "http.response.body", "body": b""}


# The headers that frame a request's body.
_FRAMING = frozenset((b"content-length", b"transfer-encoding"))


class AsgiOnly:
    """The middleware's per-request path in ASGI-only mode, and what it reads.

    ``ConnectionsMiddleware`` makes one at its first request in this mode
    and routes its requests to it (its ``_route``) until the next lifespan
    startup; it is made again if the middleware's enforcer changes.  What it
    reads per request is in its slots, taken from the enforcer once: slot
    loads are the cheapest reads there are, and the enforcer's table, clock
    and totals need no chain of loads.

    In this mode each request is a connection of its own, so it is counted
    once in ``Totals.connections`` and once in ``Totals.requests``: the
    same fields the server integration counts, so the totals stay exact
    when the integration takes over at the next lifespan, with the same
    enforcer.  Its id is its request number (``Totals.requests`` after the
    increment; a record made by ``serve_with_body`` takes its number too),
    unique among this mode's records.  Drawing it from the process's id
    counter (``records.next_id``) instead would cost a call per
    request, and matter only to a list fed by both modes at once: a server switched
    while requests were in flight.  So a request without a body costs two
    increments, a clock reading and an entry in and out of a dict.
    """

    __slots__ = ("app", "clock", "debug_path", "enforcer", "received", "route", "totals")

    def __init__(
        self,
        app: ASGIApp,
        debug_path: str | None,
        enforcer: Enforcer,
        route: Callable[[Scope, Receive, Send], Awaitable[None]],
    ) -> None:
        self.app = app
        self.debug_path = debug_path
        self.enforcer = enforcer
        # The middleware's general path: lifespan, websockets, the endpoint.
        self.route = route
        self.totals = enforcer.totals
        self.received = enforcer.connections.received
        self.clock = enforcer.clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == self.debug_path:
            route = self.route
            await route(scope, receive, send)
            return
        # Does the request have a body?  The first framing header decides.
        # (Written out, as the entry is: see above; and one test per header,
        # a set's, costs less than two comparisons.)
        for name, value in scope["headers"]:
            if name in _FRAMING:
                if name == b"transfer-encoding" or value.strip() not in (b"0", b""):
                    await serve_with_body(self.enforcer, self.app, scope, receive, send)
                    return
                break
        # No body: counted, numbered, and an entry in the list while the app runs.
        totals = self.totals
        totals.connections += 1
        key = totals.requests = totals.requests + 1
        received = self.received
        # The clock and the app are loaded before they are called: called
        # as ``self.clock()``, a callable held in a slot is a method call
        # that CPython 3.11 cannot specialize.
        clock = self.clock
        received[key] = (clock(), scope)
        app = self.app
        try:
            await app(scope, receive, send)
        finally:
            del received[key]


async def serve_with_body(
    enforcer: Enforcer, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """A request with a body: a record, timed until its last chunk arrives, while ``app`` runs."""
    connections = enforcer.connections
    # Counted and numbered as AsgiOnly does: requests are connections here.
    totals = enforcer.totals
    totals.connections += 1
    key = totals.requests = totals.requests + 1
    conn = connections.connect(client=scope.get("client"), server=scope.get("server"), id=key)
    connections.headers_complete(conn, scope["method"], scope["path"])
    # A client that expects 100 Continue sends its body once the server
    # says so, which servers do at the app's first receive(): the rate
    # times the body from then (or from the response, if the app answers
    # without reading).
    continuing = bool(enforcer.settings.body_min_rate) and _expects_continue(scope)
    if enforcer.settings.body_min_rate and not continuing:
        connections.body_begin(conn)
    handle = AsgiRequest(conn, send)
    conn.handle = handle
    enforcer.watch()
    receive_tracked, send_tracked = _tracked(connections, conn, handle, continuing, receive, send)
    try:
        await app(scope, receive_tracked, send_tracked)
    except ClientDisconnect:
        if not handle.cut:
            raise  # not connlist's doing
    finally:
        # (The list lets go of the handle, which holds the server's send: a
        # server may hold the connection open until that is freed.)
        connections.remove(conn)
        if handle.task is not None:
            await handle.task


def _tracked(
    connections: ConnectionsList,
    conn: Connection,
    handle: AsgiRequest,
    continuing: bool,
    receive: Receive,
    send: Send,
) -> tuple[Receive, Send]:
    """``serve_with_body``'s wrappers of the app's ``receive`` and ``send``, which feed ``conn``.

    ``continuing``: the client waits for 100 Continue, so the body's timing
    starts at the app's first ``receive()`` or its response, whichever
    comes first (see ``serve_with_body``).
    """

    async def receive_tracked() -> Message:
        nonlocal continuing
        if handle.cut:
            return _DISCONNECT
        if continuing:
            continuing = False
            connections.body_begin(conn, conn.body_received)
        handle.receiving = asyncio.current_task()
        try:
            message = await receive()
        except asyncio.CancelledError:
            # Only the handle's cancel (it clears ``receiving`` first) turns into a disconnect.
            if not handle.cut or handle.receiving is not None or _uncancel():
                raise
            return _DISCONNECT
        finally:
            handle.receiving = None
        if handle.cut:
            return _DISCONNECT
        if message["type"] == "http.request":
            conn.body_received += len(message.get("body", b""))
            if not message.get("more_body", False):
                connections.message_complete(conn)
        else:
            connections.message_complete(conn)
        return message

    async def send_tracked(message: Message) -> None:
        nonlocal continuing
        if handle.cut:
            return  # timed out: the 408 went out, or the response was cut short
        if message["type"] == "http.response.start":
            handle.response_started = True
            if continuing:
                continuing = False
                connections.body_begin(conn, conn.body_received)
        await send(message)

    return receive_tracked, send_tracked


def _expects_continue(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"expect":
            return bool(value.strip().lower() == b"100-continue")
    return False


def _uncancel() -> bool:
    """Take back the handle's cancel of the current task; whether other cancels are pending (3.11+).

    Without it, 3.11's structured concurrency (``asyncio.timeout``, task
    groups) in the app would take the handled cancel for one of its own.
    """
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    return uncancel is not None and uncancel() > 0


class AsgiRequest:
    """The ConnectionHandle of one request with a body in ASGI-only mode.

    Once the request is cut off, the app's pending ``receive()`` must
    return too, and not only for the app's sake: a server may keep the
    connection open for as long as a read of the body is pending.  granian
    does (its pending receive holds hyper's body stream, and hyper keeps
    reading a body that someone still wants, ``Connection: close`` or not),
    until the client's next byte.  So the handle cancels the task waiting in
    the server's ``receive()`` (cancelling granian's future drops its read),
    and that ``receive()`` returns ``http.disconnect`` to the app.
    """

    __slots__ = ("conn", "cut", "receiving", "response_started", "send", "task")

    def __init__(self, conn: Connection, send: Send) -> None:
        self.conn = conn
        self.send = send
        self.cut = False
        self.response_started = False
        self.task: asyncio.Task[None] | None = None
        # The app's task while it waits in the server's receive(), else None.
        self.receiving: asyncio.Task[Any] | None = None

    def connlist_close_expired(self) -> None:
        if self.cut:
            return
        self.cut = True
        if self.response_started:
            self._stop_receiving()
        else:
            self.task = asyncio.get_running_loop().create_task(self._send_408())

    def _stop_receiving(self) -> None:
        task, self.receiving = self.receiving, None
        if task is not None:
            task.cancel()

    async def _send_408(self) -> None:
        try:
            await self.send(_408_START)
            await self.send(_408_BODY)
        except Exception:  # the client may be gone already
            logger.debug("sending 408 failed", exc_info=True)
        finally:
            # After the 408, so the server has the whole response before the app returns.
            self._stop_receiving()

    def connlist_close_idle(self) -> bool:
        return False  # a request in ASGI-only mode is never idle

    def connlist_close_keepalive(self) -> None:
        pass  # never asked: a request in ASGI-only mode is never idle

    def connlist_close(self) -> None:
        self.connlist_close_expired()

    def connlist_abort(self) -> None:
        pass  # an ASGI app cannot abort its connection; the record goes when the app returns

    def connlist_refuse(self) -> None:
        pass  # never asked: ASGI-only mode sees requests, not connections, and has no budget

    def connlist_request(self) -> tuple[str | None, str | None]:
        return None, None  # the record stores the request's method and path itself

    def connlist_address(self, own: bool) -> Address:
        return None  # the record stores the scope's addresses itself

    def connlist_pending(self) -> int:
        return 0  # never stalled: ASGI has no view of the transport

    def connlist_acked(self) -> tuple[int, int] | None:
        return None

    def connlist_reading_paused(self) -> bool:
        # The bytes counted are the ones the app took: while it is not
        # waiting in receive(), a body that seems behind is the app's doing.
        return self.receiving is None
