"""gunicorn's own ASGI worker (``gunicorn -k asgi``): connlist's protocol, built on gunicorn's and checked.

gunicorn's ``ASGIWorker`` serves every connection with the module global
``gunicorn.workers.gasgi.ASGIProtocol``, which its ``_serve`` reads for each
connection it accepts, after the ASGI lifespan startup.  So, as for uvicorn's
config, ``ConnectionsMiddleware`` puts connlist's subclass there at the
lifespan startup (``connlist.servers.gunicorn.start``), once the class passed
its self-check (``connlist.servers.gunicorn.selfcheck``).

``ASGIProtocol`` below is that subclass: ``Tracking`` (the feeder's duties
that read nothing of gunicorn's) and gunicorn's own class are its bases,
and each of gunicorn's methods it calls is named on it or called through
gunicorn's class.  The start imports this module only once the methods it
hooks were found on gunicorn's class (``selfcheck.HOOKS``), so a gunicorn
that renamed one gets its own class back, not an import error.

How it tells the list's events from gunicorn's state
----------------------------------------------------

gunicorn's HTTP/1 path feeds each read to a callback parser
(``_feed_callback_parser``): ``PythonProtocol``, or ``gunicorn_h1c``'s
``H1CProtocol`` (``--http-parser fast``).  The parser builds a new request
object when the headers are complete (``_current_request``), sets
``is_complete`` when the message is complete, and then stops: what follows
(a pipelined request) stays in its buffer until the connection loop has
finished the response, resets the parser and feeds it that tail again.  So,
around gunicorn's ``_feed_callback_parser``:

=================================  ===========================================
before the feed, at rest, parser   ``message_begin`` (the read's first byte;
ready for a message, a byte not    a read of blank lines only begins nothing:
CR or LF                           RFC 9112 lets a server skip them)
``_current_request`` replaced      ``headers_complete`` and ``response_begin``
``is_complete`` after the feed     ``message_complete``
=================================  ===========================================

A whole request in one read is the list's ``message``.  What comes
while a response is written waits unparsed (``connlist.servers.gunicorn.held``:
``data_received`` holds it before gunicorn's runs), and a request in it is
timed from the moment it is fed (as on uvicorn's h11).

gunicorn arms its keep-alive timer (``_arm_keepalive_timer``) when a
connection becomes idle: after the response, once the application's call
has returned.  connlist's class writes the response's end there instead
(``response_complete``: the record is no longer responding, and idle from
now) and lets the list time the keep-alive (``--keep-alive``), closing the
connection with gunicorn's own handler (``_keepalive_timeout``).  Two
armings are not a connection going idle, and get gunicorn's own timer, as
they would on gunicorn: one made while the next request is in already
(``_request_ready`` set: an application call left running after its
response ended just as that request arrived; gunicorn's loop cancels the
timer at once), and one on a connection served untimed (HTTP/1 found by
h2c's sniffing), which no list event marks busy again.

Whether a response began matters only when a request is cut while its body
arrives (rare): a response under way gets no ``408``, only the close.
gunicorn says so by calling ``_send_response_start`` (the app's
``http.response.start``) or ``_send_error_response`` (its own answer): the
class notes, there, the request it is serving (``_current_request``), and a
cut compares that with the request being served then.

A cut marks the connection closed as gunicorn's own close does (``_closed``:
the app's sends are dropped), tells the request's body receiver it is
disconnected, wakes the connection loop and lets a send blocked on flow
control go; the app's ``ClientDisconnect`` that follows is connlist's doing,
and left out of gunicorn's log.

HTTP/2 (over TLS, or h2c) and uWSGI connections are counted in the list and
the budget as connections being served, and gunicorn's own rules time them:
the headers, request, body-rate and keep-alive timeouts of connlist are
HTTP/1's (the send timeout applies to all).  A websocket upgrade is the
enforcer's to allow (``Enforcer.upgrade``): within ``max_upgraded`` the
record is held as ``upgraded`` until the connection is lost (gunicorn keeps
the same protocol object for the websocket, so its ``connection_lost``
removes it, as for any connection); past it the request is answered ``503``
and closed before gunicorn's websocket side runs, and the app never sees it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

# gunicorn ships no type hints: its names are Any to mypy.  This module is
# imported once the self-check's static part passed (``connlist.servers.gunicorn.start``).
from gunicorn.asgi import protocol as gunicorn_protocol  # type: ignore[import-untyped, import-not-found, unused-ignore]
from gunicorn.asgi.parser import PythonProtocol  # type: ignore[import-untyped, import-not-found, unused-ignore]
from starlette.requests import ClientDisconnect

from connlist.core.logs import route_to_server
from connlist.core.records import FROM_HANDLE, Connection
from connlist.servers.gunicorn.held import Held
from connlist.servers.seam import (
    BETWEEN,
    BODY,
    HEADERS,
    REFUSED,
    SLOTS,
    UPGRADED,
    Tracking,
    TransportHandle,
    move,
)

__all__ = ["ASGIProtocol", "mode_of_parser", "prepare"]

_CRLF = b"\r\n"
_BLANK = (13, 10)  # CR, LF


def mode_of_parser(python: bool) -> str:
    """The view's ``mode`` for gunicorn's python parser or its fast one (gunicorn_h1c)."""
    return "gunicorn-python" if python else "gunicorn-fast"


class _AfterCutLog:
    """gunicorn's logger, as a connection connlist cut off sees it (``seam.AfterCut``'s rule).

    gunicorn logs an application's exception with ``log.exception`` inside its
    ``except``: the app's ``ClientDisconnect`` there is connlist's doing (its
    body was cut short), so it is left out; everything else is logged.
    """

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
        """gunicorn's protocol as mypy sees it (untyped): the methods connlist's class calls, the rest Any."""

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
    """gunicorn's ASGI protocol, feeding connlist from what each read changed (see the module)."""

    # connlist's attributes (``seam.SLOTS``), the last request whose headers
    # came in (its method and path, for the view), and the last request a
    # response was begun for (gunicorn's request objects, compared by
    # identity): slots, as on uvicorn's (seam.Tracking says why).
    __slots__ = (*SLOTS, "_connlist_last", "_connlist_answered")

    connlist_mode = "gunicorn-python"
    connlist_keepalive = True
    connlist_keepalive_not = ""

    _connlist_last: Any
    _connlist_answered: Any

    # gunicorn's methods that a connection or a read calls, named on this
    # class: a bound method found on the type, where ``super()`` or a look-up
    # on gunicorn's class costs more per call.  The
    # rarer ones are called through gunicorn's class (``_Gunicorn.x(self)``).
    _connlist_base_made = _Gunicorn.connection_made
    _connlist_base_lost = _Gunicorn.connection_lost
    _connlist_base_feed = _Gunicorn._feed_callback_parser

    def _connlist_tell(self, loop: Any, keep_alive: float | None) -> Any:
        """Once per loop (``Tracking._connlist_setup``): also what of gunicorn's settings the list can use."""
        enforcer = self.connlist_handover.enforcer
        if enforcer is not None and enforcer.attached_loop not in (None, loop):
            # A timer armed on another loop (this process's earlier server) never fires on this one.
            enforcer.cancel()
        if isinstance(keep_alive, bool) or not isinstance(keep_alive, (int, float)):
            keep_alive = None  # not a setting connlist can read: gunicorn times its keep-alive itself
        return Tracking._connlist_tell(self, loop, keep_alive)

    def _connlist_without_middleware(self) -> tuple[object, object]:
        """No enforcer handed over: gunicorn's lifespan setting and the app it loaded."""
        route_to_server()
        return getattr(self.cfg, "asgi_lifespan", None), self.app

    # -- the connection: joins the list; what is not HTTP/1 is served untimed --

    def connection_made(self, transport: Any) -> None:
        # No __init__ of connlist's: this is a connection's first call, and its setup.
        enforcer = Tracking._connlist_setup(self, self.worker.loop, self._keepalive)
        self._connlist_last = self._connlist_answered = None
        self._connlist_base_made(transport)
        # The addresses are read from the transport when a view or a cut
        # needs them (gunicorn keeps none; asking costs uvloop two system calls).
        record = self._connlist_record = enforcer.join(FROM_HANDLE, FROM_HANDLE, self)
        parser = self._callback_parser
        if parser is None:
            # HTTP/2 (ALPN, or h2c with prior knowledge) or uWSGI: counted, not timed.
            self._connlist_untimed(record)
        elif parser.__class__ is not PythonProtocol:
            enforcer.mode = mode_of_parser(False)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._connlist_record  # noqa: B018
        except AttributeError:
            pass  # lost before it was made (as gunicorn's own tests lose one): it never joined
        else:
            record = self._connlist_record
            if record is not None:
                self._connlist.connections.remove(record)
        self._connlist_base_lost(exc)

    def _connlist_untimed(self, record: Connection) -> None:
        """The connection leaves HTTP/1's timeouts: counted as one being served, never idle."""
        connections = self._connlist.connections
        if record.last_message_start != 0.0:
            connections.message(record)  # out of ``active``, responding
        record.responding = True
        self._connlist_phase = move(self._connlist_phase, UPGRADED)

    # -- the list's events, around gunicorn's feed of its callback parser ------

    def data_received(self, data: Any) -> None:
        # A read that comes while connlist holds one (held.Held) joins it, unparsed.  Here, not
        # in the hook: gunicorn's loop also feeds the parser's own pipelined tail through the hook.
        if self._connlist_unread is not None:
            self._connlist_hold(data)
            return
        _Gunicorn.data_received(self, data)

    def _feed_callback_parser(self, data: Any) -> bool:
        phase = self._connlist_phase
        record = self._connlist_record
        if phase or record is None:
            return self._connlist_feed_open(record, phase, data)
        # Between messages (every keep-alive request's read begins here).
        if (len(data) > self._connlist_room or self._callback_parser.is_complete) and (
            stopped := self._connlist_stop(data)
        ) is not None:
            return stopped
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
        """A read fed while a message is open (its head or its body at ``phase``), or not timed at all."""
        if record is None or phase >= UPGRADED:
            return self._connlist_base_feed(data)
        if len(data) > self._connlist_room and (stopped := self._connlist_stop(data)) is not None:
            return stopped
        if phase == BODY:
            self._connlist_body_bytes(record, len(data))
        request = self._current_request
        fed = self._connlist_base_feed(data)
        self._connlist_events(record, phase, request, fed, len(data))
        return fed

    def _connlist_begun(self, record: Connection, request: Any, held: bool, data: Any, fed: object) -> None:
        """A feed between messages that was not a whole request: the message it began, if any.

        ``held``: the parser held the read behind a response (a pipelined
        request, fed again once it is done).  A read of blank lines only
        begins nothing either (RFC 9112 lets a server skip them).
        """
        if held or not data or (data[0] in _BLANK and not data.strip(_CRLF)):
            return
        enforcer = self._connlist
        enforcer.connections.message_begin(record)
        # The head begins at the read's first byte: all of the limit is its.
        self._connlist_room = enforcer.head_limit
        self._connlist_events(record, HEADERS, request, fed, len(data))

    def _connlist_events(self, record: Connection, phase: int, request: Any, fed: object, n: int) -> None:
        """The events of a feed of ``n`` bytes: the open message (at ``phase``) got its headers, ended.

        gunicorn's parser stops at a message's end (what follows is fed
        again later, as a read between messages), so a head open after a
        feed began at its first byte, or before it: ``n`` counts against it.
        """
        if not fed or self._closed:
            return  # a malformed request: gunicorn answered it and is closing the connection
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
            # An upgrade to HTTP/2 (h2c): served on, untimed.
            self._connlist_untimed(record)
            return
        # (A head begun at rest had its room set to the whole limit: _connlist_begun.)
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
        """A read ended with the request's headers complete and its body not: the minimum rate times it.

        The body bytes of this read count too (gunicorn's body receiver still
        holds them: the app's task has not run yet).  A client that asked for
        ``100 Continue`` sends its body once gunicorn says so, at the app's
        first ``receive()``: its body is timed from its first bytes (a later
        read, ``_connlist_events``), the request timeout alone until then.
        """
        enforcer = self._connlist
        if not enforcer.settings.body_min_rate:
            return
        receiver = self._body_receiver
        record.body_received = receiver.buffered
        if not receiver.expect_continue:
            enforcer.connections.body_begin(record, record.body_received)

    # -- the response, and the keep-alive the list times -----------------------

    def _arm_keepalive_timer(self) -> None:
        # The connection is idle from now (gunicorn's own moment): the response's end, and
        # the list times the keep-alive (gunicorn's --keep-alive, closed by its handler)
        # where the enforcer can (keep_alive_timed), else gunicorn's timer does.
        # (Set by connection_made: a connection is idle only after a request.)
        record: Connection = self._connlist_record  # type: ignore[assignment]
        enforcer = self._connlist
        # (Only gunicorn's _finishing_call_done arms while its loop awaits a
        # request, the next one maybe in already: its own loop never does.)
        if (self._awaiting_request and self._request_ready.is_set()) or self._connlist_phase >= UPGRADED:
            # Not a connection going idle (module docstring): gunicorn's timer, as on gunicorn.
            _Gunicorn._arm_keepalive_timer(self)
            return
        enforcer.connections.response_complete(record)
        if not enforcer.keep_alive_timed:
            _Gunicorn._arm_keepalive_timer(self)

    def _resume_reading(self) -> None:
        # gunicorn's loop, after each response: not while connlist holds a read (held.Held).
        if self._connlist_resume():
            _Gunicorn._resume_reading(self)

    def connlist_close_keepalive(self) -> None:
        self._keepalive_timeout()

    def _close_transport(self) -> None:
        # Every close of gunicorn's (a response's end that closes, its
        # keep-alive handler): bytes the client has not taken hold it, the
        # send timeout's (seam's _connlist_closed).
        _Gunicorn._close_transport(self)
        self._connlist_closed()

    # The closes connlist decides outside a timeout wake gunicorn's connection
    # loop, as its own close does: else it waits for the next request until
    # gunicorn's grace period after the loss cancels it.

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
        if ready is not None:  # (None: not HTTP/1, no loop waits for a request)
            ready.set()

    # -- upgrades --------------------------------------------------------------

    async def _handle_websocket(self, request: Any, sockname: Any, peername: Any) -> None:
        # A websocket is never timed out (Node: its parser is freed): held as
        # upgraded until the connection is lost, or refused with 503.
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

    # -- what the enforcer's handle reads of gunicorn's state ------------------

    def _send_response_start(self, *args: Any, **kwargs: Any) -> None:
        # The app's http.response.start: from here a cut gets no 408 (_connlist_response_written),
        # though gunicorn holds the head back for the body's first write.
        self._connlist_answered = self._current_request
        _Gunicorn._send_response_start(self, *args, **kwargs)

    def _send_error_response(self, *args: Any, **kwargs: Any) -> None:
        # gunicorn's own answer, written at once: its 500 for an app that raised or returned
        # before responding, a malformed request's 4xx.  (gunicorn's tests also call it on a
        # protocol that was never set up: no request then.)
        self._connlist_answered = getattr(self, "_current_request", None)
        _Gunicorn._send_error_response(self, *args, **kwargs)

    def _connlist_response_written(self, record: Connection) -> bool:
        # gunicorn reads a request only once the previous response is done: while headers
        # arrive, nothing of a response is under way.  After them, the request being served
        # (gunicorn's ``_current_request``) is the one a response was begun for, or not.
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
            flow.resume_writing()  # a send waiting to drain returns (and drops what follows)

    def connlist_request(self) -> tuple[str | None, str | None]:
        request = self._connlist_last
        if request is None:
            return None, None
        return getattr(request, "method", None), getattr(request, "path", None)

    def connlist_reading_paused(self) -> bool:
        return bool(self._reading_paused)


def prepare(base: type) -> type[ASGIProtocol]:
    """connlist's class, once gunicorn's ``base`` (the class it is built on) filled its parser cache.

    gunicorn caches whether gunicorn_h1c is there on the class it is
    called on, and reads the cache on its own class (by name): called first
    on a subclass, the cache would be the subclass's, and gunicorn's
    ``--http-parser auto`` would take the python parser.  So gunicorn's own
    class fills its cache first.  A ``base`` other than the class this
    module was built on (gunicorn's module global replaced since) is a
    ``TypeError``.
    """
    if base is not _Gunicorn:
        raise TypeError(
            f"connlist's class is built on {_Gunicorn.__module__}.{_Gunicorn.__qualname__}, not {base!r}"
        )
    base._check_h1c_protocol_available()  # type: ignore[attr-defined]
    return ASGIProtocol
