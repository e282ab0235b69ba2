"""ConnectionsMiddleware: owns the worker's ConnectionsList, enforces the timeouts, serves the view.

With the server integration (``--http connlist.uvicorn:HttpToolsProtocol``)
the protocol feeds the list and the middleware only hands it over (through
the ASGI lifespan state) and serves the debug endpoint: requests pass straight
through: from its first request with the integration the middleware is a
``_PassThrough``, which returns the app's own coroutine (a frame of ours per
request would cost more than all of connlist's bookkeeping).  A handler that
was awaiting the body of a request connlist cut off gets Starlette's
``ClientDisconnect``; the server integration keeps that from the server log
(``connlist.uvicorn``).  At the lifespan shutdown the middleware writes the
log summary still pending.

Without it (plain uvicorn, hypercorn, ...) the middleware runs in ASGI-only
mode: it sees a request only once its headers are parsed, so it cannot enforce
the headers timeout, and it cannot see connections, only requests.  A request
with a body is a record of its own, from the scope's arrival until the app
returns; it is active until its last chunk is received, and the request
timeout and the minimum body rate apply to it (the rate's clock starts when
the app is called, and counts the body bytes the app has received).  A
request without a body has nothing left to time: it gets no record, only an
entry in ``Enforcer.in_flight`` that the view lists as handling while the
app runs (so it costs next to nothing).  When a request expires, the
middleware answers ``408`` with ``Connection: close`` if the response has not
started (the server then closes the connection and the app's pending
``receive()`` returns ``http.disconnect``), drops what the app sends after
that, and swallows the app's ``ClientDisconnect``.  If the response had
started, it cannot close the connection: the app's next ``receive()`` returns
``http.disconnect``.  Nor can it do what needs the transport: the send
timeout (ASGI does not say whether the client takes the response) and the
linger's abort (an app cannot abort its connection).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
from collections.abc import Awaitable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from connlist.connections import Connection, ConnectionsList, next_id
from connlist.debug import DEFAULT_LIMIT, DebugEndpoint, not_found, snapshot, snapshot_cooperatively
from connlist.enforcer import STATE_KEY, Enforcer, OnTimeout
from connlist.logs import route_to_uvicorn
from connlist.settings import (
    DEFAULT_BODY_GRACE,
    DEFAULT_BODY_MIN_RATE,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    Settings,
    resolve,
)
from connlist.workers import WorkerGroup

__all__ = ["ConnectionsMiddleware"]

logger = logging.getLogger("connlist")

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


class ConnectionsMiddleware:
    """Track connections, cut off slow clients with 408, and serve a live view of them.

    ``headers_timeout`` defaults to ``min(60, request_timeout)``;
    ``send_timeout`` bounds a response the client stopped taking;
    ``body_min_rate`` (bytes/s) applies to a body once ``body_grace`` has
    passed.  0 disables each; times are in seconds (docs/settings.md).
    ``debug_path=None`` turns the endpoint off; it is served to loopback
    clients only, or, with ``debug_token``, to clients presenting
    ``Authorization: Bearer <token>``.  ``on_timeout(connection, kind)`` is
    called for each connection a timeout cuts off (``kind`` is
    ``"headers"``, ``"request"``, ``"rate"`` or ``"send"``) before it is closed.
    With the endpoint on, the worker also serves its view to its sibling
    workers (``?workers=all``, ``connlist.workers``) from the lifespan startup
    to its shutdown.
    """

    # Slots, so that the switch to _PassThrough (and back) leaves attribute
    # access as fast as before it: a switch makes CPython 3.11 turn an
    # instance's inline attributes into a dict, which cost the pass-through
    # path about 800 instructions per request.  ``__dict__`` stays for what
    # the instance is given besides (the ``__call__`` of Python < 3.12, see
    # _PassThrough; a subclass's own attributes).
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_endpoint",
        "_enforcer",
        "_first_request_seen",
        "_starting",
        "_workers",
        "app",
        "debug_path",
    )

    def __init__(
        self,
        app: ASGIApp,
        *,
        headers_timeout: float | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        send_timeout: float = DEFAULT_SEND_TIMEOUT,
        body_min_rate: float = DEFAULT_BODY_MIN_RATE,
        body_grace: float = DEFAULT_BODY_GRACE,
        debug_path: str | None = "/_connections",
        debug_token: str | None = None,
        on_timeout: OnTimeout | None = None,
    ) -> None:
        settings = resolve(
            headers_timeout=headers_timeout,
            request_timeout=request_timeout,
            send_timeout=send_timeout,
            body_min_rate=body_min_rate,
            body_grace=body_grace,
        )
        if debug_path is not None and not isinstance(debug_path, str):
            raise TypeError(f"debug_path must be None or a str, got {type(debug_path).__name__}")
        if debug_path is not None and not debug_path.startswith("/"):
            raise ValueError(f"debug_path must be None or a path starting with '/', got {debug_path!r}")
        if debug_token is not None and not isinstance(debug_token, str):
            raise TypeError(f"debug_token must be None or a str, got {type(debug_token).__name__}")
        if debug_token == "":
            raise ValueError("debug_token must not be empty (None turns the token off)")
        if on_timeout is not None and not callable(on_timeout):
            raise TypeError("on_timeout must be callable or None")
        if inspect.iscoroutinefunction(on_timeout):
            # It is called from the timer callback, which cannot await.
            raise TypeError("on_timeout must be a plain function, not a coroutine function")
        self.app = app
        self.debug_path = debug_path
        self._enforcer = Enforcer(settings, on_timeout=on_timeout)
        # The sibling workers' view (workers=all): only with the endpoint on.
        self._workers = (
            None
            if debug_path is None
            else WorkerGroup(lambda limit: snapshot_cooperatively(self._enforcer, limit=limit))
        )
        self._endpoint = DebugEndpoint(lambda: self._enforcer, token=debug_token, workers=self._workers)
        self._first_request_seen = False
        self._starting: asyncio.Task[None] | None = None
        if sys.version_info < (3, 12):
            # See _PassThrough.
            self.__call__ = self._call_async  # type: ignore[method-assign]

    # -- public API ------------------------------------------------------------

    @property
    def connections(self) -> ConnectionsList:
        """This worker's ConnectionsList."""
        return self._enforcer.connections

    @property
    def headers_timeout(self) -> float:
        return self._enforcer.settings.headers_timeout

    @property
    def request_timeout(self) -> float:
        return self._enforcer.settings.request_timeout

    @property
    def send_timeout(self) -> float:
        return self._enforcer.settings.send_timeout

    @property
    def body_min_rate(self) -> float:
        return self._enforcer.settings.body_min_rate

    @property
    def body_grace(self) -> float:
        return self._enforcer.settings.body_grace

    @property
    def settings(self) -> Settings:
        """Every option's effective value."""
        return self._enforcer.settings

    @property
    def mode(self) -> str:
        """``"uvicorn-httptools"``, ``"uvicorn-h11"`` or ``"asgi"``."""
        return self._enforcer.mode

    @property
    def enforcer(self) -> Enforcer:
        return self._enforcer

    def snapshot(self, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        """What the debug endpoint serves, as JSON-ready data."""
        return snapshot(self._enforcer, limit=limit)

    # -- ASGI ------------------------------------------------------------------

    async def _call_async(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``__call__`` as a coroutine function, for ``inspect`` on Python 3.10 and 3.11 (_PassThrough)."""
        await type(self).__call__(self, scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type == "http":
            if not self._first_request_seen:
                self._first_request(scope)
            if self.debug_path is not None and scope["path"] == self.debug_path:
                if self._endpoint.allowed(scope):
                    await self._endpoint(scope, receive, send)
                else:
                    await not_found(send)
                return
            enforcer = self._enforcer
            if enforcer.mode != "asgi":
                # The server integration feeds the list: from now on, pass
                # requests straight through (see _PassThrough).
                if type(self) is ConnectionsMiddleware:
                    self.__class__ = _PassThrough
                await self.app(scope, receive, send)
                return
            # ASGI-only mode.  Does the request have a body?  (This and the
            # bookkeeping below are written out: it is most requests, and in
            # Python a call costs as much as any of them.)
            for name, value in scope["headers"]:
                if name == b"content-length":
                    if value.strip() not in (b"0", b""):
                        await self._asgi_only(scope, receive, send)
                        return
                    break
                if name == b"transfer-encoding":
                    await self._asgi_only(scope, receive, send)
                    return
            # No body: nothing to time, so no record; the view lists the
            # request while the app runs.
            totals = enforcer.totals
            totals.connections += 1
            totals.requests += 1
            in_flight = enforcer.in_flight
            ident = next_id()
            in_flight[ident] = (ident, enforcer.clock(), scope)
            try:
                await self.app(scope, receive, send)
            finally:
                del in_flight[ident]
            return
        if scope_type == "lifespan":
            # A server is starting: forget a timer left on the loop of an
            # earlier run of this app, then hand the enforcer to the server's
            # protocols (uvicorn passes this state dict to every protocol).
            # Its protocols announce their mode before the first request.
            if type(self) is _PassThrough:
                self.__class__ = ConnectionsMiddleware  # type: ignore[assignment]
            self._enforcer.cancel()
            state = scope.get("state")
            if state is not None:
                state[STATE_KEY] = self._enforcer
            route_to_uvicorn()
            receive = self._lifespan_receive(receive)
            workers = self._workers
            if workers is not None:
                # This worker's socket for its siblings, for as long as the server runs.
                await workers.start()
                try:
                    await self.app(scope, receive, send)
                finally:
                    workers.stop()
                return
        await self.app(scope, receive, send)

    def _lifespan_receive(self, receive: Receive) -> Receive:
        """The app's lifespan receive; at shutdown, what the log summary still holds is written."""

        async def receive_lifespan() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                self._enforcer.summary.flush(self._enforcer.clock(), force=True)
            return message

        return receive_lifespan

    def _first_request(self, scope: Scope) -> None:
        self._first_request_seen = True
        workers = self._workers
        if workers is not None and not workers.started:
            # The lifespan is off: serve the siblings from now on.
            self._starting = asyncio.get_running_loop().create_task(workers.start())
        state = scope.get("state")
        found = None if state is None else state.get(STATE_KEY)
        if found is not None and found is not self._enforcer:
            # The lifespan was off, so the protocol made a fallback enforcer
            # of its own: give it our settings and serve its list.
            found.configure(self._enforcer.settings, on_timeout=self._enforcer.on_timeout)
            self._enforcer = found
            logger.warning(
                "connlist: the ASGI lifespan is off, so the server integration ran with the default "
                "timeouts until this first request; turn the lifespan on to apply them from the start"
            )
        if self._enforcer.mode == "asgi":
            logger.warning(
                "connlist: ASGI-only mode: the request timeout (%gs) and the minimum body rate apply to "
                "request bodies, but the headers timeout and the send timeout need the server integration: "
                "serve with `uvicorn ... --http connlist.uvicorn:HttpToolsProtocol` "
                "(or connlist.uvicorn:H11Protocol)",
                self._enforcer.request_timeout,
            )

    async def _asgi_only(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI-only mode, a request with a body: a record, timed until its last chunk arrives."""
        enforcer = self._enforcer
        connections = enforcer.connections
        conn = connections.connect(client=scope.get("client"), server=scope.get("server"))
        connections.headers_complete(conn, scope["method"], scope["path"])
        if enforcer.settings.body_min_rate:
            connections.body_begin(conn)
        enforcer.totals.connections += 1
        enforcer.totals.requests += 1
        handle = _AsgiRequest(conn, send)
        conn.handle = handle
        enforcer.watch()

        async def receive_tracked() -> Message:
            if handle.cut:
                return _DISCONNECT
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
            if handle.cut:
                return  # timed out: the 408 went out, or the response was cut short
            if message["type"] == "http.response.start":
                handle.response_started = True
            await send(message)

        try:
            await self.app(scope, receive_tracked, send_tracked)
        except ClientDisconnect:
            if not handle.cut:
                raise  # not connlist's doing
        finally:
            connections.remove(conn)
            enforcer.unwatch()
            if handle.task is not None:
                await handle.task
            # Break the record <-> handle cycle: the handle holds the server's
            # send, and a server may hold the connection open until that is freed.
            conn.handle = None


class _PassThrough(ConnectionsMiddleware):
    """A ConnectionsMiddleware once the server integration feeds its list.

    The middleware switches to this class at its first request with the
    integration (and back at the next lifespan startup): an HTTP request
    that is not for the endpoint then passes straight through, the app's own
    coroutine returned rather than wrapped in one of ours (a coroutine frame
    costs more per request than all of connlist's own work).  Each mode's
    per-request path is then one function, with no test of the mode.
    Subclasses of ConnectionsMiddleware keep their class, and the general
    path.
    """

    __slots__ = ()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:  # type: ignore[override]
        # HTTP and websocket scopes have a path (a websocket passes through
        # on either path); a lifespan scope has none, and a try costs
        # nothing until it raises.
        try:
            path = scope["path"]
        except KeyError:
            return ConnectionsMiddleware.__call__(self, scope, receive, send)
        if path != self.debug_path:
            return self.app(scope, receive, send)
        return ConnectionsMiddleware.__call__(self, scope, receive, send)

    # Servers tell ASGI 3 apps from ASGI 2 ones by whether ``app.__call__``
    # is a coroutine function (uvicorn's Config.load, hypercorn's
    # _is_asgi_2, Starlette's is_async_callable), and may look again after
    # the switch (a second server for the same app).  This one returns a
    # coroutine without being one: from Python 3.12 it carries inspect's mark
    # (which asyncio's check honours too); before, inspect has no mark, so
    # ConnectionsMiddleware.__init__ gives the instance an ``async def``
    # ``__call__`` attribute, which ``app.__call__`` finds (calling the app
    # still goes through the class).
    if sys.version_info >= (3, 12):
        __call__ = inspect.markcoroutinefunction(__call__)


def _uncancel() -> bool:
    """Take back the handle's cancel of the current task; whether other cancels are pending (3.11+).

    Without it, 3.11's structured concurrency (``asyncio.timeout``, task
    groups) in the app would take the handled cancel for one of its own.
    """
    uncancel = getattr(asyncio.current_task(), "uncancel", None)
    return uncancel is not None and uncancel() > 0


class _AsgiRequest:
    """The ConnectionHandle of one request in ASGI-only mode.

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

    def connlist_close(self) -> None:
        self.connlist_close_expired()

    def connlist_abort(self) -> None:
        pass  # an ASGI app cannot abort its connection; the record goes when the app returns

    def connlist_request(self) -> tuple[str | None, str | None]:
        return None, None  # the record stores the request's method and path itself

    def connlist_pending(self) -> int:
        return 0  # never stalled: ASGI has no view of the transport

    def connlist_reading_paused(self) -> bool:
        # The bytes counted are the ones the app took: while it is not
        # waiting in receive(), a body that seems behind is the app's doing.
        return self.receiving is None
