"""gunicorn's own ASGI worker (``gunicorn -k asgi``), real processes, no flag: connlist's protocol at work.

Each server is started as its users start it (``gunicorn -k asgi -w N
tests.gunicorn_asgi_app:app``); the middleware puts connlist's class in each
worker at the lifespan startup.  Checked here: every worker runs it, with no
flag; legitimate clients are left alone (keep-alive, a body slower than the
headers timeout but on time, ``Expect: 100-continue``); the ways to turn it
off, the worker class, the connection budget, and a gunicorn that changed.
Both of gunicorn's HTTP/1 parsers (python; fast, gunicorn_h1c, where it is
installed).

The timeouts' scenarios that uvicorn shares run on gunicorn from their own
files (``tests.targets``): test_timeouts.py (the headers and request
timeouts, a websocket), test_hardening.py (the minimum body rate, the send
timeout's reset) and test_keepalive.py (the keep-alive, against bare
gunicorn's).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gunicorn.workers.gasgi")


from tests.servers import EARLY, GUNICORN_PARSERS, LATE, connect, is_408, read_response, read_until_closed
from tests.subprocesses import Process, exits_at_start, get_json, gunicorn_command, run_server, server_env
from tests.targets import serving

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 2.0
KEEP_ALIVE = 1
WORKERS = 2
GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
OPTIONS = {"headers_timeout": HEADERS_TIMEOUT, "request_timeout": REQUEST_TIMEOUT}


def command(
    app: str, *options: str, workers: int = 1, parser: str = "python", keep_alive: int = KEEP_ALIVE
) -> Callable[[int], list[str]]:
    return lambda port: gunicorn_command(
        port, app, "-k", "asgi", "--http-parser", parser, "--keep-alive", str(keep_alive), *options,
        workers=workers,
    )  # fmt: skip


def env(**options: Any) -> dict[str, str]:
    return server_env(CONNLIST_OPTIONS=json.dumps({**OPTIONS, **options}))


def views(port: int, workers: int, tries: int = 100) -> dict[int, dict[str, Any]]:
    """The debug view by pid, from fresh connections, until ``workers`` answered (at most ``tries``)."""
    answers: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        answer = get_json(port, "/_connections")
        answers[answer["pid"]] = answer
        if len(answers) >= workers:
            break
    return answers


@pytest.fixture(scope="module", params=GUNICORN_PARSERS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    parser: str = request.param
    log = tmp_path_factory.mktemp("gunicorn-asgi") / "gunicorn.log"
    with run_server(
        command("tests.gunicorn_asgi_app:app", workers=WORKERS, parser=parser),
        log,
        env=env(),
        ready=lambda port: len(views(port, WORKERS, tries=10)) == WORKERS,
    ) as server:
        server.parser = parser  # type: ignore[attr-defined]
        yield server


def test_every_worker_runs_connlist_protocol_with_no_flag(served: Process) -> None:
    parser = served.parser  # type: ignore[attr-defined]
    answers = views(served.port, WORKERS)
    assert len(answers) == WORKERS, answers
    for pid, view in answers.items():
        assert view["mode"] == f"gunicorn-{parser}", (pid, view)
        assert view["integration_off"] is None, view
        # gunicorn's own --keep-alive, not uvicorn's default.
        assert view["keep_alive"] == KEEP_ALIVE, view
        assert view["headers_timeout"] == HEADERS_TIMEOUT
    # Every worker in one answer: each found it is one of gunicorn's master's at its lifespan startup.
    deadline = time.monotonic() + 10
    while True:
        every = get_json(served.port, "/_connections?workers=all")["workers"]
        if len(every) >= WORKERS or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sorted(view["pid"] for view in every) == sorted(answers), every
    assert {view["mode"] for view in every} == {f"gunicorn-{parser}"}
    log = served.log()
    line = f"connlist: server integration on (gunicorn 27.0.1, asgi worker, {parser} parser)"
    assert log.count(line) == WORKERS, log
    assert "ERROR" not in log and "ASGI-only" not in log, log


def _cut_at(sock: socket.socket, started: float, timeout: float) -> None:
    data, closed = read_until_closed(sock)
    assert is_408(data), data
    elapsed = closed - started
    assert timeout - EARLY <= elapsed <= timeout + LATE, (timeout, elapsed)


def test_legitimate_clients_are_served(served: Process) -> None:
    port = served.port
    # Keep-alive: three requests on one connection, apart by less than the keep-alive time.
    sock = connect(port)
    for _ in range(3):
        sock.sendall(GET)
        assert read_response(sock).endswith(b"ok")
        time.sleep(0.3)
    # A body slower than the headers timeout, on time for the request timeout and the rate.
    sock = connect(port)
    sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n")
    for _ in range(4):
        time.sleep(0.25)
        sock.sendall(b"y" * 500)
    assert read_response(sock).endswith(b"received 2000")
    # Expect: 100-continue: the body follows the 100 Continue.
    sock = connect(port)
    sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    sock.settimeout(5)
    interim = sock.recv(65536)
    assert interim.startswith(b"HTTP/1.1 100 Continue"), interim
    time.sleep(HEADERS_TIMEOUT + 0.2)
    sock.sendall(b"hello")
    assert read_response(sock).endswith(b"received 5")


@pytest.mark.parametrize("parser", GUNICORN_PARSERS)
def test_a_request_cut_after_its_response_began_gets_no_408(parser: str, tmp_path: Path) -> None:
    # (uvicorn's: test_timeouts.py's test_response_already_started_gets_no_408.)
    with serving(f"gunicorn-{parser}", tmp_path / "gunicorn.log") as target:
        sock = connect(target.port)
        started = time.monotonic()
        # echo_app's /stream begins its response and waits for the body, which stops halfway.
        sock.sendall(b"POST /stream HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n01234")
        data, closed = read_until_closed(sock)
        assert data.startswith(b"HTTP/1.1 200") and b"first chunk" in data, data
        assert b"408" not in data, data
        # Cut at the request timeout all the same (targets.serving's, 1 s), the close alone.
        assert 1.0 - EARLY <= closed - started <= 1.0 + LATE, closed - started
        assert target.totals()["request_timeouts"] == 1


def test_integration_off_leaves_gunicorn_alone(tmp_path: Path) -> None:
    with run_server(
        command("tests.gunicorn_asgi_app:app"), tmp_path / "off.log", env=env(server_integration="off")
    ) as off:
        view = get_json(off.port, "/_connections")
        assert view["mode"] == "asgi" and view["server_integration"] == "off", view
        # gunicorn's own behaviour: a silent connection is not cut at the headers timeout.
        sock = connect(off.port)
        sock.settimeout(HEADERS_TIMEOUT + LATE + 0.5)
        with pytest.raises(TimeoutError):
            sock.recv(1)
        assert "server integration on" not in off.log()


def test_connlist_worker_class_with_the_lifespan_off(tmp_path: Path) -> None:
    # The explicit way: the worker class puts connlist's protocol in place before the worker serves.
    with run_server(
        lambda port: gunicorn_command(
            port, "tests.gunicorn_asgi_app:app", "-k", "connlist.gunicorn.ASGIWorker",
            "--asgi-lifespan", "off", "--keep-alive", str(KEEP_ALIVE), workers=1,
        ),
        tmp_path / "worker.log",
        env=env(),
    ) as server:  # fmt: skip
        # gunicorn's --http-parser auto: the fast one where it is installed.
        assert get_json(server.port, "/_connections")["mode"] == f"gunicorn-{GUNICORN_PARSERS[-1]}"
        started = time.monotonic()
        _cut_at(connect(server.port), started, HEADERS_TIMEOUT)


def test_required_refuses_to_start_with_a_gunicorn_it_does_not_know(tmp_path: Path) -> None:
    # A gunicorn whose protocol lost a hook connlist needs (tests/gunicorn_drift.py renames it).
    code, output = exits_at_start(
        command("tests.gunicorn_drift:app")(0),
        env(server_integration="required"),
    )
    assert code != 0, output
    assert "the server integration is off and it is required" in output, output
    assert "_arm_keepalive_timer" in output, output


# -- the budget, on one worker -------------------------------------------------

BUDGET = 4


@pytest.fixture(scope="module", params=GUNICORN_PARSERS)
def hardened(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log = tmp_path_factory.mktemp("gunicorn-asgi-hardened") / "gunicorn.log"
    options = {"headers_timeout": 5, "request_timeout": 30, "max_connections": BUDGET}
    # On asyncio's loop (the two-worker server runs on uvloop, gunicorn's choice where it is installed).
    with run_server(
        command("tests.gunicorn_asgi_app:app", "--asgi-loop", "asyncio", parser=request.param),
        log,
        env=env(**options),
    ) as server:
        yield server


def settled(port: int) -> dict[str, int]:
    """The totals, once no connection but the one asking is left in the list."""
    deadline = time.monotonic() + 5
    while True:
        view: dict[str, Any] = get_json(port, "/_connections")
        if len(view["all"]) <= 1 or time.monotonic() > deadline:
            result: dict[str, int] = view["totals"]
            return result
        time.sleep(0.1)


def test_budget_refuses_with_503_when_every_connection_is_served(hardened: Process) -> None:
    before = settled(hardened.port)
    served = [connect(hardened.port) for _ in range(BUDGET)]
    for sock in served:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.3)  # every one of them is being served
    extra = connect(hardened.port)
    data, _ = read_until_closed(extra)
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), data
    for sock in served:
        assert read_response(sock).endswith(b"slow")
        sock.close()
    after = settled(hardened.port)
    assert after["refused"] == before["refused"] + 1, after


def test_budget_lets_the_oldest_silent_connection_go(hardened: Process) -> None:
    settled(hardened.port)
    silent = [connect(hardened.port) for _ in range(BUDGET)]
    time.sleep(0.1)
    newcomer = connect(hardened.port)
    # The oldest silent one makes room: 408, then closed; the newcomer is served.
    data, _ = read_until_closed(silent[0])
    assert is_408(data), data
    newcomer.sendall(GET)
    assert read_response(newcomer).endswith(b"ok")


# -- a gunicorn that changed: gunicorn's own class, ASGI-only mode, one ERROR line ---


@pytest.mark.parametrize(
    ("drift", "failure"),
    [
        ("renamed", "has no `_arm_keepalive_timer`"),
        ("bypassed", "the connection is handling, where it must be idle"),
    ],
)
def test_a_drifted_gunicorn_serves_on_with_its_own_protocol(drift: str, failure: str, tmp_path: Path) -> None:
    environment = {**env(), "CONNLIST_TEST_DRIFT": drift}
    with run_server(command("tests.gunicorn_drift:app"), tmp_path / "drift.log", env=environment) as server:
        view = get_json(server.port, "/_connections")
        assert view["mode"] == "asgi", view
        assert failure in view["integration_off"], view
        sock = connect(server.port)
        sock.sendall(GET)
        assert read_response(sock).endswith(b"ok")
        log = server.log()
    errors = [line for line in log.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1, log
    assert "connlist: the server integration is off" in errors[0] and failure in errors[0], errors
    assert "gunicorn's ASGI worker keeps its own protocol" in errors[0]
    assert "server integration on" not in log


def test_connlist_worker_class_stops_gunicorn_on_a_bad_setting(tmp_path: Path) -> None:
    # Its lifespan is on (gunicorn's default, auto, would serve on with a 500 for every request).
    code, output = exits_at_start(
        gunicorn_command(0, "tests.gunicorn_asgi_app:app", "-k", "connlist.gunicorn.ASGIWorker", workers=1),
        env(headers_timeout=-1),
    )
    assert code != 0, output
    assert "headers_timeout" in output, output
