"""What both of connlist's uvicorn protocols read of uvicorn's request cycle and protocol.

uvicorn's httptools and h11 protocols share their cycle's attributes
(``body``, ``more_body``, ``waiting_for_100_continue``, ``response_started``,
``response_complete``, ``scope``, ``logger``, ``disconnected``,
``message_event``) and their own (``cycle``, ``config``,
``loop``, ``timeout_keep_alive``, ``flow``); the self-check reads each of
them before a class is handed to uvicorn (``connlist.servers.uvicorn.selfcheck``).

``UvicornCycle`` is ``connlist.servers.seam.Tracking`` with the methods that
read them: the base of each parser's mixin (``connlist.servers.uvicorn.httptools_impl``,
``connlist.servers.uvicorn.h11_impl``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from connlist.core.logs import route_to_server
from connlist.core.records import Connection
from connlist.servers.seam import BETWEEN, BODY, HEADERS, AfterCut, Tracking
from connlist.servers.uvicorn import keepalive

try:
    from uvicorn.protocols.http.flow_control import FlowControl as _FlowControl
except ImportError:  # pragma: no cover - a uvicorn that moved it: a held read is then not kept paused
    _FlowControl = None  # type: ignore[assignment, misc]

__all__ = ["UvicornCycle"]


if _FlowControl is not None:

    class _HeldFlow(_FlowControl):
        """uvicorn's flow control while connlist holds a read behind a response (``_connlist_hold``).

        uvicorn resumes reading where it paused it itself, at a response's
        end and at each ``receive()`` of the app: each would let one more
        read in behind the held one.  So its resume keeps its own state and
        leaves the transport paused; connlist resumes it once the held read
        is taken (``_connlist_release``).  The connection's own object takes
        this class while a read is held, and uvicorn's back after: nothing is
        allocated.
        """

        __slots__ = ()

        def resume_reading(self) -> None:
            self.read_paused = False


class UvicornCycle(Tracking):
    """``Tracking``, and what it reads of uvicorn's request cycle (``cycle``) and protocol."""

    __slots__ = ()

    # uvicorn's protocol's (the self-check finds each before a class is handed to uvicorn).
    cycle: Any
    config: Any
    flow: Any
    timeout_keep_alive_handler: Callable[[], None]
    timeout_keep_alive_task: Any

    loop: Any
    timeout_keep_alive: int

    # uvicorn's on_response_complete arms its keep-alive with the protocol's
    # loop: connlist's stand-in leaves it to the list (connlist.servers.uvicorn.keepalive).
    # The self-check turns this off for a uvicorn that arms it otherwise.
    connlist_keepalive = True
    # The methods of uvicorn's class as given to the class statement (connlist.servers.uvicorn.classes)
    # that connlist's override, as class attributes: the given class's own, whatever it overrides.
    # Not ``super()``, which makes an object per call on Python 3.11: the request path calls three.
    _connlist_base_read: Callable[[bytes], None]
    _connlist_base_responded: Callable[[], None]
    # The request running ahead of those queued behind it (httptools' pipelining; None: none).
    _connlist_running: Any
    connlist_keepalive_not = ""

    def connection_made(self, transport: Any) -> None:
        # Tracking's, with uvicorn's state: the enforcer, and the loop's stand-in for the keep-alive.
        enforcer = self._connlist_setup(self.loop, self.timeout_keep_alive)
        self._connlist_running = None
        if enforcer.keep_alive_timed:
            # The stand-in of the last connection's loop, where it is this one's (every connection's).
            timed = keepalive.last
            self.loop = (
                timed if timed is not None and timed.loop is self.loop else keepalive.for_loop(self.loop)
            )
        self._connlist_base_made(transport)
        self._connlist_record = enforcer.join(self.client, self.server, self)

    def connection_lost(self, exc: Exception | None) -> None:
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.remove(record)
        self._connlist_base_lost(exc)

    def connlist_close_keepalive(self) -> None:
        """The keep-alive timeout the list times: uvicorn's own handler, as its timer would have called it.

        The bytes of the last response the client has not taken then hold
        the close: the send timeout times them.
        """
        self.timeout_keep_alive_handler()
        self._connlist_closed()

    def _connlist_stopped(self, data: bytes) -> bool:
        """Whether a read at rest goes no further as it is: held behind a response, or fed in parts.

        Called only where the read is longer than the enforcer's
        ``whole_read``, or comes while a response is under way.  Then it
        would begin a request: it waits, unparsed, until the response ends
        (``_connlist_release``), so pipelined requests are read no faster
        than they are answered (h11 would take one more read into its buffer
        at each response; httptools would parse all of them at once).
        """
        if self._connlist_unread is not None or self._connlist_responding():
            self._connlist_hold(data)
            return True
        if len(data) > self._connlist_room:
            self._connlist_feed_in_parts(data)
            return True
        return False

    def _connlist_feed_in_parts(self, data: bytes) -> None:
        """A read fed a part at a time (``data_received``), no part longer than its rule allows.

        At rest, ``whole_read`` bytes: no more than a head may take, so the
        parser says whether a head ended within them; in a head, the room
        it has left (none left and more to come: the head is past
        ``max_header_size``, 431); in a body, the rest.  Behind a response
        the rest is held; after an upgrade or a close it is dropped, as
        uvicorn drops what follows them in a read.
        """
        start = 0
        while start < len(data) and not self.transport.is_closing():
            phase = self._connlist_phase
            if phase == BETWEEN:
                if self._connlist_unread is not None or self._connlist_responding():
                    self._connlist_hold(data[start:])
                    return
                size = self._connlist.whole_read
            elif phase == HEADERS:
                size = self._connlist_room
                if size <= 0:
                    self._connlist_overflow()
                    return
            elif phase == BODY:
                size = len(data)
            else:
                return
            self.data_received(data[start : start + size])  # type: ignore[attr-defined]  # uvicorn's protocol's
            start += size

    def _connlist_hold(self, data: bytes) -> None:
        """``HeadBound``'s hold, with uvicorn's resumes kept from undoing it (``_HeldFlow``)."""
        Tracking._connlist_hold(self, data)
        flow = self.flow
        if flow.__class__ is _FlowControl:
            flow.__class__ = _HeldFlow

    def _connlist_release(self) -> None:
        """A response is complete: the read held behind it is offered again; reading resumes if it is taken.

        Behind a response still under way (the next request, started from
        uvicorn's queue or h11's buffer) it is held again; else parsed.
        """
        data: bytes = self._connlist_unread  # type: ignore[assignment]  # called only with one held
        self._connlist_unread = None
        flow: Any = self.flow
        if flow.__class__ is _HeldFlow:
            flow.__class__ = _FlowControl  # type: ignore[assignment]  # (narrowed by the test above)
        self.data_received(data)  # type: ignore[attr-defined]  # uvicorn's protocol's
        if self._connlist_unread is None and not flow.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    def _connlist_without_middleware(self) -> tuple[object, object]:
        """No enforcer handed over: uvicorn's lifespan setting and loaded app, once per worker."""
        route_to_server()
        config = getattr(self, "config", None)
        return getattr(config, "lifespan", None), getattr(config, "loaded_app", None)

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
        cycle = self.cycle
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
            if self._connlist_record is record and self.cycle is cycle and self._connlist_phase == BODY:
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

    def _connlist_response_written(self, record: Connection) -> bool:
        """Whether a 408 now would corrupt the response stream or follow this request's response."""
        # ``self.cycle`` is the current request's cycle once its headers are
        # in; before that it is the previous request's, which may still be
        # writing its response.
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            return False
        return not cycle.response_complete or record.headers_completed

    def _connlist_responding(self) -> bool:
        """Whether a response to a received request is unfinished."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def connlist_request(self) -> tuple[str | None, str | None]:
        """``ConnectionHandle.connlist_request``: the method and path of the last request received."""
        # The last cycle is the last request whose headers were received
        # (pipelined ones included); its scope has the method and path.
        cycle = self.cycle
        if cycle is None:
            return None, None
        scope = cycle.scope
        return scope.get("method"), scope.get("path")

    def _connlist_cycles(self) -> list[Any]:
        """The request cycles of this connection whose app may still run (h11: the newest only)."""
        cycle = self.cycle
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
        """``ConnectionHandle.connlist_reading_paused``."""
        # uvicorn stops reading a body the app does not consume (64 KiB
        # buffered), and a request queued behind a pipelined one; connlist,
        # a read held behind a response (_connlist_hold).
        if self._connlist_unread is not None:
            return True
        flow: Any = getattr(self, "flow", None)
        return flow is not None and bool(flow.read_paused)
