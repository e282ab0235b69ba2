"""uvicorn protocols that feed the worker's ConnectionsList, as Node.js's HTTP server does.

``ConnectionsMiddleware`` puts them in place of uvicorn's own at the ASGI
lifespan startup (``connlist.integration``), so an app served as usual
(``uvicorn app:app``, ``fastapi run``) runs them.  They can also be named
outright as uvicorn's HTTP implementation::

    uvicorn app:app --lifespan on --http connlist.uvicorn:HttpToolsProtocol
    uvicorn.run(app, http=connlist.uvicorn.HttpToolsProtocol, lifespan="on")

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

When uvicorn changes
--------------------

All of the above reads parts of uvicorn that are not public API.  So the
names ``HttpToolsProtocol``, ``H11Protocol`` and ``AutoProtocol`` are not
plain classes: the first lookup of each (uvicorn's ``Config.load``, before
the server starts) builds connlist's class on uvicorn's and checks it in
memory (``connlist.selfcheck``).  If the check fails, the name is uvicorn's
own class: the server serves as with ``--http httptools`` (ASGI-only mode),
and one ERROR line says what failed, what is lost and what to do
(``CONNLIST_REQUIRE_INTEGRATION=1``: the import fails instead).  The classes
that pass are exactly the code above; nothing of the check runs per request.
"""

from __future__ import annotations

import importlib
import re
import sys
import threading
from collections import deque
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar

import h11
import uvicorn

from connlist import integration, selfcheck
from connlist.connections import Connection
from connlist.enforcer import STATE_KEY, Enforcer
from connlist.integration import TESTED_RANGE, TESTED_UVICORN
from connlist.logs import follow_uvicorn_logger, log, logger, route_to_uvicorn
from connlist.server import AfterCut, TransportHandle, enforcer_in

try:
    from uvicorn.protocols.http import h11_impl
except ImportError:  # pragma: no cover - a uvicorn that moved it: the self-check reports it
    h11_impl = None  # type: ignore[assignment]
try:
    from uvicorn.protocols.http import httptools_impl
except ImportError:  # httptools is not installed
    httptools_impl = None  # type: ignore[assignment]

__all__ = ["AutoProtocol", "H11Protocol", "HttpToolsProtocol"]

# The methods of uvicorn's protocols that connlist overrides (the self-check
# looks for them before it builds a class on them).
_COMMON_HOOKS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "handle_websocket_upgrade",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
)
# The slots connlist adds to uvicorn's protocol (see _Tracking).
_SLOTS = ("_connlist", "_connlist_phase", "_connlist_record")


def _enforcer_for(app_state: dict[str, Any], protocol: Any = None) -> Enforcer:
    """The enforcer the middleware put in the lifespan state, or this worker's fallback.

    Without one the worker's first connection says why, once: uvicorn's
    default ``--lifespan auto`` takes any exception raised while Starlette
    builds its middleware (a bad connlist option) for an app without a
    lifespan, and serves on; that is an ``ERROR``, since every request will
    fail the same way.  Which case it is comes from uvicorn's config (the
    lifespan setting) and from the app uvicorn loaded: a Starlette app whose
    middleware stack was never built, or was built with ConnectionsMiddleware
    in it, had its lifespan fail; one without ConnectionsMiddleware declared
    simply has none.
    """
    enforcer = enforcer_in(app_state)
    if enforcer is None:
        enforcer = Enforcer()
        app_state[STATE_KEY] = enforcer
        route_to_uvicorn()
        # (Looked up only here, once per worker: this runs for every connection.)
        config = getattr(protocol, "config", None)
        lifespan = getattr(config, "lifespan", None)
        declared = _declares_middleware(getattr(config, "loaded_app", None))
        defaults = (
            f"the server enforces the default timeouts (headers {enforcer.headers_timeout:g}s, "
            f"request {enforcer.request_timeout:g}s)"
        )
        if lifespan == "off":
            # The middleware adopts the fallback at its first request (and says so).
            log.warning(
                "the ASGI lifespan is off, so no ConnectionsMiddleware handed over its settings; "
                "%s until the first request. Serve with --lifespan on.",
                defaults,
            )
        elif declared is False or lifespan == "on":
            # (With --lifespan on, a failed lifespan would have stopped the server.)
            log.warning(
                "no ConnectionsMiddleware in the ASGI lifespan state; %s. Add "
                "ConnectionsMiddleware to the app, with the lifespan on, to configure them and serve the "
                "debug endpoint.",
                defaults,
            )
        elif declared:
            log.error(
                "the app's ASGI lifespan failed, so its ConnectionsMiddleware never started "
                "(uvicorn's --lifespan auto takes an exception at startup, such as a bad connlist option, "
                "for a lifespan the app does not support); %s and every request may fail with that "
                "exception. Serve with --lifespan on to see it and stop at start.",
                defaults,
            )
        else:
            log.error(
                "no ConnectionsMiddleware in the ASGI lifespan state: the app has none, or its "
                "lifespan failed (uvicorn's --lifespan auto takes an exception at startup, such as a bad "
                "connlist option, for a lifespan the app does not support); %s. Serve with --lifespan on "
                "to see the exception and stop at start.",
                defaults,
            )
    return enforcer


