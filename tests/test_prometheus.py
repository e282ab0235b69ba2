"""connlist.prometheus against real servers: uvicorn in a thread, and gunicorn with 2 workers (multiprocess).

Headers timeout 0.5 s, request timeout 1 s.  Scrapes go through
``/metrics`` on fresh connections, so each scrape is itself one accepted
connection, one request, and one ``writing`` connection while it is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware
from connlist.core.enforcer import Enforcer
from connlist.prometheus import (
    PHASES,
    ConnlistMetrics,
    Exporter,
    MetricsMiddleware,
    count_phases,
    mark_dead_processes,
    metrics_for,
)
from tests.fakes import FakeClock, MockLoop
from tests.servers import (
    INTEGRATED,
    PLAIN,
    connect,
    is_408,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)
from tests.subprocesses import PYTHON, get, get_json, gunicorn_command, run_server, server_env

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0

Values = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Values:
    values: Values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("connlist_"):
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def scrape(port: int) -> Values:
    status, body = get(port, "/metrics")
    assert status == 200, body
    return parse(body.decode())


def phases(values: Values) -> dict[str, float]:
    return {state: values[("connlist_connections", (("state", state),))] for state in PHASES}


def total(values: Values, name: str, **labels: str) -> float:
    return values[(f"connlist_{name}_total", tuple(sorted(labels.items())))]


def counters(values: Values) -> dict[str, float]:
    return {
        "accepted": total(values, "connections_accepted"),
        "requests": total(values, "requests"),
        "headers": total(values, "timeouts", kind="headers"),
        "request": total(values, "timeouts", kind="request"),
    }


async def hello(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"ok {len(body)}")


def make_app(
    registry: CollectorRegistry,
    *,
    interval: float | None,
    metrics_outside: bool = False,
    server_integration: str = "auto",
) -> Starlette:
    connections = Middleware(
        ConnectionsMiddleware,
        headers_timeout=HEADERS_TIMEOUT,
        request_timeout=REQUEST_TIMEOUT,
        server_integration=server_integration,
    )
    metrics = Middleware(MetricsMiddleware, registry=registry, interval=interval)
    return Starlette(
        routes=[Route("/", hello, methods=["GET", "POST"])],
        middleware=[metrics, connections] if metrics_outside else [connections, metrics],
    )


# -- without a server ----------------------------------------------------------


def test_exporters_of_one_process_add_up() -> None:
    registry = CollectorRegistry()
    metrics = ConnlistMetrics(registry)
    first, second = Enforcer(), Enforcer()
    a, b = Exporter(metrics), Exporter(metrics)

    def gauges() -> list[float | None]:
        return [registry.get_sample_value("connlist_connections", {"state": s}) for s in PHASES]

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"connlist_{name}_total", labels)

    for _ in range(2):
        first.connections.connect()
        first.totals.connections += 1
    conn = second.connections.connect()
    second.totals.connections += 1
    second.connections.headers_complete(conn)
    second.connections.message_complete(conn)
    second.totals.requests += 1
    assert gauges() == [0, 0, 0, 0, 0]  # every series exists from the start
    assert [value("timeouts", kind=kind) for kind in ("headers", "request", "rate", "send")] == [0, 0, 0, 0]
    a.refresh(first)
    b.refresh(second)
    b.refresh(second)  # a second refresh adds nothing
    assert count_phases(first) == {"reading": 2, "writing": 0, "waiting": 0, "timed_out": 0, "upgraded": 0}
    assert gauges() == [2, 0, 1, 0, 0]
    assert value("connections_accepted") == 3
    assert value("requests") == 1
    first.totals.headers_timeouts += 1
    second.totals.rate_timeouts += 2
    second.totals.send_timeouts += 1
    b.refresh(second)
    a.close(first)  # the last increments are counted, the connections leave the gauges
    assert gauges() == [0, 0, 1, 0, 0]
    assert [value("timeouts", kind=kind) for kind in ("headers", "request", "rate", "send")] == [1, 0, 2, 1]
    # A new enforcer behind the same exporter counts from its own zero.
    third = Enforcer()
    third.totals.connections = 5
    a.refresh(third)
    assert value("connections_accepted") == 8


def test_accept_failures_are_counted_as_they_grow() -> None:
    # The server could not accept for want of descriptors: a counter of its own, from 0.
    registry = CollectorRegistry()
    exporter = Exporter(ConnlistMetrics(registry))
    enforcer = Enforcer()

    def failures() -> float | None:
        return registry.get_sample_value("connlist_accept_failures_total")

    exporter.refresh(enforcer)
    assert failures() == 0
    enforcer.totals.accept_failures += 3
    exporter.refresh(enforcer)
    exporter.refresh(enforcer)  # nothing new: nothing added
    assert failures() == 3
    enforcer.totals.accept_failures += 1
    exporter.close(enforcer)
    assert failures() == 4


def test_header_overflows_are_counted_as_the_enforcer_cuts_them() -> None:
    # A head past max_header_size: not a timeout kind, a counter of its own, from 0.
    registry = CollectorRegistry()
    exporter = Exporter(ConnlistMetrics(registry))
    clock = FakeClock()
    enforcer = Enforcer(clock=clock, loop=MockLoop(clock))

    def overflows() -> float | None:
        return registry.get_sample_value("connlist_header_overflows_total")

    exporter.refresh(enforcer)
    assert overflows() == 0
    for _ in range(2):
        enforcer.overflow(enforcer.join(), lambda: None)
    exporter.refresh(enforcer)
    exporter.refresh(enforcer)  # nothing new: nothing added
    assert overflows() == 2
    assert registry.get_sample_value("connlist_timeouts_total", {"kind": "headers"}) == 0
    enforcer.overflow(enforcer.join(), lambda: None)
    exporter.close(enforcer)
    assert overflows() == 3
    text = generate_latest(registry).decode()
    assert (
        "# HELP connlist_header_overflows_total Request heads past max_header_size, answered 431 and closed."
        in text
    )


def test_a_websocket_at_the_metrics_path_reaches_the_app() -> None:
    # The endpoint answers HTTP; any other scope is the app's, at any path,
    # and starts no background refresh.
    seen: list[tuple[str, str]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["type"], scope["path"]))

    async def nothing() -> Any:
        raise AssertionError("not read")

    async def unsent(message: Any) -> None:
        raise AssertionError("nothing sent")

    metrics = MetricsMiddleware(app, registry=CollectorRegistry(), interval=0.01)
    asyncio.run(metrics({"type": "websocket", "path": "/metrics", "headers": []}, nothing, unsent))
    assert seen == [("websocket", "/metrics")]
    assert metrics._task is None


def test_metrics_are_shared_per_registry_and_options_are_checked() -> None:
    registry = CollectorRegistry()
    assert metrics_for(registry) is metrics_for(registry)
    MetricsMiddleware(hello, registry=registry)
    MetricsMiddleware(hello, registry=registry)  # no "Duplicated timeseries"
    with pytest.raises(ValueError, match="path"):
        MetricsMiddleware(hello, registry=registry, path="metrics")
    with pytest.raises(ValueError, match="interval"):
        MetricsMiddleware(hello, registry=registry, interval=-1)
    with pytest.raises(TypeError, match="interval"):
        MetricsMiddleware(hello, registry=registry, interval="1")  # type: ignore[arg-type]


def test_mark_dead_processes_drops_the_live_gauges_of_gone_and_zombie_processes(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()  # exited and reaped: no such process
    zombie = subprocess.Popen(["sleep", "30"])
    zombie.kill()  # killed, not reaped yet: still has a pid, state Z
    try:
        stat = Path(f"/proc/{zombie.pid}/stat")
        assert wait_for(lambda: stat.read_bytes().rpartition(b")")[2].split()[0] == b"Z")
        alive = os.getppid()
        names = [
            *(f"gauge_livesum_{pid}.db" for pid in (gone.pid, zombie.pid, alive, os.getpid())),
            f"gauge_liveall_{gone.pid}.db",
            f"counter_{gone.pid}.db",  # a dead worker's counts stay counted
            f"gauge_all_{gone.pid}.db",  # not a "live" mode: not prometheus_client's to drop
        ]
        for name in names:
            (tmp_path / name).write_bytes(b"")
        assert mark_dead_processes(str(tmp_path)) == sorted([gone.pid, zombie.pid])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [
                f"gauge_livesum_{alive}.db",
                f"gauge_livesum_{os.getpid()}.db",
                f"counter_{gone.pid}.db",
                f"gauge_all_{gone.pid}.db",
            ]
        )
        assert mark_dead_processes(str(tmp_path)) == []
    finally:
        zombie.wait()


def test_mark_dead_processes_without_a_directory_drops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert mark_dead_processes() == []  # not in multiprocess mode
    assert mark_dead_processes(str(tmp_path / "gone")) == []  # removed under the server's feet
    # The directory from the environment, as prometheus_client reads it.
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f"gauge_livesum_{gone.pid}.db").write_bytes(b"")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    assert mark_dead_processes() == [gone.pid]


def test_another_users_process_or_no_proc_counts_as_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    from connlist.observe import prometheus

    def not_yours(pid: int, signal: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    with monkeypatch.context() as patch:
        patch.setattr(prometheus.os, "kill", not_yours)
        assert prometheus._exists(1) is True
    real_open = open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", no_proc)
    assert prometheus._exists(os.getpid()) is True  # os.kill said it exists


def test_an_exporter_without_an_enforcer_publishes_nothing() -> None:
    registry = CollectorRegistry()
    exporter = Exporter(ConnlistMetrics(registry))
    enforcer = Enforcer()
    enforcer.connections.connect()
    exporter.refresh(enforcer)
    before = parse(generate_latest(registry).decode())
    exporter.refresh(None)  # no server has started (yet): nothing to read, nothing changes
    assert parse(generate_latest(registry).decode()) == before
    assert before[("connlist_connections", (("state", "reading"),))] == 1


# -- one process: uvicorn in a thread -------------------------------------------


@pytest.mark.parametrize(
    ("metrics_outside", "lifespan"),
    # Outside ConnectionsMiddleware, with no lifespan: the enforcer is found in the request's state.
    [(False, "on"), (True, "off")],
    ids=["inside-lifespan", "outside-no-lifespan"],
)
def test_scrape_follows_clients_and_timeouts(metrics_outside: bool, lifespan: str) -> None:
    registry = CollectorRegistry()
    app = make_app(registry, interval=None, metrics_outside=metrics_outside)
    scrapes = 0

    def counted_scrape(port: int) -> Values:
        nonlocal scrapes
        scrapes += 1
        return scrape(port)

    with serve(app, INTEGRATED["httptools"], lifespan=lifespan) as server:
        port = server.port
        first = counted_scrape(port)
        # The scrape itself is the one connection, writing its answer.
        assert phases(first) == {"reading": 0, "writing": 1, "waiting": 0, "timed_out": 0, "upgraded": 0}
        assert counters(first) == {"accepted": 1, "requests": 1, "headers": 0, "request": 0}

        silent = connect(port)
        partial = connect(port)
        partial.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        idle = connect(port)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(idle).endswith(b"ok 0")
        body = connect(port)
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        started = time.monotonic()

        expected = {"reading": 2, "writing": 2, "waiting": 1, "timed_out": 0, "upgraded": 0}
        assert wait_for(lambda: phases(counted_scrape(port)) == expected, limit=HEADERS_TIMEOUT - 0.2)
        during = counted_scrape(port)
        assert phases(during) == expected
        assert counters(during) == {
            "accepted": scrapes + 4,
            "requests": scrapes + 2,
            "headers": 0,
            "request": 0,
        }

        for sock in (silent, partial, body):
            data, _ = read_until_closed(sock)
            assert is_408(data), data
        assert time.monotonic() - started >= REQUEST_TIMEOUT - 0.02
        after = counted_scrape(port)
        assert phases(after) == {"reading": 0, "writing": 1, "waiting": 1, "timed_out": 0, "upgraded": 0}
        assert counters(after) == {
            "accepted": scrapes + 4,
            "requests": scrapes + 2,
            "headers": 2,
            "request": 1,
        }
    if lifespan == "on":
        # Shut down: the worker's connections left the gauges, its counters are final.
        assert registry.get_sample_value("connlist_connections", {"state": "waiting"}) == 0
        assert registry.get_sample_value("connlist_connections_accepted_total") == scrapes + 4


def test_background_refresh_without_scrapes() -> None:
    registry = CollectorRegistry()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    with serve(make_app(registry, interval=0.05), INTEGRATED["h11"]) as server:
        sock = connect(server.port)
        assert wait_for(lambda: value("connlist_connections", state="reading") == 1, limit=1.0)
        assert value("connlist_connections_accepted_total") == 1
        data, _ = read_until_closed(sock)
        assert is_408(data), data
        assert wait_for(lambda: value("connlist_timeouts_total", kind="headers") == 1, limit=1.0)
        assert value("connlist_connections", state="reading") == 0


@pytest.mark.parametrize("integrated", [True, False])
def test_the_integration_gauge_says_asgi_only_mode(parser: str, integrated: bool) -> None:
    registry = CollectorRegistry()
    http = INTEGRATED[parser] if integrated else PLAIN[parser]
    app = make_app(registry, interval=None, server_integration="auto" if integrated else "off")
    with serve(app, http) as server:
        # Known from the start: the first scrape tells, before any other request.
        values = scrape(server.port)
    assert values[("connlist_server_integration", ())] == (1.0 if integrated else 0.0)
    # The option in force: one series per value, 1 for it.
    setting = "auto" if integrated else "off"
    assert {
        value: values[("connlist_server_integration_setting", (("setting", value),))]
        for value in ("auto", "required", "off")
    } == {value: float(value == setting) for value in ("auto", "required", "off")}


def test_no_background_refresh_when_interval_is_off() -> None:
    registry = CollectorRegistry()
    with serve(make_app(registry, interval=0), INTEGRATED["httptools"]) as server:
        connect(server.port)
        time.sleep(0.2)
        # Only the scrape refreshes: nothing moved before it.
        assert registry.get_sample_value("connlist_connections_accepted_total") == 0
        assert phases(scrape(server.port))["reading"] == 1


# -- several processes: gunicorn, 2 workers, examples/fastapi_app.py ---------------

INTERVAL = 0.1
WORKERS = 2


@pytest.fixture
def gunicorn_metrics(tmp_path: Path) -> Iterator[tuple[int, Path, Any]]:
    pytest.importorskip("gunicorn")
    pytest.importorskip("uvicorn_worker")
    pytest.importorskip("fastapi")

    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    (multiproc / "counter_1.db").write_bytes(b"stale")  # the config empties the directory at start
    env = server_env(
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
        CONNLIST_HEADERS_TIMEOUT=str(HEADERS_TIMEOUT),
        CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT),
        CONNLIST_METRICS_INTERVAL=str(INTERVAL),
    )

    def args(port: int) -> list[str]:
        # --keep-alive longer than the test, so the idle connections it holds stay open.
        return gunicorn_command(port, "examples.fastapi_app:app", "--keep-alive", "30", workers=WORKERS)

    def both_workers_up(port: int) -> bool:
        return len({get_json(port, "/_connections")["pid"] for _ in range(10)}) == WORKERS

    with run_server(args, tmp_path / "gunicorn.log", env=env, ready=both_workers_up) as server:
        yield server.port, multiproc, server


def per_process(multiproc: Path, pid: int) -> Values:
    """One worker's own values, read from its files alone."""
    values: Values = {}
    files = [str(multiproc / f"counter_{pid}.db"), str(multiproc / f"gauge_livesum_{pid}.db")]
    for metric in MultiProcessCollector.merge([f for f in files if os.path.exists(f)]):
        for sample in metric.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def hold_idle_on_each_worker(port: int) -> dict[int, list[socket.socket]]:
    """Keep-alive connections, each idle after one debug request, until every worker holds at least 2."""
    held: dict[int, list[socket.socket]] = {}
    for _ in range(100):
        sock = connect(port)
        sock.sendall(b"GET /_connections HTTP/1.1\r\nHost: x\r\n\r\n")
        _, _, body = read_response(sock).partition(b"\r\n\r\n")
        pid = int(body.split(b'"pid":', 1)[1].split(b",", 1)[0])
        held.setdefault(pid, []).append(sock)
        if len(held) == WORKERS and min(len(s) for s in held.values()) >= 2:
            break
    assert len(held) == WORKERS, held
    return held


