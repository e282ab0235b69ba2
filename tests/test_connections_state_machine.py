"""Random interleavings of ConnectionsList events against a plain Python model.

The model keeps the connection order and the active order in lists and the
fields of each connection in a dict, and states the rules the way the module
docstring does ("started more than ``timeout`` ago").  Times are multiples of
1/4 s from 1000.0 and timeouts are integers, so every sum and difference is
exact and the model's ``now - start > timeout`` and the list's
``start < now - timeout`` mean the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import coverage
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from connlist.core.connections import PHASES, STATES, Connection, ConnectionsList, connection_state
from connlist.core.sweep import idle_expired, lingered, rate_expired, stall_sample, stalled_due
from tests.fakes import FakeClock


@pytest.fixture(autouse=True)
def _unmeasured() -> Iterator[None]:
    """The machine runs unmeasured by coverage.py (scripts/test), which would make it twice as slow.

    Its tens of thousands of steps run the lines tests/test_connections.py
    covers, one by one (without this machine connections.py stays at 99%):
    measuring them again costs CI 20 seconds and adds nothing.
    """
    measuring = coverage.Coverage.current()
    if measuring is None:
        yield
        return
    measuring.stop()
    try:
        yield
    finally:
        measuring.start()


TIMEOUTS = st.sampled_from([0, 1, 2, 3, 5, 8])
ADVANCES = st.sampled_from([0.0, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 9.0])
# Pairs checked with next_deadline() after every step (swapped, headers only, request only,
# far apart); the next_deadline rule draws any pair.
DEADLINE_PAIRS = [(5, 2), (3, 0), (0, 3), (1, 8)]


# Minimum body rates (powers of two, so that bytes / rate is exact) and graces.
RATES = st.sampled_from([1, 2, 4])
GRACES = st.sampled_from([1, 2, 3])
BYTES = st.sampled_from([0, 1, 2, 4, 8])
PENDING = st.sampled_from([0, 10, 100, 1000])


@dataclass
class Model:
    start: float
    headers_completed: bool = False
    requests: int = 0
    removed: bool = False
    # Left HTTP (``upgrade``): out of the ring, in ``upgraded`` until removed.
    upgraded: bool = False
    # Closed to make room (``evict``): no longer counted in ``occupied``, in the ring until removed.
    evicted: bool = False
    responding: bool = False
    begun: bool = False
    body_started: float = 0.0
    body_received: int = 0
    out_since: float = 0.0
    out_sampled: float = 0.0
    out_pending: int = 0
    # When it last became idle (between messages, not responding), or None while it is not.
    idle_start: float | None = None


def effective(headers_timeout: float, request_timeout: float) -> tuple[float, float]:
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        return request_timeout, headers_timeout
    return headers_timeout, request_timeout


class ConnectionsListMachine(RuleBasedStateMachine):
    conns = Bundle("conns")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.lst = ConnectionsList(clock=self.clock)
        self.model: dict[Connection, Model] = {}
        self.all_order: list[Connection] = []
        self.active_order: list[Connection] = []
        self.body_order: list[Connection] = []
        self.stalled_order: list[Connection] = []
        self.closing_order: list[Connection] = []
        self.upgraded_order: list[Connection] = []
        # The records in the idle heap (its order is the heap's own).
        self.idle_heap: set[Connection] = set()

    # -- the model's own rules ---------------------------------------------------

    def deadlines(self, conn: Connection, headers_timeout: float, request_timeout: float) -> list[float]:
        m = self.model[conn]
        out = []
        if headers_timeout and not m.headers_completed:
            out.append(m.start + headers_timeout)
        if request_timeout:
            out.append(m.start + request_timeout)
        return out

    def is_expired(self, conn: Connection, headers_timeout: float, request_timeout: float) -> bool:
        m = self.model[conn]
        age = self.clock.now - m.start
        return bool(
            (request_timeout and age > request_timeout)
            or (headers_timeout and not m.headers_completed and age > headers_timeout)
        )

    # -- rules ---------------------------------------------------------------------

    @initialize(target=conns)
    def first_connection(self) -> Connection:
        # So that the rules taking a connection are always enabled.
        return self.connect()

    @rule(target=conns)
    def connect(self) -> Connection:
        conn = self.lst.connect()
        self.model[conn] = Model(start=self.clock.now)
        self.all_order.append(conn)
        self.active_order.append(conn)
        return conn

    @rule(conn=conns)
    def message_begin(self, conn: Connection) -> None:
        self.lst.message_begin(conn)
        m = self.model[conn]
        if m.removed or m.upgraded:
            return
        if conn in self.active_order:
            self.active_order.remove(conn)
        self.active_order.append(conn)
        m.start = self.clock.now
        m.headers_completed = False
        m.begun = True
        m.idle_start = None
        self.discard(self.body_order, conn)

    @rule(conn=conns)
    def headers_complete(self, conn: Connection) -> None:
        self.lst.headers_complete(conn)
        self.model[conn].headers_completed = True

    @rule(conn=conns)
    def message_complete(self, conn: Connection) -> None:
        self.lst.message_complete(conn)
        m = self.model[conn]
        if m.removed or m.upgraded:
            return
        if conn in self.active_order:
            self.active_order.remove(conn)
        if m.start != 0.0:  # a request was open: it now counts as received
            m.requests += 1
            if not m.responding:  # its response ended first: idle now (else at response_complete)
                self.idle_heap.add(conn)
            m.idle_start = None if m.responding else self.clock.now
        m.start = 0.0
        self.discard(self.body_order, conn)

    @rule(conn=conns)
    def remove(self, conn: Connection) -> None:
        self.lst.remove(conn)
        m = self.model[conn]
        if m.removed:
            return
        m.removed = True
        if m.upgraded:
            m.upgraded = False
            self.upgraded_order.remove(conn)
            return
        self.leave_http(conn)

    def leave_http(self, conn: Connection) -> None:
        # Out of the ring and every HTTP list (remove, upgrade).
        m = self.model[conn]
        m.responding = False
        m.idle_start = None
        self.idle_heap.discard(conn)
        self.all_order.remove(conn)
        for order in (self.active_order, self.body_order, self.stalled_order, self.closing_order):
            self.discard(order, conn)

    @rule(conn=conns)
    def evict(self, conn: Connection) -> None:
        # Closed to make room: out of the budget's count, and timed out (``time_out``) until removed.
        self.lst.evict(conn)
        m = self.model[conn]
        if m.removed or m.upgraded or m.evicted:
            return
        m.evicted = True
        self.idle_heap.discard(conn)
        if conn in self.active_order:
            self.active_order.remove(conn)
            self.discard(self.body_order, conn)
        elif m.start == 0.0:
            m.start = self.clock.now
        m.idle_start = None

    @rule(conn=conns)
    def upgrade(self, conn: Connection) -> None:
        # A websocket: held in ``upgraded``, stamped now, until removed; no HTTP event moves it.
        self.lst.upgrade(conn, "GET", "/ws")
        m = self.model[conn]
        if m.removed or m.upgraded or m.evicted:
            return
        self.leave_http(conn)
        m.upgraded = True
        m.headers_completed = True
        m.start = m.out_since = self.clock.now
        self.upgraded_order.append(conn)

    @rule(conn=conns)
    def response_begin(self, conn: Connection) -> None:
        self.lst.response_begin(conn)
        m = self.model[conn]
        if not m.removed and not m.upgraded:
            m.responding = True
            m.idle_start = None

    @rule(conn=conns)
    def response_complete(self, conn: Connection) -> None:
        self.lst.response_complete(conn)
        m = self.model[conn]
        if m.start == 0.0 and not m.removed:
            self.idle_heap.add(conn)  # idle and no response unfinished: queued, if it was not
            if m.responding:
                m.idle_start = self.clock.now
        m.responding = False

    @rule(headers_timeout=TIMEOUTS, request_timeout=TIMEOUTS)
    def expired(self, headers_timeout: int, request_timeout: int) -> None:
        h, r = effective(headers_timeout, request_timeout)
        expected = [c for c in self.active_order if self.is_expired(c, h, r)]
        assert self.lst.expired(headers_timeout, request_timeout) == expected
        self.active_order = [c for c in self.active_order if c not in expected]
        self.body_order = [c for c in self.body_order if c not in expected]
        # Reported once: an immediate second call finds nothing.
        assert self.lst.expired(headers_timeout, request_timeout) == []

    @rule(conn=conns)
    def message(self, conn: Connection) -> None:
        # A whole request at one instant, given to the app (the server layer's common case).
        self.lst.message(conn)
        m = self.model[conn]
        if m.removed or m.upgraded:
            m.headers_completed = True  # as headers_complete does on a removed record
            return
        if m.start != 0.0:
            # New (active, no byte yet): it leaves active, and joins the idle
            # queue when its response ends.  Else the four events, in order.
            one_by_one = conn not in self.active_order or m.begun or m.headers_completed
            self.discard(self.active_order, conn)
            self.discard(self.body_order, conn)
            m.begun = True
            if one_by_one and not m.responding:
                self.idle_heap.add(conn)
        m.start = 0.0
        m.headers_completed = True
        m.requests += 1
        m.responding = True
        m.idle_start = None

    @rule(idle_time=st.sampled_from([0.25, 0.5, 1, 2]), limit=st.sampled_from([1, 100]))
    def idle_expired(self, idle_time: float, limit: int) -> None:
        # The keep-alive sweep's walk: never a record that is not idle, or idle for less.
        before = set(self.lst.idle_queue)
        now = self.clock.now
        due = idle_expired(self.lst, idle_time, now, limit)
        assert len(due) <= limit and len(set(due)) == len(due)
        for conn in due:
            m = self.model[conn]
            assert conn in before and not m.removed and m.start == 0.0 and not m.responding and not m.evicted
            assert conn not in self.stalled_order and conn not in self.closing_order
            assert m.idle_start is not None and m.idle_start + idle_time <= now, (m.idle_start, now)
        after = set(self.lst.idle_queue)
        assert after <= before and after.isdisjoint(due)
        # The others it took out were no longer idle (they join again at message_complete), or
        # were on their way out (evicted, closing).
        for conn in before - after - set(due):
            assert self.model[conn].start != 0.0 or self.model[conn].evicted or conn in self.closing_order
        self.idle_heap = after

    @staticmethod
    def discard(order: list[Connection], conn: Connection) -> None:
        if conn in order:
            order.remove(conn)

    # -- the body, stalled and closing lists ------------------------------------------

    @rule(conn=conns)
    def body_begin(self, conn: Connection) -> None:
        self.lst.body_begin(conn)
        m = self.model[conn]
        if conn in self.active_order and m.headers_completed and conn not in self.body_order:
            self.body_order.append(conn)
            m.body_started = self.clock.now
            m.body_received = 0

    @rule(conn=conns, nbytes=BYTES)
    def body_bytes(self, conn: Connection, nbytes: int) -> None:
        conn.body_received += nbytes  # the feeder's own write (ConnectionsList, "the feeder's own writes")
        self.model[conn].body_received += nbytes

    @rule(rate=RATES, grace=GRACES)
    def rate_expired(self, rate: int, grace: int) -> None:
        now = self.clock.now
        expected: list[Connection] = []
        kept: list[float] = []
        grace_end = None
        for conn in self.body_order:
            m = self.model[conn]
            if now - m.body_started <= grace:  # still in its grace period: the walk stops
                grace_end = m.body_started + grace
                break
            deadline = m.body_started + grace + m.body_received / rate
            if now > deadline:
                expected.append(conn)
            else:
                kept.append(deadline)
        assert rate_expired(self.lst, rate, grace, now) == (expected, min(kept, default=None), grace_end)
        self.body_order = [c for c in self.body_order if c not in expected]
        self.active_order = [c for c in self.active_order if c not in expected]

    @rule(conn=conns, pending=PENDING)
    def stall(self, conn: Connection, pending: int) -> None:
        self.lst.stall(conn, pending)
        m = self.model[conn]
        held = m.removed or m.upgraded
        if not held and conn not in self.stalled_order and conn not in self.closing_order:
            self.stalled_order.append(conn)
            m.out_since = m.out_sampled = self.clock.now
            m.out_pending = pending

    @rule(conn=conns)
    def unstall(self, conn: Connection) -> None:
        self.lst.unstall(conn)
        self.discard(self.stalled_order, conn)

    @rule(interval=st.sampled_from([0.5, 1, 2]), limit=st.sampled_from([1, 2, 100]), data=st.data())
    def sample_stalled(self, interval: float, limit: int, data: st.DataObject) -> None:
        now = self.clock.now
        due = [c for c in self.stalled_order if self.model[c].out_sampled <= now - interval][:limit]
        assert stalled_due(self.lst, interval, now, limit) == due
        for conn in due:
            pending = data.draw(PENDING)
            m = self.model[conn]
            if pending < m.out_pending:
                m.out_since = now
            m.out_pending = pending
            m.out_sampled = now
            self.stalled_order.remove(conn)
            self.stalled_order.append(conn)
            assert stall_sample(self.lst, conn, pending, now) == now - m.out_since

    @rule(conn=conns)
    def linger(self, conn: Connection) -> None:
        self.lst.linger(conn)
        m = self.model[conn]
        if not (m.removed or m.upgraded) and conn not in self.closing_order:
            self.discard(self.stalled_order, conn)
            self.closing_order.append(conn)
            m.out_since = self.clock.now

    @rule(linger=st.sampled_from([0, 1, 2]), limit=st.sampled_from([1, 100]))
    def lingered(self, linger: float, limit: int) -> None:
        now = self.clock.now
        done: list[Connection] = []
        for conn in self.closing_order:
            if self.model[conn].out_since > now - linger or len(done) == limit:
                break
            done.append(conn)
        assert lingered(self.lst, linger, now, limit) == done
        self.closing_order = [c for c in self.closing_order if c not in done]

    @rule(seconds=ADVANCES)
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(headers_timeout=TIMEOUTS, request_timeout=TIMEOUTS)
    def next_deadline(self, headers_timeout: int, request_timeout: int) -> None:
        self.check_next_deadline(headers_timeout, request_timeout)

    def check_next_deadline(self, headers_timeout: int, request_timeout: int) -> None:
        h, r = effective(headers_timeout, request_timeout)
        candidates = [d for c in self.active_order for d in self.deadlines(c, h, r)]
        expected = min(candidates) if candidates else None
        assert self.lst.next_deadline(headers_timeout, request_timeout) == expected

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def views_match_the_model(self) -> None:
        lst = self.lst
        assert lst.all() == self.all_order + self.upgraded_order
        assert lst.active() == self.active_order
        starts = [c.last_message_start for c in lst.active()]
        assert starts == sorted(starts)
        idle = [c for c in self.all_order if self.model[c].start == 0]
        assert lst.idle() == idle
        assert len(lst) == len(self.all_order) + len(self.upgraded_order)
        # Every connection held counts against the budget, websockets too, but those evicted.
        assert lst.occupied == len(lst) - sum(self.model[c].evicted for c in self.all_order)
        assert lst.upgraded_count == len(self.upgraded_order)
        assert lst.active_count == len(self.active_order)
        assert lst.idle_count == len(idle)
        assert lst.timed_out_count == sum(
            self.model[c].start != 0 and c not in self.active_order for c in self.all_order
        )
        assert lst.headers_pending_count == sum(
            not self.model[c].headers_completed for c in self.active_order
        )
        assert lst.idle_responding_count == sum(self.model[c].responding for c in idle)
        assert lst.stalled_count == len(self.stalled_order)
        assert lst.stalled.head_stamp() == (
            self.model[self.stalled_order[0]].out_sampled if self.stalled_order else None
        )
        assert lst.closing.head_stamp() == (
            self.model[self.closing_order[0]].out_since if self.closing_order else None
        )

    def state(self, conn: Connection) -> str:
        """The state, as docs/debug-endpoint.md defines it, from the model alone."""
        m = self.model[conn]
        if m.removed:
            return "closed"
        if m.upgraded:
            return "upgraded"
        if conn in self.active_order:
            if m.headers_completed:
                return "reading_body"
            return "reading_headers" if m.begun else "new"
        if m.start != 0:
            return "timed_out"
        if conn in self.stalled_order:
            return "stalled"
        return "handling" if m.responding else "idle"

    @invariant()
    def states_and_counts_match_the_model(self) -> None:
        states = {conn: self.state(conn) for conn in self.model}
        for conn, state in states.items():
            assert connection_state(conn) == state
        tracked = [state for state in states.values() if state != "closed"]
        assert set(tracked) <= set(STATES)
        phase = {
            "new": "reading",
            "reading_headers": "reading",
            "reading_body": "writing",
            "handling": "writing",
            "idle": "waiting",
            "timed_out": "timed_out",
            "upgraded": "upgraded",
        }
        expected = {name: 0 for name in PHASES}
        for conn, state in states.items():
            if state == "stalled":
                # Not a phase: the phase of what it does otherwise (docs/debug-endpoint.md).
                expected["writing" if self.model[conn].responding else "waiting"] += 1
            elif state != "closed":
                expected[phase[state]] += 1
        counts = self.lst.counts()
        assert {name: counts[name] for name in PHASES} == expected
        assert counts["all"] == len(tracked)
        assert counts["active"] == len(self.active_order)
        assert counts["idle"] == sum(self.model[c].start == 0 for c in self.all_order)
        assert counts["timed_out"] == tracked.count("timed_out")
        assert counts["stalled"] == len(self.stalled_order)
        assert counts["upgraded"] == tracked.count("upgraded") == len(self.upgraded_order)

    @invariant()
    def fields_match_the_model(self) -> None:
        active = set(self.active_order)
        for conn, m in self.model.items():
            assert conn.last_message_start == m.start
            assert conn.headers_completed == m.headers_completed
            assert conn.requests == m.requests
            assert conn.responding == m.responding
            assert conn.tracked == (not m.removed)
            assert conn.is_upgraded == m.upgraded
            assert conn.is_active == (conn in active)
            assert conn.receiving_body == (conn in self.body_order)
            assert conn.is_stalled == (conn in self.stalled_order)
            assert conn.body_received == m.body_received
            if conn in self.body_order:
                # In ``body`` only while a body is being received.
                assert conn.is_active and conn.headers_completed
                assert conn.body_started == m.body_started
            if conn in self.stalled_order:
                assert (conn.out_since, conn.out_sampled, conn.out_pending) == (
                    m.out_since,
                    m.out_sampled,
                    m.out_pending,
                )
            if conn in self.closing_order or m.upgraded:
                assert conn.out_since == m.out_since
            if m.upgraded:
                assert (conn.method, conn.path) == ("GET", "/ws")
                assert not conn.is_active and not conn.receiving_body and not conn.is_stalled
            if m.removed:
                assert not conn.tracked and not conn.is_active
                assert connection_state(conn) == "closed"

    @invariant()
    def lists_match_the_model(self) -> None:
        # Through the views: each list's order, its count, and its stamps in order.
        lst = self.lst
        assert list(lst.iter_all()) == self.all_order + self.upgraded_order
        assert list(lst.iter_active()) == self.active_order
        for order, queue in (
            (self.body_order, lst.body),
            (self.stalled_order, lst.stalled),
            (self.closing_order, lst.closing),
            (self.upgraded_order, lst.upgraded),
        ):
            assert list(queue) == order
            assert list(reversed(queue)) == order[::-1]
            assert len(queue) == len(order)
            stamps = [queue.stamp(c) for c in order]
            assert stamps == sorted(stamps)
        # The idle heap: its records, its count, its smallest key at the top.
        heap = lst.idle_queue
        assert set(heap) == self.idle_heap and len(heap) == len(self.idle_heap)
        keys = [conn.idle_since for conn in self.idle_heap]
        assert heap.head_stamp() == (min(keys) if keys else None)
        # What the list says of a record and what the model says agree.
        for conn in self.model:
            assert conn.receiving_body == (conn in self.body_order)
            assert conn.is_stalled == (conn in self.stalled_order)

    @invariant()
    def next_deadline_is_the_brute_force_minimum(self) -> None:
        for headers_timeout, request_timeout in DEADLINE_PAIRS:
            self.check_next_deadline(headers_timeout, request_timeout)


ConnectionsListMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    derandomize=True,
    deadline=None,
    database=None,
)
TestConnectionsList = ConnectionsListMachine.TestCase