def _declares_middleware(app: Any) -> bool | None:
    """Whether the app uvicorn loaded has a ConnectionsMiddleware; None if it cannot be told.

    Follows ``.app`` through uvicorn's own wrappers (proxy headers, the
    message logger) and other middlewares to a ConnectionsMiddleware or a
    Starlette app; a Starlette app's declared middleware (``user_middleware``)
    says.  Once per worker, at its first connection.
    """
    from starlette.applications import Starlette

    from connlist.middleware import ConnectionsMiddleware

    for _ in range(32):  # bounded: a cycle of .app attributes must not stop a worker
        if isinstance(app, ConnectionsMiddleware):
            return True
        if isinstance(app, Starlette):
            # What Starlette builds its stack from, whether or not it was built.
            return any(
                isinstance(m.cls, type) and issubclass(m.cls, ConnectionsMiddleware)
                for m in app.user_middleware
            )
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class _Tracking(TransportHandle):
    """What both protocols add to uvicorn's: the list events, and what the handle reads of uvicorn's state.

    The handle's transport methods are ``connlist.server.TransportHandle``'s;
    the duties of a feeder are ``connlist.server.Feeder``'s.
    """

    # Slots, not instance attributes: CPython (3.11, 3.12) shares the keys
    # of an instance dict only up to 30 of them, and uvicorn's httptools
    # protocol has 28 by its first request.  Two more in the dict unshared it
    # and slow down every attribute access of uvicorn's own code, by about
    # 1% of a request.  They are declared on the class built on uvicorn's
    # (``_subclass``: ``_SLOTS``), not here: a mixin with slots of its own
    # cannot be combined with a uvicorn protocol that has ``__slots__`` too
    # ("multiple bases have instance lay-out conflict").
    if TYPE_CHECKING:
        __slots__ = _SLOTS
    else:
        __slots__ = ()

    connlist_mode: ClassVar[str]

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
        # (What connlist reads of uvicorn's protocol was checked once, before
        # the class was handed to uvicorn: connlist.selfcheck.)
        enforcer = _enforcer_for(self.app_state, self)
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
        self._connlist_connect()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connlist_remove()
        super().connection_lost(exc)  # type: ignore[misc]

    def _connlist_connect(self) -> Connection:
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
            if record.handle is not None:
                # The record keeps what it showed; it stops asking the protocol.
                record.method, record.path = self.connlist_request()
            # Break the protocol <-> record cycle; a removed record needs no handle.
            record.handle = None

    # -- the body-rate feature's hooks (requests with a body only) -----------

    def _connlist_body_begin(self, record: Connection) -> None:
        """A read ended with the request's headers complete and its body not: the minimum rate times it.

        Called once per request that has a body still to come after a read,
        never for a request that arrived whole.  The body bytes of this read
        count too: the app's task has not run yet, so the request's cycle
        (the newest, ``self.cycle``) still holds exactly them.  A client
        that asked for ``100 Continue`` sends its body once the server says
        so, which uvicorn does at the app's first ``receive()``: until then
        (or until the app answers without reading), the body is not timed
        by the rate; only the request timeout applies.
        """
        enforcer = self._connlist
        if not enforcer.settings.body_min_rate:
            return
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        # Read directly: the self-check found both on uvicorn's cycle, with
        # these meanings, before this class was handed to uvicorn (a default
        # here would hide a rename and time a body the client may not send).
        # (bytes or a bytearray, as uvicorn's release has it)
        record.body_received = len(cycle.body)
        if cycle.waiting_for_100_continue:
            self._connlist_after_continue(record, cycle)
        else:
            enforcer.connections.body_begin(record, record.body_received)

    def _connlist_after_continue(self, record: Connection, cycle: Any) -> None:
        """Start the body's clock when uvicorn sends ``100 Continue``, or the app answers without reading.

        uvicorn hands the app the cycle's ``receive`` and ``send`` when its
        task first runs, after this read: the cycle gets its own, which note
        the moment and call uvicorn's.  (Only for a request that expects
        ``100 Continue``; the bytes received meanwhile go on counting.)  A
        uvicorn that called the app with other callables would bypass them:
        the self-check drives both cases, and falls back if they do not
        start the clock.
        """
        receive = cycle.receive
        send = cycle.send
        connections = self._connlist.connections

        def begin() -> None:
            # Still this request's body (the connection's last cycle), not yet begun.
            if self._connlist_record is record and self.cycle is cycle and self._connlist_phase == _BODY:  # type: ignore[attr-defined]
                connections.body_begin(record, record.body_received)

        def receive_after_continue() -> Any:
            if cycle.waiting_for_100_continue:
                begin()  # uvicorn writes 100 Continue as this receive() starts
            return receive()

        def send_after_continue(message: Any) -> Any:
            if cycle.waiting_for_100_continue and message.get("type") == "http.response.start":
                begin()  # answered without asking for the body
            return send(message)

        cycle.receive = receive_after_continue
        cycle.send = send_after_continue

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
            enforcer.connections.stall(record, self.connlist_pending(), self.connlist_acked())
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
            if not isinstance(cycle.logger, AfterCut):
                cycle.logger = AfterCut(cycle.logger)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def connlist_reading_paused(self) -> bool:
        # uvicorn stops reading a body the app does not consume (64 KiB
        # buffered), and a request queued behind a pipelined one.
        flow: Any = getattr(self, "flow", None)
        return flow is not None and bool(flow.read_paused)


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


