"""uvicorn protocols that feed the worker's ConnectionsList, as Node.js's HTTP server does.

Use one of them as uvicorn's HTTP implementation::

    uvicorn app:app --http connlist.uvicorn:HttpToolsProtocol
    uvicorn.run(app, http=connlist.uvicorn.HttpToolsProtocol)

They subclass uvicorn's own protocols and only hook the parser callbacks, so
everything else (keep-alive, pipelining, flow control, websockets) stays
uvicorn's.  The events reach the list at the points Node.js feeds its own:

=====================  ===============================  =================================
list event             httptools                        h11
=====================  ===============================  =================================
connect                ``connection_made``              ``connection_made``
message_begin          ``on_message_begin``             first byte while no request is
                                                        open and h11 reads (after each
                                                        ``data_received`` and each
                                                        ``handle_events``)
headers_complete       ``on_headers_complete``          h11 produced a new ``Request``
message_complete       ``on_message_complete``          h11's ``their_state`` left
                                                        ``SEND_BODY``
remove                 ``connection_lost``, upgrade     ``connection_lost``, upgrade
=====================  ===============================  =================================

The ``ConnectionsMiddleware`` owns the list and hands it over in the ASGI
lifespan state, which uvicorn gives every protocol it creates.  With no
middleware (or with the lifespan off) the protocol still enforces the default
timeouts on a list of its own and logs once that it does so.

With h11, a pipelined request that arrives while the response to the previous
one is still being written is held unread by h11 (uvicorn pauses reading); it
is timed from the moment the server reads it.  httptools parses it at once, so
it is timed from its first byte, as in Node.js.
"""

from __future__ import annotations

import struct
from typing import Any, ClassVar

import h11
import uvicorn
from uvicorn.protocols.http import h11_impl

from connlist.connections import Connection
from connlist.enforcer import CUT_KEY, STATE_KEY, Enforcer
from connlist.logs import logger, route_to_uvicorn

try:  # Linux: the bytes in a socket's send queue that the peer has not acknowledged
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ  # SIOCOUTQ
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _OUTQ = None

try:
    from uvicorn.protocols.http import httptools_impl
except ImportError:  # httptools is not installed
    httptools_impl = None  # type: ignore[assignment]

__all__ = ["AutoProtocol", "H11Protocol", "HttpToolsProtocol"]

# The uvicorn releases CI runs the integration's tests on: the oldest
# supported one (0.36.0, the first whose --http takes an import string) and
# the newest at the time.  pyproject.toml has no upper bound; this check is
# what stops a future uvicorn whose hook points moved.
TESTED_UVICORN = "0.36.0 to 0.54.0"

RESPONSE_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


def _require(cls: type, names: tuple[str, ...]) -> None:
    """Fail at import, loudly, when a uvicorn release moved a method connlist hooks."""
    missing = [name for name in names if not callable(getattr(cls, name, None))]
    if missing:
        raise ImportError(
            f"connlist cannot hook uvicorn {uvicorn.__version__}: {cls.__module__}.{cls.__qualname__} "
            f"has no {', '.join(missing)}. connlist is tested with uvicorn {TESTED_UVICORN}; "
            "install one of those or serve without --http connlist.uvicorn:... (ASGI-only mode)."
        )


def _require_attributes(protocol: object, names: tuple[str, ...]) -> None:
    missing = [name for name in names if not hasattr(protocol, name)]
    if missing:
        raise RuntimeError(
            f"connlist cannot hook uvicorn {uvicorn.__version__}: {type(protocol).__qualname__} "
            f"instances (uvicorn's protocol underneath) have no {', '.join(missing)}"
        )


_COMMON_HOOKS = (
    "connection_made",
    "connection_lost",
    "handle_websocket_upgrade",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
)
_COMMON_ATTRIBUTES = ("transport", "client", "server", "cycle", "app_state")


def _enforcer_for(app_state: dict[str, Any]) -> Enforcer:
    """The enforcer the middleware put in the lifespan state, or this worker's fallback."""
    enforcer = app_state.get(STATE_KEY)
    if enforcer is None:
        enforcer = Enforcer()
        app_state[STATE_KEY] = enforcer
        route_to_uvicorn()
        logger.warning(
            "connlist: no ConnectionsMiddleware in the ASGI lifespan state; the server enforces the "
            "default timeouts (headers %gs, request %gs). Add ConnectionsMiddleware to the app, with "
            "the lifespan on, to configure them and serve the debug endpoint.",
            enforcer.headers_timeout,
            enforcer.request_timeout,
        )
    return enforcer


