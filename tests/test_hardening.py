"""Slow readers, slow bodies and connections that will not close, against real servers.

uvicorn's two parsers, raw sockets on 127.0.0.1, short timeouts; the tests
that take ``target`` run on gunicorn's own ASGI worker too
(``tests.targets``).  Where the client cannot tell what happened (it reads
nothing), the server's own view is checked: the record's state and fields,
the totals, and when it left.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from connlist.core.connections import Connection, connection_state
from connlist.core.enforcer import LINGER
from connlist.core.kinds import SEND_STEP_LIMIT, send_allowance
from tests import servers
from tests.servers import (
    EARLY,
    INTEGRATED,
    LARGE,
    LATE,
    PLAIN,
    Running,
    connect,
    is_408,
    middleware,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)
from tests.targets import SERVERS, serving


def only_record(running: Running, mw: Any) -> Connection | None:
    conns = running.call(lambda: mw.connections.all())
    return conns[0] if len(conns) == 1 else None


def small_receiver(port: int, rcvbuf: int = 4096) -> socket.socket:
    """A client with a small receive buffer, set before connecting (so the window stays small)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    from tests.servers import OPEN_SOCKETS

    OPEN_SOCKETS.append(sock)
    return sock


# -- send timeout --------------------------------------------------------------


def test_reader_that_stops_is_stalled_then_aborted(parser: str) -> None:
    send_timeout = 1.0
    mw = middleware(headers_timeout=5, request_timeout=10, send_timeout=send_timeout)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = small_receiver(running.port)
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        # The server's buffers fill up and the transport pauses writing.
        assert wait_for(lambda: running.call(lambda: mw.connections.stalled_count) == 1, 5)
        conn = only_record(running, mw)
        assert conn is not None
        assert running.call(lambda: connection_state(conn)) == "stalled"
        view = running.call(lambda: mw.snapshot())
        assert view["counts"]["stalled"] == 1 and view["all"][0]["state"] == "stalled"
        # Last progress as the server saw it: cut between the allowance (the
        # send timeout, more if its window opened in steps larger than
        # SEND_STEP) and a sample interval plus 0.25 s after it.
        assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 12)
        gone = time.monotonic()
        last_progress = conn.out_since
        allowance = send_allowance(send_timeout, conn.out_step)
        assert conn.out_acked > 0  # TCP_INFO was read
        assert send_timeout <= allowance <= SEND_STEP_LIMIT * send_timeout
        assert allowance - EARLY <= gone - last_progress <= allowance + send_timeout / 4 + 0.25 + 0.05, (
            gone - last_progress,
            allowance,
        )
        assert mw.enforcer.totals.send_timeouts == 1
        # Aborted: whatever the client reads now ends in a reset, never the whole response.
        data, _ = read_until_closed(sock)
        assert len(data) < LARGE


def server_sockets(port: int, peer: int) -> list[tuple[str, int]]:
    """The server's sockets for a client's port, as ``ss -tn state all`` lists them: (state, bytes queued).

    Read from ``/proc/net/tcp``, which is what ``ss`` shows (the state in
    hex, ``tx_queue`` the bytes the socket still holds to send).
    """
    found = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) == port and int(remote.rsplit(":", 1)[1], 16) == peer:
                found.append((fields[3], int(fields[4].split(":")[0], 16)))
    return found


