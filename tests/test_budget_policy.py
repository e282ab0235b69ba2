"""max_connections on a fake clock and loop: what goes to make room, in which order; the pressure curve.

The same rules run against real servers in tests/test_budget.py; here each
step is deterministic, and the list's counts are checked after each.
"""

from __future__ import annotations

import resource

import pytest

from connlist.core.budget import idle_oldest
from connlist.core.checks import default_max_connections
from connlist.core.connections import Connection, ConnectionsList, connection_state
from connlist.core.enforcer import PRESSURE_FLOOR, PRESSURE_WATERMARK, Enforcer, shrink
from connlist.core.kinds import resolve
from connlist.core.sweep import KEEPALIVE_PER_SWEEP
from connlist.core.timer import CARRY_PACE
from tests.fakes import RESPONSE_408, RESPONSE_503, FakeClock, MemoryHandle, MockLoop


def make(clock: FakeClock, loop: MockLoop, budget: int, **options: float) -> Enforcer:
    return Enforcer(resolve(max_connections=budget, **options), clock=clock, loop=loop)  # type: ignore[arg-type]


def arrive(enforcer: Enforcer) -> tuple[Connection, MemoryHandle]:
    """A new connection, as the server layer reports it (``join``: connect, admit, watch)."""
    handle = MemoryHandle()
    conn = enforcer.join(("127.0.0.1", 5000), handle=handle)
    return conn, handle


def idle(enforcer: Enforcer, conn: Connection) -> None:
    """A whole request received on a new connection and answered: it is idle."""
    connections = enforcer.connections
    connections.message_begin(conn)
    connections.headers_complete(conn, "GET", "/")
    connections.message_complete(conn)
    connections.response_complete(conn)


def uploading(enforcer: Enforcer, conn: Connection) -> None:
    """A request whose headers are in and whose body is being received (timed by the rate)."""
    connections = enforcer.connections
    connections.message_begin(conn)
    connections.headers_complete(conn, "POST", "/upload")
    connections.body_begin(conn)


def serving(enforcer: Enforcer, conn: Connection, handle: MemoryHandle) -> None:
    """A request received whose response is being made."""
    connections = enforcer.connections
    connections.message_begin(conn)
    connections.headers_complete(conn, "GET", "/busy")
    connections.message_complete(conn)
    handle.responding = True


def consistent(connections: ConnectionsList) -> None:
    counts = connections.counts()
    states = [connection_state(conn) for conn in connections.iter_all()]
    assert counts["all"] == len(states)
    assert counts["active"] == sum(state in ("new", "reading_headers", "reading_body") for state in states)
    assert counts["timed_out"] == states.count("timed_out")
    assert counts["reading"] + counts["writing"] + counts["waiting"] + counts["timed_out"] == counts["all"]


