"""Mass timeouts and the log under attack, against uvicorn run as a real process (both parsers).

Thousands of connections expire in the same instant (the server is stopped
with SIGSTOP until their deadlines pass): the worker keeps answering other
clients, and every one of them is cut off.  A few hundred request timeouts
make one WARNING line in uvicorn's own format, and no traceback from the
handlers that were awaiting the body when connlist cut them.
"""

from __future__ import annotations

import re
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.subprocesses import PYTHON, run_server, server_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import mass_timeout


def test_thousands_expiring_at_once_do_not_stall_the_worker(
    parser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is timed is the real server: not under coverage.py (scripts/test
    # measures the subprocesses through this variable), which makes it
    # several times slower.
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
    n = 2000
    result = mass_timeout.measure(parser, n, tmp_path / "server.log", headers_timeout=2.0)
    assert (result.got_408, result.closed) == (n, n), result
    # An ordinary request sent the moment they all expire is answered, and every one of them is
    # closed, long before a cost per cut that grew with their number would allow (2,000 walks of
    # 2,000).  How fast is the benchmark's (benchmarks/mass_timeout.py, docs/benchmarks.md): here
    # the bounds hold on a machine loaded by the rest of the suite.
    assert result.latency < 0.5, result
    assert result.all_closed < 1.5, result
    assert result.warning_lines == 1, result


def test_a_few_hundred_body_timeouts_make_one_readable_warning_and_no_traceback(
    parser: str, tmp_path: Path
) -> None:
    n = 300
    env = server_env(CONNLIST_OPTIONS='{"headers_timeout": 0.5, "request_timeout": 1.0}')
    with run_server(
        lambda port: [
            PYTHON,
            "-m",
            "uvicorn",
            "tests.hardening_app:app",
            "--http",
            mass_timeout.PROTOCOLS[parser],
            "--port",
            str(port),
            "--lifespan",
            "on",
        ],
        tmp_path / "server.log",
        env=env,
    ) as server:
        socks = []
        for _ in range(n):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            # The handler awaits request.body(), which never completes.
            sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nhalf")
            socks.append(sock)
        for sock in socks:
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), data
            sock.close()
        time.sleep(0.3)  # what the server logs after the cut-offs
    # Stopped: the summary still pending was written at shutdown.
    log = server.log()
    lines = log.splitlines()
    warnings = [line for line in lines if line.startswith("WARNING")]
    # uvicorn's default format ("WARNING:  message"): the first sweep's
    # summary at once, the rest in one line (the next interval, or here the shutdown).
    assert len(warnings) == 2, log
    counted = 0
    for line in warnings:
        match = re.fullmatch(
            r"WARNING:  connlist: (\d+) connections? timed out \((\d+) request\); e\.g\. "
            r"127\.0\.0\.1:\d+(, 127\.0\.0\.1:\d+){0,2}",
            line,
        )
        assert match and match.group(1) == match.group(2), line
        counted += int(match.group(1))
    assert counted == n
    assert "Traceback" not in log and "ClientDisconnect" not in log and "ERROR" not in log, log
    # Nothing per connection: start-up and shutdown lines, the two summaries.
    assert len(lines) < 20, log
