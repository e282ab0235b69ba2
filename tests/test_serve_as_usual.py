"""Add the middleware, serve as usual: the server integration turns itself on, with no flag.

A FastAPI app that only adds ``ConnectionsMiddleware`` (tests/usual_app.py)
is served every way its users serve it, each a real process on 127.0.0.1.
In each, a client that sends half a request and then nothing gets its
``408`` at the headers timeout, every worker's view names the parser, and
each worker's log has the INFO line that says the integration is on.  Then
what must stay off: ``server_integration="off"``, a protocol connlist does
not know (a user's own, uvicorn's zttp), and ``"required"`` where it cannot
be on, which refuses to start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.servers import EARLY, LATE, connect, is_408, read_until_closed
from tests.subprocesses import (
    PYTHON,
    START_LIMIT,
    Process,
    exits_at_start,
    free_port,
    get_json,
    gunicorn_command,
    run_server,
    server_env,
)
from tests.usual_app import HEADERS_TIMEOUT

pytest.importorskip("fastapi_cli")
pytest.importorskip("uvicorn_worker")

APP = "tests.usual_app:app"
HOST = ["--host", "127.0.0.1", "--port"]
# What half a request looks like: a request line and one header, then nothing.
HALF = b"GET / HTTP/1.1\r\nHost: x\r\n"


def _uvicorn(*extra: str) -> Callable[[int], list[str]]:
    return lambda port: [PYTHON, "-m", "uvicorn", APP, *HOST, str(port), *extra]


def _fastapi(command: str, *extra: str) -> Callable[[int], list[str]]:
    return lambda port: [PYTHON, "-m", "fastapi", command, "tests/usual_app.py", *HOST, str(port), *extra]


def _run(port: int) -> list[str]:
    code = f"import uvicorn; from tests.usual_app import app; uvicorn.run(app, host='127.0.0.1', port={port})"
    return [PYTHON, "-c", code]


def _gunicorn(worker: str) -> Callable[[int], list[str]]:
    return lambda port: gunicorn_command(port, APP, "-k", worker, workers=2)


# How users serve the app -> (the command, the parser every worker must run, its workers).
SERVED: dict[str, tuple[Callable[[int], list[str]], str, int]] = {
    "uvicorn app:app": (_uvicorn(), "httptools", 1),
    "uvicorn app:app --http h11": (_uvicorn("--http", "h11"), "h11", 1),
    "uvicorn app:app --workers 2": (_uvicorn("--workers", "2"), "httptools", 2),
    "uvicorn app:app --reload": (_uvicorn("--reload", "--reload-dir", "tests/reload_watch"), "httptools", 1),
    "uvicorn.run(app)": (_run, "httptools", 1),
    "fastapi run": (_fastapi("run"), "httptools", 1),
    "fastapi dev": (_fastapi("dev", "--reload-dir", "tests/reload_watch"), "httptools", 1),
    "gunicorn -k uvicorn_worker.UvicornWorker": (_gunicorn("uvicorn_worker.UvicornWorker"), "httptools", 2),
    "gunicorn -k uvicorn_worker.UvicornH11Worker": (_gunicorn("uvicorn_worker.UvicornH11Worker"), "h11", 2),
    "gunicorn -k connlist.gunicorn.UvicornWorker": (
        _gunicorn("connlist.gunicorn.UvicornWorker"),
        "httptools",
        2,
    ),
    "uvicorn --http connlist.uvicorn:HttpToolsProtocol": (
        _uvicorn("--http", "connlist.uvicorn:HttpToolsProtocol"),
        "httptools",
        1,
    ),
}

ON_LINE = re.compile(r"connlist: server integration on \(uvicorn ([^,]+), (httptools|h11)")


def _views(server: Process, workers: int) -> list[dict[str, Any]]:
    """Every worker's view (``workers=all`` once all of them have a socket for their siblings)."""
    deadline = time.monotonic() + START_LIMIT
    while True:
        answer = get_json(server.port, "/_connections?workers=all")
        views: list[dict[str, Any]] = answer["workers"]
        if len(views) >= workers or time.monotonic() > deadline:
            return views
        time.sleep(0.05)


def _silent_client_cut(port: int) -> float:
    """Half a request, then nothing: how long until the ``408`` and the close (fails without them)."""
    sock = connect(port)
    sent = time.monotonic()
    sock.sendall(HALF)
    data, closed = read_until_closed(sock, limit=HEADERS_TIMEOUT + 5)
    assert is_408(data), data
    return closed - sent


