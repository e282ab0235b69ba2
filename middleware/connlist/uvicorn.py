"""uvicorn protocols that feed the worker's ConnectionsList, as Node.js's HTTP server does.

Use one of them as uvicorn's HTTP implementation::

    uvicorn app:app --http connlist.uvicorn:HttpToolsProtocol
    uvicorn.run(app, http=connlist.uvicorn.HttpToolsProtocol)

They subclass uvicorn's own protocols and *observe* them: everything
(parsing, keep-alive, pipelining, flow control, websockets) stays uvicorn's,
and connlist looks at uvicorn's state after each ``data_received`` to tell
which of the list's events happened in that read.  No parser callback is
overridden: httptools calls four of them for every request, and each Python
frame added there costs more than all of connlist's bookkeeping.

Theory of operation (httptools)
-------------------------------

uvicorn's httptools protocol makes a new ``scope`` dict when a message begins
(``on_message_begin``), a new ``RequestResponseCycle`` when its headers are
complete (``on_headers_complete``; the cycle holds its scope), and sets the
cycle's ``more_body`` to False when the message is complete.  A cycle created
while an earlier response is unfinished is queued (``pipeline``, newest on the
left) instead of started.  So, comparing ``scope``, ``cycle`` and the pipeline
before and after uvicorn's ``data_received``:

=====================  =============================================================
list event             seen after a read as
=====================  =============================================================
connect                ``connection_made``
message_begin          a scope that was not there before the read (one per scope
                       begun: the pipeline tells how many cycles are new)
headers_complete       a new cycle (the first belongs to the message that was
                       reading its headers, if any)
message_complete       ``cycle.more_body`` is False, or a later message began
remove                 ``connection_lost``, websocket upgrade
=====================  =============================================================

Every event of one read happens at the same instant, so the events are
replayed in order at the end of the read.  The common case, a whole request in
one read on an idle connection, is ``ConnectionsList.message``: a few
attribute updates, no link moved, no clock read.  Method and path are not
copied: the view asks the protocol (``connlist_request``), which has them in
its last cycle's scope.

One case hides the end of a message from uvicorn's state: an app that
responds before it has read the whole body.  uvicorn then ignores the rest of
the body (``on_body`` and ``on_message_complete`` return early once the
response is complete), so ``more_body`` stays True.  For the reads of such a
body, and only for them, connlist lends uvicorn a stand-in cycle
(``_BodyTail``) that drops the body and records ``more_body``.

Theory of operation (h11)
-------------------------

uvicorn's h11 protocol runs h11's state machine: a new cycle for each
``Request`` event (headers complete), and h11's ``their_state`` leaves
``SEND_BODY`` when the message is complete.  A message begins at its first
byte: a read while no request is open, or bytes h11 already buffered
(``trailing_data``) once a request ends.  With h11, a pipelined request that
arrives while the response to the previous one is still being written is held
unread by h11 (uvicorn pauses reading); it is timed from the moment the server
reads it.  httptools parses it at once, so it is timed from its first byte, as
in Node.js.

The ``ConnectionsMiddleware`` owns the list and hands it over in the ASGI
lifespan state, which uvicorn gives every protocol it creates.  With no
middleware (or with the lifespan off) the protocol still enforces the default
timeouts on a list of its own and logs once that it does so.
"""

from __future__ import annotations

import struct
import sys
from collections import deque
from typing import Any, ClassVar

import h11
import uvicorn
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http import h11_impl

