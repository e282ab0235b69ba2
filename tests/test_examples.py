"""Each example, run for real: the Starlette app through serve.py, slow_client.py against it,
the FastAPI app under uvicorn with the integration, and the gunicorn config.

(The gunicorn config also serves the real gunicorn of test_gunicorn.py and test_prometheus.py.)
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from tests.servers import EARLY, LATE, connect, is_408, read_response, read_until_closed
from tests.subprocesses import EXAMPLES, PYTHON, ROOT, get, get_json, run_server, server_env

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0


def example_env() -> dict[str, str]:
    return server_env(
        CONNLIST_HEADERS_TIMEOUT=str(HEADERS_TIMEOUT), CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT)
    )


def totals(output: str, title: str) -> dict[str, int]:
    """The ``totals:`` line under a ``title:`` section of slow_client.py's output."""
    section = output.split(f"\n{title}:", 1)[1]
    line = re.search(r"^  totals: (.*)$", section, re.MULTILINE)
    assert line, output
    return {name: int(value) for name, value in (item.split("=") for item in line.group(1).split())}


def readme_sample() -> dict[str, Any]:
    """The README's ``/_connections`` sample."""
    readme = (ROOT / "README.md").read_text()
    block = (
        readme.split("against the example shows one: its own", 1)[1]
        .split("```json\n", 1)[1]
        .split("```", 1)[0]
    )
    sample: dict[str, Any] = json.loads(block)
    return sample


def quoted_lines(page: Path, after: str) -> list[str]:
    """The lines of the first ``text`` block after ``after`` in ``page``, for the uvicorn installed here."""
    block = page.read_text().split(after, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return [
        re.sub(r"uvicorn \d+\.\d+\.\d+", f"uvicorn {uvicorn.__version__}", line)
        for line in block.splitlines()
    ]


def first_view(port: int) -> dict[str, Any]:
    """The debug endpoint once the readiness probes' connections are gone: the caller's own alone."""
    view: dict[str, Any] = get_json(port, "/_connections")
    deadline = time.monotonic() + 3
    while view["counts"]["all"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
        view = get_json(port, "/_connections")
    return view


def test_slow_client_against_the_example_server(tmp_path: Path) -> None:
    with run_server(
        lambda port: [PYTHON, str(EXAMPLES / "serve.py"), "--port", str(port)],
        tmp_path / "serve.log",
        env=example_env(),
    ) as server:
        # What the README shows is what a user sees first: their own
        # connection, idle (not receiving a request) in state handling.
        sample, view = readme_sample(), first_view(server.port)
        assert view["counts"] == sample["counts"]
        assert view.keys() == sample.keys() and view["totals"].keys() == sample["totals"].keys()
        assert view["active"] == sample["active"] == []
        own = view["idle"][0]
        assert view["all"] == view["idle"] == [own]
        assert own.keys() == sample["idle"][0].keys()
        expected = {k: sample["idle"][0][k] for k in ("state", "headers_completed", "method", "path")}
        assert {k: own[k] for k in expected} == expected
        assert get(server.port, "/")[1] == b"Hello from connlist\n"
        result = subprocess.run(
            [PYTHON, str(EXAMPLES / "slow_client.py"), "--port", str(server.port), "--limit", "10"],
            cwd=ROOT,
            env=example_env(),
            capture_output=True,
            text=True,
            timeout=30,
        )
        log = server.log()
        # (After the log the assertions below read: a cut of its own would join its summary.)
        # The example bounds bodies (Starlette's max_body_size: 413), connlist the head (431).
        sock = connect(server.port)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 << 20))
        assert read_response(sock).startswith(b"HTTP/1.1 413 "), "the body limit"
        sock = connect(server.port)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nCookie: " + b"c" * 20_000 + b"\r\n\r\n")
        assert read_until_closed(sock)[0].startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    output = result.stdout
    assert result.returncode == 0, (output, result.stderr, log)
    assert "connlist example: app at" in log
    # The README's first command prints the start line the README and the quickstart quote.
    (start,) = quoted_lines(ROOT / "README.md", "One line at start says so")
    lines = log.splitlines()
    assert start in lines, log
    quickstart = quoted_lines(ROOT / "docs" / "quickstart.md", "The start says so:")
    at = lines.index(quickstart[0])
    assert lines[at : at + len(quickstart)] == quickstart, log

    # The 408 came after the headers timeout, measured by the script from its first byte.
    arrived = re.search(r"^408 arrived after ([0-9.]+)s", output, re.MULTILINE)
    assert arrived, output
    took = float(arrived.group(1))
    assert HEADERS_TIMEOUT - EARLY <= took <= HEADERS_TIMEOUT + LATE + 0.1, output
    # Through uvicorn's own log format (a level prefix), not Python's last-resort handler.
    assert re.search(
        r"^WARNING: +connlist: 1 connection timed out \(1 headers\); e\.g\. 127\.0\.0\.1:", log, re.M
    ), log
    # The example's on_timeout line is in the log too (serve.py configures its logger).
    assert re.search(
        r"^INFO: +on_timeout: cut off 127\.0\.0\.1:\d+ \(headers timeout\)$", log, re.MULTILINE
    ), log

    # Before, during and after, as the debug endpoint told.
    assert "debug endpoint before: 1 worker(s), pid" in output and "mode uvicorn-httptools" in output
    assert re.search(
        r"^  active: #\d+ 127\.0\.0\.1:\d+ reading_headers for 0\.\d+s, headers timeout in 0\.\d+s "
        r"\(worker \d+\)$",
        output,
        re.MULTILINE,
    ), output
    before, after = totals(output, "debug endpoint before"), totals(output, "debug endpoint after")
    assert after["headers_timeouts"] == before["headers_timeouts"] + 1 == 1
    assert after["connections"] == before["connections"] + 3  # slow client, during, after
    assert re.search(r"^  active: none$", output.split("\ndebug endpoint after:")[1], re.MULTILINE)