def _endless_head_cut(port: int) -> bytes:
    """Header lines without end: what the server answers before the client has sent 1 MiB."""
    sock = connect(port)
    line = b"X-Endless: " + b"e" * 1000 + b"\r\n"
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        sock.sendall(HALF)
        for _ in range(1024 * 1024 // len(line)):
            sock.sendall(line)
    return read_until_closed(sock)[0]


@pytest.mark.parametrize("served", list(SERVED))
def test_the_integration_turns_itself_on(served: str, tmp_path: Path) -> None:
    command, parser, workers = SERVED[served]
    with run_server(command, tmp_path / "server.log") as server:
        views = _views(server, workers)
        assert len(views) == workers, views
        assert {view["mode"] for view in views} == {f"uvicorn-{parser}"}, views
        assert {view["integration_off"] for view in views} == {None}
        assert {view["server_integration"] for view in views} == {"auto"}
        took = _silent_client_cut(server.port)
        assert HEADERS_TIMEOUT - EARLY <= took <= HEADERS_TIMEOUT + LATE, took
        # A head that never ends: 431 at max_header_size (16 KiB), long before the client is done.
        assert _endless_head_cut(server.port).startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        log = server.log()
    lines = ON_LINE.findall(log)
    # One line per worker; the explicit flag says so too.
    assert lines == [(uvicorn.__version__, parser)] * workers, log
    assert "ASGI-only mode" not in log, log


def _held(port: int) -> None:
    """The silent client is still connected well past the headers timeout (nothing cuts it)."""
    sock = connect(port)
    sock.sendall(HALF)
    sock.settimeout(HEADERS_TIMEOUT + 1)
    with pytest.raises(TimeoutError):
        sock.recv(1)


def test_off_leaves_the_server_alone(parser: str, tmp_path: Path) -> None:
    env = server_env(CONNLIST_TEST_OPTIONS=json.dumps({"server_integration": "off"}))
    with run_server(_uvicorn("--http", parser), tmp_path / "server.log", env=env) as server:
        view = get_json(server.port, "/_connections")
        assert view["mode"] == "asgi" and view["server_integration"] == "off"
        assert view["integration_off"] == 'server_integration is "off"'
        _held(server.port)
        log = server.log()
    assert "server integration on" not in log
    (warning,) = [line for line in log.splitlines() if "ASGI-only mode" in line]
    assert (
        'Why it is off: server_integration is "off". To turn it on: set server_integration="auto"' in warning
    )


def _protocols() -> dict[str, str]:
    """Protocols connlist leaves alone: a user's own subclass, and uvicorn's zttp where it has one."""
    protocols = {"own": "tests.usual_app:OwnProtocol"}
    # (uvicorn 0.54 and later, with the zttp package, which the test extra installs on Linux)
    if "zttp" in uvicorn.config.HTTP_PROTOCOLS and importlib.util.find_spec("zttp") is not None:
        protocols["zttp"] = "zttp"
    return protocols


@pytest.mark.parametrize("protocol", list(_protocols()))
def test_a_protocol_connlist_does_not_know_is_left_alone(protocol: str, tmp_path: Path) -> None:
    with run_server(_uvicorn("--http", _protocols()[protocol]), tmp_path / "server.log") as server:
        view = get_json(server.port, "/_connections")
        assert view["mode"] == "asgi"
        assert "so connlist leaves it alone" in view["integration_off"]
        _held(server.port)
        log = server.log()
    (warning,) = [line for line in log.splitlines() if "ASGI-only mode" in line]
    assert "neither uvicorn's own httptools or h11 protocol nor one of connlist.uvicorn's" in warning


def _refuses(command: list[str], env: dict[str, str]) -> str:
    """A server that must refuse to start: its log."""
    code, log = exits_at_start(command, env)
    assert code == 3, log  # uvicorn's status for a failed startup
    assert "Uvicorn running on" not in log
    return log


@pytest.mark.parametrize("protocol", list(_protocols()))
@pytest.mark.parametrize("how", ["option", "environment"])
def test_required_refuses_to_start_where_it_cannot_be_on(protocol: str, how: str) -> None:
    if how == "option":
        env = server_env(CONNLIST_TEST_OPTIONS=json.dumps({"server_integration": "required"}))
    else:
        env = server_env(CONNLIST_REQUIRE_INTEGRATION="1")
    command = _uvicorn("--http", _protocols()[protocol])(free_port())
    log = _refuses(command, env)
    (refusal,) = [line for line in log.splitlines() if "connlist:" in line]
    assert (
        "connlist: the server integration is off and it is required, so the server refuses to start: "
        "the server's HTTP protocol is "
    ) in refusal
    assert refusal.endswith("so connlist leaves it alone"), refusal


def test_the_environment_wins_over_required(tmp_path: Path) -> None:
    # The operator's CONNLIST_REQUIRE_INTEGRATION=0 makes "required" "auto": served, in ASGI-only mode.
    env = server_env(
        CONNLIST_TEST_OPTIONS=json.dumps({"server_integration": "required"}), CONNLIST_REQUIRE_INTEGRATION="0"
    )
    with run_server(
        _uvicorn("--http", "tests.usual_app:OwnProtocol"), tmp_path / "server.log", env=env
    ) as server:
        view = get_json(server.port, "/_connections")
    assert view["mode"] == "asgi" and view["server_integration"] == "auto"
