"""The enforcer's one timer, deterministically: a mock loop, a fake clock, handles over memory transports.

Each test drives the list's events and the enforcer's entry points
(``join``, ``watch``, ``bring_forward``, ``cancel``) as the server layer
does, and runs the timer with ``MockLoop.run_until``: when the timer is
armed, what each sweep cuts and when the next one is due are exact.  The
real-server tests (tests/test_timeouts.py, tests/test_hardening.py) check
the same rules end to end within wall-clock bounds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import typing
import unittest.mock

import pytest

from connlist.core.connections import Connection
from connlist.core.enforcer import SLOW_CALLBACK, Enforcer
from connlist.core.kinds import (
    HEADER_OVERFLOW,
    ROOM_KINDS,
    TIMEOUT_KINDS,
    UPGRADE_REFUSED,
    RoomKind,
    TimeoutKind,
    Totals,
    resolve,
)
from connlist.core.logs import SUMMARY_INTERVAL
from connlist.core.sweep import _BATCH, RATE_RESOLUTION, SLACK
from connlist.core.timer import CARRY_PACE, SWEEP_TIME
from tests.fakes import RESPONSE_408, T0, FakeClock, MemoryHandle, MockLoop

LINGER = 1.0


def make(clock: FakeClock, loop: MockLoop, **options: float) -> Enforcer:
    """An enforcer on ``loop`` with the options given, every other timeout off."""
    values: dict[str, float] = {
        "headers_timeout": 0,
        "request_timeout": 0,
        "send_timeout": 0,
        "body_min_rate": 0,
    }
    values.update(options)
    return Enforcer(resolve(**values), clock=clock, loop=loop, linger=LINGER)  # type: ignore[arg-type]


def connect(enforcer: Enforcer) -> tuple[Connection, MemoryHandle]:
    """A new connection, as the server layer reports it (``join``)."""
    handle = MemoryHandle()
    conn = enforcer.join(("127.0.0.1", 5000), handle=handle)
    return conn, handle


def finish_request(enforcer: Enforcer, conn: Connection) -> None:
    """A whole request received: the connection is idle (and responding)."""
    enforcer.connections.headers_complete(conn, "GET", "/")
    enforcer.connections.message_complete(conn)


# -- when the timer is armed ---------------------------------------------------


def test_the_timer_is_armed_while_something_can_be_due_and_not_again_once_nothing_is(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30, send_timeout=8)
    lst = enforcer.connections
    enforcer.watch()
    assert loop.armed == []  # no connection
    conn, _ = connect(enforcer)
    assert loop.armed == [T0 + 2]  # a new connection is active; send_timeout / 4 bounds every sleep
    finish_request(enforcer, conn)
    assert loop.armed == [T0 + 2]  # idle: nothing can be due, and nothing was cancelled ...
    loop.run_until(T0 + 2)
    assert loop.armed == []  # ... the sweep found nothing to watch, and armed no timer
    lst.stall(conn, 100)
    enforcer.watch()
    assert loop.armed == [T0 + 4]  # a stalled response is sampled
    lst.unstall(conn)
    loop.run_until(T0 + 4)
    assert loop.armed == []
    lst.linger(conn)
    enforcer.watch()
    assert loop.armed == [T0 + 4 + LINGER]  # a closed connection's linger ends
    lst.remove(conn)
    loop.run_until(T0 + 4 + LINGER)
    assert loop.armed == []  # the sweep found nothing more to watch


def test_a_connection_per_request_costs_no_timer_work_while_the_timer_is_armed(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    armed: list[float] = []
    call_later = loop.call_later

    def counted(delay: float, callback: typing.Any, *args: typing.Any) -> typing.Any:
        armed.append(clock.now + delay)
        return call_later(delay, callback, *args)

    loop.call_later = counted  # type: ignore[method-assign]
    for _ in range(100):  # a connection, a whole request, the close: 0.01 s each
        conn, _ = connect(enforcer)
        enforcer.connections.message(conn)
        enforcer.connections.response_complete(conn)
        enforcer.connections.remove(conn)
        clock.advance(0.01)
    # One timer, armed by the first connection for its headers timeout, and never cancelled.
    assert armed == [T0 + 10] and loop.armed == [T0 + 10]
    loop.run_until(T0 + 10)
    assert loop.armed == [] and len(armed) == 1 and enforcer.totals.connections == 100


def test_with_every_timeout_off_no_timer_is_ever_armed(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop)
    assert enforcer.settings.shortest == 0
    conn, _ = connect(enforcer)
    enforcer.connections.headers_complete(conn, "POST", "/upload")
    enforcer.connections.body_begin(conn)
    enforcer.watch()
    assert loop.armed == []


def test_with_every_timeout_off_a_linger_still_ends(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop)
    conn, handle = connect(enforcer)
    enforcer.connections.linger(conn)  # closed by close_idle(), say: the timer ends its linger
    enforcer.bring_forward(T0 + LINGER)
    assert loop.armed == [T0 + LINGER]
    loop.run_until(T0 + LINGER)
    assert handle.transport.aborted and loop.armed == []


def test_with_only_the_rate_on_a_body_is_looked_at_after_its_grace(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, body_min_rate=100, body_grace=2)
    _, handle = receiving(enforcer)
    # No deadline yet (no headers or request timeout), but the body can be due: in a grace.
    assert loop.armed == [T0 + 2]
    loop.run_until(T0 + 2)
    assert loop.armed == [T0 + 2 + SLACK]
    loop.run_until(T0 + 2 + SLACK)
    assert handle.transport.buffer == RESPONSE_408 and enforcer.totals.rate_timeouts == 1


def test_the_timer_is_armed_just_after_the_earliest_deadline(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    conn, handle = connect(enforcer)
    # No further than Settings.shortest (10 s) away, and a second watch() arms nothing more.
    assert loop.armed == [T0 + 10]
    enforcer.watch()
    assert loop.armed == [T0 + 10]
    # At T0 + 10 nothing is due yet (Node's rule is strict: older than the
    # timeout), so the timer is armed just after the deadline ...
    assert loop.run_until(T0 + 10) == 1
    assert handle.transport.buffer == b"" and conn.is_active
    assert loop.armed == [T0 + 10 + SLACK]
    # ... where the connection is cut: counted, 408 and close, then it lingers.
    loop.run_until(T0 + 10 + SLACK)
    assert handle.transport.buffer == RESPONSE_408 and handle.transport.closed
    assert enforcer.totals.headers_timeouts == 1 and not conn.is_active
    assert loop.armed == [pytest.approx(T0 + 10 + SLACK + LINGER)]


def test_a_deadline_nearer_than_the_shortest_wins(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    first, _ = connect(enforcer)
    clock.advance(7)
    second, _ = connect(enforcer)
    assert loop.armed == [T0 + 10]  # the second connect moved nothing
    enforcer.cancel()
    enforcer.watch()
    # The first connection's deadline (T0 + 10) is nearer than now + shortest (T0 + 17).
    assert loop.armed == [T0 + 10 + SLACK]
    loop.run_until(T0 + 10 + SLACK)
    assert (first.is_active, second.is_active) == (False, True)
    # Next: the first one's linger, before the second one's deadline.
    assert loop.armed == [pytest.approx(T0 + 10 + SLACK + LINGER)]
    loop.run_until(T0 + 16)
    assert loop.armed == [pytest.approx(T0 + 17 + SLACK)]


def test_a_far_deadline_is_reached_in_sleeps_of_the_shortest(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    conn, handle = connect(enforcer)
    enforcer.connections.headers_complete(conn, "POST", "/upload")
    # The request timeout is 30 s away; the timer sleeps 10 s at a time, as
    # a request begun in the meantime could be due 10 s after it began.
    assert loop.run_until(T0 + 29) == 2
    assert loop.armed == [T0 + 30]
    assert handle.transport.buffer == b""
    loop.run_until(T0 + 30 + SLACK)
    assert handle.transport.buffer == RESPONSE_408
    assert (enforcer.totals.headers_timeouts, enforcer.totals.request_timeouts) == (0, 1)


def test_a_request_begun_after_the_timer_was_armed_never_moves_it(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    lst = enforcer.connections
    first, _ = connect(enforcer)
    second, _ = connect(enforcer)
    finish_request(enforcer, second)
    clock.advance(3)
    lst.message_begin(second)  # the hot path: no watch(), the timer already fires by T0 + 13
    assert loop.armed == [T0 + 10]
    loop.run_until(T0 + 10 + SLACK)
    assert not first.is_active
    # The sweep armed the timer at the earlier of the first one's linger and the second one's deadline.
    assert loop.armed == [pytest.approx(T0 + 10 + SLACK + LINGER)]
    lst.remove(first)
    loop.run_until(T0 + 12)
    assert loop.armed == [pytest.approx(T0 + 13 + SLACK)]


def test_configure_rearms_with_the_new_settings(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    connect(enforcer)
    before = loop.later[0]
    enforcer.configure(resolve(headers_timeout=2, request_timeout=3, send_timeout=0), on_timeout=None)
    assert before.cancelled
    assert loop.armed == [T0 + 2]


# -- cutting off in budgets ----------------------------------------------------


def costly(enforcer: Enforcer, clock: FakeClock) -> None:
    """Make every reading of the enforcer's clock cost half of ``SWEEP_TIME``, as cutting off costs time."""

    def reading() -> float:
        clock.now += SWEEP_TIME / 2
        return clock.now

    enforcer.clock = reading