def test_fastapi_example_with_the_integration(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    prometheus = pytest.importorskip("prometheus_client.parser")
    with run_server(
        lambda port: [
            PYTHON,
            "-m",
            "uvicorn",
            "examples.fastapi_app:app",
            "--http",
            "connlist.uvicorn:H11Protocol",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        tmp_path / "uvicorn.log",
        env=example_env(),
    ) as server:
        port = server.port
        assert json.loads(get(port, "/")[1]) == {"hello": "from connlist"}
        sock = connect(port)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        assert read_response(sock).endswith(b'{"received":5}')
        sock.close()

        started = time.monotonic()
        silent = connect(port)
        data, closed = read_until_closed(silent)
        assert is_408(data), data
        elapsed = closed - started
        assert HEADERS_TIMEOUT - EARLY <= elapsed <= HEADERS_TIMEOUT + LATE + 0.1, elapsed

        debug = get_json(port, "/_connections")
        assert debug["mode"] == "uvicorn-h11"
        assert debug["totals"]["headers_timeouts"] == 1
        status, body = get(port, "/metrics")
        assert status == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in prometheus.text_string_to_metric_families(body.decode())
            for s in family.samples
        }
        assert samples[("connlist_timeouts_total", (("kind", "headers"),))] == 1
        assert samples[("connlist_connections", (("state", "reading"),))] == 0
        # The same as the debug endpoint's totals, plus the scrape itself.
        assert samples[("connlist_requests_total", ())] == debug["totals"]["requests"] + 1
        assert samples[("connlist_connections_accepted_total", ())] == debug["totals"]["connections"] + 1


def test_gunicorn_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gunicorn_util = pytest.importorskip("gunicorn.util")
    monkeypatch.delenv("GUNICORN_BIND", raising=False)
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    multiproc = tmp_path / "prometheus"
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(multiproc))
    config = runpy.run_path(str(EXAMPLES / "gunicorn.conf.py"))
    from connlist.gunicorn import UvicornWorker

    assert gunicorn_util.load_class(config["worker_class"]) is UvicornWorker
    # The protocol uvicorn imports from the worker's config is connlist.uvicorn:AutoProtocol.
    from uvicorn.importer import import_from_string

    import connlist.uvicorn

    assert import_from_string(UvicornWorker.CONFIG_KWARGS["http"]) is connlist.uvicorn.AutoProtocol
    # A bad setting makes the worker fail to boot (tests/test_startup_errors.py), for both classes.
    from connlist.gunicorn import UvicornH11Worker

    assert UvicornWorker.CONFIG_KWARGS["lifespan"] == UvicornH11Worker.CONFIG_KWARGS["lifespan"] == "on"
    assert config["bind"] == "127.0.0.1:8000"
    assert config["workers"] == 2
    # on_starting creates and empties the Prometheus directory; child_exit drops a dead worker's gauges.
    config["on_starting"](None)
    assert multiproc.is_dir()
    (multiproc / "counter_41.db").write_bytes(b"")
    (multiproc / "gauge_livesum_42.db").write_bytes(b"")
    (multiproc / "gauge_livesum_43.db").write_bytes(b"")

    class Worker:
        pid = 42

    config["child_exit"](None, Worker())
    assert sorted(p.name for p in multiproc.iterdir()) == ["counter_41.db", "gauge_livesum_43.db"]
    config["on_starting"](None)
    assert list(multiproc.iterdir()) == []


def test_slow_client_sees_itself_under_several_workers(tmp_dir: Path) -> None:
    # With --workers 2 the "while" view comes on another connection, which
    # may reach the other worker: the script asks for every worker.
    from tests.test_workers import WORKERS, both_up, env_for, stop_master, uvicorn_command

    env = env_for(TMPDIR=str(tmp_dir))
    # The slow client waits for the headers timeout, twice: 2 s (its view while is at about 1.2 s).
    env.update(CONNLIST_HEADERS_TIMEOUT="2", CONNLIST_REQUEST_TIMEOUT="4")
    with run_server(uvicorn_command, tmp_dir / "uvicorn.log", env=env, ready=both_up) as server:
        for _ in range(2):  # twice: each connection may reach either worker
            result = subprocess.run(
                [PYTHON, str(EXAMPLES / "slow_client.py"), "--port", str(server.port), "--limit", "10"],
                cwd=ROOT,
                env=example_env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            output = result.stdout
            assert result.returncode == 0, (output, result.stderr)
            assert f"debug endpoint before: {WORKERS} worker(s)" in output, output
            during = output.split("\ndebug endpoint while the slow client trickles:", 1)[1].split(
                "\n408 ", 1
            )[0]
            assert re.search(r"^  active: #\d+ 127\.0\.0\.1:\d+ reading_headers for ", during, re.M), output
        stop_master(server)
