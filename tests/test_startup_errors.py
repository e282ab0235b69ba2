"""A new user's three mistakes stop the server at start, under every serving command, with no flag.

A misspelled option, a value of the wrong type, and a headers timeout longer
than the request timeout: each is found while Starlette builds its
middleware, at the first lifespan call, and the middleware answers the
lifespan startup with ``lifespan.startup.failed`` (connlist.asgi.middleware,
``_defer``).  So ``uvicorn app:app`` (the lifespan ``auto``), ``fastapi
run``, gunicorn with uvicorn-worker's, gunicorn's own (``-k asgi``) and
connlist's workers, ``--lifespan on`` and examples/serve.py must all exit at
start, with one ERROR line that names the option and the rule.  Where the
lifespan failed for another reason (another middleware that cannot be
built) under uvicorn's ``auto``, the server integration's first connection
logs the ERROR that says what happened and how to see it.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Callable
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

STARLETTE_APP = "tests.settings_app:app"
HOST = ["--host", "127.0.0.1", "--port"]


def _uvicorn(*extra: str) -> Callable[[int], list[str]]:
    return lambda port: [PYTHON, "-m", "uvicorn", STARLETTE_APP, *HOST, str(port), *extra]


def _fastapi_run(port: int) -> list[str]:
    # tests/usual_app.py: a FastAPI app (add_middleware), the options from the same variable.
    return [PYTHON, "-m", "fastapi", "run", "tests/usual_app.py", *HOST, str(port)]


def _gunicorn(worker: str) -> Callable[[int], list[str]]:
    return lambda port: gunicorn_command(port, STARLETTE_APP, "-k", worker, workers=1)


# How users serve the app -> (the command, what must import for it, the server's line at a failed start).
UVICORN_FAILED = "Application startup failed. Exiting."
GUNICORN_FAILED = "Reason: Worker failed to boot."
LAUNCHERS: dict[str, tuple[Callable[[int], list[str]], str, str]] = {
    "uvicorn app:app": (_uvicorn(), "uvicorn", UVICORN_FAILED),
    "uvicorn app:app --http h11": (_uvicorn("--http", "h11"), "uvicorn", UVICORN_FAILED),
    "uvicorn app:app --lifespan on": (_uvicorn("--lifespan", "on"), "uvicorn", UVICORN_FAILED),
    "fastapi run": (_fastapi_run, "fastapi_cli", UVICORN_FAILED),
    "gunicorn -k uvicorn_worker.UvicornWorker": (
        _gunicorn("uvicorn_worker.UvicornWorker"),
        "uvicorn_worker",
        GUNICORN_FAILED,
    ),
    "gunicorn -k asgi": (_gunicorn("asgi"), "gunicorn.workers.gasgi", GUNICORN_FAILED),
    "gunicorn -k connlist.gunicorn.UvicornH11Worker": (
        _gunicorn("connlist.gunicorn.UvicornH11Worker"),
        "uvicorn_worker",
        GUNICORN_FAILED,
    ),
}

# Every mistake under uvicorn's default; one each (in turn) under the others: the path is the same.
CASES = [(mistake, "uvicorn app:app") for mistake in MISTAKES] + [
    (list(MISTAKES)[i % len(MISTAKES)], launcher)
    for i, launcher in enumerate(name for name in LAUNCHERS if name != "uvicorn app:app")
]


def exits_at_start(command: list[str], options: dict[str, Any]) -> tuple[int, str]:
    """Run a server given ``options`` that must fail to start; its exit code and output."""
    return subprocesses.exits_at_start(command, server_env(CONNLIST_TEST_OPTIONS=json.dumps(options)))


def error_lines(log: str) -> list[str]:
    """The log's ERROR lines (uvicorn's ``ERROR:`` and gunicorn's ``[ERROR]``) that are connlist's."""
    return [line for line in log.splitlines() if "ERROR" in line and "connlist:" in line]


@pytest.mark.parametrize(("mistake", "launcher"), CASES)
def test_a_bad_setting_stops_every_launcher_at_start(mistake: str, launcher: str) -> None:
    command, needs, failed = LAUNCHERS[launcher]
    pytest.importorskip(needs)
    options, message = MISTAKES[mistake]
    code, log = exits_at_start(command(free_port()), options)
    # uvicorn's exit code for a failed startup, gunicorn's for a worker that cannot boot.
    assert code == 3, log
    errors = error_lines(log)
    assert len(errors) == 1, log
    assert f"connlist: ConnectionsMiddleware cannot be built, so the app cannot run: {message}" in errors[0]
    assert failed in log, log
    # No traceback, and never served.
    assert "Traceback" not in log, log
    assert "Uvicorn running on" not in log and "Application startup complete" not in log, log


def test_the_lines_the_readme_quotes_are_uvicorns() -> None:
    # The README's bad setting, under the README's `uvicorn app:app`: the very lines it quotes.
    readme = (ROOT / "README.md").read_text()
    block = (
        readme.split("stops every one of these commands at start", 1)[1]
        .split("```text\n", 1)[1]
        .split("```", 1)[0]
    )
    code, log = exits_at_start(LAUNCHERS["uvicorn app:app"][0](free_port()), MISTAKES["misspelled"][0])
    assert code == 3
    lines = log.splitlines()
    quoted = block.splitlines()
    at = lines.index(quoted[0])
    assert lines[at : at + len(quoted)] == quoted, log


def test_the_example_server_stops_at_start() -> None:
    # examples/serve.py, the README's first command, with the example app's own settings.
    command = [PYTHON, str(EXAMPLES / "serve.py"), "--port", str(free_port())]
    env = server_env(CONNLIST_HEADERS_TIMEOUT="100", CONNLIST_REQUEST_TIMEOUT="30")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=START_LIMIT)
    log = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 3, log
    errors = error_lines(log)
    assert len(errors) == 1 and MISTAKES["headers-over-request"][1] in errors[0], log


def test_with_the_lifespan_off_the_first_request_says_it_once(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing can stop the server: every request fails with the error, and one ERROR line names it.
    caplog.set_level(logging.WARNING, logger="connlist")
    app = Starlette(middleware=[Middleware(ConnectionsMiddleware, headers_timout=10)])
    with serve(app, INTEGRATED[parser], lifespan="off") as running:
        for _ in range(2):
            sock = connect(running.port)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).startswith(b"HTTP/1.1 500 "), parser
    errors = [r.getMessage() for r in caplog.records if r.name == "connlist" and r.levelno == logging.ERROR]
    assert errors == [
        f"connlist: ConnectionsMiddleware cannot be built, so the app cannot run: {MISTAKES['misspelled'][1]}"
    ], errors


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
    # Another middleware that cannot be built (connlist's own bad settings stop the server instead).
    class Broken:
        def __init__(self, app: Any) -> None:
            raise RuntimeError("not today")

    app = Starlette(middleware=[Middleware(ConnectionsMiddleware), Middleware(Broken)])
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
        "WARNING connlist: no ConnectionsMiddleware started in the ASGI lifespan; "
        "the server enforces the default timeouts"
    ], lines


def test_auto_lifespan_of_an_app_that_cannot_be_told_says_both(
    parser: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A plain ASGI app (echo_app): connlist cannot look inside it, so it names both causes.
    lines = first_connection_log(echo_app, parser, "auto", caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "ERROR connlist: no ConnectionsMiddleware started in the ASGI lifespan: the app has "
        "none, or its lifespan failed"
    ), lines
    assert "Serve with --lifespan on to see the exception and stop at start." in lines[0]


def test_the_middleware_is_looked_for_through_wrappers() -> None:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from connlist.servers.seam import declares_middleware

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