class _Tracking:
    """What both protocols add to uvicorn's: the list events and the connection handle."""

    # Slots, not instance attributes: CPython (3.11, 3.12) shares the keys
    # of an instance dict only up to 30 of them, and uvicorn's httptools
    # protocol has 28 by its first request.  Two more in the dict unshared it
    # and slow down every attribute access of uvicorn's own code, by about
    # 1% of a request.
    __slots__ = ("_connlist", "_connlist_conn")

    connlist_mode: ClassVar[str]
    _connlist_attributes_checked: ClassVar[bool] = False

    # Provided by uvicorn's protocol.
    transport: Any
    client: tuple[str, int] | None
    server: tuple[str, int | None] | None
    app_state: dict[str, Any]

    # Per worker: the enforcer and its list (shared by every connection).
    _connlist: Enforcer
    # Per connection: this connection's record (None until connection_made).
    _connlist_conn: Connection | None

    def _connlist_setup(self) -> None:
        cls = type(self)
        if not cls._connlist_attributes_checked:
            _require_attributes(self, _COMMON_ATTRIBUTES)
            cls._connlist_attributes_checked = True
        enforcer = _enforcer_for(self.app_state)
        enforcer.mode = self.connlist_mode
        self._connlist = enforcer
        self._connlist_conn = None

    # -- asyncio.Protocol: the connection joins the list, and leaves it -------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._connlist_connect()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connlist_remove()
        super().connection_lost(exc)  # type: ignore[misc]

    def _connlist_connect(self) -> Connection:
        enforcer = self._connlist
        conn = enforcer.connections.connect(client=self.client, server=self.server, handle=self)
        self._connlist_conn = conn
        enforcer.totals.connections += 1
        enforcer.watch()
        return conn

    def _connlist_remove(self) -> None:
        conn = self._connlist_conn
        if conn is not None:
            self._connlist.connections.remove(conn)
            # Break the protocol <-> record cycle; a removed record needs no handle.
            conn.handle = None

    # -- the body rate: a request with a body, and its reads ------------------

    def _connlist_body_begin(self, conn: Connection) -> None:
        """The request's headers are in and its body is still to come: the minimum rate times it."""
        enforcer = self._connlist
        if enforcer.settings.body_min_rate:
            enforcer.connections.body_begin(conn)

    # -- the send timeout: fed by flow control, which runs only under back-pressure

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        conn = self._connlist_conn
        enforcer = self._connlist
        if conn is not None and enforcer.settings.send_timeout:
            enforcer.connections.stall(conn, self.connlist_pending())

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        conn = self._connlist_conn
        if conn is not None:
            self._connlist.connections.unstall(conn)

    # -- the 408 decision, and what close_idle skips -------------------------

    def _connlist_response_written(self, conn: Connection) -> bool:
        """Whether a 408 now would corrupt the response stream or follow this request's response."""
        # ``self.cycle`` is the current request's cycle once its headers are
        # in; before that it is the previous request's, which may still be
        # writing its response.
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        if cycle is None or not cycle.response_started:
            return False
        return not cycle.response_complete or conn.headers_completed

    def _connlist_responding(self) -> bool:
        """Whether a response to a received request is unfinished."""
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        return cycle is not None and not cycle.response_complete

    # -- ConnectionHandle ----------------------------------------------------

    def _connlist_cycles(self) -> list[Any]:
        """The request cycles of this connection whose app may still run."""
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        return [] if cycle is None else [cycle]

    def _connlist_mark_cut(self) -> None:
        """The connection is being cut off: its apps' sends are dropped from now on, receives disconnect.

        uvicorn marks only its current cycle disconnected when the connection
        is lost; a cycle still running behind it (pipelining) would go on
        writing to a closed transport, which uvloop answers with an exception
        (a traceback per connection).  The scope mark tells the middleware
        that the app's ClientDisconnect is connlist's doing.
        """
        scope = getattr(self, "scope", None)
        if isinstance(scope, dict):
            scope[CUT_KEY] = True
        for cycle in self._connlist_cycles():
            cycle.scope[CUT_KEY] = True
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def _connlist_linger(self) -> None:
        """A close connlist decided outside a sweep: abort the connection if it has not gone in time."""
        conn = self._connlist_conn
        if conn is not None:
            enforcer = self._connlist
            enforcer.connections.linger(conn)
            enforcer.bring_forward(enforcer.clock() + enforcer.linger)

    def connlist_close_expired(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._connlist_mark_cut()
        conn = self._connlist_conn
        if conn is not None and not self._connlist_response_written(conn):
            transport.write(RESPONSE_408)
        # A close waits for the write buffer to drain, which a client that
        # reads nothing never lets happen: the enforcer aborts it after the linger.
        transport.close()

    def connlist_close_idle(self) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing() or self._connlist_responding():
            return False
        transport.close()
        self._connlist_linger()
        return True

    def connlist_close(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            self._connlist_linger()

    def connlist_abort(self) -> None:
        transport = self.transport
        if transport is not None:
            self._connlist_mark_cut()
            transport.abort()

    def connlist_reading_paused(self) -> bool:
        # uvicorn stops reading a body the app does not consume (64 KiB
        # buffered), and a request queued behind a pipelined one.
        flow: Any = getattr(self, "flow", None)
        return flow is not None and bool(flow.read_paused)

    def connlist_pending(self) -> int:
        transport = self.transport
        if transport is None:
            return 0
        pending: int = transport.get_write_buffer_size()
        if _OUTQ is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    queued = fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0")
                except OSError:  # closed meanwhile, or not a socket that has a send queue
                    pass
                else:
                    pending += struct.unpack("i", queued)[0]
        return pending


if httptools_impl is not None:
    _require(
        httptools_impl.HttpToolsProtocol,
        (
            *_COMMON_HOOKS,
            "on_message_begin",
            "on_headers_complete",
            "on_message_complete",
        ),
    )

    _HttpTools = httptools_impl.HttpToolsProtocol

    class HttpToolsProtocol(_Tracking, httptools_impl.HttpToolsProtocol):
        """uvicorn's httptools protocol, feeding connlist from the parser's callbacks.

        The callbacks run once per request each, so they call uvicorn's
        method directly (not through ``super()``) and make one call into the
        list.
        """

        connlist_mode = "uvicorn-httptools"

        # The cycle whose app runs (slots: see _Tracking): with pipelining,
        # ``self.cycle`` is the last one parsed, queued behind it.
        __slots__ = ("_connlist_running",)
        _connlist_running: Any

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._connlist_setup()
            self._connlist_running = None

        def data_received(self, data: bytes) -> None:
            conn = self._connlist_conn
            if conn is None:
                _HttpTools.data_received(self, data)
                return
            if conn._body_next is not conn:
                conn.body_received += len(data)
            _HttpTools.data_received(self, data)
            # Headers in and the message not complete after this read: a
            # body is still to come.
            if conn.headers_completed and conn._active_next is not conn and conn._body_next is conn:
                self._connlist_body_begin(conn)

        def on_message_begin(self) -> None:
            _HttpTools.on_message_begin(self)
            conn = self._connlist_conn
            if conn is not None:
                # No watch(): the enforcer keeps a timer armed while any connection is tracked.
                self._connlist.connections.message_begin(conn)

        def on_headers_complete(self) -> None:
            _HttpTools.on_headers_complete(self)
            if not self.pipeline:
                self._connlist_running = self.cycle  # started at once, not queued
            conn = self._connlist_conn
            if conn is not None:
                scope = self.scope
                enforcer = self._connlist
                enforcer.connections.headers_complete(conn, scope["method"], scope.get("path"))
                enforcer.totals.requests += 1

        def on_message_complete(self) -> None:
            _HttpTools.on_message_complete(self)
            conn = self._connlist_conn
            if conn is not None:
                self._connlist.connections.message_complete(conn)

        def on_response_complete(self) -> None:
            pipeline = self.pipeline
            if pipeline:
                self._connlist_running = pipeline[-1][0]  # the one uvicorn starts now
            _HttpTools.on_response_complete(self)
            conn = self._connlist_conn
            # uvicorn has just started the next pipelined request, if any.
            if conn is not None and not pipeline and self.cycle.response_complete:
                self._connlist.connections.response_complete(conn)

        def _connlist_cycles(self) -> list[Any]:
            # Marking a cycle twice is harmless: no need to drop duplicates.
            cycles = [cycle for cycle, _ in self.pipeline] if self.pipeline else []
            for cycle in (self._connlist_running, self.cycle):
                if cycle is not None:
                    cycles.append(cycle)
            return cycles

        def handle_websocket_upgrade(self) -> None:
            # Upgraded connections are never timed out (Node: parser freed).
            self._connlist_remove()
            super().handle_websocket_upgrade()

        def _connlist_response_written(self, conn: Connection) -> bool:
            # With requests queued behind it, the running request is an
            # earlier one, whose response may be on the wire: never a 408.
            return bool(self.pipeline) or _Tracking._connlist_response_written(self, conn)

        def _connlist_responding(self) -> bool:
            return bool(self.pipeline) or _Tracking._connlist_responding(self)

else:  # pragma: no cover - httptools missing

    def HttpToolsProtocol(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]
        raise RuntimeError(
            "connlist.uvicorn:HttpToolsProtocol needs httptools: pip install 'connlist[httptools]', "
            "or use connlist.uvicorn:H11Protocol"
        )


_require(h11_impl.H11Protocol, (*_COMMON_HOOKS, "data_received", "handle_events"))

# h11 phases of the request being received on a connection.
_BETWEEN = 0  # no request open: new or idle connection
_HEADERS = 1  # message begun, headers not yet parsed by h11
_BODY = 2  # headers parsed, body not complete
_UPGRADED = 3  # handed over to the websocket protocol


class H11Protocol(_Tracking, h11_impl.H11Protocol):
    """uvicorn's h11 protocol, feeding connlist by observing h11's state machine."""

    connlist_mode = "uvicorn-h11"

    # Per connection: where the request being received stands, and the
    # cycle of the last request whose headers were seen (slots: see _Tracking).
    __slots__ = ("_connlist_phase", "_connlist_seen")
    _connlist_phase: int
    _connlist_seen: h11_impl.RequestResponseCycle | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connlist_setup()
        self._connlist_phase = _BETWEEN
        self._connlist_seen = None

    def _connlist_begin(self, conn: Connection) -> None:
        self._connlist_phase = _HEADERS
        self._connlist.connections.message_begin(conn)

    def data_received(self, data: bytes) -> None:
        conn = self._connlist_conn
        if conn is not None:
            phase = self._connlist_phase
            # A byte while no request is open starts one, unless h11 holds it
            # unread behind a response still being written (their_state DONE).
            if phase == _BETWEEN and self.conn.their_state is h11.IDLE:
                self._connlist_begin(conn)
            elif phase == _BODY:
                conn.body_received += len(data)
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        conn = self._connlist_conn
        if conn is None or self._connlist_phase == _UPGRADED:
            return
        connections = self._connlist.connections
        cycle = self.cycle
        if cycle is not self._connlist_seen:
            # h11 produced a new Request since we last looked.
            self._connlist_seen = cycle
            if self._connlist_phase != _HEADERS:
                # Its first byte was held by h11 (pipelining), or the previous
                # request ended and this one began within the same call.
                self._connlist_begin(conn)
            scope = self.scope
            connections.headers_complete(conn, scope["method"], scope.get("path"))
            self._connlist.totals.requests += 1
            self._connlist_phase = _BODY
        their_state = self.conn.their_state
        if self._connlist_phase == _BODY:
            if their_state is not h11.SEND_BODY:
                connections.message_complete(conn)
                self._connlist_phase = _BETWEEN
            elif conn._body_next is conn:
                self._connlist_body_begin(conn)
        if self._connlist_phase == _BETWEEN and their_state is h11.IDLE and self.conn.trailing_data[0]:
            # The next request's first bytes were already buffered.
            self._connlist_begin(conn)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._connlist_conn is not None and not self._connlist_responding():
            self._connlist.connections.response_complete(self._connlist_conn)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._connlist_phase = _UPGRADED
        self._connlist_remove()
        super().handle_websocket_upgrade(event)


AutoProtocol: type[Any] = H11Protocol if httptools_impl is None else HttpToolsProtocol
"""httptools when it is installed, else h11, as uvicorn's ``--http auto``."""