def _end_open_message(
    record: Connection,
    enforcer: Enforcer,
    phase0: int,
    got_headers: bool,
    begun: int,
    upgraded: bool,
    cycle: Any,
) -> int:
    """httptools: the events of the message that was open when a read began; where it stands after.

    ``phase0`` is where it stood (``_HEADERS`` or ``_BODY``), ``got_headers``
    whether its headers came in, ``begun`` how many messages began after it
    in the read, ``cycle`` uvicorn's newest cycle.
    """
    # Its headers came in: a new cycle, or the upgrade (which makes none) if it was the last.
    if got_headers or (upgraded and not begun and phase0 == _HEADERS):
        _headers_received(record, enforcer)
        phase0 = _BODY
    # It ended if a later message began, or (as the last) if its body is in.
    if begun or (phase0 == _BODY and (upgraded or not cycle.more_body)):
        enforcer.connections.message_complete(record)
        return _BETWEEN
    return phase0


def _begun_messages(
    record: Connection,
    enforcer: Enforcer,
    with_headers: int,
    begun: int,
    upgraded: bool,
    cycle: Any,
    last: int,
) -> int:
    """httptools: the events of the ``begun`` messages a read began; where the last stands after.

    The first ``with_headers`` of them got their headers (each a cycle); the
    one after them, if any, is still reading its headers, unless the read
    ended in an upgrade: then it is the upgrade request (whole, but no
    cycle).  ``last`` is where the connection stood before them.
    """
    connections = enforcer.connections
    for i in range(begun):
        connections.message_begin(record)
        if i < with_headers:
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
    return last


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


# What mypy checks the mixins against: uvicorn's classes.  At run time the
# mixins derive from object, and ``_subclass`` puts uvicorn's class after them.
if TYPE_CHECKING:
    _HttpToolsBase = httptools_impl.HttpToolsProtocol
    _H11Base = h11_impl.H11Protocol
else:
    _HttpToolsBase = _H11Base = object