@pytest.mark.parametrize("server", SERVERS)
def test_send_timeout_cut_is_a_reset_that_releases_the_socket(server: str, tmp_path: Path) -> None:
    # A client that reads nothing: once the send timeout cuts it, the
    # server's socket (and the megabytes queued in it) is gone within a
    # second, and the client sees a reset, not a response that seems to end.
    options = {"headers_timeout": 5, "request_timeout": 30, "send_timeout": 1.0}
    with serving(server, tmp_path / "server.log", **options) as target:
        sock = small_receiver(target.port)
        peer = sock.getsockname()[1]
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: target.counts()["stalled"] == 1, 5)
        queued = server_sockets(target.port, peer)
        assert len(queued) == 1 and queued[0][1] > 0, queued  # established, its send queue full
        assert wait_for(lambda: target.totals()["send_timeouts"] == 1, 12)
        cut = time.monotonic()
        assert wait_for(lambda: not server_sockets(target.port, peer), 1.0), server_sockets(target.port, peer)
        assert time.monotonic() - cut <= 1.0
        sock.settimeout(5)
        received = 0
        with pytest.raises(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += len(chunk)
        assert received < LARGE


def test_slow_but_steady_reader_gets_every_byte(parser: str) -> None:
    mw = middleware(headers_timeout=5, request_timeout=10, send_timeout=1.0)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = small_receiver(running.port)
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = 0
        stalled_seen = False
        while True:
            # 64 KiB every 50 ms: about 1.3 MB/s, far slower than the server writes.
            budget = 64 * 1024
            while budget > 0:
                data = sock.recv(min(budget, 65536))
                if not data:
                    break
                received += len(data)
                budget -= len(data)
            if not data:
                break
            stalled_seen = stalled_seen or running.call(lambda: mw.connections.stalled_count) == 1
            time.sleep(0.05)
        assert received > LARGE  # the head and every byte of the body
        assert stalled_seen  # it was stalled all along, and never cut
        assert mw.enforcer.totals.send_timeouts == 0


# The kernel buffers of both ends, kept small: a /tail response stays mostly
# in the server's transport, under its high-water mark (no pause_writing).
TAIL_BUFFERS = 4096


def held_tail(running: Running, mw: Any) -> Connection:
    """The one connection, once its response ended with bytes left in the transport; it never paused."""
    assert wait_for(lambda: (conn := only_record(running, mw)) is not None and not conn.responding, 5)
    conn = only_record(running, mw)
    assert conn is not None and conn.requests == 1
    return conn


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_a_response_tail_the_client_never_reads_is_aborted_after_the_close(parser: str, close: bool) -> None:
    # The tail of a response under the transport's high-water mark never
    # pauses writing, and a close waits for it to drain: a client that
    # stopped reading held the connection, and its place in the budget, for
    # good.  The close (uvicorn's at a Connection: close response's end, the
    # list's at the keep-alive) hands it to the send timeout.
    send_timeout = 1.0
    keep_alive = 1
    mw = middleware(headers_timeout=5, request_timeout=10, send_timeout=send_timeout)
    with serve(mw, INTEGRATED[parser], sndbuf=TAIL_BUFFERS, timeout_keep_alive=keep_alive) as running:
        sock = small_receiver(running.port, TAIL_BUFFERS)
        sock.sendall(
            b"GET /tail HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n"
        )
        conn = held_tail(running, mw)
        assert conn.is_stalled == close  # closed with bytes unsent: a stall from the close
        # When the response ended, on the list's clock (time.monotonic, as here): the stall
        # begun at the close, or the idle time begun at the response's end.  (Seen here, it
        # would be up to a poll of wait_for later.)
        ended = conn.out_since if close else conn.responded_at
        assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 10)
        gone = time.monotonic()
        allowance = send_allowance(send_timeout, conn.out_step)
        # After the close (at once, or at the keep-alive), the send timeout's allowance.
        closed = 0 if close else keep_alive
        assert closed + allowance - EARLY <= gone - ended <= closed + allowance + send_timeout / 4 + 0.5, (
            gone - ended,
            allowance,
        )
        totals = mw.enforcer.totals
        assert (totals.send_timeouts, totals.keepalive_timeouts) == (1, 0 if close else 1)
        data, _ = read_until_closed(sock)
        assert len(data) < 64_000


def test_a_slow_reader_of_a_response_tail_gets_every_byte_after_the_close(parser: str) -> None:
    # The same tail, read slowly but steadily after uvicorn closed: the
    # send timeout sees progress, and the client gets the whole response.
    mw = middleware(headers_timeout=5, request_timeout=10, send_timeout=0.5)
    with serve(mw, INTEGRATED[parser], sndbuf=TAIL_BUFFERS) as running:
        sock = small_receiver(running.port, TAIL_BUFFERS)
        sock.sendall(b"GET /tail HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        conn = held_tail(running, mw)
        assert conn.is_stalled
        received = b""
        while True:
            # 2 KiB every 50 ms: about 40 KB/s, the tail over 1.5 s, three send timeouts.
            data = sock.recv(2048)
            if not data:
                break
            received += data
            time.sleep(0.05)
        assert received.endswith(b"t" * 64_000)
        assert mw.enforcer.totals.send_timeouts == 0
        assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 3)


