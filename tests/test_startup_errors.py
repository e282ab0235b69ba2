"""A new user's three mistakes stop the server at start, under every serving command the docs give.

A misspelled option, a value of the wrong type, and a headers timeout longer
than the request timeout: each raises while Starlette builds its middleware,
at the first lifespan call.  ``uvicorn --lifespan on`` (the README's and the
quickstart's command), examples/serve.py and gunicorn with connlist's workers
(lifespan ``on`` by default) must exit non-zero at start with the error,
naming the option, in their log.  Where the lifespan is still uvicorn's
``auto``, the server integration's first connection logs the ERROR that says
what happened and how to see it.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware

from connlist import ConnectionsMiddleware
from tests import subprocesses
from tests.servers import INTEGRATED, connect, echo_app, read_response, serve
from tests.subprocesses import EXAMPLES, PYTHON, ROOT, START_LIMIT, free_port, gunicorn_command, server_env

# Each mistake: the options, and what the server's log must say.
MISTAKES: dict[str, tuple[dict[str, Any], str]] = {
    "misspelled": (
        {"headers_timout": 10},
        "TypeError: ConnectionsMiddleware() got an unexpected keyword argument 'headers_timout'; "
        "did you mean 'headers_timeout'?",
    ),
    "wrong-type": (
        {"request_timeout": "30"},
        "TypeError: request_timeout must be a number of seconds, got str",
    ),
    "headers-over-request": (
        {"headers_timeout": 100, "request_timeout": 30},
        "ValueError: headers_timeout (100) must not be greater than request_timeout (30) "
        "when both are enabled",
    ),
}


def exits_at_start(command: list[str], options: dict[str, Any]) -> tuple[int, str]:
    """Run a server given ``options`` that must fail to start; its exit code and output."""
    return subprocesses.exits_at_start(command, server_env(CONNLIST_TEST_OPTIONS=json.dumps(options)))


@pytest.mark.parametrize("parser", list(INTEGRATED))
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_uvicorn_lifespan_on_stops_at_start(mistake: str, parser: str) -> None:
    options, message = MISTAKES[mistake]
    command = [PYTHON, "-m", "uvicorn", "tests.settings_app:app", "--lifespan", "on"]
    command += ["--http", INTEGRATED[parser], "--host", "127.0.0.1", "--port", str(free_port())]
    code, log = exits_at_start(command, options)
    assert code == 3, log  # uvicorn's exit code for a failed startup
    assert message in log, log
    assert "Application startup failed. Exiting." in log
    assert "Uvicorn running on" not in log


@pytest.mark.parametrize(
    ("mistake", "worker"),
    [
        ("misspelled", "connlist.gunicorn.UvicornWorker"),
        ("wrong-type", "connlist.gunicorn.UvicornH11Worker"),
        ("headers-over-request", "connlist.gunicorn.UvicornWorker"),
    ],
)
def test_gunicorn_with_connlists_worker_stops_at_start(mistake: str, worker: str) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    options, message = MISTAKES[mistake]
    # No -k on the command line would do too: the example config names the worker; be explicit.
    command = gunicorn_command(free_port(), "tests.settings_app:app", "-k", worker, workers=1)
    code, log = exits_at_start(command, options)
    assert code != 0, log
    assert message in log, log
    assert "Worker failed to boot." in log


def test_the_example_server_stops_at_start() -> None:
    # examples/serve.py, the README's first command, with the example app's own settings.
    command = [PYTHON, str(EXAMPLES / "serve.py"), "--port", str(free_port())]
    env = server_env(CONNLIST_HEADERS_TIMEOUT="100", CONNLIST_REQUEST_TIMEOUT="30")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=START_LIMIT)
    log = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 3, log
    assert MISTAKES["headers-over-request"][1] in log, log


# -- where the lifespan is still uvicorn's auto: the first connection says so -----


def first_connection_log(app: Any, parser: str, lifespan: str, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.set_level(logging.WARNING, logger="connlist")
    with serve(app, INTEGRATED[parser], lifespan=lifespan) as running:
        for _ in range(2):  # said once per server, not per connection
            sock = connect(running.port)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            read_response(sock)
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.name == "connlist"]


def test_auto_lifespan_that_failed_is_an_error_at_the_first_connection(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Starlette(middleware=[Middleware(ConnectionsMiddleware, headers_timout=10)])
    lines = first_connection_log(app, parser, "auto", caplog)
    errors = [line for line in lines if line.startswith("ERROR connlist: the app's ASGI lifespan failed")]
    assert len(errors) == 1, lines
    assert "Serve with --lifespan on to see it and stop at start." in errors[0]


def test_auto_lifespan_without_the_middleware_is_a_warning(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A Starlette app with no ConnectionsMiddleware declared: nothing failed, it has none.
    lines = first_connection_log(Starlette(), parser, "auto", caplog)
    assert [re.sub(r" \(.*", "", line) for line in lines] == [
        "WARNING connlist: no ConnectionsMiddleware in the ASGI lifespan state; "
        "the server enforces the default timeouts"
    ], lines


def test_auto_lifespan_of_an_app_that_cannot_be_told_says_both(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain ASGI app (echo_app): connlist cannot look inside it, so it names both causes.
    lines = first_connection_log(echo_app, parser, "auto", caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "ERROR connlist: no ConnectionsMiddleware in the ASGI lifespan state: the app has "
        "none, or its lifespan failed"
    ), lines
    assert "Serve with --lifespan on to see the exception and stop at start." in lines[0]


def test_the_middleware_is_looked_for_through_wrappers() -> None:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from connlist.server import declares_middleware

    declared = Starlette(middleware=[Middleware(ConnectionsMiddleware)])
    assert declares_middleware(ProxyHeadersMiddleware(declared)) is True  # as uvicorn loads it
    assert declares_middleware(ProxyHeadersMiddleware(Starlette())) is False
    assert declares_middleware(ConnectionsMiddleware(echo_app)) is True  # wrapped by hand
    assert declares_middleware(echo_app) is None  # a plain ASGI app: cannot tell

    class Loop:
        app: Any = None

    loop = Loop()
    loop.app = loop
    assert declares_middleware(loop) is None  # bounded: a cycle of .app ends the search