def carry_on(enforcer: Enforcer, loop: MockLoop) -> int:
    """Run the sweep that carries on, ``CARRY_PACE`` after each stop, until it finishes; how many times."""
    ran = 0
    while enforcer.timer_at == math.inf and loop.armed:  # no timer of its own: the sweep carries on
        loop.run_until(loop.armed[0])
        ran += 1
    return ran


def mass_timeout(clock: FakeClock, loop: MockLoop, n: int) -> tuple[Enforcer, list[MemoryHandle]]:
    """``n`` connections past their headers deadline, and a clock that moves half the budget per reading."""
    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2)
    handles = [connect(enforcer)[1] for _ in range(n)]
    loop.run_until(T0 + 1)  # nothing is older than the timeout yet
    costly(enforcer, clock)
    return enforcer, handles


@pytest.mark.parametrize("kind", ["rate", "send", "linger"])
def test_each_kind_of_mass_cut_off_keeps_to_the_budget(clock: FakeClock, loop: MockLoop, kind: str) -> None:
    enforcer = make(clock, loop, body_min_rate=100, body_grace=1, send_timeout=4, headers_timeout=10)
    lst = enforcer.connections
    n = 3 * _BATCH + 4
    handles = []
    for _ in range(n):
        if kind == "rate":
            conn, handle = receiving(enforcer)
        elif kind == "send":
            conn, handle = stalled(enforcer, 1000)
        else:
            conn, handle = connect(enforcer)
            finish_request(enforcer, conn)
            lst.linger(conn)
            enforcer.watch()
        handles.append(handle)
    # Due after the grace (rate), at the sample 4 s without progress (send), after the linger.
    due = {"rate": T0 + 1 + SLACK, "send": T0 + 4, "linger": T0 + LINGER}[kind]
    loop.run_until(due - 0.0001)
    assert not any(h.transport.closed for h in handles)
    costly(enforcer, clock)  # each reading of the clock costs half the budget from now on
    loop.run_until(due)
    done = [h for h in handles if h.transport.closed]
    assert 0 < len(done) < n and loop.queued == 0 and loop.armed == [clock.now + CARRY_PACE]
    assert carry_on(enforcer, loop) >= 1
    assert all(h.transport.closed for h in handles)
    if kind == "linger":
        assert all(h.transport.aborted for h in handles)


