"""What any server integration needs: the feeder's contract, and the parts of it that are not the server's.

A server integration feeds the worker's ``ConnectionsList`` from inside the
server, where it sees what the ASGI app never does: a connection before its
first byte, a request's headers arriving, a response the client stopped
taking.  ``connlist.servers.uvicorn.protocols`` is the one connlist ships; an integration for
another asyncio server (hypercorn, zttp) implements the same contract,
``Feeder``, and takes the rest from here:

* ``HANDOVER`` (``connlist.core.handover``): where ``ConnectionsMiddleware``
  hands its enforcer over, one per worker; a protocol reads its class's
  ``connlist_handover``;
* ``RESPONSE_408`` and ``RESPONSE_503``: what a connection cut at a timeout,
  or refused at ``max_connections``, is answered before it is closed;
* ``TransportHandle``: the handle methods the enforcer calls to close a
  connection, for a protocol that writes to an asyncio transport; the
  server's part is three methods that read its own request state;
* ``AfterCut``: the logger a request of a cut connection is given, so that
  the app's ``ClientDisconnect`` (connlist's doing, not the app's failure)
  is not logged as an error;
* ``Tracking``: the feeder's duties that read nothing of the server's, as
  a base of its protocol: the enforcer at start (``fallback_enforcer``,
  with its one line, where no middleware handed one over), the connection
  joining the list and leaving it, a body's bytes, where a read left the
  message (``settle``: the timer follows), and the stalls of flow control.

What stays in the integration is what only the server has: how it tells
the list's events from its own state (its ``data_received``), and what its
request cycles say (the body so far, whether a response is under way).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from starlette.requests import ClientDisconnect

from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER, HandOver
from connlist.core.logs import log
from connlist.core.records import Address, Connection, ConnectionHandle
from connlist.servers import sending
from connlist.servers.heads import HeadBound
from connlist.servers.phases import (
    BETWEEN,
    BODY,
    HEADERS,
    OVERFLOWED,
    REFUSED,
    UPGRADED,
    move,
)

__all__ = [
    "BETWEEN",
    "BODY",
    "HANDOVER",
    "HEADERS",
    "OVERFLOWED",
    "REFUSED",
    "RESPONSE_408",
    "RESPONSE_431",
    "RESPONSE_503",
    "SLOTS",
    "UPGRADED",
    "AfterCut",
    "Feeder",
    "HandOver",
    "ListOwner",
    "Tracking",
    "TransportHandle",
    "declares_middleware",
    "fallback_enforcer",
    "move",
]

RESPONSE_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
# A request head past max_header_size (Node's answer to HPE_HEADER_OVERFLOW).
RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)
# A new connection refused at max_connections, every connection being a request being served.
RESPONSE_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"

# SO_LINGER on with a zero timeout: close() then resets the connection and
# the kernel drops what is queued for it (nginx's reset_timedout_connection).
_LINGER_ZERO = struct.pack("ii", 1, 0)


def fallback_enforcer(handover: HandOver, lifespan: object, app: object) -> Enforcer:
    """No middleware handed an enforcer over: this worker's own, put in ``handover``, and one line why.

    Later connections, and the middleware at its first request (the
    lifespan was off), find it there.

    Which case it is comes from the server's ``lifespan`` setting ("on",
    "off", "auto" or None where the server does not tell) and from the
    ``app`` it loaded: a Starlette app whose middleware stack was never
    built, or was built with ConnectionsMiddleware in it, had its lifespan
    fail; one without ConnectionsMiddleware declared simply has none.  A
    lifespan that failed is an ``ERROR``: uvicorn's default ``--lifespan
    auto`` takes any exception raised while Starlette builds its middleware
    (another middleware that cannot be built; a bad connlist option fails
    the startup instead) for an app without a lifespan, and serves on, and
    every request will fail the same way.
    """
    enforcer = Enforcer()
    handover.enforcer = enforcer
    declared = declares_middleware(app)
    defaults = (
        f"the server enforces the default timeouts (headers {enforcer.headers_timeout:g}s, "
        f"request {enforcer.request_timeout:g}s)"
    )
    if lifespan == "off":
        # The middleware adopts the fallback at its first request (and says so).
        log.warning(
            "the ASGI lifespan is off, so no ConnectionsMiddleware handed over its settings; "
            "%s until the first request. Leave the lifespan on (uvicorn's default, auto, runs it).",
            defaults,
        )
    elif declared is False or lifespan == "on":
        # (With --lifespan on, a failed lifespan would have stopped the server.)
        log.warning(
            "no ConnectionsMiddleware started in the ASGI lifespan; %s. Add "
            "ConnectionsMiddleware to the app, with the lifespan on, to configure them and serve the "
            "debug endpoint.",
            defaults,
        )
    elif declared:
        log.error(
            "the app's ASGI lifespan failed, so its ConnectionsMiddleware never started "
            "(uvicorn's --lifespan auto takes an exception at startup, such as a middleware that cannot "
            "be built, for a lifespan the app does not support); %s and every request may fail with that "
            "exception. Serve with --lifespan on to see it and stop at start.",
            defaults,
        )
    else:
        log.error(
            "no ConnectionsMiddleware started in the ASGI lifespan: the app has none, or its "
            "lifespan failed (uvicorn's --lifespan auto takes an exception at startup, such as a "
            "middleware that cannot be built, for a lifespan the app does not support); %s. Serve "
            "with --lifespan on to see the exception and stop at start.",
            defaults,
        )
    return enforcer


class ListOwner:
    """What owns the worker's list and hands it over to the server (``HANDOVER``): the middleware.

    The servers look for it in the app they loaded (``declares_middleware``)
    without importing the ASGI side, which sits above them.
    """

    __slots__ = ()


def declares_middleware(app: Any) -> bool | None:
    """Whether the app the server loaded has a ConnectionsMiddleware; None if it cannot be told.

    Follows ``.app`` through the server's own wrappers (uvicorn's proxy
    headers, its message logger) and other middlewares to a
    ConnectionsMiddleware or a Starlette app; a Starlette app's declared
    middleware (``user_middleware``) says.  Once per worker, at its first
    connection.
    """
    from starlette.applications import Starlette

    for _ in range(32):  # bounded: a cycle of .app attributes must not stop a worker
        if isinstance(app, ListOwner):
            return True
        if isinstance(app, Starlette):
            # What Starlette builds its stack from, whether or not it was built.
            return any(isinstance(m.cls, type) and issubclass(m.cls, ListOwner) for m in app.user_middleware)
        app = getattr(app, "app", None)
        if app is None:
            return None
    return None


class Feeder(ConnectionHandle, Protocol):
    """A server integration's protocol object: it feeds the list, and is each connection's handle.

    Its duties, each the one place where its event is seen:

    1. **Mode.**  When the server starts using it, it sets
       ``enforcer.mode`` to its ``connlist_mode`` (the view's ``mode``: any
       value but ``"asgi"`` says the integration is in use), and takes the
       enforcer handed over (its ``connlist_handover``, this worker's
       ``HANDOVER``) or, without one, makes its own, puts it there and
       says so once.
    2. **Connections.**  At connect: ``enforcer.join(client, server,
       self)`` (the list, the count, the budget and the timer in one call).
       When the connection is lost: ``connections.remove(record)``.  An
       upgrade request (a websocket), once complete and before the server
       hands it over: ``enforcer.upgrade(record, method, path)``, which
       holds it as ``upgraded`` (True: hand it over, and remove the record
       when the upgraded connection is lost) or refuses it with ``503``
       past ``max_upgraded`` (False: hand nothing over; the app never sees
       it).
    3. **Requests.**  The list's events in order, each at the instant the
       server saw it, each called, never written out: ``message_begin`` (a
       request's first byte), ``enforcer.request_received`` (headers
       complete: the request goes to the app, counted), ``message_complete``
       (its last byte), ``response_complete`` (no response unfinished); or
       ``message`` for a whole request seen at once, with ``totals.requests
       += 1``.  ``enforcer.watch()`` after ``message_begin`` and a stall
       (nothing after ``message_complete``: the timer, once armed, finds
       for itself that nothing is due).
    4. **Bodies and stalls.**  ``body_begin`` / ``body_bytes`` where the
       minimum rate applies; ``stall`` when the transport asks it to pause
       writing, ``unstall`` when it resumes.
    5. **Handle.**  The methods of ``ConnectionHandle`` (``TransportHandle``
       has them for an asyncio transport): the enforcer calls them to cut,
       close and sample the connection, on the event loop.

    The counts are explicit increments by the one feeder that sees the
    event (``connlist.asgi.asgi_only`` is the other, in ASGI-only mode), so they stay
    exact when one feeder takes over from the other at a lifespan restart.
    """

    connlist_mode: ClassVar[str]
    # Whether the class leaves the keep-alive timeout to the list (the
    # sweep's ``keepalive`` step) instead of a server timer per response;
    # why not, if it does not.
    connlist_keepalive: ClassVar[bool] = False
    connlist_keepalive_not: ClassVar[str] = "the server times it"


class TransportHandle:
    """``ConnectionHandle`` for a protocol that writes to an asyncio transport (mixed into it).

    The protocol provides ``transport``, ``_connlist`` (the enforcer) and
    ``_connlist_record`` (None before connect), and these three, which read
    the server's request state: ``_connlist_response_written(record)``
    (whether a 408 now would corrupt the response stream), and
    ``_connlist_responding()`` and ``_connlist_mark_cut()``.
    """

    __slots__ = ()

    transport: Any
    _connlist: Enforcer
    _connlist_record: Connection | None

    def _connlist_response_written(self, record: Connection) -> bool:
        raise NotImplementedError

    def _connlist_responding(self) -> bool:
        raise NotImplementedError

    def _connlist_mark_cut(self) -> None:
        raise NotImplementedError

    def connlist_address(self, own: bool) -> Address:
        """``ConnectionHandle.connlist_address``: the transport's ``peername`` (or ``sockname``).

        Asked when a view or a cut needs it, maybe after the transport
        closed: an address it no longer has is None.
        """
        transport = self.transport
        if transport is None:
            return None
        try:
            address = transport.get_extra_info("sockname" if own else "peername")
        except (
            OSError,
            RuntimeError,
            AttributeError,
            ValueError,
        ):  # uvloop asks the socket, which may be closed
            return None
        if isinstance(address, (tuple, list)) and len(address) >= 2:
            return (address[0], address[1])
        return address if isinstance(address, str) else None

    def _connlist_linger(self) -> None:
        """A close connlist decided outside a sweep: abort the connection if it has not gone in time."""
        record = self._connlist_record
        if record is not None:
            enforcer = self._connlist
            enforcer.connections.linger(record)
            enforcer.bring_forward(enforcer.clock() + enforcer.linger)

    def connlist_close_expired(self) -> None:
        self._connlist_answer_and_close(RESPONSE_408)

    def connlist_close_overflow(self) -> None:
        self._connlist_answer_and_close(RESPONSE_431)

    def _connlist_answer_and_close(self, answer: bytes) -> None:
        """A cut: ``answer`` unless a response to the current request was written, then close."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        record = self._connlist_record
        if record is not None and not self._connlist_response_written(record):
            transport.write(answer)
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

    def connlist_close_keepalive(self) -> None:
        # A server whose keep-alive connlist times closes it its own way (uvicorn: its handler).
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()

    def connlist_close(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            self._connlist_linger()

    def connlist_abort(self) -> None:
        transport = self.transport
        if transport is not None:
            self._connlist_mark_cut()
            # A cut is a release: without this the kernel keeps the socket
            # (FIN-WAIT-1) and everything queued for a client that reads
            # nothing, for as long as the client keeps the connection.  With
            # it, the close that abort() makes sends a reset, and the client
            # sees ECONNRESET, not a response that seems to end.  (asyncio's
            # transport closes its socket at the next iteration, uvloop's
            # handle at once: both after this.)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # (Closed meanwhile, or not a socket: the abort alone, then.)
                with contextlib.suppress(OSError, AttributeError, TypeError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
            transport.abort()

    def connlist_refuse(self) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(RESPONSE_503)
            transport.close()
            self._connlist_linger()

    def connlist_acked(self) -> tuple[int, int] | None:
        return sending.acked(self.transport)

    def connlist_pending(self) -> int:
        return sending.pending(self.transport)


class AfterCut:
    """A server's logger, as a request of a connection connlist cut off sees it.

    The app's ``ClientDisconnect`` there is expected (its body was cut
    short), so the server's "Exception in ASGI application" for it is left
    out; everything else goes to the server's logger as before.
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


# The attributes ``Tracking`` adds to the server's protocol.
SLOTS = ("_connlist", "_connlist_phase", "_connlist_record", "_connlist_room", "_connlist_unread")


class Tracking(HeadBound, TransportHandle):
    """The feeder's duties that read nothing of the server's, as a base of its asyncio protocol.

    The server's protocol provides ``transport``, ``client`` and ``server``
    (the peer's and its own address), sets ``connlist_mode``, calls
    ``_connlist_setup`` before the connection joins (when it is made, or at
    ``connection_made``, as uvicorn's do), and implements the rest of
    ``Feeder``: from its ``data_received``, the list's events of each read,
    then ``_connlist_settle``; ``_connlist_body_begin`` (what its request
    cycle says of the body so far); ``connlist_request``;
    ``_connlist_without_middleware``; and ``TransportHandle``'s three.
    """

    # Declared on the class built on the server's (``SLOTS``), not here: a
    # mixin with slots of its own cannot be combined with a server protocol
    # that has ``__slots__`` too ("multiple bases have instance lay-out
    # conflict").  Slots, not instance attributes, because two more keys
    # in uvicorn's instance dict unshare its keys and slow down every
    # attribute access of uvicorn's own code.
    if TYPE_CHECKING:
        __slots__ = SLOTS
    else:
        __slots__ = ()

    connlist_mode: ClassVar[str]
    # Whether the class leaves the keep-alive timeout to the list (the
    # sweep's ``keepalive`` step) instead of a server timer per response;
    # why not, if it does not.
    connlist_keepalive: ClassVar[bool] = False
    connlist_keepalive_not: ClassVar[str] = "the server times it"

    # Provided by the server's protocol.
    transport: Any
    # The server's connection_made and connection_lost, where its class's
    # own replace Tracking's, named on connlist's class (connlist.servers.gunicorn.protocol's
    # ASGIProtocol; connlist.servers.uvicorn.classes's statements).
    _connlist_base_made: Callable[[Any], None]
    _connlist_base_lost: Callable[[Exception | None], None]
    client: tuple[str, int] | None
    server: tuple[str, int | None] | None

    # Where the middleware hands the worker's enforcer over: this worker's (a
    # self-check's protocols read one of their own: ``selfcheck.handed_over``).
    connlist_handover: HandOver = HANDOVER
    # Per worker: the enforcer and its list (shared by every connection).
    _connlist: Enforcer
    # Per connection: this connection's record (None until connection_made),
    # and where the message being received on it stands (BETWEEN, ...); the
    # bytes the head being received may still take (``heads.head_end``), or at
    # rest the enforcer's ``whole_read``; and a read held unparsed behind a
    # response still under way (None: none).
    _connlist_record: Connection | None
    _connlist_phase: int
    _connlist_room: int
    _connlist_unread: bytes | None

    def _connlist_setup(self, loop: Any, keep_alive: float | None) -> Enforcer:
        """At the connection's start, before ``join``: its enforcer (the one handed over, or a fallback).

        What the protocol tells the enforcer (``_connlist_tell``) is the same
        for every protocol of a server: told once, it costs a connection
        three tests.
        """
        enforcer = self.connlist_handover.enforcer
        if enforcer is None or enforcer.fed_by is not self.__class__ or enforcer.attached_loop is not loop:
            enforcer = self._connlist_tell(loop, keep_alive)
        self._connlist = enforcer
        self._connlist_record = None
        self._connlist_phase = BETWEEN
        self._connlist_room = enforcer.whole_read
        self._connlist_unread = None
        return enforcer

    def _connlist_tell(self, loop: Any, keep_alive: float | None) -> Enforcer:
        """The server's first protocol of this class on this loop: the enforcer learns its mode and loop."""
        handover = self.connlist_handover
        enforcer = handover.enforcer
        if enforcer is None:
            enforcer = fallback_enforcer(handover, *self._connlist_without_middleware())
        enforcer.mode = self.connlist_mode
        # Once per loop: the loop's accept failures, and the server's keep-alive time.
        if loop is not None and enforcer.attached_loop is not loop:
            enforcer.attach(loop, keep_alive)
        enforcer.keep_alive_timed = self.connlist_keepalive and bool(keep_alive and keep_alive > 0)
        enforcer.fed_by = self.__class__
        return enforcer

    def _connlist_without_middleware(self) -> tuple[object, object]:
        """No middleware handed an enforcer over: the server's lifespan setting and the app it loaded.

        Once per worker (``fallback_enforcer`` says which case it is).
        """
        return None, None

    # -- asyncio.Protocol: the connection joins the list, and leaves it -------

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._connlist_record = self._connlist.join(self.client, self.server, self)

    def connection_lost(self, exc: Exception | None) -> None:
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.remove(record)
        super().connection_lost(exc)  # type: ignore[misc]

    def connlist_request(self) -> tuple[str | None, str | None]:
        raise NotImplementedError

    def connlist_reading_paused(self) -> bool:
        raise NotImplementedError

    # -- the body-rate feature's hooks (requests with a body only) -----------

    def _connlist_body_begin(self, record: Connection) -> None:
        """A read ended with the request's headers complete and its body not: the minimum rate times it."""
        raise NotImplementedError

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
        self._connlist_phase = move(self._connlist_phase, phase)
        if phase != BETWEEN:
            self._connlist.watch()  # the connection is active: it can expire

    # -- the send timeout: fed by flow control, which runs only under back-pressure,
    # and by a close that waits for unsent bytes

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
            transport = self.transport
            if transport is not None and transport.is_closing() and sending.unsent(transport):
                return  # a close waits for the rest: still timed (_connlist_closed)
            self._connlist.connections.unstall(record)

    def _connlist_closed(self) -> None:
        """The server closed the transport: the bytes it has not sent are the send timeout's.

        A transport's close waits for
        its buffer to drain.  A client that stopped reading before it did would
        hold the connection, and its place in the budget, for good, in no list
        a sweep walks: a tail under the transport's high-water mark never
        paused writing.  As a stall it is sampled, and aborted once it makes no
        progress for the send timeout; a slow reader that keeps reading gets
        every byte.  The server layer calls it after each close of its own (a
        response's end that closes, the keep-alive's close).
        """
        # (None where the server closes a protocol never made, as gunicorn's own tests do.)
        record = getattr(self, "_connlist_record", None)
        if record is None:
            return
        # ``sending.unsent``, written out: every response that closes asks, and holds nothing.
        try:
            if not self.transport.get_write_buffer_size():
                return
        except (AttributeError, NotImplementedError):
            return
        if self._connlist.settings.send_timeout:
            enforcer = self._connlist
            enforcer.connections.stall(record, self.connlist_pending(), self.connlist_acked())
            enforcer.watch()
