"""connlist.otel against real servers: the SDK's in-memory reader sees what the debug view sees.

Headers timeout 0.5 s, request timeout 1 s, uvicorn in a thread
(``tests.servers``).  A collection from the test's thread hops to the
server's event loop; one from the loop's own thread reads at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.metrics")

from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from connlist import ConnectionsMiddleware
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.observe import otel
from connlist.otel import MetricsMiddleware, instruments_for
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
from tests.subprocesses import get, get_json

HEADERS_TIMEOUT = 0.5
REQUEST_TIMEOUT = 1.0

Values = dict[tuple[str, tuple[tuple[str, Any], ...]], float]


def collect(reader: InMemoryMetricReader) -> Values:
    values: Values = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else []:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "connlist"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    values[(metric.name, tuple(sorted(point.attributes.items())))] = point.value  # type: ignore[union-attr]
    return values


def provider() -> tuple[MeterProvider, InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def expected_from_view(view: dict[str, Any]) -> Values:
    """The instruments' values for a debug view: the same counts and totals, under OpenTelemetry's names."""
    counts, totals = view["counts"], view["totals"]
    values: Values = {
        ("connlist.accepted_connections", ()): totals["connections"],
        ("connlist.requests", ()): totals["requests"],
        ("connlist.rejected_connections", ()): totals["refused"],
        ("connlist.accept_failures", ()): totals["accept_failures"],
        ("connlist.rejected_upgrades", ()): totals["upgrades_refused"],
        ("connlist.header_overflows", ()): totals["header_overflows"],
        ("connlist.upgraded_connections", ()): counts["upgraded"],
        ("connlist.max_connections", ()): view["max_connections"],
        ("connlist.server_integration", ()): int(view["mode"] != "asgi"),
    }
    for state in ("reading", "writing", "waiting", "timed_out", "upgraded"):
        values[("connlist.active_connections", (("connlist.connection.state", state),))] = counts[state]
    for kind in ("headers", "request", "rate", "send", "keepalive"):
        key = ("connlist.timed_out_connections", (("connlist.timeout.kind", kind),))
        values[key] = totals[f"{kind}_timeouts"]
    for kind in ("idle", "headers", "body"):
        key = ("connlist.evicted_connections", (("connlist.eviction.kind", kind),))
        values[key] = totals[f"{kind}_evictions"]
    return values


async def hello(request: Request) -> PlainTextResponse:
    body = await request.body()
    return PlainTextResponse(f"ok {len(body)}")


BLOCKING = threading.Event()


def block(request: Request) -> PlainTextResponse:
    # A handler that holds the event loop (a sync call in an async app).
    BLOCKING.set()
    time.sleep(float(request.query_params["seconds"]))
    return PlainTextResponse("done")


async def blocking(request: Request) -> PlainTextResponse:
    return block(request)


def make_app(
    meter_provider: MeterProvider | None, *, outside: bool = False, server_integration: str = "auto"
) -> Starlette:
    connections = Middleware(
        ConnectionsMiddleware,
        headers_timeout=HEADERS_TIMEOUT,
        request_timeout=REQUEST_TIMEOUT,
        debug_path="/_connections",
        server_integration=server_integration,
    )
    metrics = Middleware(MetricsMiddleware, meter_provider=meter_provider)
    return Starlette(
        routes=[Route("/", hello, methods=["GET", "POST"]), Route("/block", blocking)],
        middleware=[metrics, connections] if outside else [connections, metrics],
    )


def test_collections_equal_the_view_on_a_real_server() -> None:
    meter_provider, reader = provider()
    with serve(make_app(meter_provider), INTEGRATED["httptools"]) as server:
        port = server.port
        silent = connect(port)
        partial = connect(port)
        partial.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        idle = connect(port)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(idle).endswith(b"ok 0")
        body = connect(port)
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")

        # While they are open: 2 reading, the body writing, the keep-alive waiting.
        def during() -> bool:
            values = collect(reader)
            states = ("reading", "writing", "waiting")
            active = [
                values[("connlist.active_connections", (("connlist.connection.state", s),))] for s in states
            ]
            return active == [2, 1, 1]

        assert wait_for(during, limit=HEADERS_TIMEOUT - 0.1)
        for sock in (silent, partial, body):
            data, _ = read_until_closed(sock)
            assert is_408(data), data

        # The view counts itself (one connection, one request, writing while it
        # answers); once it has closed, the instruments must read its numbers
        # but for that one writing connection.
        view = get_json(port, "/_connections?format=json")
        assert view["mode"] == "uvicorn-httptools"
        assert view["totals"]["headers_timeouts"] == 2 and view["totals"]["request_timeouts"] == 1
        expected = expected_from_view(view)
        expected[("connlist.active_connections", (("connlist.connection.state", "writing"),))] -= 1
        assert wait_for(lambda: collect(reader) == expected, limit=2.0), (collect(reader), expected)
        # The same, collected on the server's own event loop (no hop).
        assert server.call(collect, reader) == expected
    # Shut down: the connections leave, the counters keep their values, no mode is reported.
    after = collect(reader)
    assert after[("connlist.active_connections", (("connlist.connection.state", "waiting"),))] == 0
    assert after[("connlist.max_connections", ())] == 0
    assert ("connlist.server_integration", ()) not in after
    assert after[("connlist.timed_out_connections", (("connlist.timeout.kind", "headers"),))] == 2
    assert after[("connlist.accepted_connections", ())] == view["totals"]["connections"]


def test_asgi_only_mode_and_the_global_meter_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    # No meter_provider: the API's global one, where the service's exporter reads.
    meter_provider, reader = provider()
    monkeypatch.setattr(otel_metrics, "get_meter_provider", lambda: meter_provider)
    app = make_app(None, server_integration="off")
    assert instruments_for() is instruments_for(meter_provider)
    with serve(app, PLAIN["h11"]) as server:
        assert get(server.port, "/")[0] == 200
        view = get_json(server.port, "/_connections?format=json")
        assert view["mode"] == "asgi"
        values = collect(reader)
    assert values[("connlist.server_integration", ())] == 0
    # ASGI-only mode counts the requests that reach the app: GET /, not the view's.
    assert (values[("connlist.requests", ())], view["totals"]["requests"]) == (1, 1)


def test_without_the_lifespan_and_after_the_loop_closed() -> None:
    # Outside ConnectionsMiddleware with the lifespan off: the enforcer is
    # found in the first request's state.  With no shutdown to tell it, the
    # source finds the loop closed and reports its last reading.
    meter_provider, reader = provider()
    with serve(make_app(meter_provider, outside=True), INTEGRATED["h11"], lifespan="off") as server:
        assert collect(reader) == {}  # nothing served yet: no enforcer, nothing observed
        assert get(server.port, "/")[0] == 200
        during = collect(reader)
        assert during[("connlist.requests", ())] == 1
        assert during[("connlist.server_integration", ())] == 1
        time.sleep(otel._FRESH)
    assert collect(reader) == during


def test_a_stuck_loop_gives_the_last_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel, "HOP_TIMEOUT", 0.1)
    meter_provider, reader = provider()
    with serve(make_app(meter_provider), INTEGRATED["httptools"]) as server:
        before = collect(reader)
        sock = connect(server.port)
        BLOCKING.clear()
        sock.sendall(b"GET /block?seconds=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert BLOCKING.wait(5)  # the handler holds the loop from now on, for 1 s
        started = time.monotonic()
        assert collect(reader) == before
        assert time.monotonic() - started < 0.9  # the collection did not wait for the loop
        assert read_response(sock).endswith(b"done")
        assert wait_for(lambda: collect(reader)[("connlist.requests", ())] == 1)


class _Lifespan:
    """An app whose lifespan collects once, on the loop, before it completes."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.reader = reader
        self.seen: list[Values] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(collect(self.reader))


