"""What both of connlist's uvicorn protocols read of uvicorn's request cycle and protocol.

``UvicornCycle`` is the seam's ``Tracking`` with the methods that read the attributes both parsers'
protocols share (each checked by the self-check): the base of each parser's mixin.
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
        """uvicorn's flow control while a read is held behind a response: its resumes leave reading paused.

        uvicorn resumes at a response's end and at each ``receive()``, which would let one more read
        in behind the held one; ``_connlist_release`` resumes instead.  The connection's own object
        takes this class while a read is held, so nothing is allocated.
        """

        __slots__ = ()

        def resume_reading(self) -> None:
            self.read_paused = False


class UvicornCycle(Tracking):
    """``Tracking``, and what it reads of uvicorn's request cycle (``cycle``) and protocol."""

    __slots__ = ()

    # uvicorn's protocol's.
    cycle: Any
    config: Any
    flow: Any
    timeout_keep_alive_handler: Callable[[], None]
    timeout_keep_alive_task: Any

    loop: Any
    timeout_keep_alive: int

    # The keep-alive timed by the list (connlist.servers.uvicorn.keepalive); the self-check turns it
    # off for a uvicorn that arms it otherwise.
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
        enforcer = self._connlist_setup(self.loop, self.timeout_keep_alive)
        self._connlist_running = None
        if enforcer.keep_alive_timed:
            timed = keepalive.last
            self.loop = (
                timed if timed is not None and timed.loop is self.loop else keepalive.for_loop(self.loop)
            )
        self._connlist_base_made(transport)
        self._connlist_record = enforcer.join(self.client, self.server, self)

    def connlist_close_keepalive(self) -> None:
        """The keep-alive's end, timed by the list: uvicorn's handler (unsent bytes: the send timeout's)."""
        self.timeout_keep_alive_handler()
        self._connlist_closed(self._connlist_record)

    def _connlist_stopped(self, data: bytes) -> bool:
        """Whether a read at rest is held behind a response, or fed in parts, rather than parsed as it is.

        Held, it waits unparsed until the response ends (``_connlist_release``), so pipelined
        requests are read no faster than they are answered.
        """
        if self._connlist_unread is not None or self._connlist_responding():
            self._connlist_hold(data)
            return True
        if len(data) > self._connlist_room:
            self._connlist_feed_in_parts(data)
            return True
        return False

    def _connlist_feed_in_parts(self, data: bytes) -> None:
        """A read fed a part at a time, no part longer than its phase allows.

        At rest, ``whole_read`` bytes; in a head, the room it has left (none left: 431); in a body,
        the rest.  Behind a response the rest is held; after an upgrade or a close, dropped.
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
        """A response is complete: the read held behind it is offered again; reading resumes if taken."""
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
        """A read ended with the headers in and the body not: the minimum rate times the body from here.

        This read's body bytes count: the app has not run, so the cycle holds exactly them.  A
        client that asked for ``100 Continue`` is not timed by the rate until uvicorn sends it.
        """
        enforcer = self._connlist
        if not enforcer.settings.body_min_rate:
            return
        cycle = self.cycle
        # Read directly, as the self-check found them: a default would hide a rename.
        record.body_received = len(cycle.body)
        if cycle.waiting_for_100_continue:
            self._connlist_after_continue(record, cycle)
        else:
            enforcer.connections.body_begin(record, record.body_received)

    def _connlist_after_continue(self, record: Connection, cycle: Any) -> None:
        """Start the body's clock when uvicorn sends ``100 Continue``, or the app answers without reading.

        The app gets the cycle's ``receive`` and ``send`` when its task first runs, after this read,
        so the cycle gets its own, which note the moment and call uvicorn's.
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
        # Before the headers are in, ``self.cycle`` is the previous request's, maybe still writing.
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
        """A cut: every cycle's app is disconnected, and its ``ClientDisconnect`` left out of the log.

        uvicorn marks only its newest cycle at a lost connection; one running ahead of queued ones
        would write on to a closed transport, which uvloop answers with a traceback.
        """
        for cycle in self._connlist_cycles():
            if not isinstance(cycle.logger, AfterCut):
                cycle.logger = AfterCut(cycle.logger)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()

    def connlist_reading_paused(self) -> bool:
        """``ConnectionHandle.connlist_reading_paused``."""
        if self._connlist_unread is not None:
            return True
        flow: Any = getattr(self, "flow", None)
        return flow is not None and bool(flow.read_paused)
