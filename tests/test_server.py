"""connlist.servers.seam: the seam any server integration uses, and uvicorn's protocols built on it."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from connlist.core.connections import Connection, ConnectionHandle
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER, HandOver
from connlist.core.sweep import lingered
from connlist.servers import seam as server
from connlist.servers import sending
from connlist.servers.heads import HeadBound
from connlist.servers.uvicorn import protocols as connlist_uvicorn
from connlist.servers.uvicorn.cycle import UvicornCycle
from tests.fakes import FakeClock, MockLoop
from tests.servers import wait_for


def test_the_protocols_read_the_workers_hand_over() -> None:
    # One per worker, the protocols' by default; a hand-over holds an enforcer and nothing else.
    assert server.Tracking.connlist_handover is HANDOVER and server.HANDOVER is HANDOVER
    assert HandOver().enforcer is None
    enforcer = Enforcer()
    assert HandOver(enforcer).enforcer is enforcer
    with pytest.raises(AttributeError):
        HandOver().state = {}  # type: ignore[attr-defined]


def _handle_methods() -> list[str]:
    return [
        name
        for name, _ in inspect.getmembers(ConnectionHandle, inspect.isfunction)
        if name.startswith("connlist_")
    ]


def test_uvicorn_protocols_take_the_transport_handle_from_the_seam(parser: str) -> None:
    cls = connlist_uvicorn._integrate(parser)
    assert issubclass(cls, server.TransportHandle), cls
    assert cls.connlist_mode == f"uvicorn-{parser}"
    for name in _handle_methods():
        method = getattr(cls, name)
        assert callable(method), name
    # What is the transport's is written once, in connlist.servers.seam; the rest reads uvicorn's state.
    for name in (
        "connlist_close_expired",
        "connlist_abort",
        "connlist_refuse",
        "connlist_pending",
        "connlist_acked",
    ):
        assert getattr(cls, name) is getattr(server.TransportHandle, name), name
    for name in ("connlist_request", "connlist_reading_paused", "_connlist_mark_cut", "_connlist_responding"):
        assert getattr(cls, name) is not getattr(server.TransportHandle, name, None), name
    # What reads nothing of uvicorn's state is connlist.servers.seam's Tracking, both protocols' base.
    assert issubclass(cls, server.Tracking)
    for name in (
        "pause_writing",
        "resume_writing",
        "connection_lost",
        "_connlist_setup",
        "_connlist_settle",
    ):
        assert getattr(cls, name) is getattr(server.Tracking, name), name
    # Its connection_made sets up from uvicorn's state (the enforcer, the loop's stand-in) and
    # joins, calling uvicorn's given class's, as Tracking's connection_lost does when it removes.
    assert cls.connection_made is UvicornCycle.connection_made
    # Six classes of connlist's over uvicorn's: the class statement's, the parser's mixin, what both
    # read of uvicorn's cycle, Tracking, the head's bound, TransportHandle.
    uvicorn_base = cls.__mro__[6]
    assert cls.__mro__[2:6] == (UvicornCycle, server.Tracking, HeadBound, server.TransportHandle)
    assert uvicorn_base.__module__.startswith("uvicorn.")
    assert len(cls.__mro__) == len(uvicorn_base.__mro__) + 6
    assert cls._connlist_overflow is HeadBound._connlist_overflow
    # The hold keeps uvicorn's own resumes from undoing it (UvicornCycle's, for both parsers).
    assert cls._connlist_hold is UvicornCycle._connlist_hold is not HeadBound._connlist_hold


def test_after_cut_leaves_out_the_apps_client_disconnect_only() -> None:
    from starlette.requests import ClientDisconnect

    seen: list[tuple[object, dict[str, object]]] = []

    class Logger:
        level = 10

        def error(self, msg: object, *args: object, **kwargs: object) -> None:
            seen.append((msg, kwargs))

    wrapped = server.AfterCut(Logger())
    wrapped.error("Exception in ASGI application\n", exc_info=ClientDisconnect())
    failure = ValueError("the app's own")
    wrapped.error("Exception in ASGI application\n", exc_info=failure)
    assert seen == [("Exception in ASGI application\n", {"exc_info": failure})]
    assert wrapped.level == 10


# -- TransportHandle: what the enforcer's calls do to a transport, at every edge ----------


class SocketTransport:
    """An asyncio transport's surface over a real socket (or none): what it was told, and when."""

    def __init__(self, sock: Any = None) -> None:
        self.sock = sock
        self.written = b""
        self.closing = False
        self.aborted = False
        self.buffered = 0

    def write(self, data: bytes) -> None:
        assert not self.closing, "written after close"
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Protocol(server.TransportHandle):
    """A server's protocol on the seam: its three methods read a request state the test sets."""

    def __init__(self, enforcer: Enforcer, transport: Any, *, tracked: bool = True) -> None:
        self._connlist = enforcer
        self.transport = transport
        self._connlist_record = enforcer.connections.connect(handle=self) if tracked else None
        self.written = False  # a response byte of the current request went out
        self.responding = False
        self.cuts = 0

    def _connlist_response_written(self, record: Connection) -> bool:
        return self.written

    def _connlist_responding(self) -> bool:
        return self.responding

    def _connlist_mark_cut(self) -> None:
        self.cuts += 1