def test_a_mass_timeout_is_spread_over_loop_iterations(clock: FakeClock, loop: MockLoop) -> None:
    enforcer, handles = mass_timeout(clock, loop, 3 * _BATCH + 4)
    loop.run_until(T0 + 1 + SLACK)
    # Three batches, then the budget was spent: the rest waits CARRY_PACE,
    # and no timer of the enforcer's own is armed meanwhile.
    assert enforcer.totals.headers_timeouts == 3 * _BATCH
    assert sum(h.transport.buffer == RESPONSE_408 for h in handles) == 3 * _BATCH
    carry = clock.now + CARRY_PACE
    assert (loop.queued, loop.armed, enforcer.timer_at) == (0, [carry], math.inf)
    enforcer.watch()  # a connect while the sweep carries on arms nothing
    enforcer.bring_forward(clock.now)
    enforcer.wake_by(clock.now)
    assert (loop.queued, loop.armed) == (0, [carry])
    # Until then the loop serves the closed connections' connection_lost and
    # other clients: the sweep cuts nothing.
    loop.run_soon()
    loop.run_until(carry - CARRY_PACE / 10)
    assert enforcer.totals.headers_timeouts == 3 * _BATCH
    assert loop.armed == [carry]
    assert loop.run_until(carry) == 1
    assert all(h.transport.buffer == RESPONSE_408 for h in handles)
    assert enforcer.totals.headers_timeouts == 3 * _BATCH + 4
    # Done: nothing queued, the timer armed again for the lingers.
    assert loop.queued == 0 and len(loop.armed) == 1 and enforcer.timer_at == loop.armed[0]


