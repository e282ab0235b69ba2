"""A real gunicorn with connlist's worker classes and 2 workers, serving examples/app.py.

Started with the example config (``-c examples/gunicorn.conf.py``) and the
worker class on the command line; the timeouts come from the environment the
example app reads (headers 0.5 s, request 1 s).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gunicorn")
pytest.importorskip("uvicorn_worker")

from connlist.servers import integration
from tests.servers import EARLY, LATE, connect, is_408, read_until_closed
from tests.subprocesses import Process, get_json, gunicorn_command, run_server, server_env

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0
WORKERS = 2
# Fresh connections tried before giving up on seeing both workers answer.
MAX_TRIES = 200

WORKER_CLASSES = {
    "connlist.gunicorn.UvicornWorker": "uvicorn-httptools",
    "connlist.gunicorn.UvicornH11Worker": "uvicorn-h11",
}


def workers_seen(port: int, tries: int = MAX_TRIES) -> dict[int, dict[str, Any]]:
    """Debug answers by pid, from fresh connections, until every worker answered (at most ``tries``)."""
    answers: dict[int, dict[str, Any]] = {}
    for _ in range(tries):
        answer = get_json(port, "/_connections")
        answers[answer["pid"]] = answer
        if len(answers) >= WORKERS:
            break
    return answers


@pytest.fixture(scope="module", params=list(WORKER_CLASSES))
def gunicorn_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    worker_class: str = request.param
    log: Path = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    env = server_env(
        CONNLIST_HEADERS_TIMEOUT=str(HEADERS_TIMEOUT),
        CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT),
    )
    with run_server(
        lambda port: gunicorn_command(port, "examples.app:app", "-k", worker_class, workers=WORKERS),
        log,
        env=env,
        # Both workers up, so the tests do not race a booting one.
        ready=lambda port: len(workers_seen(port, tries=10)) == WORKERS,
    ) as server:
        server.worker_class = worker_class  # type: ignore[attr-defined]
        yield server


def test_both_workers_answer_with_the_integration(gunicorn_server: Process) -> None:
    answers = workers_seen(gunicorn_server.port)
    assert len(answers) == WORKERS, answers
    assert gunicorn_server.proc.pid not in answers  # workers answer, not the master
    expected_mode = WORKER_CLASSES[gunicorn_server.worker_class]  # type: ignore[attr-defined]
    for pid, answer in answers.items():
        assert answer["mode"] == expected_mode, (pid, answer)
        assert answer["headers_timeout"] == HEADERS_TIMEOUT
        assert answer["request_timeout"] == REQUEST_TIMEOUT
    log = gunicorn_server.log()
    assert f"Using worker: {gunicorn_server.worker_class}" in log  # type: ignore[attr-defined]


def test_slow_clients_get_408_on_time(gunicorn_server: Process) -> None:
    port = gunicorn_server.port
    before = sum(a["totals"]["headers_timeouts"] for a in workers_seen(port).values())
    # Both at once: one silent (headers timeout), one whose body stops (request timeout).
    started = time.monotonic()
    silent = connect(port)
    stalled = connect(port)
    stalled.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
    for sock, timeout in ((silent, HEADERS_TIMEOUT), (stalled, REQUEST_TIMEOUT)):
        data, closed = read_until_closed(sock)
        assert is_408(data), data
        elapsed = closed - started
        assert timeout - EARLY <= elapsed <= timeout + LATE + 0.1, (timeout, elapsed)
    answers = workers_seen(port)
    assert sum(a["totals"]["headers_timeouts"] for a in answers.values()) == before + 1


def test_a_uvicorn_worker_without_config_kwargs_falls_back(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connlist.servers.gunicorn import workers as gunicorn

    class Bare:
        pass

    # Without CONFIG_KWARGS the protocol cannot be chosen: uvicorn-worker's own class, one ERROR line.
    caplog.set_level(logging.ERROR, logger="connlist")
    worker = gunicorn._worker("W", Bare, gunicorn.AUTO_PROTOCOL, "doc")
    assert issubclass(worker, Bare) and not hasattr(worker, "CONFIG_KWARGS")
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "Bare has no CONFIG_KWARGS dict (connlist is tested with uvicorn-worker 0.4)" in line
    assert integration.asgi_only() in line
    # Asked to refuse instead: the import fails, as gunicorn then reports.
    monkeypatch.setenv("CONNLIST_REQUIRE_INTEGRATION", "1")
    with pytest.raises(ImportError, match=r"Bare has no CONFIG_KWARGS dict.*refusing to start"):
        gunicorn._worker("W", Bare, gunicorn.AUTO_PROTOCOL, "doc")
    old = type("Old", (), {"CONFIG_KWARGS": {"loop": "auto"}})
    assert gunicorn._base_kwargs(old, "p") == {"loop": "auto", "http": "p", "lifespan": "on"}


# -- connlist's lines in gunicorn's log ------------------------------------------------


def gunicorn_line(level: str, text: str) -> str:
    """A line of gunicorn's error log, "[2026-01-02 03:04:05 +0000] [pid] [LEVEL] message", as a pattern."""
    return rf"^\[\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{{4}}\] \[\d+\] \[{level}\] connlist: {text}"


@pytest.mark.parametrize(
    ("worker_class", "level", "text"),
    [
        # uvicorn-worker's: uvicorn's logger, which that worker gives gunicorn's handlers.
        ("uvicorn_worker.UvicornWorker", "INFO", r"server integration on \(uvicorn "),
        # gunicorn's own ASGI worker: the integration's line, through gunicorn's logger.
        ("asgi", "INFO", r"server integration on \(gunicorn [^,]+, asgi worker, "),
    ],
)
def test_connlists_lines_are_in_gunicorns_format_and_level(
    worker_class: str, level: str, text: str, tmp_path: Path
) -> None:
    if worker_class == "asgi":
        pytest.importorskip("gunicorn.workers.gasgi")
    import re

    def command(log_level: str) -> Any:
        return lambda port: gunicorn_command(
            port, "examples.app:app", "-k", worker_class, "--log-level", log_level, workers=1
        )

    with run_server(command("info"), tmp_path / "info.log", env=server_env()) as server:
        get_json(server.port, "/_connections")
        log = server.log()
    lines = [line for line in log.splitlines() if "connlist:" in line]
    assert lines, log
    # Every connlist line carries gunicorn's time, pid and level, and the one expected is there.
    assert all(re.match(gunicorn_line("[A-Z]+", ""), line) for line in lines), lines
    assert any(re.match(gunicorn_line(level, text), line) for line in lines), lines
    # gunicorn's --log-level is connlist's: one level above the line's, the line is gone.
    above = {"INFO": "warning", "WARNING": "error"}[level]
    with run_server(command(above), tmp_path / "above.log", env=server_env()) as server:
        get_json(server.port, "/_connections")
        log = server.log()
    assert not re.search(gunicorn_line(level, text), log, re.M), log
