"""connlist's subclass of gunicorn's ASGI protocol (``gunicorn -k asgi``), which ``start`` installs.

The list's events are read off gunicorn's callback parser around each feed:
at rest, a read that is not blank lines begins a message; ``_current_request``
replaced means the headers are complete; ``is_complete`` ends the message.
A connection goes idle where gunicorn arms its keep-alive timer.  HTTP/2 and
uWSGI connections are counted, and timed by gunicorn's own rules.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from gunicorn.asgi import protocol as gunicorn_protocol  # type: ignore[import-untyped, import-not-found, unused-ignore]
from gunicorn.asgi.parser import PythonProtocol  # type: ignore[import-untyped, import-not-found, unused-ignore]
from starlette.requests import ClientDisconnect

from connlist.core.logs import route_to_server
from connlist.core.records import FROM_HANDLE, Connection
from connlist.servers.gunicorn.held import Held
from connlist.servers.phases import BETWEEN, BODY, HEADERS, REFUSED, UPGRADED, move
from connlist.servers.seam import SLOTS, Tracking, TransportHandle

__all__ = ["ASGIProtocol", "mode_of_parser", "prepare"]

_CRLF = b"\r\n"
_BLANK = (13, 10)  # CR, LF


def mode_of_parser(python: bool) -> str:
    """The view's ``mode`` for gunicorn's python parser or its fast one (gunicorn_h1c)."""
    return "gunicorn-python" if python else "gunicorn-fast"


class _AfterCutLog:
    """gunicorn's logger once connlist cut the connection: the app's ``ClientDisconnect`` left out."""

    __slots__ = ("_log",)

    def __init__(self, log: Any) -> None:
        self._log = log

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(sys.exc_info()[1], ClientDisconnect):
            return
        self._log.exception(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


if TYPE_CHECKING:

    class _Gunicorn:
        """gunicorn's untyped protocol as mypy sees it: the methods connlist's class calls, the rest Any."""

        _closed: bool
        _current_request: Any
        log: Any

        def __init__(self, worker: Any) -> None: ...
        def connection_made(self, transport: Any) -> None: ...
        def connection_lost(self, exc: Exception | None) -> None: ...
        def pause_writing(self) -> None: ...
        def resume_writing(self) -> None: ...
        def data_received(self, data: Any) -> None: ...
        def _feed_callback_parser(self, data: Any) -> bool: ...
        def _arm_keepalive_timer(self) -> None: ...
        def _close_transport(self) -> None: ...
        def _resume_reading(self) -> None: ...
        def _send_response_start(self, *args: Any, **kwargs: Any) -> None: ...
        def _send_error_response(self, *args: Any, **kwargs: Any) -> None: ...
        async def _handle_websocket(self, request: Any, sockname: Any, peername: Any) -> None: ...
        async def _handle_h2c_upgrade(self, request: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...
else:
    _Gunicorn = gunicorn_protocol.ASGIProtocol


class ASGIProtocol(Tracking, Held, _Gunicorn):
    """gunicorn's ASGI protocol, feeding connlist from what each read changed."""

    # The last request whose headers came in (for the view), the last one a response was begun for.
    __slots__ = (*SLOTS, "_connlist_last", "_connlist_answered")
    connlist_mode = "gunicorn-python"
    connlist_keepalive = True
    connlist_keepalive_not = ""
    _connlist_last: Any
    _connlist_answered: Any

    # On the class, as the hot path calls them; the rarer ones go through ``_Gunicorn.x(self)``.
    _connlist_base_made = _Gunicorn.connection_made
    _connlist_base_lost = _Gunicorn.connection_lost
    _connlist_base_feed = _Gunicorn._feed_callback_parser

    def _connlist_tell(self, loop: Any, keep_alive: float | None) -> Any:
        """Once per loop (``Tracking._connlist_setup``), with the gunicorn settings the list can use."""
        enforcer = self.connlist_handover.enforcer
        if enforcer is not None and enforcer.attached_loop not in (None, loop):
            # A timer armed on another loop (this process's earlier server) never fires on this one.
            enforcer.cancel()
        if isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float)):
            keep_alive = None  # gunicorn times its keep-alive itself
        return Tracking._connlist_tell(self, loop, keep_alive)

    def _connlist_without_middleware(self) -> tuple[object, object]:
        """No enforcer handed over: gunicorn's lifespan setting and the app it loaded."""
        route_to_server()
        return getattr(self.cfg, "asgi_lifespan", None), self.app

    def connection_made(self, transport: Any) -> None:
        # The connection's setup: connlist adds no __init__.
        enforcer = Tracking._connlist_setup(self, self.worker.loop, self._keepalive)
        self._connlist_last = self._connlist_answered = None
        self._connlist_base_made(transport)
        # Addresses are read from the transport only when needed: asking costs uvloop system calls.
        record = self._connlist_record = enforcer.join(FROM_HANDLE, FROM_HANDLE, self)
        parser = self._callback_parser
        if parser is None:
            # HTTP/2 (ALPN, or h2c with prior knowledge) or uWSGI: counted, not timed.
            self._connlist_untimed(record)
        elif parser.__class__ is not PythonProtocol:
            enforcer.mode = mode_of_parser(False)

    def connection_lost(self, exc: Exception | None) -> None:
        # (None where lost before it was made, as in gunicorn's own tests: it never joined.)
        record = getattr(self, "_connlist_record", None)
        if record is not None:
            self._connlist.connections.remove(record)
        self._connlist_base_lost(exc)

    def _connlist_untimed(self, record: Connection) -> None:
        """The connection leaves HTTP/1's timeouts: counted as being served, never idle."""
        connections = self._connlist.connections
        if record.last_message_start != 0.0:
            connections.message(record)  # out of ``active``, responding
        record.responding = True
        self._connlist_phase = move(self._connlist_phase, UPGRADED)

    def data_received(self, data: Any) -> None:
        # A read behind a held one joins it.  Here, not in the hook: gunicorn's loop also
        # feeds the parser's own pipelined tail through the hook.
        if self._connlist_unread is not None:
            self._connlist_hold(data)
            return
        _Gunicorn.data_received(self, data)

    def _feed_callback_parser(self, data: Any) -> bool:
        phase = self._connlist_phase
        record = self._connlist_record
        if phase or record is None:
            return self._connlist_feed_open(record, phase, data)
        # Between messages.
        if len(data) > self._connlist_room or self._callback_parser.is_complete:
            return self._connlist_stop(data)
        request = self._current_request
        held = self._callback_parser.is_complete
        fed = self._connlist_base_feed(data)
        new = self._current_request
        parser = self._callback_parser
        if (
            new is not request
            and not held
            and parser is not None
            and parser.is_complete
            and self._h2c_upgrade_settings is None
        ):
            # A whole request in one read.
            self._connlist_last = new
            enforcer = self._connlist
            enforcer.totals.requests += 1
            enforcer.connections.message(record)
        else:
            self._connlist_begun(record, request, held, data, fed)
        return fed

    def _connlist_feed_open(self, record: Connection | None, phase: int, data: Any) -> bool:
        """A read fed while a message is open (at ``phase``), or on a connection not timed."""
        if record is None or phase >= UPGRADED:
            return self._connlist_base_feed(data)
        if len(data) > self._connlist_room:
            return self._connlist_stop(data)
        if phase == BODY:
            self._connlist_body_bytes(record, len(data))
        request = self._current_request
        fed = self._connlist_base_feed(data)
        self._connlist_events(record, phase, request, fed, len(data))
        return fed

    def _connlist_begun(self, record: Connection, request: Any, held: bool, data: Any, fed: object) -> None:
        """The message a feed at rest began, if any; blank lines begin none (RFC 9112)."""
        if held or not data or (data[0] in _BLANK and not data.strip(_CRLF)):
            return
        enforcer = self._connlist
        enforcer.connections.message_begin(record)
        # The head begins at the read's first byte.
        self._connlist_room = enforcer.head_limit
        self._connlist_events(record, HEADERS, request, fed, len(data))

    def _connlist_events(self, record: Connection, phase: int, request: Any, fed: object, n: int) -> None:
        """A feed's events for the message open at ``phase``; all ``n`` bytes count against an open head."""
        if not fed or self._closed:
            return  # malformed: gunicorn answered it and is closing
        enforcer = self._connlist
        connections = enforcer.connections
        new = self._current_request
        got_headers = phase == HEADERS and new is not request
        if got_headers:
            self._connlist_last = new
            enforcer.request_received(record)
            phase = BODY
        parser = self._callback_parser
        if parser is None or self._h2c_upgrade_settings is not None:
            # Upgraded to HTTP/2 (h2c): served on, untimed.
            self._connlist_untimed(record)
            return
        self._connlist_counted(got_headers, phase == HEADERS, False, n)
        if phase == BODY:
            if parser.is_complete:
                connections.message_complete(record)
                phase = BETWEEN
            elif (
                not got_headers
                and not record.receiving_body
                and enforcer.settings.body_min_rate
                and not self._body_receiver.expect_continue
            ):
                # The body after 100 Continue: its clock starts with its first bytes.
                connections.body_begin(record, record.body_received)
        self._connlist_settle(record, phase, got_headers and phase == BODY)

    def _connlist_body_begin(self, record: Connection) -> None:
        """The minimum rate times the body from the bytes buffered; after ``100 Continue``, from its first."""
        enforcer = self._connlist
        if not enforcer.settings.body_min_rate:
            return
        receiver = self._body_receiver
        record.body_received = receiver.buffered
        if not receiver.expect_continue:
            enforcer.connections.body_begin(record, record.body_received)

    def _arm_keepalive_timer(self) -> None:
        # The connection is idle from now: the response ended, and the list times the keep-alive.
        record: Connection = self._connlist_record  # type: ignore[assignment]
        enforcer = self._connlist
        # Not going idle: the next request is in already (an app call that outlived its
        # response; gunicorn cancels the timer at once), or the connection is not timed.
        if (self._awaiting_request and self._request_ready.is_set()) or self._connlist_phase >= UPGRADED:
            _Gunicorn._arm_keepalive_timer(self)
            return
        enforcer.connections.response_complete(record)
        if not enforcer.keep_alive_timed:
            _Gunicorn._arm_keepalive_timer(self)

    def _resume_reading(self) -> None:
        if self._connlist_resume():
            _Gunicorn._resume_reading(self)

    def connlist_close_keepalive(self) -> None:
        self._keepalive_timeout()

    def _close_transport(self) -> None:
        # Any close of gunicorn's: unsent bytes hold it, under the send timeout.
        _Gunicorn._close_transport(self)
        # (No record where gunicorn closes a protocol never made, as its own tests do.)
        self._connlist_closed(getattr(self, "_connlist_record", None))

    # connlist's closes wake gunicorn's connection loop, as its own do: else it waits for a request.
    def connlist_close_idle(self) -> bool:
        closed = TransportHandle.connlist_close_idle(self)
        if closed:
            self._connlist_wake()
        return closed

    def connlist_close(self) -> None:
        TransportHandle.connlist_close(self)
        self._connlist_wake()

    def connlist_refuse(self) -> None:
        TransportHandle.connlist_refuse(self)
        self._connlist_wake()

    def _connlist_wake(self) -> None:
        self._closed = True
        ready = self._request_ready
        if ready is not None:  # None: not HTTP/1
            ready.set()

    async def _handle_websocket(self, request: Any, sockname: Any, peername: Any) -> None:
        # Within the enforcer's ``max_upgraded``, upgraded until lost; past it, 503 and closed.
        self._connlist_phase = move(self._connlist_phase, UPGRADED)
        record = self._connlist_record
        if record is not None and not self._connlist.upgrade(record, request.method, request.path):
            self._connlist_phase = move(self._connlist_phase, REFUSED)
            return
        self._connlist_hand_over()
        await _Gunicorn._handle_websocket(self, request, sockname, peername)

    async def _handle_h2c_upgrade(self, request: Any) -> None:
        self._connlist_untimed(self._connlist_record)  # type: ignore[arg-type]  # set by connection_made
        self._connlist_hand_over()
        await _Gunicorn._handle_h2c_upgrade(self, request)

    def _send_response_start(self, *args: Any, **kwargs: Any) -> None:
        # From here a cut gets no 408, though gunicorn holds the head back until the body's first write.
        self._connlist_answered = self._current_request
        _Gunicorn._send_response_start(self, *args, **kwargs)

    def _send_error_response(self, *args: Any, **kwargs: Any) -> None:
        # gunicorn's own 500 or 4xx.  getattr: gunicorn's tests call it on a protocol never set up.
        self._connlist_answered = getattr(self, "_current_request", None)
        _Gunicorn._send_error_response(self, *args, **kwargs)

    def _connlist_response_written(self, record: Connection) -> bool:
        # Nothing is under way while headers arrive: gunicorn reads a request once the last response is done.
        request = self._current_request
        return record.headers_completed and request is not None and self._connlist_answered is request

    def _connlist_responding(self) -> bool:
        record = self._connlist_record
        return record is not None and record.responding

    def _connlist_mark_cut(self) -> None:
        """Closed as gunicorn's own close marks it: the app's sends dropped, its receive disconnected."""
        if self._closed:
            return
        self._closed = True
        self.log = _AfterCutLog(self.log)
        receiver = self._body_receiver
        if receiver is not None:
            receiver.signal_disconnect()
        for finishing in self._finishing_calls.values():
            if finishing is not None:
                finishing.signal_disconnect()
        ready = self._request_ready
        if ready is not None:
            ready.set()  # the connection loop sees _closed and ends
        flow = self._flow_control
        if flow is not None:
            flow.resume_writing()  # a send waiting to drain returns

    def connlist_request(self) -> tuple[str | None, str | None]:
        request = self._connlist_last
        if request is None:
            return None, None
        return getattr(request, "method", None), getattr(request, "path", None)

    def connlist_reading_paused(self) -> bool:
        return bool(self._reading_paused)


def prepare(base: type) -> type[ASGIProtocol]:
    """connlist's class, once gunicorn's ``base`` filled its parser cache; TypeError for another base.

    gunicorn reads the cache on its own class: filled on a subclass, ``auto`` would take the python parser.
    """
    if base is not _Gunicorn:
        raise TypeError(
            f"connlist's class is built on {_Gunicorn.__module__}.{_Gunicorn.__qualname__}, not {base!r}"
        )
    base._check_h1c_protocol_available()  # type: ignore[attr-defined]
    return ASGIProtocol