def test_steady_reader_acknowledged_in_steps_is_never_cut(parser: str) -> None:
    # A default receive buffer read at 64 KiB/s: Linux reopens its window in
    # steps of about 100 KB on loopback, and the server sees no progress for
    # longer than the send timeout between them.  The allowance (a send
    # timeout per SEND_STEP of its steps) keeps it; then it reads the rest
    # at full speed.
    send_timeout = 1.0
    mw = middleware(headers_timeout=5, request_timeout=30, send_timeout=send_timeout)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = connect(running.port)
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert wait_for(lambda: running.call(lambda: mw.connections.stalled_count) == 1, 5)
        conn = only_record(running, mw)
        assert conn is not None
        received = 0
        longest = 0.0
        started = time.monotonic()
        while time.monotonic() - started < 4:
            want = 6554
            while want:
                data = sock.recv(want)
                assert data, "closed"
                received += len(data)
                want -= len(data)
            # Without progress for this long, as the server sees it.
            since = running.call(lambda: mw.enforcer.clock() - conn.out_since if conn.is_stalled else 0.0)
            longest = max(longest, since)
            time.sleep(0.1)
        assert mw.enforcer.totals.send_timeouts == 0
        assert longest > send_timeout, longest  # the old rule (no progress for send_timeout) would cut it
        sock.settimeout(10)
        while data:
            data = sock.recv(65536)
            received += len(data)
        assert received > LARGE  # the head and every byte of the body
        assert mw.enforcer.totals.send_timeouts == 0


def assert_aborted_after_the_linger(running: Running, mw: Any, sock: socket.socket, started: float) -> None:
    """The timeout fired 0.5 s after ``started``; the record is timed_out, then gone after the linger."""
    assert wait_for(lambda: mw.enforcer.totals.headers_timeouts + mw.enforcer.totals.request_timeouts == 1, 3)
    conn = only_record(running, mw)
    assert conn is not None and running.call(lambda: connection_state(conn)) == "timed_out"
    assert running.call(lambda: mw.connections.timed_out_count) == 1
    assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 4)
    gone = time.monotonic() - started
    # Gone within about 2 s of the timeout, and not before the linger.
    assert 0.5 + LINGER - EARLY <= gone <= 0.5 + LINGER + LATE + 0.3, gone
    assert running.call(lambda: mw.connections.timed_out_count) == 0
    data, _ = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200") and len(data) < LARGE
    assert b"408" not in data[:100]  # a response had started: no 408 in the middle of it


def test_pipelined_partial_request_behind_an_unread_response_is_aborted_after_the_linger(
    parser: str,
) -> None:
    # A large response, a partial pipelined request, and nothing read: the
    # headers timeout fires, the close waits for the write buffer to drain,
    # and the linger aborts it.  The send timeout is off to isolate the linger.
    if parser == "h11":
        # h11 holds the pipelined bytes unread behind the response, so no
        # headers timeout runs (documented): the send timeout cuts it.
        mw = middleware(headers_timeout=0.5, request_timeout=5, send_timeout=1)
        with serve(mw, INTEGRATED[parser]) as running:
            sock = small_receiver(running.port)
            sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x")
            assert wait_for(lambda: running.call(lambda: mw.connections.stalled_count) == 1, 3)
            assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 10)
            totals = mw.enforcer.totals
            assert (totals.send_timeouts, totals.headers_timeouts) == (1, 0)
        return
    mw = middleware(headers_timeout=0.5, request_timeout=5, send_timeout=0)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = small_receiver(running.port)
        started = time.monotonic()
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x")
        assert_aborted_after_the_linger(running, mw, sock, started)
        assert mw.enforcer.totals.headers_timeouts == 1


