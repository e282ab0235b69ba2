"""The servers' keep-alive timeout, timed by connlist's list: the same closes at the same times as theirs.

Each case runs against real servers started from the command line with
their keep-alive setting: ``uvicorn --timeout-keep-alive`` on both parsers,
and gunicorn's own ASGI worker (``gunicorn -k asgi --keep-alive``) on its
own.  Each serves an app without connlist (``tests.keepalive_app:bare``), and
the same app with ``ConnectionsMiddleware`` (the integration turns itself
on).  The clients use raw sockets, and the cases of one server run side by
side:

* a connection idle after one response is closed ``--timeout-keep-alive``
  after it;
* after pipelined requests, the same after the last response, also when
  one of them takes longer than the keep-alive time to answer (the last,
  or the first, the others waiting behind it);
* a request sent just before the deadline keeps the connection, which is
  then closed the keep-alive time after its response;
* a websocket idle for longer than that stays open;
* with ``--timeout-keep-alive 0``, the connection is closed at once after
  its response, as uvicorn does;
* a blank line after a response begins no request: the connection is
  still closed at the keep-alive time (uvicorn's httptools protocol would
  hold it for good; gunicorn's closes it so, with or without connlist).

For connlist, the view counts the closes (``keepalive_timeouts``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from websockets.sync.client import connect as ws_connect

from tests.servers import EARLY, LATE, connect, read_response, read_until_closed
from tests.subprocesses import PYTHON, get_json, gunicorn_command, run_server
from tests.targets import SERVERS

KEEP_ALIVE = 1.0
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
APPS = {"bare": "tests.keepalive_app:bare", "connlist": "tests.keepalive_app:app"}


def _command(app: str, server: str, keep_alive: float) -> Callable[[int], list[str]]:
    """``server`` (one of ``tests.targets.SERVERS``) serving ``app`` with its keep-alive setting."""
    name, _, parser = server.partition("-")
    if name == "gunicorn":
        return lambda port: gunicorn_command(
            port, app, "-k", "asgi", "--http-parser", parser, "--keep-alive", f"{keep_alive:g}", workers=1
        )
    return lambda port: [
        PYTHON, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
        "--http", parser, "--timeout-keep-alive", f"{keep_alive:g}", "--log-level", "warning",
    ]  # fmt: skip


SLOW = 1.5  # /slow's work, server side, before its response


class Closed:
    """When the server closed a connection, seen from the client on both sides of the last response.

    The keep-alive starts at the response's end, after the last request was
    sent (and after any work the server does for it) and before the client
    read the response: the close is at least the keep-alive time after the
    send plus that work, and at most the keep-alive time (plus ``LATE``)
    after the read, however late the client's thread ran.
    """

    def __init__(self, sock: socket.socket, sent: float, read: float, work: float = 0.0) -> None:
        data, closed = read_until_closed(sock, limit=KEEP_ALIVE + 5)
        assert data == b"", data
        self.after_send = closed - sent - work
        self.after_read = closed - read

    def check(self, name: str) -> None:
        assert self.after_send >= KEEP_ALIVE - EARLY, (name, "early", self.after_send)
        assert self.after_read <= KEEP_ALIVE + LATE, (name, "late", self.after_read)


def idle_after_one(port: int) -> Closed:
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(GET)
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    return Closed(sock, sent, time.monotonic())


def idle_after_pipelined(port: int) -> Closed:
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(GET * 3)
    for _ in range(3):
        assert read_response(sock).startswith(b"HTTP/1.1 200")
    return Closed(sock, sent, time.monotonic())


def pipelined_behind_a_slow_one(port: int) -> Closed:
    # The second request takes longer than the keep-alive time to answer.
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(GET + b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    assert read_response(sock).endswith(b"slow")
    return Closed(sock, sent, time.monotonic(), SLOW)


def pipelined_after_a_slow_one(port: int) -> Closed:
    # The second request waits behind a response slower than the keep-alive time.
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + GET)
    assert read_response(sock).endswith(b"slow")
    assert read_response(sock).endswith(b"ok")
    return Closed(sock, sent, time.monotonic(), SLOW)


def kept_by_a_request_just_before(port: int) -> Closed:
    sock = connect(port)
    sock.sendall(GET)
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    time.sleep(KEEP_ALIVE - 0.3)
    sent = time.monotonic()
    sock.sendall(GET)
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    return Closed(sock, sent, time.monotonic())


def websocket_outlives(port: int) -> None:
    with ws_connect(f"ws://127.0.0.1:{port}/ws", open_timeout=5) as ws:
        ws.send("a")
        assert ws.recv(timeout=5) == "a"
        time.sleep(KEEP_ALIVE + 0.5)
        ws.send("b")
        assert ws.recv(timeout=5) == "b"


def blank_line_after_a_response(port: int) -> Closed:
    # The blank line begins no request: the keep-alive still runs from the response.
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(GET)
    assert read_response(sock).startswith(b"HTTP/1.1 200")
    read = time.monotonic()
    sock.sendall(b"\r\n")
    return Closed(sock, sent, read)


CASES = (
    idle_after_one,
    idle_after_pipelined,
    pipelined_behind_a_slow_one,
    pipelined_after_a_slow_one,
    kept_by_a_request_just_before,
    websocket_outlives,
)
# The cases that end in a keep-alive close (the view counts them).
CLOSES = 5


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("app", list(APPS))
def test_closed_at_the_keep_alive_time(app: str, server: str, tmp_path: Path) -> None:
    cases = CASES
    if server.startswith("gunicorn"):
        cases += (blank_line_after_a_response,)  # (uvicorn's own would hold it: see the last test)
    with run_server(
        _command(APPS[app], server, KEEP_ALIVE), tmp_path / "server.log", ready_path="/"
    ) as running:
        with ThreadPoolExecutor(len(cases)) as pool:
            closes = dict(zip(cases, pool.map(lambda case: case(running.port), cases), strict=True))
        for case, closed in closes.items():
            if closed is not None:  # (a websocket stays open)
                closed.check(case.__name__)
        if app == "connlist":
            view = get_json(running.port, "/_connections")
            assert view["mode"] == server, view
            # The readiness checks' connections were closed at the keep-alive time too.
            assert view["totals"]["keepalive_timeouts"] >= CLOSES, view["totals"]
        log = running.log()
    assert "keep-alive" not in log, log


@pytest.mark.parametrize("app", list(APPS))
def test_keep_alive_zero_closes_after_the_response(app: str, parser: str, tmp_path: Path) -> None:
    command = _command(APPS[app], f"uvicorn-{parser}", 0)
    with run_server(command, tmp_path / "server.log", ready_path="/") as running:
        sock = connect(running.port)
        sent = time.monotonic()
        sock.sendall(GET)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert Closed(sock, sent, time.monotonic()).after_read <= LATE


def test_a_blank_line_after_a_response_does_not_hold_the_connection(tmp_path: Path) -> None:
    # uvicorn's httptools protocol cancels its timer at any read and arms it
    # again only after a response: a blank line would hold the connection
    # for good.  No request began, so the list still counts it idle.
    command = _command(APPS["connlist"], "uvicorn-httptools", KEEP_ALIVE)
    with run_server(command, tmp_path / "server.log", ready_path="/") as running:
        blank_line_after_a_response(running.port).check("blank line")
