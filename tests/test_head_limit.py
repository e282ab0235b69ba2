"""The request head's bound and pipelining, against real servers: uvicorn's two parsers, and gunicorn's.

Node.js's tests, ported (test/parallel/test-http-header-overflow.js,
test-http-max-http-headers.js, test-http-max-header-size-per-stream.js,
test-http-pipeline-requests-connection-leak.js, test-http-pipeline-flood.js),
on every server connlist integrates with (``tests.targets``), with raw
sockets on 127.0.0.1; and the legitimate clients the bound must not cut: a
request with large cookies, a pipelined request behind a response that takes
its time, a head split across reads behind one.  One server per target and
option set serves a module's tests (none changes it); what the server did is
read from its debug view.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import connect, read_response, read_until_closed, wait_for
from tests.targets import SERVERS, Target, serving

LIMIT = 16384
RAISED = 65536
# Timeouts no test here reaches, even on a loaded machine (sixty pipelined requests answered
# one by one): the bound is the point, not the clock.
TIMEOUTS = {"headers_timeout": 30.0, "request_timeout": 60.0}
RESPONSE_431 = b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"


@contextlib.contextmanager
def _serving(name: str, log: Path, **options: object) -> Iterator[Target]:
    with serving(name, log, **TIMEOUTS, **options) as target:
        yield target


@pytest.fixture(scope="module", params=SERVERS)
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    with _serving(request.param, tmp_path_factory.mktemp("head") / "server.log") as target:
        yield target


@pytest.fixture(scope="module", params=SERVERS)
def raised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    log = tmp_path_factory.mktemp("raised") / "server.log"
    with _serving(request.param, log, max_header_size=RAISED) as target:
        yield target


def head(size: int, *, path: bytes = b"/", close: bool = True) -> bytes:
    """A ``GET`` whose head (request line through the blank line) is ``size`` bytes.

    Cookies in lines of at most 4,000 bytes, as a browser with large cookies
    sends them, within every server's own limits on one line (gunicorn's
    ``--limit-request-field_size``, 8,190 bytes).
    """
    start = b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"")
    lines = [start]
    left = size - len(start) - 2  # the blank line
    while left > 0:
        value = min(left - len(b"Cookie: \r\n"), 4000)
        if value < 1:
            # Too little left for a cookie line: the first line takes it.
            lines[0] = start.replace(b"Host: x", b"Host: " + b"x" * (1 + left))
            break
        line = b"Cookie: " + b"c" * value + b"\r\n"
        lines.append(line)
        left -= len(line)
    data = b"".join(lines) + b"\r\n"
    assert len(data) == size, (len(data), size)
    return data


def overflows(target: Target) -> int:
    return target.totals()["header_overflows"]


def answer(sock: socket.socket) -> bytes:
    data, _ = read_until_closed(sock)
    return data


# -- test-http-header-overflow.js: at the limit served, one byte over 431 -------


def test_a_head_at_the_limit_is_served(target: Target) -> None:
    sock = connect(target.port)
    sock.sendall(head(LIMIT))
    assert answer(sock).startswith(b"HTTP/1.1 200"), target.name


def test_one_byte_over_the_limit_is_answered_431_and_closed(target: Target) -> None:
    before = overflows(target)
    sock = connect(target.port)
    sock.sendall(head(LIMIT + 1))
    data = answer(sock)
    assert data == RESPONSE_431 + b"Content-Length: 0\r\n\r\n", data
    assert overflows(target) == before + 1
    # Counted in the view's recent cuts too, as a kind of its own.
    assert wait_for(lambda: target.counts()["all"] == 1)


def test_large_cookies_are_served(target: Target) -> None:
    sock = connect(target.port)
    sock.sendall(head(12 * 1024))
    assert answer(sock).startswith(b"HTTP/1.1 200")


def test_a_head_in_one_read_far_over_the_limit_is_cut_before_it_is_parsed(target: Target) -> None:
    # 200 KB in one send: whole in the server's first reads, which the parser never gets.
    before = overflows(target)
    sock = connect(target.port)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(head(200_000))
    assert answer(sock).startswith(RESPONSE_431)
    assert overflows(target) == before + 1


# -- test-http-max-http-headers.js: a head in 100-byte pieces -------------------


def _send_in_pieces(sock: socket.socket, data: bytes, piece: int = 100) -> tuple[int, bytes]:
    """``data`` in ``piece``-byte sends until the server answers or closes: bytes sent, and what it said."""
    sent = 0
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while sent < len(data):
            try:
                sock.sendall(data[sent : sent + piece])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += piece
            if selector.select(0.002):
                break
    return sent, answer(sock)


def test_a_head_in_pieces_is_cut_at_the_limit(target: Target) -> None:
    sock = connect(target.port)
    sent, data = _send_in_pieces(sock, head(4 * LIMIT))
    assert data.startswith(RESPONSE_431), data[:80]
    # Cut at the read that passed the limit: the server read no more than a piece beyond it,
    # and the client was stopped long before its head's end.
    assert sent < 2 * LIMIT, sent


@pytest.mark.parametrize("first", [b"GET /a HTTP/1.1", b"GET /a HTTP/1.1\r\nX: " + b"x" * 8000])
def test_a_head_whose_read_begins_with_a_line_end_is_still_bounded(target: Target, first: bytes) -> None:
    # The previous read ended mid-line: a read that begins with CRLF need not end the head.
    sock = connect(target.port)
    sock.sendall(first)
    time.sleep(0.2)  # (two reads)
    rest = b"\r\nHost: x\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 300) for i in range(60)) + b"\r\n"
    assert len(first) + len(rest) > LIMIT
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(rest)
    assert answer(sock).startswith(RESPONSE_431)


def test_a_head_in_pieces_just_under_the_limit_is_served(target: Target) -> None:
    sock = connect(target.port)
    sent, data = _send_in_pieces(sock, head(LIMIT - 1))
    assert sent >= LIMIT - 1
    assert data.startswith(b"HTTP/1.1 200"), data[:80]


# -- test-http-max-header-size-per-stream.js: a raised limit ---------------------


def test_a_raised_limit_takes_a_head_three_times_the_default(raised: Target) -> None:
    for size in (3 * LIMIT, 40 * 1024, RAISED):
        sock = connect(raised.port)
        sock.sendall(head(size))
        assert answer(sock).startswith(b"HTTP/1.1 200"), (raised.name, size)
    sock = connect(raised.port)
    sock.sendall(head(RAISED + 1))
    assert answer(sock).startswith(RESPONSE_431)
    assert raised.view()["max_header_size"] == RAISED


# -- test-http-pipeline-requests-connection-leak.js: every pipelined request answered --


def _pipelined(count: int) -> bytes:
    """``count`` pipelined POSTs, request i with a body of ``i % 97`` bytes, the last closing."""
    requests = []
    for i in range(count):
        body = b"b" * (i % 97)
        close = b"Connection: close\r\n" if i == count - 1 else b""
        requests.append(
            b"POST / HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s" % (close, len(body), body)
        )
    return b"".join(requests)


def test_a_burst_of_pipelined_requests_is_answered_whole_and_in_order(target: Target) -> None:
    count = 3000
    sock = connect(target.port, timeout=30)
    sock.sendall(_pipelined(count))
    data, _ = read_until_closed(sock, 30)
    bodies = [part.rpartition(b"\r\n\r\n")[2] for part in data.split(b"HTTP/1.1 200 OK")[1:]]
    assert len(bodies) == count, (target.name, len(bodies))
    assert bodies == [b"ok %d" % (i % 97) for i in range(count)]


def test_ten_thousand_pipelined_gets_are_all_answered(target: Target) -> None:
    count = 10_000
    sock = connect(target.port, timeout=30)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * (count - 1) + head(100))
    data, _ = read_until_closed(sock, 30)
    assert data.count(b"HTTP/1.1 200 OK") == count


# -- test-http-pipeline-flood.js: once responses back up, nothing more is read ------


def test_a_client_that_pipelines_and_reads_nothing_is_not_read_on(target: Target) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", target.port))
    sock.settimeout(0.5)
    # /tail answers 64,000 bytes: the client's buffer and the server's fill after a few.
    request = b"GET /tail HTTP/1.1\r\nHost: x\r\n\r\n"
    burst = request * 1000
    sent = 0
    deadline = time.monotonic() + 3
    with contextlib.suppress(TimeoutError, BlockingIOError):
        while time.monotonic() < deadline:
            sent += sock.send(burst)
    # The server stopped reading: what the client could send is what the kernel's buffers and
    # one read take, not the 3 s of a client that writes as fast as it can.
    assert sent < 8 * 1024 * 1024, sent
    view = target.view()
    [conn] = [c for c in view["all"] if c["path"] != "/_connections"]
    assert conn["requests"] < 1000, conn
    sock.close()


def test_a_client_that_pipelines_and_reads_as_fast_as_it_can_is_held_to_one_read(target: Target) -> None:
    # Each response's end, and each receive() of the app, would let the server read on: what it
    # holds unparsed must stay one read (uvicorn's resumes undid the hold: a read per request).
    sock = connect(target.port, timeout=5)
    # /slow reads its body, then answers 0.3 s later: the client sends far faster than it is answered.
    request = b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    stop = time.monotonic() + 2
    answered = [0]

    def send() -> None:
        with contextlib.suppress(OSError):
            while time.monotonic() < stop:
                sock.sendall(request * 500)

    def read() -> None:
        with contextlib.suppress(OSError):
            while time.monotonic() < stop + 1:
                data = sock.recv(65536)
                if not data:
                    return
                answered[0] += data.count(b"HTTP/1.1 200")

    threads = [threading.Thread(target=send, daemon=True), threading.Thread(target=read, daemon=True)]
    for thread in threads:
        thread.start()
    held = []
    while time.monotonic() < stop:
        held.append(target.view()["unread_bytes"])
        time.sleep(0.1)
    assert max(held) <= 256 * 1024, held
    assert answered[0] >= 3
    sock.close()
    for thread in threads:
        thread.join(3)


# -- legitimate clients the bound must not cut --------------------------------------


def test_a_pipelined_request_behind_a_slow_response_is_answered_after_it(target: Target) -> None:
    # /slow answers after 0.3 s (its body read first); the next request arrives meanwhile,
    # in its own read, its head split in two.
    sock = connect(target.port)
    sock.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
    time.sleep(0.05)
    sock.sendall(b"GET / HTTP/1.1\r\nHo")
    time.sleep(0.05)
    sock.sendall(b"st: x\r\n" + b"Cookie: " + b"c" * 3000 + b"\r\n\r\n")
    first = read_response(sock)
    second = read_response(sock)
    assert first.endswith(b"ok 2") and second.endswith(b"ok 0"), (first, second)


def test_a_pipelined_request_behind_a_response_whose_app_runs_on_is_answered_at_once(target: Target) -> None:
    # /background answers after 0.3 s, then keeps its call running for 3 s (a background task);
    # a request pipelined while it is served is answered next, not when the task ends.
    sock = connect(target.port)
    sock.sendall(b"GET /background?sleep=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.1)
    started = time.monotonic()
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock).endswith(b"bg")
    assert read_response(sock).endswith(b"ok 0")
    assert time.monotonic() - started < 1.5


def test_pipelined_requests_behind_a_response_that_runs_on_stay_in_order(target: Target) -> None:
    # A background task still running; a body its app never reads (/tail answers without
    # reading it), requests pipelined behind it in the same send; then one more request, sent alone.
    # On uvicorn the body outgrows the transport's buffer: reading pauses, and resumes after the
    # response.  gunicorn keeps a connection alive after an unread body only if the whole body was
    # in when the app returned, and closes it silently otherwise (bare gunicorn 27.0.1 does so in
    # about a run in four on a loaded machine): there the body is one loopback segment, in at once.
    sock = connect(target.port, timeout=10)
    sock.sendall(b"GET /background?sleep=3 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock).endswith(b"bg")
    body = b"b" * (300_000 if target.name.startswith("uvicorn") else 30_000)
    names = [b"/a%02d" % i for i in range(60)]
    pipelined = b"".join(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (n, len(n), n) for n in names
    )
    sock.sendall(
        b"POST /tail?bytes=2 HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body + pipelined
    )
    time.sleep(0.3)
    sock.sendall(b"POST /z HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nzzz")
    answers = [read_response(sock, 10).rpartition(b"\r\n\r\n")[2] for _ in range(len(names) + 2)]
    assert answers == [b"tt"] + [b"ok %d" % len(n) for n in names] + [b"ok 3"], answers


def test_an_upload_with_100_continue_is_served(target: Target) -> None:
    body = b"u" * 300_000
    sock = connect(target.port)
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    sock.settimeout(5)
    assert sock.recv(1000).startswith(b"HTTP/1.1 100")
    sock.sendall(body)
    assert read_response(sock).endswith(b"ok %d" % len(body))


def test_a_body_and_the_next_request_in_one_send_are_both_served(target: Target) -> None:
    # A long read that holds a body's end and a whole request after it.
    body = b"u" * 100_000
    sock = connect(target.port)
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body) + head(8000)
    )
    assert read_response(sock).endswith(b"ok %d" % len(body))
    assert read_response(sock).endswith(b"ok 0")