from connlist.connections import Connection
from connlist.enforcer import STATE_KEY, Enforcer
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
# A new connection refused at max_connections, every connection being a request being served.
RESPONSE_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


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
    __slots__ = ("_connlist", "_connlist_phase", "_connlist_record")

    connlist_mode: ClassVar[str]
    _connlist_attributes_checked: ClassVar[bool] = False

    # Provided by uvicorn's protocol.
    transport: Any
    client: tuple[str, int] | None
    server: tuple[str, int | None] | None
    app_state: dict[str, Any]

    # Per worker: the enforcer and its list (shared by every connection).
    _connlist: Enforcer
    # Per connection: this connection's record (None until connection_made),
    # and where the message being received on it stands (_BETWEEN, ...).
    _connlist_record: Connection | None
    _connlist_phase: int

    def _connlist_setup(self) -> None:
        cls = type(self)
        if not cls._connlist_attributes_checked:
            _require_attributes(self, _COMMON_ATTRIBUTES)
            cls._connlist_attributes_checked = True
        enforcer = _enforcer_for(self.app_state)
        enforcer.mode = self.connlist_mode
        # Once per loop: the loop's accept failures, and uvicorn's keep-alive time.
        loop = getattr(self, "loop", None)
        if loop is not None and enforcer.attached_loop is not loop:
            enforcer.attach(loop, getattr(self, "timeout_keep_alive", None))
        self._connlist = enforcer
        self._connlist_record = None

    # -- asyncio.Protocol: the connection joins the list, and leaves it -------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._connlist_recordect()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connlist_remove()
        super().connection_lost(exc)  # type: ignore[misc]

    def _connlist_recordect(self) -> Connection:
        enforcer = self._connlist
        record = enforcer.connections.connect(client=self.client, server=self.server, handle=self)
        self._connlist_record = record
        enforcer.totals.connections += 1
        enforcer.admit(record)  # max_connections: may make room, or refuse this one
        enforcer.watch()
        return record

    def _connlist_remove(self) -> None:
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.remove(record)
            self._connlist.unwatch()
            # (A removed record is not responding: on_response_complete relies on it.)
            if record.handle is not None:
                # The record keeps what it showed; it stops asking the protocol.
                record.method, record.path = self.connlist_request()
            # Break the protocol <-> record cycle; a removed record needs no handle.
            record.handle = None

    # -- the body-rate feature's hooks (requests with a body only) -----------

    def _connlist_body_begin(self, record: Connection) -> None:
        """A read ended with the request's headers complete and its body not: the minimum rate times it.

        Called once per request that has a body still to come after a read,
        never for a request that arrived whole.
        """
        enforcer = self._connlist
        if enforcer.settings.body_min_rate:
            enforcer.connections.body_begin(record)

    @staticmethod
    def _connlist_body_bytes(record: Connection, n: int) -> None:
        """A later read of ``n`` bytes (framing included, and maybe the next request's first) for the body.

        Called for each read received while a request's body is incomplete,
        before its events: O(1), one addition.
        """
        record.body_received += n

    def _connlist_settle(self, record: Connection, phase: int, body_begins: bool) -> None:
        """Where a read (or a finished response) left the message being received; the timer follows."""
        if body_begins:
            self._connlist_body_begin(record)
        self._connlist_phase = phase
        if phase == _BETWEEN:
            self._connlist.unwatch()
        else:
            self._connlist.watch()  # the connection is active: it can expire

    # -- the send timeout: fed by flow control, which runs only under back-pressure

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        record = self._connlist_record
        enforcer = self._connlist
        if record is not None and enforcer.settings.send_timeout:
            enforcer.connections.stall(record, self.connlist_pending())
            enforcer.watch()

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.unstall(record)

    # -- the 408 decision, and what close_idle skips -------------------------

    def _connlist_response_written(self, record: Connection) -> bool:
        """Whether a 408 now would corrupt the response stream or follow this request's response."""
        # ``self.cycle`` is the current request's cycle once its headers are
        # in; before that it is the previous request's, which may still be
        # writing its response.
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        if cycle is None or not cycle.response_started:
            return False
        return not cycle.response_complete or record.headers_completed

    def _connlist_responding(self) -> bool:
        """Whether a response to a received request is unfinished."""
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        return cycle is not None and not cycle.response_complete

    # -- ConnectionHandle ----------------------------------------------------

    def connlist_request(self) -> tuple[str | None, str | None]:
        # The last cycle is the last request whose headers were received
        # (pipelined ones included); its scope has the method and path.
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        if cycle is None:
            return None, None
        scope = cycle.scope
        return scope.get("method"), scope.get("path")

    def _connlist_cycles(self) -> list[Any]:
        """The request cycles of this connection whose app may still run."""
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        return [] if cycle is None else [cycle]

    def _connlist_mark_cut(self) -> None:
        """The connection is being cut off: its apps' sends are dropped from now on, receives disconnect.

        uvicorn marks only its current cycle disconnected when the connection
        is lost; a cycle still running behind it (pipelining) would go on
        writing to a closed transport, which uvloop answers with an exception
        (a traceback per connection).  And the app's ``ClientDisconnect``
        (a handler awaiting the body) is connlist's doing, not the app's
        failure: each cycle's logger becomes one that leaves it out of the
        log (any other exception is logged as before).  Nothing of this runs
        per request.
        """
        for cycle in self._connlist_cycles():
            if not isinstance(cycle.logger, _AfterCut):
                cycle.logger = _AfterCut(cycle.logger)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def _connlist_linger(self) -> None:
        """A close connlist decided outside a sweep: abort the connection if it has not gone in time."""
        record = self._connlist_record
        if record is not None:
            enforcer = self._connlist
            enforcer.connections.linger(record)
            enforcer.bring_forward(enforcer.clock() + enforcer.linger)

    def connlist_close_expired(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        record = self._connlist_record
        if record is not None and not self._connlist_response_written(record):
            transport.write(RESPONSE_408)
        self._connlist_mark_cut()
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

    def connlist_refuse(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(RESPONSE_503)
            transport.close()
            self._connlist_linger()

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


class _AfterCut:
    """uvicorn's logger, as a request cycle of a connection connlist cut off sees it.

    The app's ``ClientDisconnect`` there is expected (its body was cut
    short), so uvicorn's "Exception in ASGI application" for it is left
    out; everything else goes to uvicorn's logger as before.
    """

    __slots__ = ("_logger",)

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), ClientDisconnect):
            return
        self._logger.error(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


# Where the message being received on a connection stands (both protocols).
_BETWEEN = 0  # no message open: a new or idle connection
_HEADERS = 1  # message begun, headers incomplete
_BODY = 2  # headers complete, message incomplete
_UPGRADED = 3  # handed over to the websocket protocol


def _headers_received(record: Connection, enforcer: Enforcer) -> None:
    # The request goes to the app (or is queued behind the running one).
    connections = enforcer.connections
    connections.headers_complete(record)
    connections.response_begin(record)
    enforcer.totals.requests += 1


class _Discard:
    """A body that keeps nothing: ``+=`` drops the bytes and the length stays 0."""

    __slots__ = ()

    def __iadd__(self, data: bytes) -> _Discard:
        return self

    def __len__(self) -> int:
        return 0


class _NoEvent:
    __slots__ = ()

    def set(self) -> None:
        pass


_DISCARD = _Discard()
_NO_EVENT = _NoEvent()


class _BodyTail:
    """Lent to uvicorn's httptools protocol as ``cycle`` while the rest of an unread body arrives.

    The real cycle's response is complete, so uvicorn ignores the body and
    never marks the message complete.  This one is not complete until the
    message is: uvicorn's ``on_body`` drops the bytes into ``_DISCARD``,
    ``on_message_complete`` sets ``more_body`` to False, and from then on it
    is complete, so a request that follows in the same read is started, not
    queued.  It is in place only during ``data_received``.
    """

    __slots__ = ("body", "more_body")
    message_event = _NO_EVENT

    def __init__(self) -> None:
        self.body = _DISCARD
        self.more_body = True

    @property
    def response_complete(self) -> bool:
        return not self.more_body


class _Pipeline(deque[Any]):
    """uvicorn's queue of pipelined requests, which also knows the request running ahead of them.

    uvicorn starts a request's app at once if the previous response is
    complete, else queues it here; the one running is then referenced by
    nobody but its task.  A connection connlist cuts off must mark it
    disconnected too (see ``_Tracking._connlist_mark_cut``), so the queue
    notes it when the first request is queued (the cycle uvicorn compared
    with, its local ``existing_cycle``) and whenever uvicorn starts the next.
    Both happen only with pipelining: a request that is not queued costs
    nothing more.
    """

    __slots__ = ("running",)

    def __init__(self) -> None:
        super().__init__()
        self.running: Any = None

    def appendleft(self, item: Any) -> None:
        if not self:
            # Called from uvicorn's on_headers_complete (rare: pipelining only).
            self.running = sys._getframe(1).f_locals.get("existing_cycle")
        super().appendleft(item)

    def pop(self) -> Any:  # type: ignore[override]  # deque.pop takes no index
        item = super().pop()
        self.running = item[0]  # uvicorn starts it now
        return item


if httptools_impl is not None:
    _require(httptools_impl.HttpToolsProtocol, (*_COMMON_HOOKS, "data_received"))

    _HttpTools = httptools_impl.HttpToolsProtocol
    # uvicorn's methods, called directly: a module global is found faster
    # than a class attribute, and these run for every read and response.
    _httptools_data_received = _HttpTools.data_received
    _httptools_on_response_complete = _HttpTools.on_response_complete

    class HttpToolsProtocol(_Tracking, httptools_impl.HttpToolsProtocol):
        """uvicorn's httptools protocol, feeding connlist from what each read changed (see above)."""

        connlist_mode = "uvicorn-httptools"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._connlist_setup()
            self._connlist_phase = _BETWEEN
            self.pipeline = _Pipeline()

        def _connlist_cycles(self) -> list[Any]:
            # The queued ones, the one running ahead of them, the newest.
            pipeline = self.pipeline
            cycles = [cycle for cycle, _ in pipeline]
            running = getattr(pipeline, "running", None)
            for cycle in (running, self.cycle):
                if cycle is not None:
                    cycles.append(cycle)
            return cycles

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._connlist_phase:
                self._connlist_read(data, self.scope, cycle)
                return
            _httptools_data_received(self, data)
            # The common case: no message was open, and one request began,
            # got its headers and completed in this read, with none queued.
            new = self.cycle
            if new is not cycle and not new.more_body and new.scope is self.scope and not self.pipeline:
                # Set by connection_made, before any read; a read never comes
                # after connection_lost or an upgrade, so the record is tracked.
                record: Connection = self._connlist_record  # type: ignore[assignment]
                if record.last_message_start == 0.0:
                    # ConnectionsList.message on an idle connection, written
                    # out: in Python a call costs as much as all of this.
                    # (headers_completed is True already: a record becomes
                    # idle only through message_complete, which these
                    # protocols send only after headers_complete.)
                    record.requests += 1
                    enforcer = self._connlist
                    if not record._responding:
                        record._responding = True
                        enforcer.connections._n_idle_responding += 1
                    enforcer.totals.requests += 1
                    return
            # Between messages, the last scope is the last cycle's.
            self._connlist_events(_BETWEEN, None if cycle is None else cycle.scope, cycle)

        def _connlist_read(self, data: bytes, scope: Any, cycle: Any) -> None:
            """A read while a message is open (or after an upgrade)."""
            phase = self._connlist_phase
            if phase == _BODY:
                record = self._connlist_record
                if record is not None:
                    self._connlist_body_bytes(record, len(data))
                if cycle.response_complete and cycle.more_body:
                    # The app responded before the body was in: see _BodyTail.
                    tail: Any = _BodyTail()
                    self.cycle = tail
                    try:
                        _HttpTools.data_received(self, data)
                    finally:
                        if self.cycle is tail:
                            self.cycle = cycle
                    if not tail.more_body:
                        cycle.more_body = False
                    self._connlist_events(phase, scope, cycle)
                    return
            _HttpTools.data_received(self, data)
            if phase != _UPGRADED:
                self._connlist_events(phase, scope, cycle)

        def _connlist_events(self, phase0: int, scope0: Any, cycle0: Any) -> None:
            """Replay the list events of the read that just ended, from uvicorn's state before and after."""
            record = self._connlist_record
            if record is None:
                return
            enforcer = self._connlist
            connections = enforcer.connections
            upgraded = self._connlist_phase == _UPGRADED
            scope = self.scope
            cycle = self.cycle
            # Cycles made in this read: the queued ones newer than cycle0,
            # and the one started directly if cycle0 was complete (then
            # nothing was queued before the read).
            new_cycles = 0
            if cycle is not cycle0:
                for queued, _app in self.pipeline:  # newest first
                    if queued is cycle0:
                        break
                    new_cycles += 1
                else:
                    if cycle0 is None or cycle0.response_complete:
                        new_cycles += 1
            # The open message's headers came in: the first new cycle is its.
            open_got_headers = phase0 == _HEADERS and new_cycles > 0
            begun_with_headers = new_cycles - open_got_headers
            # A message begun here and still reading its headers (or upgraded: no cycle).
            partial = scope is not scope0 and (cycle is None or cycle.scope is not scope)
            begun = begun_with_headers + partial
            if phase0 != _BETWEEN:
                if open_got_headers or (upgraded and not begun and phase0 == _HEADERS):
                    _headers_received(record, enforcer)
                    phase0 = _BODY
                # It ended if a later message began, or (as the last) if its body is in.
                if begun or (phase0 == _BODY and (upgraded or not cycle.more_body)):
                    connections.message_complete(record)
                    last = _BETWEEN
                else:
                    last = phase0
            else:
                last = _BETWEEN
            for i in range(begun):
                connections.message_begin(record)
                if i < begun_with_headers:
                    _headers_received(record, enforcer)
                    if i < begun - 1 or not cycle.more_body:
                        connections.message_complete(record)
                        last = _BETWEEN
                    else:
                        last = _BODY
                elif upgraded:
                    _headers_received(record, enforcer)
                    connections.message_complete(record)
                else:
                    last = _HEADERS
            if upgraded:
                self._connlist_remove()
                return
            body_begins = last == _BODY and bool(begun or phase0 != _BODY or open_got_headers)
            self._connlist_settle(record, last, body_begins)

        def on_response_complete(self) -> None:
            _httptools_on_response_complete(self)
            record: Connection = self._connlist_record  # type: ignore[assignment]  # set by connection_made
            # ConnectionsList.response_complete, written out (once per request).
            # self.cycle is the newest request's: if uvicorn has just started
            # a pipelined one, or any is still queued, it is not complete.
            # (A removed record is not responding: see _connlist_remove.)
            if record._responding and self.cycle.response_complete:
                record._responding = False
                if record.last_message_start == 0.0:
                    self._connlist.connections._n_idle_responding -= 1

        def handle_websocket_upgrade(self) -> None:
            # Upgraded connections are never timed out (Node: parser freed);
            # the record leaves the list once the read's events are replayed.
            self._connlist_phase = _UPGRADED
            super().handle_websocket_upgrade()

        def _connlist_response_written(self, record: Connection) -> bool:
            # With requests queued behind it, the running request is an
            # earlier one, whose response may be on the wire: never a 408.
            return bool(self.pipeline) or _Tracking._connlist_response_written(self, record)

        def _connlist_responding(self) -> bool:
            return bool(self.pipeline) or _Tracking._connlist_responding(self)

else:  # pragma: no cover - httptools missing

    def HttpToolsProtocol(*args: Any, **kwargs: Any) -> Any:  # type: ignore[no-redef]
        raise RuntimeError(
            "connlist.uvicorn:HttpToolsProtocol needs httptools: pip install 'connlist[httptools]', "
            "or use connlist.uvicorn:H11Protocol"
        )


_require(h11_impl.H11Protocol, (*_COMMON_HOOKS, "data_received"))

_H11 = h11_impl.H11Protocol


class H11Protocol(_Tracking, h11_impl.H11Protocol):
    """uvicorn's h11 protocol, feeding connlist by observing h11's state machine (see above)."""

    connlist_mode = "uvicorn-h11"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._connlist_setup()
        self._connlist_phase = _BETWEEN

    def data_received(self, data: bytes) -> None:
        phase = self._connlist_phase
        cycle = self.cycle
        if phase:
            record = self._connlist_record
            if phase == _BODY and record is not None:
                self._connlist_body_bytes(record, len(data))
            _H11.data_received(self, data)
            self._connlist_events(phase, cycle)
            return
        _H11.data_received(self, data)
        # The common case: a whole request in this read, nothing after it.
        if self.cycle is not cycle:
            h11_conn = self.conn
            if h11_conn.their_state is h11.DONE and not h11_conn.trailing_data[0]:
                record = self._connlist_record
                if record is not None and record.last_message_start == 0.0:
                    enforcer = self._connlist
                    enforcer.connections.message(record)
                    enforcer.totals.requests += 1
                    return
        self._connlist_events(_BETWEEN, cycle)

    def _connlist_events(self, phase0: int, cycle0: Any) -> None:
        """The list events of what h11 just processed (a read, or what a finished response let in)."""
        record = self._connlist_record
        phase = self._connlist_phase
        if record is None or phase == _UPGRADED:
            return  # an upgrade removed the record already
        enforcer = self._connlist
        connections = enforcer.connections
        their_state = self.conn.their_state
        new_request = self.cycle is not cycle0
        if new_request:
            # h11 produced a new Request: one at most per call, because h11
            # pauses at the end of each request until its response is done.
            if phase == _BODY:
                # The open request ended first (its response was already
                # complete, so h11 went on to the next one).
                connections.message_complete(record)
                phase = _BETWEEN
            if phase != _HEADERS:
                # Its first byte was held by h11 (pipelining), or the previous
                # request ended and this one began within the same call.
                connections.message_begin(record)
            _headers_received(record, enforcer)
            phase = _BODY
        if phase == _BODY and their_state is not h11.SEND_BODY:
            connections.message_complete(record)
            phase = _BETWEEN
        if phase == _BETWEEN and their_state is h11.IDLE and self.conn.trailing_data[0]:
            # The next request's first bytes are buffered: it has begun.
            connections.message_begin(record)
            phase = _HEADERS
        self._connlist_settle(record, phase, phase == _BODY and (new_request or phase0 != _BODY))

    def on_response_complete(self) -> None:
        phase = self._connlist_phase
        cycle = self.cycle
        _H11.on_response_complete(self)
        record = self._connlist_record
        if record is not None:
            # A finished response lets h11 go on to what it held.
            self._connlist_events(phase, cycle)
            if not self._connlist_responding():
                self._connlist.connections.response_complete(record)

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._connlist_phase = _UPGRADED
        self._connlist_remove()
        super().handle_websocket_upgrade(event)


AutoProtocol: type[Any] = H11Protocol if httptools_impl is None else HttpToolsProtocol
"""httptools when it is installed, else h11, as uvicorn's ``--http auto``."""