class ArmingHandle(MemoryHandle):
    """Its close arms the timer every way the server layer's can from within a sweep."""

    def __init__(self, enforcer: Enforcer, clock: FakeClock) -> None:
        super().__init__()
        self.enforcer = enforcer
        self.clock = clock

    def connlist_close_expired(self) -> None:
        super().connlist_close_expired()
        # A close that lingers (seam's _connlist_linger), a 408 that fills
        # the buffer (pause_writing: a stall, watch), a response that ends
        # and leaves a connection idle (wake_by).
        self.enforcer.bring_forward(self.clock.now + LINGER)
        self.enforcer.watch()
        self.enforcer.wake_by(self.clock.now)


def test_a_timer_armed_from_within_a_sweep_waits_for_its_end(clock: FakeClock, loop: MockLoop) -> None:
    # A handle's close can arm the timer (a linger brought forward, a stall,
    # a keep-alive close under pressure): in the sweep, that arming is the
    # sweep's to make at its end, else a timer and a carry would both be
    # armed, and the timer, firing once a carry had cleared its time, would
    # sweep with an infinite now.
    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2)
    handles = [ArmingHandle(enforcer, clock) for _ in range(3 * _BATCH + 4)]
    for handle in handles:
        enforcer.join(("127.0.0.1", 5000), handle=handle)
    loop.run_until(T0 + 1)
    costly(enforcer, clock)
    sweeps = []
    work = enforcer._work

    def recorded(floor: float = 0.0, carrying: bool = False) -> bool:
        sweeps.append(floor)
        return work(floor, carrying)

    enforcer._work = recorded  # type: ignore[method-assign]
    loop.run_until(T0 + 1 + SLACK)
    # The sweep did not finish: its carry is all that is armed.
    assert 0 < enforcer.totals.headers_timeouts < len(handles)
    assert (len(loop.armed), enforcer.timer_at) == (1, math.inf)
    assert carry_on(enforcer, loop) >= 1
    assert all(h.transport.buffer == RESPONSE_408 for h in handles)
    # Finished: one timer, for the lingers, and every sweep had a finite now.
    assert len(loop.armed) == 1 and enforcer.timer_at == loop.armed[0]
    loop.run_until(clock.now + LINGER + 1)
    assert all(h.transport.aborted for h in handles)
    assert all(math.isfinite(floor) for floor in sweeps) and len(sweeps) >= 3


def test_cancel_forgets_the_sweep_that_carries_on(clock: FakeClock, loop: MockLoop) -> None:
    enforcer, _ = mass_timeout(clock, loop, 3 * _BATCH + 4)
    loop.run_until(T0 + 1 + SLACK)
    assert len(loop.armed) == 1 and enforcer.timer_at == math.inf
    enforcer.cancel()  # a server starting, or nothing due any more
    assert loop.armed == [] and loop.run_until(clock.now + 1) == 0
    assert enforcer.totals.headers_timeouts == 3 * _BATCH
    # Not continuing any more: a timer can be armed again at once.
    enforcer.watch()
    assert len(loop.armed) == 1