def test_counters_survive_a_lifespan_restart_and_sources_add_up() -> None:
    meter_provider, reader = provider()
    app = _Lifespan(reader)
    first = MetricsMiddleware(app, meter_provider=meter_provider)
    second = MetricsMiddleware(app, meter_provider=meter_provider)
    # No enforcer handed over in its worker (no ConnectionsMiddleware): it adds nothing.
    alone = MetricsMiddleware(app, meter_provider=meter_provider)
    assert first.instruments is second.instruments  # no instrument registered twice
    one, two, three = Enforcer(), Enforcer(), Enforcer()
    one.totals.requests, one.totals.refused, one.totals.idle_evictions = 5, 2, 1
    two.totals.requests, two.totals.accept_failures, two.totals.header_overflows = 7, 3, 2
    three.totals.requests, three.totals.send_timeouts = 1, 4
    one.connections.connect()

    async def lifespan(middleware: MetricsMiddleware, enforcer: Enforcer | None) -> None:
        HANDOVER.enforcer = enforcer  # as ConnectionsMiddleware's lifespan hands it over
        await middleware({"type": "lifespan", "state": {}}, None, None)

    async def run() -> None:
        await lifespan(first, one)
        await lifespan(first, two)  # a restart: a new enforcer, from 0
        await lifespan(second, three)
        await lifespan(alone, None)

    asyncio.run(run())
    # Inside the first lifespan: one connection reading, one's totals.
    assert app.seen[0][("connlist.active_connections", (("connlist.connection.state", "reading"),))] == 1
    assert app.seen[0][("connlist.requests", ())] == 5
    values = collect(reader)
    assert values[("connlist.requests", ())] == 5 + 7 + 1
    assert values[("connlist.rejected_connections", ())] == 2
    assert values[("connlist.accept_failures", ())] == 3
    one.totals.header_overflows = 6  # after its lifespan: not read again
    assert values[("connlist.header_overflows", ())] == 2
    assert values[("connlist.evicted_connections", (("connlist.eviction.kind", "idle"),))] == 1
    assert values[("connlist.timed_out_connections", (("connlist.timeout.kind", "send"),))] == 4
    assert values[("connlist.active_connections", (("connlist.connection.state", "reading"),))] == 0