@pytest.fixture
def enforcer(clock: FakeClock, loop: MockLoop) -> Enforcer:
    return Enforcer(clock=clock, loop=loop, linger=2.0)  # type: ignore[arg-type]


@pytest.fixture
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Both ends of a loopback TCP connection: (the server's, the client's)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname()[:2], timeout=5)
        accepted, _ = listener.accept()
    with accepted, client:
        yield accepted, client


def closing(enforcer: Enforcer, now: float) -> list[Connection]:
    """The records the enforcer closed and will abort once the linger is over."""
    return lingered(enforcer.connections, 0.0, now, 100)


def test_a_timed_out_request_is_answered_408_unless_its_response_began(
    enforcer: Enforcer, clock: FakeClock
) -> None:
    fresh = Protocol(enforcer, SocketTransport())
    fresh.connlist_close_expired()
    assert fresh.transport.written == server.RESPONSE_408
    assert fresh.transport.closing and not fresh.transport.aborted and fresh.cuts == 1
    # A response already under way: a 408 would corrupt it; closed all the same.
    answering = Protocol(enforcer, SocketTransport())
    answering.written = True
    answering.connlist_close_expired()
    assert answering.transport.written == b"" and answering.transport.closing and answering.cuts == 1
    # Not tracked (yet): nothing to answer for, but closed.
    untracked = Protocol(enforcer, SocketTransport(), tracked=False)
    untracked.connlist_close_expired()
    assert untracked.transport.written == b"" and untracked.transport.closing and untracked.cuts == 1
    # Closing already, or no transport (lost): left as it is, not counted as cut.
    for transport in (SocketTransport(), None):
        gone = Protocol(enforcer, transport)
        if transport is not None:
            transport.close()
        gone.connlist_close_expired()
        assert gone.cuts == 0
        assert transport is None or transport.written == b""


def test_an_idle_close_skips_a_connection_responding_closing_or_lost(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    busy = Protocol(enforcer, SocketTransport())
    busy.responding = True
    assert busy.connlist_close_idle() is False and not busy.transport.closing
    done = Protocol(enforcer, SocketTransport())
    done.transport.close()
    assert done.connlist_close_idle() is False
    assert Protocol(enforcer, None).connlist_close_idle() is False
    assert closing(enforcer, clock.now) == [] and loop.armed == []
    # Idle: closed, and aborted after the linger if the client never lets it go.
    idle = Protocol(enforcer, SocketTransport())
    assert idle.connlist_close_idle() is True
    assert idle.transport.closing and idle.transport.written == b"" and idle.cuts == 0
    assert loop.armed == [clock.now + enforcer.linger]
    assert closing(enforcer, clock.now) == [idle._connlist_record]
    # Untracked: closed; nothing to linger over.
    untracked = Protocol(enforcer, SocketTransport(), tracked=False)
    assert untracked.connlist_close_idle() is True and untracked.transport.closing
    assert closing(enforcer, clock.now) == []


def test_close_and_refuse_leave_a_closing_or_lost_connection_alone(
    enforcer: Enforcer, clock: FakeClock
) -> None:
    for transport in (None, SocketTransport()):
        protocol = Protocol(enforcer, transport)
        if transport is not None:
            transport.close()
        protocol.connlist_close()
        protocol.connlist_refuse()
        assert transport is None or transport.written == b""
    assert closing(enforcer, clock.now) == []
    refused = Protocol(enforcer, SocketTransport())
    refused.connlist_refuse()
    assert refused.transport.written == server.RESPONSE_503 and refused.transport.closing
    closed = Protocol(enforcer, SocketTransport())
    closed.connlist_close()
    assert closed.transport.written == b"" and closed.transport.closing
    assert closing(enforcer, clock.now) == [refused._connlist_record, closed._connlist_record]


def test_an_abort_resets_the_socket_and_survives_a_transport_without_one(
    enforcer: Enforcer, tcp_pair: tuple[socket.socket, socket.socket]
) -> None:
    accepted, _ = tcp_pair
    on_socket = Protocol(enforcer, SocketTransport(accepted))
    on_socket.connlist_abort()
    assert on_socket.transport.aborted and on_socket.cuts == 1
    # SO_LINGER on with a zero timeout: the close sends a reset, the queue is dropped.
    linger = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.calcsize("ii"))
    assert struct.unpack("ii", linger) == (1, 0)
    no_socket = Protocol(enforcer, SocketTransport())
    no_socket.connlist_abort()
    assert no_socket.transport.aborted and no_socket.cuts == 1
    lost = Protocol(enforcer, None)
    lost.connlist_abort()
    assert lost.cuts == 0