if httptools_impl is not None:
    _HttpTools = httptools_impl.HttpToolsProtocol
    # The two methods of uvicorn's that every read and every response go
    # through, as module globals: one lookup each, where
    # ``_HttpTools.data_received`` is two (a global, then a class attribute)
    # and ``super()`` more.  (A release that lacks one fails the self-check
    # before any is called.)
    _httptools_data_received: Any = getattr(_HttpTools, "data_received", None)
    _httptools_on_response_complete: Any = getattr(_HttpTools, "on_response_complete", None)

    class _HttpToolsTracking(_Tracking, _HttpToolsBase):
        """uvicorn's httptools protocol, feeding connlist from what each read changed (see above)."""

        __slots__ = ()

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
                    # ConnectionsList.message on an idle record: one request
                    # more, responding; the feeder's own writes, on which no
                    # count of the list depends (connlist.connections).
                    record.requests += 1
                    record.responding = True
                    self._connlist.totals.requests += 1
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
                        _httptools_data_received(self, data)
                    finally:
                        if self.cycle is tail:
                            self.cycle = cycle
                    if not tail.more_body:
                        cycle.more_body = False
                    self._connlist_events(phase, scope, cycle)
                    return
            _httptools_data_received(self, data)
            if phase != _UPGRADED:
                self._connlist_events(phase, scope, cycle)

        def _connlist_events(self, phase0: int, scope0: Any, cycle0: Any) -> None:
            """Replay the list events of the read that just ended, from uvicorn's state before and after.

            In order: the message open at the read's start (``phase0``) gets
            its headers and ends; then the messages begun in the read, each
            begun, given its headers and ended, but the last, which may still
            be reading its headers or body; then where the read left the
            connection (or, after an upgrade, its removal).
            """
            record = self._connlist_record
            if record is None:
                return
            enforcer = self._connlist
            upgraded = self._connlist_phase == _UPGRADED
            scope = self.scope
            cycle = self.cycle
            new_cycles = self._connlist_new_cycles(cycle0, cycle)
            # The open message's headers came in: the first new cycle is its.
            open_got_headers = phase0 == _HEADERS and new_cycles > 0
            begun_with_headers = new_cycles - open_got_headers
            # A message begun here and still reading its headers (or upgraded: no cycle).
            partial = scope is not scope0 and (cycle is None or cycle.scope is not scope)
            begun = begun_with_headers + partial
            last = _BETWEEN
            if phase0 != _BETWEEN:
                last = _end_open_message(record, enforcer, phase0, open_got_headers, begun, upgraded, cycle)
            last = _begun_messages(record, enforcer, begun_with_headers, begun, upgraded, cycle, last)
            if upgraded:
                self._connlist_remove()
                return
            # A body began in this read: a message begun here, or the open
            # one's, if its headers came in (it was not in its body before).
            body_begins = last == _BODY and bool(begun or phase0 != _BODY or open_got_headers)
            self._connlist_settle(record, last, body_begins)

        def _connlist_new_cycles(self, cycle0: Any, cycle: Any) -> int:
            """How many cycles the read made, from the newest before it (``cycle0``) and after (``cycle``).

            The queued ones newer than cycle0, and the one started directly
            if cycle0 was complete (then nothing was queued before the read).
            """
            if cycle is cycle0:
                return 0
            n = 0
            for queued, _app in self.pipeline:  # newest first
                if queued is cycle0:
                    return n
                n += 1
            if cycle0 is None or cycle0.response_complete:
                n += 1
            return n

        def on_response_complete(self) -> None:
            _httptools_on_response_complete(self)
            # ConnectionsList.response_complete, the feeder's own write (see
            # connlist.connections).  self.cycle is the newest
            # request's: if uvicorn has just started a pipelined one, or any
            # is still queued, it is not complete.
            if self.cycle.response_complete:
                record: Connection = self._connlist_record  # type: ignore[assignment]  # set by connection_made
                record.responding = False

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
    _HttpToolsTracking = None  # type: ignore[misc]


_H11: Any = None if h11_impl is None else h11_impl.H11Protocol


class _H11Tracking(_Tracking, _H11Base):
    """uvicorn's h11 protocol, feeding connlist by observing h11's state machine (see above)."""

    __slots__ = ()

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
                    # ConnectionsList.message on an idle record (as httptools').
                    record.requests += 1
                    record.responding = True
                    self._connlist.totals.requests += 1
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


# -- the classes handed to uvicorn: built, checked, or uvicorn's own ----------
#
# ``connlist.uvicorn:HttpToolsProtocol`` and the others are looked up by
# uvicorn (``Config.load``) before the server starts.  The first lookup of
# each builds connlist's class on uvicorn's and checks it
# (``connlist.selfcheck``); if anything fails, the name gives uvicorn's own
# class instead, and one ERROR line says what failed and what is lost.  So
# each class is checked once per process, when it is first used, and only
# the ones used are checked.