def kill_a_worker(
    port: int, multiproc: Path, held: dict[int, list[socket.socket]], log: Any, *, child_exit: bool
) -> None:
    """kill -9 the worker holding fewer connections: its gauges leave the sum, its counters stay.

    With ``child_exit`` (gunicorn) the hook drops its gauge files before any
    scrape; without (uvicorn --workers) the next scrape does.
    """
    values = scrape(port)
    before = counters(values)
    victim = min(held, key=lambda pid: len(held[pid]))
    survivors = sum(len(s) for pid, s in held.items() if pid != victim)
    assert phases(values)["waiting"] == sum(len(s) for s in held.values())
    gauges = multiproc / f"gauge_livesum_{victim}.db"
    assert gauges.exists()
    os.kill(victim, signal.SIGKILL)
    if child_exit:
        assert wait_for(lambda: not gauges.exists(), limit=5.0), log()
    time.sleep(3 * INTERVAL)
    assert gauges.exists() != child_exit
    values = scrape(port)
    assert not gauges.exists()
    assert phases(values) == {"reading": 0, "writing": 1, "waiting": survivors, "timed_out": 0, "upgraded": 0}
    assert counters(values)["accepted"] >= before["accepted"] + 1
    assert counters(values)["headers"] == before["headers"]
    for socks in held.values():
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.close()