def test_cancel_on_a_closed_loop_forgets_the_timer(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    connect(enforcer)
    timer = loop.later[0]
    loop.closed = True
    enforcer.cancel()  # (cancelling a handle of a closed loop does nothing on asyncio's and uvloop's)
    assert timer.cancelled and enforcer.timer_at == math.inf
    loop.closed = False
    enforcer.watch()  # forgotten: a timer of its own
    assert loop.armed == [T0 + 10]


def test_a_closed_server_loop_is_forgotten_for_the_running_one(clock: FakeClock) -> None:
    # A server stopped and the enforcer serves the next one: its first arming
    # finds the old server's loop closed and arms on the loop running now.
    old, new = MockLoop(clock), MockLoop(clock)
    enforcer = Enforcer(resolve(headers_timeout=10, request_timeout=30), clock=clock)
    enforcer.attach(typing.cast(asyncio.AbstractEventLoop, old), None)
    old.closed = True
    running = typing.cast(asyncio.AbstractEventLoop, new)
    with unittest.mock.patch("asyncio.get_running_loop", return_value=running):
        connect(enforcer)
    assert enforcer.attached_loop is None and old.later == [] and new.armed == [T0 + 10]


def test_a_closed_loop_given_is_not_replaced(clock: FakeClock, loop: MockLoop) -> None:
    # The loop an enforcer was given is its owner's to keep open: no other is taken silently.
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    loop.closed = True
    with pytest.raises(RuntimeError, match="closed"):
        connect(enforcer)


def test_bring_forward_moves_a_later_timer_only(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    conn, handle = connect(enforcer)
    first = loop.later[0]
    enforcer.bring_forward(T0 + 20)  # the timer fires before that already
    assert not first.cancelled and loop.armed == [T0 + 10]
    # A close outside a sweep starts a linger: the timer must fire by its end.
    enforcer.connections.linger(conn)
    enforcer.bring_forward(T0 + LINGER)
    assert first.cancelled and loop.armed == [T0 + LINGER]
    loop.run_until(T0 + LINGER)
    assert handle.transport.aborted


def test_without_a_loop_the_timer_runs_on_the_running_loop() -> None:
    async def main() -> None:
        enforcer = Enforcer(resolve(headers_timeout=0.01, request_timeout=0.02, send_timeout=0), linger=0.01)
        handle = MemoryHandle()
        enforcer.connections.connect(handle=handle)
        enforcer.watch()
        for _ in range(200):
            if handle.transport.aborted:
                break
            await asyncio.sleep(0.005)
        enforcer.cancel()
        assert handle.transport.buffer == RESPONSE_408 and handle.transport.aborted

    asyncio.run(main())


# -- linger ----------------------------------------------------------------------


def test_a_cut_connection_that_lingers_is_aborted_once(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    _, handle = connect(enforcer)
    loop.run_until(T0 + 10 + SLACK)
    assert handle.transport.closed and not handle.transport.aborted
    loop.run_until(T0 + 10 + LINGER)
    assert not handle.transport.aborted
    loop.run_until(T0 + 10 + SLACK + LINGER)
    assert handle.transport.aborted
    # It left the closing list: nothing more to watch.
    assert loop.armed == []


def test_a_connection_that_goes_within_the_linger_is_not_aborted(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30)
    conn, handle = connect(enforcer)
    loop.run_until(T0 + 10 + SLACK)
    enforcer.connections.remove(conn)  # the server reports the connection lost
    loop.run_until(T0 + 20)
    assert handle.transport.closed and not handle.transport.aborted
    assert loop.armed == []  # the linger's sweep found it gone, and nothing more to watch


# -- the body rate -------------------------------------------------------------


def receiving(enforcer: Enforcer) -> tuple[Connection, MemoryHandle]:
    conn, handle = connect(enforcer)
    enforcer.connections.headers_complete(conn, "POST", "/upload")
    enforcer.connections.body_begin(conn)
    return conn, handle


def test_a_body_behind_the_minimum_rate_is_cut_at_its_deadline(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=60, body_min_rate=100, body_grace=2)
    conn, handle = receiving(enforcer)
    assert loop.armed == [T0 + 2]  # the grace period bounds the sleep
    clock.advance(1)
    conn.body_received += 300  # enough until T0 + 2 + 300 / 100
    loop.run_until(T0 + 5)
    assert (handle.transport.buffer, enforcer.totals.rate_timeouts) == (b"", 0)
    loop.run_until(T0 + 5 + SLACK)
    assert handle.transport.buffer == RESPONSE_408 and enforcer.totals.rate_timeouts == 1
    assert not conn.is_active and not conn.receiving_body


def test_a_body_just_ahead_of_the_rate_is_looked_at_every_resolution(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=60, body_min_rate=100, body_grace=2)
    conn, _ = receiving(enforcer)
    conn.body_received += 5  # due at T0 + 2.05
    loop.run_until(T0 + 2 + SLACK)  # past the grace period: its rate deadline is now known
    assert loop.armed == [pytest.approx(T0 + 2 + SLACK + RATE_RESOLUTION)]


def test_a_body_held_up_by_the_server_gets_a_new_grace(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=60, body_min_rate=100, body_grace=2)
    conn, handle = receiving(enforcer)
    handle.transport.read_paused = True  # the app has not read the body: the server stopped reading
    loop.run_until(T0 + 3)
    assert enforcer.totals.rate_timeouts == 0 and conn.receiving_body
    handle.transport.read_paused = False
    # Its clock started again when it was found behind (T0 + 2 + SLACK).
    loop.run_until(T0 + 4)
    assert enforcer.totals.rate_timeouts == 0
    loop.run_until(T0 + 4.01)
    assert enforcer.totals.rate_timeouts == 1 and handle.transport.buffer == RESPONSE_408


# -- stalled responses -----------------------------------------------------------


def stalled(enforcer: Enforcer, pending: int) -> tuple[Connection, MemoryHandle]:
    """A connection whose response the client stopped taking, ``pending`` bytes unsent."""
    conn, handle = connect(enforcer)
    finish_request(enforcer, conn)
    handle.transport.unsent = pending
    enforcer.connections.stall(conn, pending)
    enforcer.watch()
    return conn, handle


def test_a_stalled_response_is_sampled_and_aborted_without_progress(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30, send_timeout=8)
    conn, handle = stalled(enforcer, 1000)
    # Sampled every send_timeout / 4 from the stall on, also when armed later than the stall.
    assert loop.armed == [T0 + 2]
    clock.advance(1)
    enforcer.cancel()
    enforcer.watch()
    assert loop.armed == [T0 + 2]
    assert loop.run_until(T0 + 5) == 2
    handle.transport.unsent = 500  # progress: the client took some, the clock restarts at the next sample
    loop.run_until(T0 + 13.9)
    assert conn.is_stalled and not handle.transport.aborted
    # No progress since the sample at T0 + 6: aborted at the sample 8 s later, with no 408.
    loop.run_until(T0 + 14)
    assert handle.transport.aborted and handle.transport.buffer == b""
    assert enforcer.totals.send_timeouts == 1 and not conn.is_stalled


def test_a_stall_that_ends_is_not_cut(clock: FakeClock, loop: MockLoop) -> None:
    enforcer = make(clock, loop, headers_timeout=10, request_timeout=30, send_timeout=8)
    conn, handle = stalled(enforcer, 1000)
    loop.run_until(T0 + 4)
    enforcer.connections.unstall(conn)  # the client takes the response again
    loop.run_until(T0 + 40)
    assert not handle.transport.aborted and enforcer.totals.send_timeouts == 0
    assert loop.armed == []


# -- the log summary and the callback ---------------------------------------------


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_pending_summary_keeps_the_timer_until_it_is_written(
    clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    enforcer = make(clock, loop, headers_timeout=3, request_timeout=6)
    first, _ = connect(enforcer)
    loop.run_until(T0 + 3 + SLACK)
    assert warnings(caplog) == ["connlist: 1 connection timed out (1 headers); e.g. 127.0.0.1:5000"]
    enforcer.connections.remove(first)
    loop.run_until(T0 + 5)
    assert loop.armed == []  # nothing left to watch
    # A second timeout within the interval waits for the next summary ...
    second, _ = connect(enforcer)
    loop.run_until(T0 + 8 + SLACK)
    enforcer.connections.remove(second)
    # ... which keeps the timer armed with nothing else due, and is written on time.
    due = T0 + 3 + SLACK + SUMMARY_INTERVAL
    loop.run_until(due - 0.01)
    assert len(warnings(caplog)) == 1 and loop.armed == [pytest.approx(due)]
    loop.run_until(due)
    assert warnings(caplog)[1:] == ["connlist: 1 connection timed out (1 headers); e.g. 127.0.0.1:5000"]
    assert loop.armed == []


def test_a_failing_callback_is_logged_once_then_counted(
    clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    calls: list[str] = []

    def on_timeout(conn: Connection, kind: str) -> None:
        calls.append(kind)
        raise RuntimeError("boom")

    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2)
    enforcer.on_timeout = on_timeout
    handles = [connect(enforcer)[1] for _ in range(3)]
    loop.run_until(T0 + 1 + SLACK)
    # Every connection is closed anyway; one traceback, the other failures in the summary.
    assert calls == ["headers"] * 3
    assert all(h.transport.buffer == RESPONSE_408 for h in handles)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert warnings(caplog)[-1].endswith("; on_timeout raised 2 times")


def test_a_record_handed_to_the_callback_keeps_its_request_once_the_connection_is_gone(
    clock: FakeClock, loop: MockLoop
) -> None:
    kept: list[Connection] = []
    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2)
    enforcer.on_timeout = lambda conn, kind: kept.append(conn)
    conn, handle = connect(enforcer)
    handle.request = ("POST", "/upload")
    enforcer.connections.message_begin(conn)
    loop.run_until(T0 + 1 + SLACK)
    # The server reports the connection lost, and lets go of the record (connlist.servers.seam).
    enforcer.connections.remove(conn)
    conn.handle = None
    assert kept == [conn] and (conn.method, conn.path) == ("POST", "/upload")
    # One that no callback holds stores nothing: it asks its handle while it has one.
    other, other_handle = connect(enforcer)
    other_handle.request = ("GET", "/")
    assert (other.method, other.path) == ("GET", "/")
    enforcer.connections.remove(other)
    other.handle = None
    assert (other.method, other.path) == (None, None)


def test_a_slow_callback_is_warned_about_once(
    clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")

    def on_timeout(conn: Connection, kind: str) -> None:
        clock.advance(SLOW_CALLBACK * 2)

    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2)
    enforcer.on_timeout = on_timeout
    for _ in range(2):
        connect(enforcer)
    loop.run_until(T0 + 1 + SLACK)
    slow = [message for message in warnings(caplog) if "on_timeout took" in message]
    assert len(slow) == 1
    assert slow[0].startswith(f"connlist: on_timeout took {SLOW_CALLBACK * 2000:.0f} ms; ")


def test_a_record_without_a_handle_is_counted_and_nothing_is_closed(clock: FakeClock, loop: MockLoop) -> None:
    # (ASGI-only mode's records have no handle on some paths: nothing to close them through.)
    enforcer = make(clock, loop, headers_timeout=1, request_timeout=2, send_timeout=4)
    lst = enforcer.connections
    waiting = lst.connect()
    stalling = lst.connect()
    lst.headers_complete(stalling, "GET", "/")
    lst.message_complete(stalling)
    lst.stall(stalling, 100)
    lingering = lst.connect()
    lst.headers_complete(lingering, "GET", "/")
    lst.message_complete(lingering)
    lst.linger(lingering)
    enforcer.watch()
    loop.run_until(T0 + 5)
    assert (enforcer.totals.headers_timeouts, enforcer.totals.send_timeouts) == (1, 1)
    assert not waiting.is_active and not stalling.is_stalled
    # Once the second timeout's summary is written, nothing is left to watch:
    # the linger ended, with nothing to abort.
    loop.run_until(T0 + 12)
    assert loop.armed == []


def test_every_timeout_kind_has_its_total() -> None:
    # Each row of the kinds' tables names its Totals field; the views and the metrics list the rows.
    names = {field.name for field in dataclasses.fields(Totals)}
    assert [kind.name for kind in TIMEOUT_KINDS] == list(typing.get_args(TimeoutKind))
    assert {kind.name for kind in TIMEOUT_KINDS} == {"headers", "request", "rate", "send", "keepalive"}
    assert set(typing.get_args(RoomKind)) == {kind.name for kind in ROOM_KINDS}
    for kind in (*TIMEOUT_KINDS, *ROOM_KINDS, UPGRADE_REFUSED, HEADER_OVERFLOW):
        assert kind.counter in names, kind
    assert {
        kind.counter for kind in (*TIMEOUT_KINDS, *ROOM_KINDS, UPGRADE_REFUSED, HEADER_OVERFLOW)
    } == names - {
        "connections",
        "requests",
        "accept_failures",
        "upgrades",
    }


def test_attach_learns_the_keep_alive_on_a_loop_without_exception_handlers() -> None:
    # uvicorn's own protocol tests drive the protocols on a MockLoop with only what they use:
    # no accept() to watch there, and nothing to fail.
    class BareLoop:
        pass

    enforcer = Enforcer()
    loop = typing.cast(asyncio.AbstractEventLoop, BareLoop())
    enforcer.attach(loop, 7)
    assert enforcer.keep_alive == 7.0 and enforcer.attached_loop is loop


def test_a_sweep_carrying_on_runs_the_steps_left_and_all_of_them_once_a_while_has_passed(
    clock: FakeClock, loop: MockLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    from connlist.core import enforcer as enforcer_module
    from connlist.core.sweep import Step
    from connlist.core.timer import CARRY_ON_WHOLE

    ran: list[str] = []
    # What each step says at its next run: finished (True), or not (False).
    answers: dict[str, list[bool]] = {"limited": [], "slow": [], "quick": []}

    def step(name: str, spends: float = 0.0) -> Step:
        def run(_enforcer: object, _now: float, _stop: float) -> bool:
            ran.append(name)
            clock.advance(spends)
            return answers[name].pop(0) if answers[name] else True

        return Step(run, lambda _enforcer, _now: None)

    monkeypatch.setattr(enforcer_module, "STEPS", (step("limited"), step("slow"), step("quick")))
    enforcer = make(clock, loop)

    # A step stopped at its own limit: the others still ran, in order.
    answers["limited"] = [False, False, False]
    assert not enforcer._work(0.0, False)
    assert ran == ["limited", "slow", "quick"]
    # Carrying on: only the step left.
    ran.clear()
    assert not enforcer._work(0.0, True)
    assert ran == ["limited"]
    # Once CARRY_ON_WHOLE has passed since the last whole sweep, every step again.
    ran.clear()
    clock.advance(CARRY_ON_WHOLE)
    assert not enforcer._work(0.0, True)
    assert ran == ["limited", "slow", "quick"]
    # A sweep not carrying on (the timer fired) is whole, whatever was left.
    ran.clear()
    assert enforcer._work(0.0, False)
    assert ran == ["limited", "slow", "quick"]

    # Out of the sweep's time: the steps not run yet are left too, and run next.
    ran.clear()
    answers["limited"] = [False]
    monkeypatch.setattr(
        enforcer_module, "STEPS", (step("limited", spends=SWEEP_TIME * 2), step("slow"), step("quick"))
    )
    clock.advance(CARRY_ON_WHOLE)
    assert not enforcer._work(0.0, False)
    assert ran == ["limited"]
    ran.clear()
    assert enforcer._work(0.0, True)
    assert ran == ["limited", "slow", "quick"]