_PARSERS = {
    # parser -> (the module of uvicorn's class, the class's name, connlist's mixin)
    "httptools": ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol", _HttpToolsTracking),
    "h11": ("uvicorn.protocols.http.h11_impl", "H11Protocol", _H11Tracking),
}
# connlist's name for each parser's class.
_NAMES = {"httptools": "HttpToolsProtocol", "h11": "H11Protocol"}
# Each parser's class as a --http flag gets it (connlist's, or uvicorn's in its place).
_resolved: dict[str, type[Any]] = {}
# Each parser's build and check (_checked), shared by the flag and the automatic path.
_built: dict[str, tuple[type[Any] | None, type | None, selfcheck.Result]] = {}
_lock = threading.RLock()
_newer_warned = False

# The outcome of each parser's check, once it ran (connlist.selfcheck.Result).
CHECKS: dict[str, selfcheck.Result] = {}


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version: "0.55.0rc1" -> (0, 55, 0)."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _connlist_version() -> str:
    try:
        return metadata.version("connlist")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed (a source tree)
        from connlist import __version__

        return __version__


def _subclass(name: str, mixin: type, base: type) -> type[Any]:
    """connlist's protocol: the mixin's methods over uvicorn's class, with connlist's slots.

    The slots are declared here, on the one class that has uvicorn's as a
    base, so that a uvicorn protocol with ``__slots__`` of its own is no
    layout conflict (see _Tracking).
    """
    namespace = {"__slots__": _SLOTS, "__module__": __name__, "__qualname__": name, "__doc__": mixin.__doc__}
    return type(name, (mixin, base), namespace)


def _build(parser: str) -> tuple[type[Any] | None, type | None, selfcheck.Result]:
    """connlist's class for ``parser`` built on uvicorn's and checked (once per process, see _checked).

    Returns (connlist's class if it passed, uvicorn's class if found, the check's result).
    """
    module_name, base_name, mixin = _PARSERS[parser]
    name = _NAMES[parser]
    base: type | None = None
    cls: type[Any] | None = None
    try:
        module = importlib.import_module(module_name)
        base = getattr(module, base_name, None)
        if not isinstance(base, type):
            raise selfcheck.CheckFailed(f"{module_name} has no class {base_name}")
        selfcheck.check_static(base, _COMMON_HOOKS, parser)
        try:
            cls = _subclass(name, mixin, base)
        except TypeError as exc:
            raise selfcheck.CheckFailed(
                f"connlist's class cannot be built on uvicorn's {name}: {exc}"
            ) from None
    except selfcheck.CheckFailed as failed:
        result = selfcheck.Result(str(failed))
    except ImportError as exc:
        result = selfcheck.Result(f"uvicorn has no {module_name} ({exc})")
    else:
        result = selfcheck.run_in_thread(cls, base, parser)
    CHECKS[parser] = result
    if result.logger_name:
        # connlist's lines go wherever uvicorn's protocols write theirs.
        follow_uvicorn_logger(result.logger_name)
    if not result.passed:
        return None, base, result
    assert cls is not None
    integration.record_pass(cls)
    _warn_if_newer()
    return cls, base, result


def _checked(parser: str) -> tuple[type[Any] | None, type | None, selfcheck.Result]:
    """``_build``'s outcome for ``parser``, built once per process: both paths below share it."""
    with _lock:
        built = _built.get(parser)
        if built is None:
            built = _built[parser] = _build(parser)
        return built


def _integrate(parser: str) -> type[Any]:
    """The class a ``--http connlist.uvicorn:...`` flag names: connlist's, or uvicorn's in its place."""
    integration.require_integration()  # a bad value stops the start here, naming the variable
    cls, base, result = _checked(parser)
    if cls is not None:
        return cls
    return _fall_back(parser, base, result.failure or "")


def for_server(parser: str, *, required: bool) -> tuple[type[Any] | None, str | None]:
    """The automatic path: connlist's class for the server's own ``parser`` protocol, or why not.

    The middleware calls it at the lifespan startup when the server runs
    uvicorn's own ``parser`` class (``connlist.integration.turn_on``).  On a
    failed check the reason is recorded for the view, and the ERROR line is
    logged unless ``required``, where the middleware's refusal to start
    says it instead.
    """
    cls, base, result = _checked(parser)
    if cls is not None:
        return cls, None
    what, advice = _failure_text(parser, result.failure or "")
    reason = f"uvicorn {uvicorn.__version__}: {_NAMES[parser]}: {result.failure}"
    if base is not None:
        integration.record_failure(base, reason)
    if required:
        return None, f"{what}. {advice}"
    route_to_uvicorn()
    log.error(
        "the server integration is off: %s. The server keeps uvicorn's own %s protocol and connlist runs in "
        "ASGI-only mode: request bodies are still timed (request timeout, minimum body rate), but the "
        'headers timeout and the send timeout are not enforced. %s Set server_integration="required" '
        "(or %s=1) to refuse to start instead.",
        what,
        parser,
        advice,
        integration.REQUIRE_ENV,
    )
    return None, reason