def test_multiprocess_sums_both_workers(gunicorn_metrics: tuple[int, Path, Any]) -> None:
    port, multiproc, server = gunicorn_metrics
    assert not (multiproc / "counter_1.db").exists()
    held = hold_idle_on_each_worker(port)
    assert server.proc.pid not in held
    n_held = sum(len(s) for s in held.values())

    silent = [connect(port) for _ in range(4)]
    time.sleep(3 * INTERVAL)
    values = scrape(port)
    assert phases(values) == {"reading": 4, "writing": 1, "waiting": n_held, "timed_out": 0, "upgraded": 0}
    # The answer is the sum of both workers' own files, and each worker served some requests.
    own = {pid: per_process(multiproc, pid) for pid in held}
    for name in ("connlist_requests_total", "connlist_connections_accepted_total"):
        parts = [own[pid][(name, ())] for pid in held]
        assert all(part >= 2 for part in parts), (name, parts)
        assert values[(name, ())] == sum(parts), (name, parts)

    for sock in silent:
        data, _ = read_until_closed(sock)
        assert is_408(data), data
    time.sleep(3 * INTERVAL)
    values = scrape(port)
    assert counters(values)["headers"] == 4
    assert phases(values) == {"reading": 0, "writing": 1, "waiting": n_held, "timed_out": 0, "upgraded": 0}

    # A worker killed outright: gunicorn's child_exit (in the example config)
    # drops its connections from the gauge; its counters stay counted.
    kill_a_worker(port, multiproc, held, server.log, child_exit=True)


