"""The keep-alive timeout the list times, on a fake clock and loop: when each idle connection is closed.

What ``connlist.servers.uvicorn.keepalive`` does at the end of a response that
leaves a connection idle is ``responded`` below; the rest is the enforcer's
(the idle heap, the sweep's ``keepalive`` step, ``wake_by``).  uvicorn's own
tests (scripts/uvicorn-protocol-tests) and tests/test_keepalive.py drive
the real protocols.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, rule

from connlist.core.budget import idle_oldest
from connlist.core.connections import Connection, ConnectionsList
from connlist.core.enforcer import PRESSURE_FLOOR, Enforcer
from connlist.core.kinds import resolve
from connlist.core.sweep import KEEPALIVE_BATCH, KEEPALIVE_PER_SWEEP, SLACK, idle_expired
from connlist.core.timer import CARRY_ON_WHOLE, CARRY_PACE
from tests.fakes import T0, FakeClock, LingeringHandle, MockLoop
from tests.test_budget_policy import arrive

KEEP_ALIVE = 5.0


@pytest.fixture
def enforcer(clock: FakeClock, loop: MockLoop) -> Enforcer:
    enforcer = Enforcer(resolve(), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = KEEP_ALIVE
    enforcer.keep_alive_timed = True
    return enforcer


def first_request(enforcer: Enforcer, conn: Connection) -> None:
    """A whole request on a new connection (the server layer's slow path), its response begun."""
    connections = enforcer.connections
    connections.message_begin(conn)
    connections.headers_complete(conn, "GET", "/")
    connections.message_complete(conn)


def responded(enforcer: Enforcer, conn: Connection) -> None:
    """The end of a response that leaves ``conn`` idle, as connlist.servers.uvicorn.keepalive writes it."""
    enforcer.connections.response_complete(conn)
    conn.responded_at = idle_at = enforcer.clock()
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


def test_a_mass_close_goes_in_batches_never_early_and_at_most_a_batch_late(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    # 200 connections gone idle 1 ms apart: 200 deadlines within 0.2 s.
    conns = [arrive(enforcer) for _ in range(200)]
    idle_at = {}
    for conn, handle in conns:
        first_request(enforcer, conn)
        clock.advance(0.001)
        responded(enforcer, conn)
        idle_at[handle] = clock.now
    closed_at = {}
    iterations = 0
    while len(closed_at) < len(conns):
        # The timer, or the sweep carrying on CARRY_PACE later (KEEPALIVE_PER_SWEEP).
        assert not loop.queued
        iterations += loop.run_until(min(loop.armed))
        closed_at.update({h: clock.now for _, h in conns if h.closed_keepalive and h not in closed_at})
    first = min(idle_at.values())
    late = [closed_at[h] - (idle_at[h] + KEEP_ALIVE) for _, h in conns]
    assert min(late) >= 0  # never early
    assert closed_at[conns[0][1]] == first + KEEP_ALIVE  # the first, exactly at its time
    assert max(late) <= KEEPALIVE_BATCH + 1e-9
    # About one sweep per batch (and one per KEEPALIVE_PER_SWEEP of it), not one per connection.
    assert iterations <= len(conns) / KEEPALIVE_PER_SWEEP + 0.2 / KEEPALIVE_BATCH + 2, iterations
    assert iterations < len(conns) / 2, iterations


def test_a_mass_close_takes_a_batch_a_millisecond_and_holds_other_timeouts_back_at_most_a_while(
    clock: FakeClock, loop: MockLoop
) -> None:
    enforcer = Enforcer(resolve(headers_timeout=KEEP_ALIVE), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = KEEP_ALIVE
    enforcer.keep_alive_timed = True
    # Connections gone idle at one instant, all due at once; and a silent client
    # whose headers deadline comes with them.
    n = 3 * KEEPALIVE_PER_SWEEP + 4
    _, silent_handle = arrive(enforcer)
    conns = [arrive(enforcer) for _ in range(n)]
    for conn, _ in conns:
        first_request(enforcer, conn)
        responded(enforcer, conn)
    loop.run_until(T0 + KEEP_ALIVE)

    def closed() -> int:
        return sum(handle.closed_keepalive for _, handle in conns)

    # One batch (at the keep-alive time, exactly), then the next CARRY_PACE
    # later, no timer of the enforcer's own meanwhile.
    assert closed() == KEEPALIVE_PER_SWEEP
    assert (loop.queued, loop.armed, enforcer.timer_at) == (0, [clock.now + CARRY_PACE], math.inf)
    assert not silent_handle.transport.buffer  # not yet past its deadline (Node's rule is strict)

    def carry_on() -> None:
        # The iterations before it (the closed connections' losses, other clients) close nothing.
        loop.run_soon()
        assert closed() == before
        assert loop.run_until(loop.armed[0]) == 1

    # Carrying on, a sweep runs the step that did not finish, the keep-alive's ...
    before = closed()
    carry_on()
    assert closed() == 2 * KEEPALIVE_PER_SWEEP
    assert not silent_handle.transport.buffer
    # ... and every step once CARRY_ON_WHOLE has passed since the last whole
    # sweep: the headers timeout did not wait for the end of the mass close.
    clock.advance(CARRY_ON_WHOLE)
    before = closed()
    carry_on()
    assert closed() == 3 * KEEPALIVE_PER_SWEEP
    assert silent_handle.transport.buffer.startswith(b"HTTP/1.1 408 ")
    before = closed()
    carry_on()
    assert closed() == n and enforcer.totals.keepalive_timeouts == n
    assert loop.queued == 0


def test_a_connection_that_fails_to_close_leaves_the_others_of_its_batch_closed(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    conns = [arrive(enforcer) for _ in range(3)]
    for conn, _ in conns:
        first_request(enforcer, conn)
        responded(enforcer, conn)

    def broken() -> None:
        raise OSError("the transport is gone")

    conns[1][1].connlist_close_keepalive = broken  # type: ignore[method-assign]
    loop.run_until(clock.now + KEEP_ALIVE)
    assert [handle.closed_keepalive for _, handle in conns] == [True, False, True]
    assert enforcer.totals.keepalive_timeouts == 3
    assert "closing a connection failed" in caplog.text and "the transport is gone" in caplog.text


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


def test_a_connection_that_arrives_while_the_keep_alive_is_awaited_is_timed(
    clock: FakeClock, loop: MockLoop
) -> None:
    # The timer a response arms for the keep-alive (5 s) is never armed further
    # away than the shortest timeout (1 s), so a silent client that connects
    # meanwhile, which arms nothing while a timer is armed, gets its 408 on time.
    enforcer = Enforcer(resolve(headers_timeout=1, request_timeout=2), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = KEEP_ALIVE
    enforcer.keep_alive_timed = True
    conn, handle = arrive(enforcer)
    enforcer.connections.message(conn)
    loop.run_until(clock.now + 1)  # the connect's timer: nothing due
    assert loop.armed == []
    responded(enforcer, conn)
    assert loop.armed == [clock.now + 1]
    connected = clock.now + 0.5
    loop.run_until(connected)
    _, silent_handle = arrive(enforcer)
    assert len(loop.armed) == 1  # it armed nothing of its own
    loop.run_until(connected + 1)
    assert silent_handle.transport.buffer == b""
    loop.run_until(connected + 1 + SLACK)  # more than the headers timeout ago: Node's rule
    assert silent_handle.transport.buffer.startswith(b"HTTP/1.1 408 ")
    assert not handle.transport.closed  # the idle one waits for its keep-alive time
    loop.run_until(connected - 0.5 + KEEP_ALIVE)
    assert handle.closed_keepalive


def test_without_the_list_timing_it_idle_connections_are_left_to_the_server(
    enforcer: Enforcer, clock: FakeClock, loop: MockLoop
) -> None:
    enforcer.keep_alive_timed = False
    conn, handle = arrive(enforcer)
    first_request(enforcer, conn)
    enforcer.connections.response_complete(conn)
    loop.run_until(clock.now + 60)
    assert not handle.transport.closed and enforcer.totals.keepalive_timeouts == 0
    # The timer its connect armed found nothing to watch, and armed none.
    assert enforcer.timer_at == math.inf and loop.armed == []


def test_under_pressure_the_same_rule_closes_sooner_and_says_so(
    clock: FakeClock, loop: MockLoop, caplog: pytest.LogCaptureFixture
) -> None:
    total = KEEPALIVE_PER_SWEEP + 4
    enforcer = Enforcer(resolve(max_connections=total), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = 30.0
    enforcer.keep_alive_timed = True
    conns = [arrive(enforcer) for _ in range(total)]
    for conn, _ in conns:
        first_request(enforcer, conn)
        responded(enforcer, conn)
    assert enforcer.pressed
    since = clock.now
    while not conns[0][1].transport.closed and clock.now < since + PRESSURE_FLOOR + 0.3:
        loop.run_until(min(loop.armed))
    # As many as a sweep takes (KEEPALIVE_PER_SWEEP), which relieves the
    # pressure: when it carries on (CARRY_PACE later), the rest keep their keep-alive.
    n = KEEPALIVE_PER_SWEEP
    assert [handle.transport.closed for _, handle in conns] == [True] * n + [False] * (len(conns) - n)
    loop.run_soon()
    assert enforcer.pressed
    assert loop.run_until(clock.now + CARRY_PACE) == 1
    assert not enforcer.pressed and enforcer.idle_time_now == enforcer.keep_alive
    assert sum(handle.transport.closed for _, handle in conns) == n
    # Counted as keep-alive closes, each let go (out of the budget) and in the log summary.
    assert enforcer.totals.keepalive_timeouts == n and enforcer.connections.occupied == len(conns) - n
    assert not any(handle.closed_keepalive for _, handle in conns)  # closed as the budget closes
    assert f"{n} connections timed out ({n} keepalive)" in caplog.text


def test_a_mass_close_that_begins_under_pressure_keeps_one_timer_and_a_finite_now(
    clock: FakeClock, loop: MockLoop
) -> None:
    # The budget's closes linger, as the server's do, and bring the timer
    # forward from within the sweep; the pressure ends after one sweep, and
    # the rest are past their whole keep-alive: the sweep carries on.  Each
    # connection is closed once, no sooner than its rule allows, with one
    # timer or one carry armed at a time, and the sweep's now always finite.
    total = 3 * KEEPALIVE_PER_SWEEP
    enforcer = Enforcer(resolve(max_connections=total), clock=clock, loop=loop)  # type: ignore[arg-type]
    enforcer.keep_alive = 30.0
    enforcer.keep_alive_timed = True
    handles = []
    for _ in range(total):
        handle = LingeringHandle(enforcer, clock)
        conn = handle.record = enforcer.join(("127.0.0.1", 5000), handle=handle)
        first_request(enforcer, conn)
        responded(enforcer, conn)
        handles.append(handle)
    assert enforcer.pressed
    floors: list[float] = []
    work = enforcer._work

    def recorded(floor: float = 0.0, carrying: bool = False) -> bool:
        floors.append(floor)
        return work(floor, carrying)

    enforcer._work = recorded  # type: ignore[method-assign]
    clock.advance(enforcer.keep_alive + 1)  # the loop was held up: every one is past its keep-alive
    while loop.armed and len(floors) < 100:
        assert len(loop.armed) == 1
        loop.run_until(loop.armed[0])
        loop.run_soon()
    assert all(handle.transport.closed for handle in handles)
    assert enforcer.totals.keepalive_timeouts == total
    assert floors and all(math.isfinite(floor) for floor in floors)
    assert enforcer.totals.idle_evictions == 0 and not enforcer.pressed


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


# -- the idle heap against a model ------------------------------------------------------


@dataclass
class IdleModel:
    # A message open (its first byte came, it is not all in), a response unfinished, gone.
    open: bool = True
    responding: bool = False
    removed: bool = False
    # When its idle time began, and whether the list knows it exactly (a
    # response ended after its message did); None while it is not idle.
    idle_start: float | None = None
    exact: bool = False


class IdleHeapMachine(RuleBasedStateMachine):
    """The keep-alive walk (``idle_expired``) after any events: never early, and exact where it can be."""

    conns = Bundle("conns")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.lst = ConnectionsList(self.clock)
        self.model: dict[Connection, IdleModel] = {}

    @initialize(target=conns)
    def connections(self) -> object:
        # Three, made once: the rules then act on them (a close is the sweep's).
        made = [self.lst.connect() for _ in range(3)]
        for conn in made:
            self.model[conn] = IdleModel()
        return multiple(*made)

    @rule(conn=conns)
    def whole_request(self, conn: Connection) -> None:
        # In one read, to the app (the fast path on an idle connection).
        self.lst.message(conn)
        m = self.model[conn]
        if not m.removed:
            m.open, m.responding, m.idle_start, m.exact = False, True, None, False

    @rule(conn=conns)
    def first_bytes(self, conn: Connection) -> None:
        self.lst.message_begin(conn)
        m = self.model[conn]
        if not m.removed:
            m.open, m.idle_start, m.exact = True, None, False

    @rule(conn=conns, answered_first=st.booleans())
    def rest_of_request(self, conn: Connection, answered_first: bool) -> None:
        # The rest of an open request; its app may have answered before its body was in.
        m = self.model[conn]
        if m.removed or not m.open:
            return
        self.lst.headers_complete(conn, None if answered_first else "GET", "/")
        if answered_first:
            self.lst.response_complete(conn)  # every response so far ended, the body not yet in
        self.lst.message_complete(conn)
        m.open = False
        if answered_first:
            m.responding, m.idle_start, m.exact = False, self.clock.now, False
        else:
            m.responding = True

    @rule(conn=conns)
    def response_end(self, conn: Connection) -> None:
        m = self.model[conn]
        if m.removed or not m.responding:
            return
        self.lst.response_complete(conn)
        m.responding = False
        if not m.open:
            m.idle_start, m.exact = self.clock.now, True

    @rule(seconds=st.sampled_from([0.5, 1.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(idle_time=st.sampled_from([0.5, 1.0, 2.0]))
    def sweep(self, idle_time: float) -> None:
        now = self.clock.now
        due = idle_expired(self.lst, idle_time, now, 1000)
        for conn in due:
            m = self.model[conn]
            # Never a record that is not idle, or idle for less.
            assert m.idle_start is not None and not m.responding, m
            assert m.idle_start + idle_time <= now, (m, now)
            m.idle_start = None  # closed: the model forgets it
            m.removed = True
            self.lst.remove(conn)
        # Exact: every record whose idle time the list knows is found when due.
        for m in self.model.values():
            if not m.removed and m.exact and m.idle_start is not None:
                assert m.idle_start + idle_time > now, (m, now)

    @invariant()
    def every_idle_record_is_in_the_heap(self) -> None:
        # Idle after a request: in the heap (the sweep takes out only what is not idle).
        heap = self.lst.idle_queue
        for conn, m in self.model.items():
            if not m.removed and not m.open and not m.responding and m.idle_start is not None:
                assert conn in heap, m


IdleHeapMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, derandomize=True, deadline=None, database=None
)
TestIdleHeap = IdleHeapMachine.TestCase


# -- the loop uvicorn's protocols are given (connlist.servers.uvicorn.keepalive) ------------


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_stand_in_loop_arms_nothing_for_the_keep_alive_and_is_the_loop_otherwise(loop_kind: str) -> None:
    import asyncio

    from connlist.servers.uvicorn.keepalive import TIMED_BY_LIST, for_loop

    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()

    class Protocol:
        def timeout_keep_alive_handler(self) -> None:
            pass

        def other(self) -> None:
            pass

    try:
        stand_in = for_loop(loop)
        # uvicorn's keep-alive: nothing armed on the loop.
        assert stand_in.call_later(5, Protocol().timeout_keep_alive_handler) is TIMED_BY_LIST
        # Any other call_later, and a zero delay (an immediate close), is the loop's.
        for delay, callback in ((5, Protocol().other), (0, Protocol().timeout_keep_alive_handler)):
            handle = stand_in.call_later(delay, callback)
            assert handle is not TIMED_BY_LIST and "Handle" in type(handle).__name__  # the loop's own
            handle.cancel()
        # The rest of the event loop's API is the loop's own.
        assert stand_in.create_task.__self__ is loop
        assert stand_in.call_soon.__self__ is loop and stand_in.create_future.__self__ is loop
        assert stand_in.time() <= loop.time() and not stand_in.is_closed()
        assert "__getattr__" not in vars(type(stand_in))  # (each read is the loop's, in C: see its docstring)
        with pytest.raises(AttributeError):
            stand_in._ready  # noqa: B018  # a loop's private parts are not its API
    finally:
        loop.close()
    assert stand_in.is_closed()


def test_the_stand_in_for_a_test_loop_gives_it_everything() -> None:
    # uvicorn's own tests (tests/protocols/test_http.py) give the protocol a MockLoop,
    # and call its own methods through the protocol's loop.
    from connlist.servers.uvicorn.keepalive import for_loop

    class MockLoop:
        def __init__(self) -> None:
            self._tasks: list[object] = []

        def create_task(self, coroutine: object) -> object:
            self._tasks.append(coroutine)
            return coroutine

        def run_one(self) -> object:
            return self._tasks.pop()

    loop = MockLoop()
    stand_in = for_loop(loop)
    assert stand_in.create_task("request") == "request"
    assert stand_in.run_one() == "request" and stand_in._tasks == []  # type: ignore[attr-defined]
