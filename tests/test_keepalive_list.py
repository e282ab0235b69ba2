"""The keep-alive timeout the list times, on a fake clock and loop: when each idle connection is closed.

What ``connlist.uvicorn_keepalive`` does at the end of a response that
leaves a connection idle is ``responded`` below; the rest is the enforcer's
(the idle heap, the sweep's ``keepalive`` step, ``wake_by``).  uvicorn's own
tests (scripts/uvicorn-protocol-tests) and tests/test_keepalive.py drive
the real protocols.
"""

from __future__ import annotations

import math

import pytest

from connlist.budget import idle_oldest
from connlist.connections import Connection
from connlist.enforcer import PRESSURE_FLOOR, Enforcer
from connlist.kinds import resolve
from tests.fakes import FakeClock, MemoryHandle, MockLoop

KEEP_ALIVE = 5.0


@pytest.fixture
def enforcer(clock: FakeClock, loop: MockLoop) -> Enforcer:
    enforcer = Enforcer(resolve(), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = KEEP_ALIVE
    enforcer.keep_alive_timed = True
    return enforcer


def arrive(enforcer: Enforcer) -> tuple[Connection, MemoryHandle]:
    handle = MemoryHandle()
    conn = enforcer.connections.connect(client=("127.0.0.1", 5000), handle=handle)
    enforcer.admit(conn)
    enforcer.watch()
    return conn, handle


def first_request(enforcer: Enforcer, conn: Connection) -> None:
    """A whole request on a new connection (the server layer's slow path), its response begun."""
    connections = enforcer.connections
    connections.message_begin(conn)
    connections.headers_complete(conn, "GET", "/")
    connections.message_complete(conn)
    enforcer.unwatch()


def responded(enforcer: Enforcer, conn: Connection) -> None:
    """The end of a response that leaves ``conn`` idle, as connlist.uvicorn_keepalive writes it."""
    enforcer.connections.response_complete(conn)
    conn.idle_at = idle_at = enforcer.clock()
    if idle_at + enforcer.keep_alive < enforcer.timer_at:
        enforcer.wake_by(idle_at + enforcer.keep_alive)


def test_an_idle_connection_is_closed_at_exactly_the_keep_alive_time(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    clock.advance(0.3)
    responded(enforcer, conn)
    since = clock.now
    assert loop.armed == [since + KEEP_ALIVE]
    loop.run_until(since + KEEP_ALIVE - 0.001)
    assert not handle.transport.closed
    loop.run_until(since + KEEP_ALIVE)
    assert handle.closed_keepalive and clock.now == since + KEEP_ALIVE
    assert enforcer.totals.keepalive_timeouts == 1
    # uvicorn's own rule, not a slow client: counted, not in the log summary.
    loop.run_until(clock.now + 60)
    assert not enforcer.summary.pending and "timed out" not in caplog.text


def test_each_request_moves_the_deadline_and_the_timer_wakes_once_per_period(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    responded(enforcer, conn)
    armed = 0
    for _ in range(100):  # a request every 0.2 s for 20 s: each on an idle connection, whole
        armed += loop.run_until(clock.now + 0.2)
        enforcer.connections.message(conn)
        clock.advance(0.01)
        responded(enforcer, conn)
    last = clock.now
    # The timer fired about once per keep-alive period, not once per request.
    assert armed <= 20 / KEEP_ALIVE + 1, armed
    loop.run_until(last + KEEP_ALIVE - 0.001)
    assert not handle.transport.closed
    loop.run_until(last + KEEP_ALIVE)
    assert handle.closed_keepalive and clock.now == last + KEEP_ALIVE


def test_a_connection_serving_a_request_is_never_closed(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    responded(enforcer, conn)
    clock.advance(1)
    enforcer.connections.message(conn)  # a request that takes 30 s to answer
    loop.run_until(clock.now + 30)
    assert not handle.transport.closed
    responded(enforcer, conn)
    loop.run_until(clock.now + KEEP_ALIVE)
    assert handle.closed_keepalive


def test_a_request_that_begins_takes_the_connection_out_until_it_is_received(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    responded(enforcer, conn)
    clock.advance(4)
    enforcer.connections.message_begin(conn)  # its headers trickle: the headers timeout's
    enforcer.watch()
    loop.run_until(clock.now + 20)
    assert not handle.transport.closed and conn not in enforcer.connections.idle_queue
    first_request(enforcer, conn)  # (the rest of it)
    responded(enforcer, conn)
    loop.run_until(clock.now + KEEP_ALIVE)
    assert handle.closed_keepalive


def test_connections_are_closed_in_the_order_their_idle_time_began(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    # Joined the idle heap in one order (first requests), idle in the reverse (their responses).
    conns = [arrive(enforcer) for _ in range(5)]
    for conn, _ in conns:
        first_request(enforcer, conn)
    for conn, _ in reversed(conns):
        clock.advance(0.1)
        enforcer.connections.message(conn)
        responded(enforcer, conn)
    closed: list[int] = []
    for _ in range(60):
        loop.run_until(clock.now + 0.1)
        closed += [i for i, (_, handle) in enumerate(conns) if handle.transport.closed and i not in closed]
        if len(closed) == 5:
            break
    assert closed == [4, 3, 2, 1, 0]


def test_a_timer_the_loop_runs_takes_the_time_it_was_armed_for(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    # A loop that runs a timer without its clock having moved (uvicorn's
    # tests' MockLoop) has reached the timer's time for the list as well.
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    responded(enforcer, conn)
    (timer,) = [h for h in loop.later if not h.cancelled]
    loop.later.remove(timer)
    timer.run()
    assert handle.closed_keepalive and enforcer.totals.keepalive_timeouts == 1
    # A timer replaced since does nothing when its loop runs it anyway.
    other, other_handle = arrive(enforcer)
    first_request(enforcer, other)
    responded(enforcer, other)
    (current,) = [h for h in loop.later if not h.cancelled]
    timer.run()
    assert not other_handle.transport.closed and enforcer.timer_at == current.when


def test_without_the_list_timing_it_idle_connections_are_left_to_the_server(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    enforcer.keep_alive_timed = False
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    enforcer.connections.response_complete(conn)
    assert enforcer.timer_at == math.inf and loop.armed == []
    loop.run_until(clock.now + 60)
    assert not handle.transport.closed and enforcer.totals.keepalive_timeouts == 0


def test_under_pressure_the_same_rule_closes_sooner_and_says_so(
    clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    enforcer = Enforcer(resolve(max_connections=10), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = 30.0
    enforcer.keep_alive_timed = True
    conns = [arrive(enforcer) for _ in range(10)]
    for conn, _ in conns:
        first_request(enforcer, conn)
        responded(enforcer, conn)
    assert enforcer.pressed
    since = clock.now
    loop.run_until(since + PRESSURE_FLOOR + 0.3)
    assert all(handle.transport.closed for _, handle in conns)
    # Counted as keep-alive closes, each let go (out of the budget) and in the log summary.
    assert enforcer.totals.keepalive_timeouts == 10 and enforcer.connections.occupied == 0
    assert not any(handle.closed_keepalive for _, handle in conns)  # closed as the budget closes
    assert "10 connections timed out (10 keepalive)" in caplog.text


def test_the_budget_lets_go_of_the_connection_idle_longest_by_its_responses_end(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    # Both joined the idle heap at their first request; b's response ended first.
    (a, _), (b, _) = arrive(enforcer), arrive(enforcer)
    first_request(enforcer, a)
    first_request(enforcer, b)
    clock.advance(1)
    responded(enforcer, b)
    clock.advance(1)
    responded(enforcer, a)
    assert idle_oldest(enforcer.connections, clock.now) is b
    assert idle_oldest(enforcer.connections, clock.now) is a
    assert idle_oldest(enforcer.connections, clock.now) is None