def test_default_budget_leaves_room_for_the_rest_of_the_worker() -> None:
    assert default_max_connections(1024) == 1024 - 64 - 128
    assert default_max_connections(65536) == 65536 - 64 - 8192
    assert default_max_connections(10) == 1
    # An unlimited descriptor limit (ulimit -n unlimited): no budget.
    assert default_max_connections(resource.RLIM_INFINITY) == 0
    assert resolve().max_connections == default_max_connections()


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("9", TypeError)]
)
def test_max_connections_is_validated(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_connections"):
        resolve(max_connections=value)  # type: ignore[arg-type]


def test_order_idle_then_headers_then_body_then_refuse(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, 4, body_min_rate=1000)
    connections = enforcer.connections
    busy, busy_handle = arrive(enforcer)
    serving(enforcer, busy, busy_handle)
    old_idle, old_idle_handle = arrive(enforcer)
    idle(enforcer, old_idle)
    _, silent_handle = arrive(enforcer)
    body, body_handle = arrive(enforcer)
    uploading(enforcer, body)
    clock.advance(1)
    # Over the budget: the idle one goes (closed, not aborted), nothing else.
    first, _ = arrive(enforcer)
    assert old_idle_handle.transport.closed and not old_idle_handle.transport.aborted
    assert not silent_handle.transport.closed and not body_handle.transport.closed
    assert connections.occupied == 4
    consistent(connections)
    # No idle one: the oldest still sending its headers: 408, then aborted.
    second, _ = arrive(enforcer)
    assert silent_handle.transport.buffer == RESPONSE_408 and silent_handle.transport.aborted
    # Then the newer silent ones, oldest first; the body (keeping up: it has
    # no bytes, but idle and header-reading ones go first) stays.
    third, _ = arrive(enforcer)
    assert connection_state(first) == "timed_out" and connection_state(second) == "new"
    arrive(enforcer)
    assert connection_state(second) == "timed_out" and connection_state(third) == "new"
    assert connections.occupied == 4
    assert not body_handle.transport.closed
    totals = enforcer.totals
    assert (totals.idle_evictions, totals.headers_evictions, totals.body_evictions, totals.refused) == (
        1,
        3,
        0,
        0,
    )
    assert not busy_handle.transport.closed  # a request being served is never cut
    consistent(connections)


def test_an_idle_connection_already_closing_is_let_go_and_never_aborted(
    clock: FakeClock, loop: MockLoop
) -> None:
    # Its last response was answered with ``Connection: close``: the server
    # closed it and is flushing that response.  An abort (a reset) would drop it.
    enforcer = make(clock, loop, 2)
    closing, closing_handle = arrive(enforcer)
    idle(enforcer, closing)
    closing_handle.transport.close()
    arrive(enforcer)
    arrive(enforcer)
    assert enforcer.totals.idle_evictions == 1
    assert not closing_handle.transport.aborted
    assert enforcer.connections.occupied == 2
    consistent(enforcer.connections)


def test_a_slow_body_goes_before_a_refusal_and_a_served_request_never(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, 2, body_min_rate=1000)
    connections = enforcer.connections
    busy, busy_handle = arrive(enforcer)
    serving(enforcer, busy, busy_handle)
    body, body_handle = arrive(enforcer)
    uploading(enforcer, body)
    clock.advance(1)
    body.body_received = 10  # far behind 1000 B/s
    newcomer, newcomer_handle = arrive(enforcer)
    assert body_handle.transport.buffer == RESPONSE_408 and body_handle.transport.aborted
    assert enforcer.totals.body_evictions == 1
    # Now the serving one and the newcomer, which sends a request being served.
    serving(enforcer, newcomer, newcomer_handle)
    _, refused_handle = arrive(enforcer)
    assert refused_handle.transport.buffer == RESPONSE_503 and refused_handle.transport.closed
    assert not busy_handle.transport.closed and not newcomer_handle.transport.closed
    assert enforcer.totals.refused == 1
    assert connections.occupied == 2
    consistent(connections)


def test_a_body_the_server_stopped_reading_is_not_taken_for_slow(clock: FakeClock, loop: MockLoop) -> None:
    # The app has not consumed its body, so uvicorn paused reading: the server's doing, not the client's.
    enforcer = make(clock, loop, 1, body_min_rate=1000)
    connections = enforcer.connections
    body, body_handle = arrive(enforcer)
    uploading(enforcer, body)
    body_handle.transport.read_paused = True
    clock.advance(1)
    _, refused_handle = arrive(enforcer)
    assert not body_handle.transport.closed
    assert refused_handle.transport.buffer == RESPONSE_503
    assert enforcer.totals.body_evictions == 0 and enforcer.totals.refused == 1
    consistent(connections)


def test_a_body_keeping_up_with_the_rate_is_not_cut(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, 1, body_min_rate=1000)
    body, body_handle = arrive(enforcer)
    uploading(enforcer, body)
    clock.advance(1)
    body.body_received = 5000
    _, refused_handle = arrive(enforcer)
    assert not body_handle.transport.closed
    assert refused_handle.transport.buffer == RESPONSE_503


def test_an_idle_connection_used_since_it_went_idle_gets_a_second_chance(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, 3)
    connections = enforcer.connections
    a, a_handle = arrive(enforcer)
    idle(enforcer, a)
    b, b_handle = arrive(enforcer)
    idle(enforcer, b)
    c, c_handle = arrive(enforcer)
    idle(enforcer, c)
    # a serves another request the fast way (ConnectionsList.message), a
    # second later: it stays where it is in the idle order, but it was used since.
    clock.advance(1)
    connections.message(a)
    connections.response_complete(a)
    arrive(enforcer)
    assert not a_handle.transport.closed
    assert b_handle.transport.closed
    # And a responding idle one is never closed.
    connections.message(c)
    arrive(enforcer)
    assert a_handle.transport.closed and not c_handle.transport.closed
    consistent(connections)


def test_the_second_chance_walk_looks_at_each_record_once(clock: FakeClock, loop: MockLoop) -> None:
    connections = ConnectionsList(clock)
    conns = [connections.connect() for _ in range(5)]
    for conn in conns:
        connections.message_begin(conn)
        connections.headers_complete(conn, "GET", "/")
        connections.message_complete(conn)  # responding: idle, serving
    assert idle_oldest(connections, clock.now) is None
    connections.response_complete(conns[2])
    assert idle_oldest(connections, clock.now) is conns[2]


def test_shrink_is_linear_above_the_watermark_to_the_floor() -> None:
    assert shrink(60, 0.5) == 60
    assert shrink(60, PRESSURE_WATERMARK) == 60
    middle = (PRESSURE_WATERMARK + 1) / 2
    assert shrink(60, middle) == pytest.approx((60 + PRESSURE_FLOOR) / 2)
    assert shrink(60, 1.0) == PRESSURE_FLOOR
    assert shrink(60, 1.3) == PRESSURE_FLOOR
    assert shrink(1.0, 1.0) == 1.0  # below the floor already
    assert shrink(0.0, 1.0) == 0.0  # disabled stays disabled


def test_under_pressure_the_headers_timeout_shrinks_and_comes_back(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, 10, headers_timeout=60, request_timeout=300)
    conns = [arrive(enforcer) for _ in range(10)]
    assert enforcer.pressed
    # At 100%: cut after the floor, not 60 s.
    loop.run_until(clock.now + PRESSURE_FLOOR + 0.5)
    assert enforcer.totals.headers_timeouts == 10
    assert all(handle.transport.buffer == RESPONSE_408 for _, handle in conns)
    for conn, _ in conns:
        enforcer.connections.remove(conn)
    loop.run_until(clock.now + 1)
    assert not enforcer.pressed
    # Back under the watermark: 60 s again.
    conn, handle = arrive(enforcer)
    loop.run_until(clock.now + 30)
    assert not handle.transport.closed


def test_under_pressure_idle_keep_alive_connections_are_closed_sooner(
    clock: FakeClock, loop: MockLoop
) -> None:
    total = KEEPALIVE_PER_SWEEP + 2
    enforcer = make(clock, loop, total)
    enforcer.keep_alive = 30.0
    handles = []
    for _ in range(total):
        conn, handle = arrive(enforcer)
        idle(enforcer, conn)
        handles.append(handle)
    assert enforcer.pressed
    since = clock.now
    while not handles[0].transport.closed and clock.now < since + PRESSURE_FLOOR + 1:
        loop.run_until(min(loop.armed))
    # At most KEEPALIVE_PER_SWEEP in a sweep; that relieved the pressure, so
    # when the sweep carries on (CARRY_PACE later: the closed connections'
    # losses run meanwhile) the rest keep their keep-alive.
    n = KEEPALIVE_PER_SWEEP
    assert [handle.transport.closed for handle in handles] == [True] * n + [False] * (total - n)
    loop.run_soon()
    assert enforcer.pressed and sum(handle.transport.closed for handle in handles) == n
    assert loop.run_until(clock.now + CARRY_PACE) == 1
    assert not enforcer.pressed
    assert sum(handle.transport.closed for handle in handles) == n
    assert enforcer.totals.keepalive_timeouts == n
    assert enforcer.totals.idle_evictions == 0


def test_the_view_the_page_and_the_metrics_show_the_budget(clock: FakeClock, loop: MockLoop) -> None:
    from prometheus_client import CollectorRegistry

    from connlist.observe import page
    from connlist.observe.debug import snapshot
    from connlist.prometheus import ConnlistMetrics, Exporter

    enforcer = make(clock, loop, 4, headers_timeout=60, request_timeout=300)
    enforcer.mode = "uvicorn-httptools"  # the events below are the integration's
    registry = CollectorRegistry()
    exporter = Exporter(ConnlistMetrics(registry))
    exporter.refresh(enforcer)
    assert registry.get_sample_value("connlist_max_connections") == 4
    assert registry.get_sample_value("connlist_budget_total", {"kind": "headers"}) == 0
    for _ in range(5):
        arrive(enforcer)
    view = snapshot(enforcer)
    assert view["max_connections"] == 4
    budget = view["budget"]
    assert (budget["max_connections"], budget["occupied"], budget["pressure"], budget["pressed"]) == (
        4,
        4,
        1.0,
        True,
    )
    assert budget["headers_timeout_now"] == PRESSURE_FLOOR
    assert view["totals"]["headers_evictions"] == 1
    html = page.render(view).decode()
    assert "budget 4 of 4 connections (pressure 100%)" in html
    assert "headers timeout now 2 s" in html and "not enforced" not in html
    exporter.refresh(enforcer)
    assert registry.get_sample_value("connlist_budget_total", {"kind": "headers"}) == 1
    assert registry.get_sample_value("connlist_budget_total", {"kind": "refused"}) == 0


def test_an_accept_out_of_descriptors_is_logged_once_with_the_numbers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio
    import errno
    import logging

    enforcer = Enforcer(resolve(max_connections=100))
    event_loop = asyncio.new_event_loop()
    try:
        seen: list[dict[str, object]] = []
        event_loop.set_exception_handler(lambda _loop, context: seen.append(context))
        enforcer.attach(event_loop, 7.0)
        assert enforcer.keep_alive == 7.0
        failure = OSError(errno.EMFILE, "Too many open files")
        with caplog.at_level(logging.ERROR, logger="connlist"):
            for _ in range(3):
                event_loop.call_exception_handler(
                    {"message": "socket.accept() out of system resource", "exception": failure}
                )
        lines = [record.getMessage() for record in caplog.records if record.name == "connlist"]
        assert len(lines) == 1, lines
        assert "max_connections 100" in lines[0] and "RLIMIT_NOFILE" in lines[0]
        assert enforcer.totals.accept_failures == 3
        # Anything else still reaches the handler that was there before.
        event_loop.call_exception_handler({"message": "something else"})
        assert [context["message"] for context in seen] == ["something else"]
    finally:
        event_loop.close()


def test_a_loop_attached_twice_is_watched_once_and_without_a_handler_asyncios_default_applies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio
    import errno
    import logging

    enforcer = Enforcer(resolve(max_connections=100))
    default_keep_alive = enforcer.keep_alive
    event_loop = asyncio.new_event_loop()
    try:
        enforcer.attach(event_loop, None)  # a server that does not say: the keep-alive stays
        assert enforcer.keep_alive == default_keep_alive
        handler = event_loop.get_exception_handler()
        assert handler is not None
        enforcer.attach(event_loop, 3.0)  # every connection attaches: the handler is not wrapped again
        assert event_loop.get_exception_handler() is handler and enforcer.keep_alive == 3.0
        failure = OSError(errno.ENFILE, "Too many open files in system")
        with caplog.at_level(logging.ERROR):
            event_loop.call_exception_handler(
                {"message": "socket.accept() out of system resource", "exception": failure}
            )
            event_loop.call_exception_handler({"message": "something else"})
        assert enforcer.totals.accept_failures == 1
        # No handler was there before: asyncio's default one logs the rest, as without connlist.
        assert [record.getMessage() for record in caplog.records if record.name == "asyncio"] == [
            "something else"
        ]
    finally:
        event_loop.close()


def test_a_pipelined_request_behind_a_response_being_served_is_not_taken(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, 2)
    connections = enforcer.connections
    busy, busy_handle = arrive(enforcer)
    serving(enforcer, busy, busy_handle)
    connections.message_begin(busy)  # the next request's first bytes, while the first is served
    _, silent_handle = arrive(enforcer)
    arrive(enforcer)
    assert silent_handle.transport.aborted and not busy_handle.transport.closed
    consistent(connections)
