"""Headers and request timeouts against real servers, raw sockets: uvicorn's two parsers, and gunicorn's.

Modelled on Node.js's test/parallel/test-http-server-headers-timeout-*.js,
test-http-server-request-timeout-*.js and
test/sequential/test-http-server-request-timeouts-mixed.js.  Headers timeout
0.5 s, request timeout 1 s; each test asserts when the 408 (or the close)
arrives, within [deadline - EARLY, deadline + LATE].  The tests that take
``target`` run on gunicorn's own ASGI worker too (``tests.targets``); those
that take ``server`` read uvicorn's list in the test's process.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.sync.client import connect as ws_connect

from connlist.core.connections import connection_state
from connlist.uvicorn import H11Protocol, HttpToolsProtocol
from tests.servers import (
    EARLY,
    INTEGRATED,
    LATE,
    LOOP,
    connect,
    is_408,
    middleware,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)
from tests.targets import SERVERS, Target, serving

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0


def assert_on_time(started: float, arrived: float, timeout: float) -> None:
    elapsed = arrived - started
    assert timeout - EARLY <= elapsed <= timeout + LATE, f"arrived after {elapsed:.3f}s, deadline {timeout}s"


@pytest.fixture
def server(parser: str):  # type: ignore[no-untyped-def]
    mw = middleware(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT)
    with serve(mw, INTEGRATED[parser]) as running:
        running.mw = mw  # type: ignore[attr-defined]
        yield running
    # Nothing leaked: every connection left both lists.
    assert len(mw.connections) == 0
    assert mw.connections.active_count == 0


@pytest.fixture(params=SERVERS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with serving(request.param, tmp_path / "server.log") as target:
        yield target
    if target.mw is not None:
        # Nothing leaked: every connection left both lists.
        assert len(target.mw.connections) == 0
        assert target.mw.connections.active_count == 0


def test_integration_is_in_use(server, parser: str) -> None:  # type: ignore[no-untyped-def]
    mw = server.mw
    sock = connect(server.port)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    # Not ASGI-only mode: the protocol announced itself and the list saw the connection.
    assert mw.mode == f"uvicorn-{parser}"
    expected = HttpToolsProtocol if parser == "httptools" else H11Protocol
    assert server.server.config.http_protocol_class is expected
    assert server.call(lambda: len(mw.connections)) == 1
    # The loop CONNLIST_TEST_LOOP asked for (.ci/run runs this file once on uvloop).
    assert type(server.loop).__module__.split(".")[0] == LOOP
    conn = server.call(lambda: mw.connections.all()[0])
    assert conn.requests == 1 and conn.path == "/" and conn.method == "GET"
    sock.close()
    assert wait_for(lambda: server.call(lambda: len(mw.connections)) == 0)


def test_connect_and_send_nothing(target: Target) -> None:
    started = time.monotonic()
    sock = connect(target.port)
    data, closed = read_until_closed(sock)
    assert is_408(data), data
    assert_on_time(started, closed, HEADERS_TIMEOUT)
    assert target.totals()["headers_timeouts"] == 1


def test_interrupted_headers(target: Target) -> None:
    sock = connect(target.port)
    time.sleep(0.2)  # the clock restarts at the first byte, as in Node
    started = time.monotonic()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nContent-Le")
    data, closed = read_until_closed(sock)
    assert is_408(data), data
    assert_on_time(started, closed, HEADERS_TIMEOUT)


def test_headers_trickled_slowly_are_cut_off(target: Target) -> None:
    # Slowloris: a header line every 0.2 s never completes the headers.
    sock = connect(target.port)
    started = time.monotonic()
    sock.sendall(b"GET / HTTP/1.1\r\n")
    sock.settimeout(0.2)
    data = b""
    for i in range(10):
        try:
            sock.sendall(b"X-Slow-%d: 1\r\n" % i)
            data += sock.recv(1000)
            if data:
                break
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    rest, closed = read_until_closed(sock)
    assert is_408(data + rest), data + rest
    assert_on_time(started, closed, HEADERS_TIMEOUT)


def test_keepalive_idle_gap_is_not_timed_then_slow_second_request(target: Target) -> None:
    sock = connect(target.port)
    # A slow but timely first request: headers in 0.3 s, within 0.5 s.
    sock.sendall(b"GET / HTTP/1.1\r\n")
    time.sleep(0.3)
    sock.sendall(b"Host: localhost\r\n\r\n")
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    # Idle for longer than both timeouts: idle connections are not timed.
    time.sleep(REQUEST_TIMEOUT + 0.3)
    started = time.monotonic()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: loc")
    data, closed = read_until_closed(sock)
    # The 408 answers the second request even though a response to the first went out.
    assert is_408(data), data
    assert_on_time(started, closed, HEADERS_TIMEOUT)


def test_pipelining_second_request_never_completes(server) -> None:  # type: ignore[no-untyped-def]
    sock = connect(server.port)
    started = time.monotonic()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\nGET / HTTP/1.1\r\nHost: loc")
    data, closed = read_until_closed(sock)
    first, sep, second = data.partition(b"ok 0")
    assert first.startswith(b"HTTP/1.1 200") and sep, data
    assert is_408(second), data
    assert_on_time(started, closed, HEADERS_TIMEOUT)


def test_pipelined_requests_behind_a_slow_response_are_not_cut_off(server) -> None:  # type: ignore[no-untyped-def]
    # Three complete requests at once; the first takes 0.3 s to answer.
    sock = connect(server.port)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
    for _ in range(3):
        assert read_response(sock).startswith(b"HTTP/1.1 200")
    sock.close()


def test_body_stops_halfway(target: Target) -> None:
    sock = connect(target.port)
    started = time.monotonic()
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
    data, closed = read_until_closed(sock)
    assert is_408(data), data
    assert_on_time(started, closed, REQUEST_TIMEOUT)
    assert target.totals()["request_timeouts"] == 1


def test_slow_but_timely_body(server) -> None:  # type: ignore[no-untyped-def]
    sock = connect(server.port)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
    for _ in range(4):
        time.sleep(0.15)
        sock.sendall(b"01234")
    assert read_response(sock).endswith(b"ok 20")
    sock.close()


def test_response_already_started_gets_no_408(server) -> None:  # type: ignore[no-untyped-def]
    sock = connect(server.port)
    started = time.monotonic()
    sock.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n01234")
    data, closed = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200"), data
    assert b"first chunk" in data
    assert b"408" not in data
    assert_on_time(started, closed, REQUEST_TIMEOUT)


def test_websocket_is_never_timed_out(target: Target) -> None:
    with ws_connect(f"ws://127.0.0.1:{target.port}/ws", open_timeout=5) as ws:
        # Upgraded: in the list, in neither active nor idle, and no timeout runs for it
        # (the other connection, active or idle, is the view's own).
        counts = target.counts()
        assert (counts["all"], counts["upgraded"], counts["active"] + counts["idle"]) == (2, 1, 1)
        time.sleep(REQUEST_TIMEOUT + 0.5)
        ws.send("still here")
        assert ws.recv(timeout=2) == "still here"
        assert target.counts()["upgraded"] == 1
    assert wait_for(lambda: target.counts()["upgraded"] == 0)


def test_mixed_clients(server) -> None:  # type: ignore[no-untyped-def]
    """Like Node's test-http-server-request-timeouts-mixed.js: several clients at once."""
    results: dict[str, tuple[bytes, float, float]] = {}

    def client(name: str, steps: list[tuple[float, bytes]]) -> None:
        sock = connect(server.port)
        started = time.monotonic()
        for delay, chunk in steps:
            time.sleep(delay)
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        data, closed = read_until_closed(sock)
        results[name] = (data, started, closed)

    # Connection: close, so that a served client is not left to uvicorn's keep-alive timeout.
    head = b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 6\r\n"
    clients = {
        # complete in time, then closes (Connection: close)
        "quick": [(0.0, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")],
        # headers in time, body in time
        "timely": [(0.0, head), (0.3, b"\r\n"), (0.3, b"abc"), (0.2, b"def")],
        # headers never complete
        "headers": [(0.0, head)],
        # headers in time, body never completes
        "body": [(0.0, head + b"\r\nabc")],
        # nothing at all
        "silent": [],
    }
    threads = [threading.Thread(target=client, args=item) for item in clients.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    data, _, _ = results["quick"]
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"ok 0"), data
    data, started, closed = results["timely"]
    assert data.startswith(b"HTTP/1.1 200") and b"ok 6" in data, data
    for name, timeout in (
        ("headers", HEADERS_TIMEOUT),
        ("silent", HEADERS_TIMEOUT),
        ("body", REQUEST_TIMEOUT),
    ):
        data, started, closed = results[name]
        assert is_408(data), (name, data)
        assert_on_time(started, closed, timeout)
    totals = server.mw.enforcer.totals
    assert (totals.headers_timeouts, totals.request_timeouts) == (2, 1)


def test_many_slow_clients_are_cut_off_while_others_are_served(server) -> None:  # type: ignore[no-untyped-def]
    count = 200
    socks: list[socket.socket] = []
    started = time.monotonic()
    for i in range(count):
        sock = connect(server.port)
        if i % 2:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(sock)
    # Every one seen by the server (on a busy machine the first may already
    # be cut while the last connect: the deadlines below allow for the setup).
    assert wait_for(lambda: server.call(lambda: server.mw.enforcer.totals.connections) == count)
    setup = time.monotonic() - started

    # Meanwhile an ordinary keep-alive client gets quick answers.
    latencies: list[float] = []

    def ordinary() -> None:
        sock = connect(server.port)
        while time.monotonic() - started < HEADERS_TIMEOUT + setup + LATE + 0.2:
            t = time.monotonic()
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"ok 0")
            latencies.append(time.monotonic() - t)
            time.sleep(0.02)
        sock.close()

    thread = threading.Thread(target=ordinary)
    thread.start()

    # Every slow client gets its 408 on time: watch all of them at once.
    selector = selectors.DefaultSelector()
    received = {sock: b"" for sock in socks}
    closed_at: dict[socket.socket, float] = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    while len(closed_at) < count and time.monotonic() - started < 10:
        for key, _ in selector.select(timeout=0.5):
            sock = key.fileobj  # type: ignore[assignment]
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if data:
                received[sock] += data
            else:
                closed_at[sock] = time.monotonic()
                selector.unregister(sock)
    selector.close()
    thread.join(10)
    assert len(closed_at) == count
    for sock in socks:
        assert is_408(received[sock]), received[sock]
        assert HEADERS_TIMEOUT - EARLY <= closed_at[sock] - started <= HEADERS_TIMEOUT + setup + LATE
        sock.close()
    assert len(latencies) >= 5
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.05, latencies
    assert server.mw.enforcer.totals.headers_timeouts == count
    assert wait_for(lambda: server.call(lambda: len(server.mw.connections)) == 0)


def test_without_a_minimum_rate_a_body_is_timed_by_the_request_timeout_alone(parser: str) -> None:
    # body_min_rate=0: the body never joins the rate's list, whatever it
    # does; it is served when it is in, and only the request timeout applies.
    mw = middleware(headers_timeout=HEADERS_TIMEOUT, request_timeout=REQUEST_TIMEOUT, body_min_rate=0)
    with serve(mw, INTEGRATED[parser]) as running:
        sock = connect(running.port)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")

        def records() -> list[tuple[str, bool]]:
            return [(connection_state(conn), conn.receiving_body) for conn in mw.connections.all()]

        assert wait_for(lambda: running.call(records) == [("reading_body", False)])
        assert mw.mode == f"uvicorn-{parser}"
        sock.sendall(b"56789")
        assert read_response(sock).endswith(b"ok 10")
        # A second body, never finished: cut at the request timeout, 408.
        started = time.monotonic()
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0")
        data, closed = read_until_closed(sock)
        assert is_408(data), data
        assert_on_time(started, closed, REQUEST_TIMEOUT)
        assert mw.enforcer.totals.request_timeouts == 1 and mw.enforcer.totals.rate_timeouts == 0