def test_partial_body_behind_an_unread_response_is_aborted_after_the_linger(parser: str) -> None:
    # The app answers before reading the body; the body never completes and
    # the client reads nothing: the request timeout fires, then the linger.
    mw = middleware(headers_timeout=0.3, request_timeout=0.5, send_timeout=0)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = small_receiver(running.port)
        started = time.monotonic()
        sock.sendall(b"POST /large HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        assert_aborted_after_the_linger(running, mw, sock, started)
        assert mw.enforcer.totals.request_timeouts == 1


# -- minimum body rate ----------------------------------------------------------


@pytest.mark.parametrize("server", SERVERS)
def test_trickled_body_gets_408_at_the_grace(server: str, tmp_path: Path) -> None:
    grace = 1.0
    options = {"headers_timeout": 5, "request_timeout": 10, "body_min_rate": 500, "body_grace": grace}
    with serving(server, tmp_path / "server.log", **options) as target:
        sock = connect(target.port)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        sock.settimeout(0.2)
        data = b""
        while time.monotonic() - started < 3:
            try:
                sock.sendall(b"abc")  # 3 bytes every 0.2 s: 15 bytes/s
                data += sock.recv(1000)
                if data:
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        rest, closed = read_until_closed(sock)
        assert is_408(data + rest), data + rest
        # Behind from the start: cut at the end of the grace (the bytes buy
        # a few milliseconds), checked every 0.1 s at most.
        assert grace - EARLY <= closed - started <= grace + LATE, closed - started
        totals = target.totals()
        assert (totals["rate_timeouts"], totals["request_timeouts"]) == (1, 0)


def test_body_that_keeps_twice_the_rate_is_served(parser: str) -> None:
    mw = middleware(headers_timeout=5, request_timeout=10, body_min_rate=1000, body_grace=0.5)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = connect(running.port)
        size = 3000
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        # 100 bytes every 50 ms: 2,000 bytes/s for 1.5 s, well past the grace.
        for _ in range(size // 100):
            sock.sendall(b"x" * 100)
            time.sleep(0.05)
        assert read_response(sock).endswith(b"ok %d" % size)
        assert mw.enforcer.totals.rate_timeouts == 0


def test_upload_of_megabytes_at_a_healthy_rate_is_served(parser: str) -> None:
    # The defaults' rate with a short grace, so the rate is checked during the upload.
    mw = middleware(headers_timeout=5, request_timeout=30, body_grace=0.5)
    assert mw.settings.body_min_rate == 500.0
    with serve(mw, INTEGRATED[parser]) as running:
        sock = connect(running.port)
        size = 2 * 1024 * 1024
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        chunk = b"y" * (32 * 1024)
        for _ in range(size // len(chunk)):  # 32 KiB every 50 ms: about 640 KiB/s, 3.2 s
            sock.sendall(chunk)
            time.sleep(0.05)
        assert read_response(sock, limit=10).endswith(b"ok %d" % size)
        assert mw.enforcer.totals.rate_timeouts == 0


def test_asgi_only_mode_trickled_body_gets_408_at_the_grace(parser: str) -> None:
    grace = 1.0
    mw = middleware(request_timeout=10, body_min_rate=500, body_grace=grace, server_integration="off")
    with serve(mw, PLAIN[parser]) as running:
        sock = connect(running.port)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab")
        started = time.monotonic()
        time.sleep(0.2)
        sock.sendall(b"cd")
        data, closed = read_until_closed(sock)
        assert mw.mode == "asgi"
        assert is_408(data), data
        # The app is called once the headers are in, so the clock starts a little later.
        assert grace - EARLY <= closed - started <= grace + LATE, closed - started
        assert mw.enforcer.totals.rate_timeouts == 1


def test_body_held_up_by_a_busy_handler_is_not_the_clients_fault(parser: str) -> None:
    # The handler works 1.5 s before it reads the body; the server stops
    # reading once it has buffered 64 KiB, so the bytes received fall far
    # behind the rate, through no fault of the client.
    mw = middleware(headers_timeout=5, request_timeout=10, body_min_rate=100_000, body_grace=0.3)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = connect(running.port)
        size = 1024 * 1024
        sock.sendall(b"POST /busy HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        sock.sendall(b"z" * size)
        assert read_response(sock, limit=10).endswith(b"ok %d" % size)
        assert mw.enforcer.totals.rate_timeouts == 0


def test_asgi_only_mode_body_held_up_by_a_busy_handler_is_not_the_clients_fault(parser: str) -> None:
    mw = middleware(request_timeout=10, body_min_rate=100_000, body_grace=0.3, server_integration="off")
    with serve(mw, PLAIN[parser]) as running:
        sock = connect(running.port)
        size = 1024 * 1024
        sock.sendall(b"POST /busy HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
        sock.sendall(b"z" * size)
        assert read_response(sock, limit=10).endswith(b"ok %d" % size)
        assert mw.enforcer.totals.rate_timeouts == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_pipelined_slow_reader_cut_off_leaves_no_traceback(
    parser: str, loop: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # slowhttptest -X: three pipelined requests for a large response, and
    # nothing read.  Behind the aborted one, uvicorn's queued cycles would
    # write to the closed transport (uvloop raises, asyncio warns) unless
    # connlist marks them disconnected.
    monkeypatch.setattr(servers, "LOOP", loop)
    caplog.set_level(logging.INFO)
    mw = middleware(headers_timeout=5, request_timeout=10, send_timeout=0.5)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = small_receiver(running.port)
        sock.sendall(b"GET /large HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        assert wait_for(lambda: mw.enforcer.totals.send_timeouts == 1, 5)
        assert wait_for(lambda: running.call(lambda: len(mw.connections)) == 0, 3)
        time.sleep(0.3)  # what the apps still do after the abort
    noise = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "connlist"]
    assert noise == [], [r.getMessage() for r in noise]


# -- what is never cut: the server's own delays, and how TCP split the bytes ----


def read_until(sock: socket.socket, marker: bytes, limit: float = 10.0) -> tuple[bytes, float]:
    """What the server sends up to and including ``marker``; and the monotonic time it arrived."""
    sock.settimeout(limit)
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    return data, time.monotonic()


def read_until_orderly_close(sock: socket.socket) -> tuple[bytes, float]:
    """Everything up to the server's FIN, and when it came; a reset fails the test."""
    sock.settimeout(5)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pytest.fail(f"reset after {b''.join(chunks)!r}: a 408 that was sent ends with an orderly close")
    return b"".join(chunks), time.monotonic()


EXPECT = b"POST /busy?sleep=%g HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n"


def expect_100_continue(mw: Any, port: int, work: float, grace: float) -> None:
    """A handler that works ``work`` seconds before it reads the body; two clients that wait for 100 Continue.

    The first sends its body once told to: 200, never 408.  The second sends
    nothing after the 100 Continue: the grace starts then, so its 408 comes
    ``grace`` after it.
    """
    size = 1000
    served, silent = connect(port), connect(port)
    started = time.monotonic()
    served.sendall(EXPECT % (work, size))
    silent.sendall(EXPECT % (work, size))
    head, continued = read_until(served, b"\r\n\r\n")
    assert head == b"HTTP/1.1 100 Continue\r\n\r\n", head
    assert work - EARLY <= continued - started <= work + LATE, continued - started
    served.sendall(b"b" * size)
    assert read_response(served).endswith(b"ok %d" % size)
    head, _ = read_until(silent, b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), head
    data, closed = read_until_orderly_close(silent)
    assert is_408(head[len(b"HTTP/1.1 100 Continue\r\n\r\n") :] + data), head + data
    assert work + grace - EARLY <= closed - started <= work + grace + LATE + 0.1, closed - started
    assert mw.enforcer.totals.rate_timeouts == 1
    assert mw.enforcer.totals.request_timeouts == 0


def test_expect_100_continue_body_is_timed_from_the_100_continue(parser: str) -> None:
    grace = 1.0
    mw = middleware(headers_timeout=5, request_timeout=10, body_min_rate=500, body_grace=grace)
    with serve(mw, INTEGRATED[parser]) as running:
        expect_100_continue(mw, running.port, 4.0, grace)
        assert mw.mode == f"uvicorn-{parser}"


def test_asgi_only_mode_expect_100_continue_body_is_timed_from_the_100_continue(parser: str) -> None:
    grace = 1.0
    mw = middleware(request_timeout=10, body_min_rate=500, body_grace=grace, server_integration="off")
    with serve(mw, PLAIN[parser]) as running:
        expect_100_continue(mw, running.port, 1.5, grace)
        assert mw.mode == "asgi"


def split_body_pair(mw: Any, port: int) -> list[tuple[bytes, float]]:
    """The same body sent two ways at once: 2,000 bytes in the headers' write, or 50 ms after them.

    Then nothing until 1 s, then the last 2,000 bytes.  With a 0.5 s grace
    and 2,000 bytes/s, the first 2,000 bytes buy 1 s more: both are served,
    whichever read their bytes arrived in.
    """
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4000\r\n\r\n"
    together, apart = connect(port), connect(port)
    started = time.monotonic()
    together.sendall(head + b"t" * 2000)
    apart.sendall(head)
    time.sleep(0.05)
    apart.sendall(b"a" * 2000)
    time.sleep(max(0.0, started + 1.0 - time.monotonic()))
    verdicts = []
    for sock in (together, apart):
        sock.sendall(b"z" * 2000)
        sock.settimeout(5)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        verdicts.append((data.split(b"\r\n", 1)[0], time.monotonic() - started))
    return verdicts


def test_body_bytes_count_whichever_read_they_arrived_in(parser: str) -> None:
    mw = middleware(headers_timeout=5, request_timeout=10, body_min_rate=2000, body_grace=0.5)
    with serve(mw, INTEGRATED[parser]) as running:
        verdicts = split_body_pair(mw, running.port)
        assert [status for status, _ in verdicts] == [b"HTTP/1.1 200 OK"] * 2, verdicts
        assert mw.enforcer.totals.rate_timeouts == 0
        assert mw.mode == f"uvicorn-{parser}"


def test_asgi_only_mode_body_bytes_count_whichever_read_they_arrived_in(parser: str) -> None:
    mw = middleware(request_timeout=10, body_min_rate=2000, body_grace=0.5, server_integration="off")
    with serve(mw, PLAIN[parser]) as running:
        verdicts = split_body_pair(mw, running.port)
        assert [status for status, _ in verdicts] == [b"HTTP/1.1 200 OK"] * 2, verdicts
        assert mw.enforcer.totals.rate_timeouts == 0
        assert mw.mode == "asgi"
