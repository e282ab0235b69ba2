"""ASGI-only mode on other real servers: hypercorn and granian, each a subprocess on 127.0.0.1.

The middleware alone (``tests/asgi_app.py``: echo_app under
``ConnectionsMiddleware``, request timeout 1 s), raw sockets.  What ASGI-only
mode promises on any server: a body that stops arriving gets a ``408`` with
``Connection: close`` at the request deadline, and the connection closes.
What each server does besides (its own header timeouts, daphne's buffering)
is measured in docs/comparison.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import pytest

from tests.servers import EARLY, LATE, connect, read_response, read_until_closed
from tests.subprocesses import PYTHON, ROOT, Process, get_json, run_server, server_env

REQUEST_TIMEOUT = 1.0
APP = "tests.asgi_app:app"

COMMANDS: dict[str, Callable[[int], list[str]]] = {
    "hypercorn": lambda port: [PYTHON, "-m", "hypercorn", "--bind", f"127.0.0.1:{port}", APP],
    "granian": lambda port: [
        PYTHON,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        APP,
    ],
}


@pytest.fixture(scope="module", params=sorted(COMMANDS))
def other_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    name = request.param
    pytest.importorskip(name)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = server_env(PYTHONPATH=path, CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT))
    log = tmp_path_factory.mktemp(name) / "server.log"
    with run_server(COMMANDS[name], log, env=env) as server:
        yield server


def is_408_close(data: bytes) -> bool:
    # hypercorn sends no reason phrase ("HTTP/1.1 408 \r\n"); granian does.
    head = data.partition(b"\r\n\r\n")[0].lower()
    return head.startswith(b"http/1.1 408") and b"\r\nconnection: close" in head


def test_mode_is_asgi_only(other_server: Process) -> None:
    debug = get_json(other_server.port, "/_connections")
    assert debug["mode"] == "asgi"
    assert debug["request_timeout"] == REQUEST_TIMEOUT


def test_timely_body_is_served(other_server: Process) -> None:
    sock = connect(other_server.port)
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
    time.sleep(0.3)
    sock.sendall(b"56789")
    assert read_response(sock).endswith(b"ok 10")


def test_body_stops_halfway(other_server: Process) -> None:
    before = get_json(other_server.port, "/_connections")["totals"]["request_timeouts"]
    sock = connect(other_server.port)
    started = time.monotonic()
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n0123456789")
    # The 408 at the deadline, then the server closes: read_until_closed
    # times out (and the test fails) on a connection left open.
    data, closed = read_until_closed(sock, limit=REQUEST_TIMEOUT + 3)
    assert is_408_close(data), (data, other_server.log())
    assert REQUEST_TIMEOUT - EARLY <= closed - started <= REQUEST_TIMEOUT + LATE, closed - started
    after = get_json(other_server.port, "/_connections")
    assert after["totals"]["request_timeouts"] == before + 1
    assert after["counts"]["active"] == 0


def test_body_trickled_past_the_deadline(other_server: Process) -> None:
    # A byte every 0.2 s: each one arrives, the whole body not within 1 s.
    sock = connect(other_server.port)
    started = time.monotonic()
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
    sock.settimeout(0.2)
    data = b""
    while time.monotonic() - started < REQUEST_TIMEOUT + 2 and not data:
        try:
            sock.sendall(b"x")
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
    rest, closed = read_until_closed(sock, limit=3)
    data += rest
    assert is_408_close(data), data
    assert REQUEST_TIMEOUT - EARLY <= closed - started <= REQUEST_TIMEOUT + LATE + 0.2, closed - started


def test_log_says_asgi_only_mode(other_server: Process) -> None:
    # The middleware's own warning reaches the server's log (each server configures logging its own way).
    get_json(other_server.port, "/_connections")
    assert "connlist: ASGI-only mode" in other_server.log()