@pytest.mark.skipif(sending._TCP_INFO is None, reason="TCP_INFO is Linux's")
def test_acked_reads_what_the_peer_acknowledged_or_says_it_cannot(
    enforcer: Enforcer, tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    accepted, client = tcp_pair
    protocol = Protocol(enforcer, SocketTransport(accepted))
    accepted.sendall(b"x" * 1000)
    assert client.recv(1000, socket.MSG_WAITALL) == b"x" * 1000
    assert wait_for(lambda: (protocol.connlist_acked() or (0, 0))[0] == 1000)
    acked = protocol.connlist_acked()
    assert acked is not None and acked[1] > 0  # the client's window, open
    # No socket, no transport, a socket that is not TCP: no answer.
    assert Protocol(enforcer, SocketTransport()).connlist_acked() is None
    assert Protocol(enforcer, None).connlist_acked() is None
    left, right = socket.socketpair()
    with left, right:
        assert Protocol(enforcer, SocketTransport(left)).connlist_acked() is None

    class OldKernel:
        """A kernel before 4.1: its struct tcp_info ends before tcpi_bytes_acked."""

        def getsockopt(self, level: int, name: int, size: int) -> bytes:
            return bytes(104)

    assert Protocol(enforcer, SocketTransport(OldKernel())).connlist_acked() is None
    monkeypatch.setattr(sending, "_TCP_INFO", None)  # not Linux
    assert protocol.connlist_acked() is None


@pytest.mark.skipif(sending._OUTQ is None, reason="SIOCOUTQ is Linux's")
def test_pending_counts_the_buffer_and_the_kernels_queue_when_it_can(
    enforcer: Enforcer, tcp_pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    accepted, client = tcp_pair
    transport = SocketTransport(accepted)
    transport.buffered = 10
    protocol = Protocol(enforcer, transport)
    assert protocol.connlist_pending() == 10  # the peer has taken everything sent
    # A client that reads nothing: the kernel's queue fills, and counts.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    accepted.setblocking(False)
    sent = 0
    with contextlib.suppress(BlockingIOError):
        for _ in range(10_000):
            sent += accepted.send(b"y" * 65536)
    assert sent > 0
    assert protocol.connlist_pending() > 10
    assert Protocol(enforcer, None).connlist_pending() == 0
    assert Protocol(enforcer, SocketTransport()).connlist_pending() == 0  # no socket: the buffer only
    closed = socket.socket()
    closed.close()
    gone = SocketTransport(closed)
    gone.buffered = 3
    assert Protocol(enforcer, gone).connlist_pending() == 3  # closed meanwhile: the buffer only
    monkeypatch.setattr(sending, "_OUTQ", None)  # not Linux
    assert protocol.connlist_pending() == 10
    # A transport that cannot say what it holds (a test's, as uvicorn's): nothing.
    assert sending.unsent(object()) == 0 and sending.unsent(asyncio.Transport()) == 0


def test_the_handle_requires_the_servers_three_methods(enforcer: Enforcer) -> None:
    class Incomplete(server.TransportHandle):
        def __init__(self) -> None:
            self._connlist = enforcer
            self.transport = SocketTransport()
            self._connlist_record = enforcer.connections.connect(handle=self)

    handle = Incomplete()
    with pytest.raises(NotImplementedError):
        handle.connlist_close_idle()  # asks _connlist_responding
    with pytest.raises(NotImplementedError):
        handle.connlist_close_expired()  # asks _connlist_response_written
    handle._connlist_record = None
    with pytest.raises(NotImplementedError):
        handle.connlist_close_expired()  # then _connlist_mark_cut
    assert handle.transport.written == b""
