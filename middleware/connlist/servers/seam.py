"""The neutral seam: what every server integration needs that is not the server's.

An integration feeds the worker's list from inside the server, where it sees what the
app never does (a connection before its first byte, a client that stopped reading).  Its
protocol implements ``Feeder`` and takes the rest from here, re-exported as one contract.
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
from connlist.servers.phases import BETWEEN, BODY, HEADERS, OVERFLOWED, REFUSED, UPGRADED, move

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
RESPONSE_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)
RESPONSE_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_LINGER_ZERO = struct.pack("ii", 1, 0)
_CLOSED_SOCKET = (OSError, RuntimeError, AttributeError, ValueError)


def fallback_enforcer(handover: HandOver, lifespan: object, app: object) -> Enforcer:
    """No middleware handed an enforcer over: this worker's own, put in ``handover``, and one line why."""
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
    """The middleware's base: lets the servers find it in an app without importing the ASGI side."""

    __slots__ = ()


def declares_middleware(app: Any) -> bool | None:
    """Whether the app the server loaded has a ConnectionsMiddleware; None if it cannot be told."""
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
    """A server integration's protocol: it feeds the list, and is each connection's handle.

    Each duty is done where the server sees its event: the enforcer taken at connect (``join``),
    the list's events in order, each at the instant the server saw it, ``remove`` when lost,
    ``enforcer.upgrade`` before a hand-over.  Counts are increments by the one feeder that sees
    the event, so they stay exact when ASGI-only mode takes over at a lifespan restart.
    """

    connlist_mode: ClassVar[str]
    # True where the list's sweep times the keep-alive, not a server timer; else ``_not`` says why.
    connlist_keepalive: ClassVar[bool] = False
    connlist_keepalive_not: ClassVar[str] = "the server times it"


class TransportHandle:
    """``ConnectionHandle`` for a protocol on an asyncio transport, which implements the first three."""

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
        """The transport's ``peername`` (or ``sockname``); None once it is gone."""
        transport = self.transport
        if transport is None:
            return None
        try:
            address = transport.get_extra_info("sockname" if own else "peername")
        except _CLOSED_SOCKET:  # uvloop asks the socket, which may be closed
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
        # A client that reads nothing never lets the close drain: the linger aborts it.
        transport.close()

    def connlist_close_idle(self) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing() or self._connlist_responding():
            return False
        transport.close()
        self._connlist_linger()
        return True

    def connlist_close_keepalive(self) -> None:
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
            # SO_LINGER zero: the close is a reset, and the kernel drops what a non-reader left queued.
            sock = transport.get_extra_info("socket")
            if sock is not None:
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
    """A server's logger for a request connlist cut off: its expected ``ClientDisconnect`` is not an error."""

    __slots__ = ("_logger",)

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        if isinstance(kwargs.get("exc_info"), ClientDisconnect):
            return
        self._logger.error(msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


SLOTS = ("_connlist", "_connlist_phase", "_connlist_record", "_connlist_room", "_connlist_unread")


class Tracking(HeadBound, TransportHandle):
    """The feeder's duties that read nothing of the server's, as a base of its asyncio protocol.

    The server's protocol calls ``_connlist_setup`` before the connection joins, ends
    its ``data_received`` with ``_connlist_settle``, and implements the rest of ``Feeder``.
    """

    # ``SLOTS`` go on the class built on the server's, as a mixin's own would conflict with its
    # ``__slots__``; slots, as more keys in uvicorn's instance dict would slow all its attributes.
    if TYPE_CHECKING:
        __slots__ = SLOTS
    else:
        __slots__ = ()

    connlist_mode: ClassVar[str]
    connlist_keepalive: ClassVar[bool] = False
    connlist_keepalive_not: ClassVar[str] = "the server times it"
    # Provided by the server's protocol (``_base_*``: its own, where connlist's class overrides them).
    _connlist_base_made: Callable[[Any], None]
    _connlist_base_lost: Callable[[Exception | None], None]
    client: tuple[str, int] | None
    server: tuple[str, int | None] | None
    # A self-check's protocols read a handover of their own.
    connlist_handover: HandOver = HANDOVER

    def _connlist_setup(self, loop: Any, keep_alive: float | None) -> Enforcer:
        """Before ``join``: the connection's enforcer (handed over, or a fallback), told of the class once."""
        enforcer = self.connlist_handover.enforcer
        if enforcer is None or enforcer.fed_by is not type(self) or enforcer.attached_loop is not loop:
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
        if loop is not None and enforcer.attached_loop is not loop:
            enforcer.attach(loop, keep_alive)
        enforcer.keep_alive_timed = self.connlist_keepalive and bool(keep_alive and keep_alive > 0)
        enforcer.fed_by = type(self)
        return enforcer

    def _connlist_without_middleware(self) -> tuple[object, object]:
        """The server's lifespan setting and the app it loaded, for ``fallback_enforcer``."""
        return None, None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._connlist_record = self._connlist.join(self.client, self.server, self)

    def connection_lost(self, exc: Exception | None) -> None:
        record = self._connlist_record
        if record is not None:
            self._connlist.connections.remove(record)
        self._connlist_base_lost(exc)

    def connlist_request(self) -> tuple[str | None, str | None]:
        raise NotImplementedError

    def connlist_reading_paused(self) -> bool:
        raise NotImplementedError

    def _connlist_body_begin(self, record: Connection) -> None:
        """A read ended with the request's headers complete and its body not: the minimum rate times it."""
        raise NotImplementedError

    @staticmethod
    def _connlist_body_bytes(record: Connection, n: int) -> None:
        """A later read of ``n`` bytes (framing included, and maybe the next request's first) for the body."""
        record.body_received += n

    def _connlist_settle(self, record: Connection, phase: int, body_begins: bool) -> None:
        """Where a read (or a finished response) left the message being received; the timer follows."""
        if body_begins:
            self._connlist_body_begin(record)
        self._connlist_phase = move(self._connlist_phase, phase)
        if phase != BETWEEN:
            self._connlist.watch()  # the connection is active: it can expire

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

    def _connlist_closed(self, record: Connection | None) -> None:
        """The server closed the transport of ``record``: the bytes it has not sent are the send timeout's.

        A close waits for the buffer to drain, and a tail under the high-water mark never
        paused writing: a client that stopped reading would hold the connection for good.
        """
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