def _warn_if_newer() -> None:
    global _newer_warned
    if _newer_warned or _version(uvicorn.__version__) <= _version(TESTED_UVICORN[1]):
        return
    _newer_warned = True
    route_to_uvicorn()
    logger.warning(
        "connlist %s is tested with uvicorn %s; this is %s; the self-check passed",
        _connlist_version(),
        TESTED_RANGE,
        uvicorn.__version__,
    )


# The exit status of a refusal to start: uvicorn's own for a failed startup,
# and gunicorn's for a worker that failed to boot (its master then stops).
REFUSAL_STATUS = 3


def _failure_text(parser: str, failure: str) -> tuple[str, str]:
    """What failed, and what to do: the ERROR line's and the refusal's words."""
    what = (
        f"connlist {_connlist_version()} does not work with uvicorn {uvicorn.__version__} "
        f"({_NAMES[parser]}: {failure})"
    )
    advice = (
        f"connlist is tested with uvicorn {TESTED_RANGE}: pin uvicorn to that range (pip install "
        f"'uvicorn>={TESTED_UVICORN[0]},<={TESTED_UVICORN[1]}'), or upgrade connlist."
    )
    return what, advice


def _fall_back(parser: str, base: type | None, failure: str) -> type[Any]:
    """uvicorn's own class instead of connlist's, and the one ERROR line (or the refusal to start)."""
    what, advice = _failure_text(parser, failure)
    route_to_uvicorn()
    if integration.require_integration():
        # One line, the server's own exit status for a failed start, no traceback.
        log.error(
            "refusing to start (%s=1): the server integration would be off: %s. %s",
            integration.REQUIRE_ENV,
            what,
            advice,
        )
        raise SystemExit(REFUSAL_STATUS)
    if base is None:
        # uvicorn moved its protocol: its own name for it is the stand-in.
        from uvicorn.config import HTTP_PROTOCOLS
        from uvicorn.importer import import_from_string

        base = import_from_string(HTTP_PROTOCOLS[parser])
    assert base is not None
    integration.record_failure(base, f"uvicorn {uvicorn.__version__}: {_NAMES[parser]}: {failure}")
    log.error(
        "the server integration is off: %s. The server runs uvicorn's own %s protocol and connlist "
        "runs in ASGI-only mode: request bodies are still timed (request timeout, minimum body rate), but "
        "the headers timeout and the send timeout are not enforced. %s Set %s=1 to refuse to start instead.",
        what,
        parser,
        advice,
        integration.REQUIRE_ENV,
    )
    return base


def _resolve(parser: str) -> type[Any]:
    with _lock:
        cls = _resolved.get(parser)
        if cls is None:
            cls = _resolved[parser] = _integrate(parser)
        return cls


def _needs_httptools(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - httptools missing
    raise RuntimeError(
        "connlist.uvicorn:HttpToolsProtocol needs httptools: pip install 'connlist[httptools]', "
        "or use connlist.uvicorn:H11Protocol"
    )


if TYPE_CHECKING:
    # What the names give when the check passes (mypy's view).
    class HttpToolsProtocol(_HttpToolsTracking, httptools_impl.HttpToolsProtocol):
        pass

    class H11Protocol(_H11Tracking, h11_impl.H11Protocol):
        pass

    AutoProtocol: type[Any]
else:

    def __getattr__(name: str) -> Any:
        """``HttpToolsProtocol``, ``H11Protocol``, ``AutoProtocol``: checked when first looked up."""
        if name == "HttpToolsProtocol":
            return _needs_httptools if httptools_impl is None else _resolve("httptools")
        if name == "H11Protocol":
            return _resolve("h11")
        if name == "AutoProtocol":
            # httptools when it is installed, else h11, as uvicorn's ``--http auto``.
            return _resolve("h11" if httptools_impl is None else "httptools")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