def test_uvicorn_workers_drop_a_killed_workers_gauges(tmp_path: Path) -> None:
    # uvicorn --workers restarts a killed worker but has no child_exit hook:
    # the scrape itself finds the dead pid's gauge files and drops them.
    pytest.importorskip("fastapi")
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = server_env(
        PROMETHEUS_MULTIPROC_DIR=str(multiproc),
        CONNLIST_HEADERS_TIMEOUT=str(HEADERS_TIMEOUT),
        CONNLIST_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT),
        CONNLIST_METRICS_INTERVAL=str(INTERVAL),
    )

    def args(port: int) -> list[str]:
        return [
            PYTHON,
            "-m",
            "uvicorn",
            "examples.fastapi_app:app",
            "--workers",
            str(WORKERS),
            "--http",
            INTEGRATED["httptools"],
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # Longer than the test, so the idle connections it holds stay open.
            "--timeout-keep-alive",
            "30",
        ]

    def both_workers_up(port: int) -> bool:
        return len({get_json(port, "/_connections")["pid"] for _ in range(10)}) == WORKERS

    with run_server(args, tmp_path / "uvicorn.log", env=env, ready=both_workers_up) as server:
        held = hold_idle_on_each_worker(server.port)
        assert server.proc.pid not in held
        time.sleep(3 * INTERVAL)
        kill_a_worker(server.port, multiproc, held, server.log, child_exit=False)
