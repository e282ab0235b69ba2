"""Unit tests for connlist.core.connections, with an injected fake clock.

Every step asserts the whole state of the list (h11-style): the three views,
the three counts, and the fields of every connection involved.
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

import pytest

from connlist.core.budget import body_slowest, headers_oldest, idle_oldest
from connlist.core.checks import check_timeout
from connlist.core.connections import Connection, ConnectionsList, connection_state
from connlist.core.kinds import SEND_STEP, SEND_STEP_LIMIT, Settings, deadline, send_allowance
from connlist.core.sweep import idle_expired, lingered, rate_expired, stall_sample, stalled_due
from tests.fakes import T0, FakeClock


class S(NamedTuple):
    """The observable fields of one connection."""

    start: float
    headers_completed: bool
    requests: int
    tracked: bool
    is_active: bool


def fields(conn: Connection) -> S:
    return S(
        conn.last_message_start,
        conn.headers_completed,
        conn.requests,
        conn.tracked,
        conn.is_active,
    )


# Shorthands for the usual states (start, headers_completed, requests).
def ACTIVE(start: float, headers: bool = False, requests: int = 0) -> S:
    return S(start, headers, requests, True, True)


def IDLE(requests: int, headers: bool = False) -> S:
    return S(0.0, headers, requests, True, False)


def EXPIRED(start: float, headers: bool = False, requests: int = 0) -> S:
    return S(start, headers, requests, True, False)


def REMOVED(start: float, headers: bool = False, requests: int = 0) -> S:
    return S(start, headers, requests, False, False)


def check(
    lst: ConnectionsList,
    *,
    all_: list[Connection],
    active: list[Connection],
    idle: list[Connection],
    states: dict[Connection, S],
) -> None:
    """Assert the whole state of ``lst``."""
    assert lst.all() == all_
    assert list(lst.iter_all()) == all_
    assert lst.active() == active
    assert list(lst.iter_active()) == active
    assert lst.idle() == idle
    assert len(lst) == len(all_)
    assert lst.active_count == len(active)
    assert lst.idle_count == len(idle)
    assert lst.timed_out_count == len(all_) - len(active) - len(idle)
    # The debug view's phase counts.
    assert lst.headers_pending_count == sum(not conn.headers_completed for conn in active)
    assert lst.idle_responding_count == sum(conn.responding for conn in idle)
    # ``active`` is ordered by message start.
    starts = [conn.last_message_start for conn in active]
    assert starts == sorted(starts)
    for conn, expected in states.items():
        assert fields(conn) == expected, conn
        assert (conn in all_) == expected.tracked
        assert (conn in active) == expected.is_active


@pytest.fixture
def lst(clock: FakeClock) -> ConnectionsList:
    return ConnectionsList(clock=clock)


# -- construction and connect ------------------------------------------------


def test_empty(lst: ConnectionsList, clock: FakeClock) -> None:
    assert lst.clock is clock
    check(lst, all_=[], active=[], idle=[], states={})
    assert lst.expired(1, 2) == []
    assert lst.next_deadline(1, 2) is None


def test_default_clock_is_monotonic() -> None:
    import time

    assert ConnectionsList().clock is time.monotonic


def test_fresh_connection_is_in_no_list() -> None:
    conn = Connection()
    assert fields(conn) == S(0.0, False, 0, False, False)
    assert connection_state(conn) == "closed"
    assert not (conn.receiving_body or conn.is_stalled)


def test_connect_joins_all_and_active_timed(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect(client="10.0.0.1:5000", server="10.0.0.2:80")
    check(lst, all_=[a], active=[a], idle=[], states={a: ACTIVE(T0)})
    assert a.connected_at == T0
    assert (a.client, a.server, a.handle) == ("10.0.0.1:5000", "10.0.0.2:80", None)
    assert (a.method, a.path, a.responding) == (None, None, False)

    clock.advance(1.5)
    b = lst.connect()
    check(lst, all_=[a, b], active=[a, b], idle=[], states={a: ACTIVE(T0), b: ACTIVE(T0 + 1.5)})
    assert b.connected_at == T0 + 1.5
    assert b.id > a.id
    assert repr(a).startswith(f"<Connection id={a.id} client='10.0.0.1:5000' start={T0!r}")


def test_connect_at_the_same_instant_keeps_connection_order(lst: ConnectionsList) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    check(
        lst,
        all_=[a, b, c],
        active=[a, b, c],
        idle=[],
        states={a: ACTIVE(T0), b: ACTIVE(T0), c: ACTIVE(T0)},
    )


# -- message_begin -----------------------------------------------------------


def test_message_begin_from_active_restarts_clock_and_moves_to_tail(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.headers_complete(a)
    clock.advance(2)
    lst.message_begin(a)
    check(
        lst,
        all_=[a, b, c],
        active=[b, c, a],
        idle=[],
        states={a: ACTIVE(T0 + 2), b: ACTIVE(T0), c: ACTIVE(T0)},
    )
    # From the middle, at the same instant: still moved to the tail.
    lst.message_begin(c)
    check(
        lst,
        all_=[a, b, c],
        active=[b, a, c],
        idle=[],
        states={a: ACTIVE(T0 + 2), b: ACTIVE(T0), c: ACTIVE(T0 + 2)},
    )
    # The tail itself.
    clock.advance(1)
    lst.message_begin(c)
    check(
        lst,
        all_=[a, b, c],
        active=[b, a, c],
        idle=[],
        states={a: ACTIVE(T0 + 2), b: ACTIVE(T0), c: ACTIVE(T0 + 3)},
    )


def test_message_begin_from_idle(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(a)
    lst.message_complete(a)
    check(lst, all_=[a, b], active=[b], idle=[a], states={a: IDLE(1, headers=True), b: ACTIVE(T0)})
    clock.advance(3)
    lst.message_begin(a)
    check(lst, all_=[a, b], active=[b, a], idle=[], states={a: ACTIVE(T0 + 3, requests=1), b: ACTIVE(T0)})


def test_message_begin_rejoins_active_after_expiry(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    clock.advance(1)
    b2 = lst.connect()
    clock.advance(5)
    assert lst.expired(5, 0) == [a, b]
    check(
        lst,
        all_=[a, b, b2],
        active=[b2],
        idle=[],
        states={a: EXPIRED(T0), b: EXPIRED(T0), b2: ACTIVE(T0 + 1)},
    )
    lst.message_begin(b)
    check(
        lst,
        all_=[a, b, b2],
        active=[b2, b],
        idle=[],
        states={a: EXPIRED(T0), b: ACTIVE(T0 + 6), b2: ACTIVE(T0 + 1)},
    )
    assert lst.expired(5, 0) == []


# -- headers_complete --------------------------------------------------------


def test_headers_complete_only_sets_the_flag(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    clock.advance(1)
    lst.headers_complete(a)
    check(
        lst,
        all_=[a, b],
        active=[a, b],
        idle=[],
        states={a: ACTIVE(T0, headers=True), b: ACTIVE(T0)},
    )
    lst.headers_complete(a)
    check(
        lst,
        all_=[a, b],
        active=[a, b],
        idle=[],
        states={a: ACTIVE(T0, headers=True), b: ACTIVE(T0)},
    )


# -- message_complete --------------------------------------------------------


def test_message_complete_leaves_active_and_is_idle(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.headers_complete(b)
    clock.advance(1)
    lst.message_complete(b)
    check(
        lst,
        all_=[a, b, c],
        active=[a, c],
        idle=[b],
        states={a: ACTIVE(T0), b: IDLE(1, headers=True), c: ACTIVE(T0)},
    )
    # A second request on the same connection.
    clock.advance(1)
    lst.message_begin(b)
    check(
        lst,
        all_=[a, b, c],
        active=[a, c, b],
        idle=[],
        states={a: ACTIVE(T0), b: ACTIVE(T0 + 2, requests=1), c: ACTIVE(T0)},
    )
    lst.headers_complete(b)
    lst.message_complete(b)
    lst.message_complete(a)
    check(
        lst,
        all_=[a, b, c],
        active=[c],
        idle=[a, b],
        states={a: IDLE(1), b: IDLE(2, headers=True), c: ACTIVE(T0)},
    )
    lst.message_complete(c)
    check(lst, all_=[a, b, c], active=[], idle=[a, b, c], states={a: IDLE(1), b: IDLE(2, True), c: IDLE(1)})


def test_message_complete_on_expired_connection_makes_it_idle(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    clock.advance(10)
    assert lst.expired(5, 0) == [a]
    check(lst, all_=[a], active=[], idle=[], states={a: EXPIRED(T0)})
    lst.message_complete(a)
    check(lst, all_=[a], active=[], idle=[a], states={a: IDLE(1)})


def test_message_complete_on_idle_connection_counts_nothing(lst: ConnectionsList) -> None:
    a, b = lst.connect(), lst.connect()
    lst.message_complete(a)
    check(lst, all_=[a, b], active=[b], idle=[a], states={a: IDLE(1), b: ACTIVE(T0)})
    # A second call for the same request is not a second request.
    lst.message_complete(a)
    check(lst, all_=[a, b], active=[b], idle=[a], states={a: IDLE(1), b: ACTIVE(T0)})
    lst.remove(a)
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(0.0, requests=1), b: ACTIVE(T0)})


def test_idle_responding_count(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    # Responding while receiving a request: not idle, not counted.
    lst.response_begin(a)
    assert (a.responding, lst.idle_responding_count, lst.headers_pending_count) == (True, 0, 2)
    lst.headers_complete(a)
    assert lst.headers_pending_count == 1
    lst.message_complete(a)
    check(lst, all_=[a, b], active=[b], idle=[a], states={a: IDLE(1, True), b: ACTIVE(T0)})
    assert lst.idle_responding_count == 1
    lst.response_complete(a)
    check(lst, all_=[a, b], active=[b], idle=[a], states={a: IDLE(1, True), b: ACTIVE(T0)})
    assert (a.responding, lst.idle_responding_count) == (False, 0)
    lst.response_begin(a)
    assert lst.idle_responding_count == 1
    # The next request begins before the response ends.
    clock.advance(1)
    lst.message_begin(a)
    check(lst, all_=[a, b], active=[b, a], idle=[], states={a: ACTIVE(T0 + 1, requests=1), b: ACTIVE(T0)})
    assert a.responding
    lst.message_complete(a)
    assert lst.idle_responding_count == 1
    lst.remove(a)
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(0.0, requests=2), b: ACTIVE(T0)})
    assert lst.idle_responding_count == 0
    # A removed connection is not responding, and stays so.
    assert not a.responding
    lst.response_begin(a)
    assert (a.responding, lst.idle_responding_count) == (False, 0)
    lst.response_complete(a)
    assert lst.idle_responding_count == 0


def test_idle_responding_count_after_expiry(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.response_begin(a)
    clock.advance(6)
    assert lst.expired(5, 0) == [a]
    check(lst, all_=[a], active=[], idle=[], states={a: EXPIRED(T0)})
    assert (lst.idle_responding_count, lst.headers_pending_count) == (0, 0)
    lst.message_complete(a)
    check(lst, all_=[a], active=[], idle=[a], states={a: IDLE(1)})
    assert lst.idle_responding_count == 1


def test_response_begin_and_complete_count_once(lst: ConnectionsList) -> None:
    a = lst.connect()
    lst.message_complete(a)
    lst.response_begin(a)
    assert a.responding is True
    assert lst.idle_responding_count == 1
    lst.response_begin(a)  # still responding: not counted twice
    assert lst.idle_responding_count == 1
    lst.response_complete(a)
    assert a.responding is False
    assert lst.idle_responding_count == 0
    lst.response_complete(a)  # still done: not uncounted twice
    assert lst.idle_responding_count == 0


def test_headers_pending_count(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    assert lst.headers_pending_count == 2
    lst.headers_complete(a)
    lst.headers_complete(a)
    assert lst.headers_pending_count == 1
    lst.message_begin(a)  # a new request: its headers are pending again
    assert lst.headers_pending_count == 2
    lst.message_complete(b)
    assert lst.headers_pending_count == 1
    lst.headers_complete(b)  # idle: not counted either way
    lst.message_begin(b)
    assert lst.headers_pending_count == 2
    lst.remove(a)
    assert lst.headers_pending_count == 1
    lst.headers_complete(a)  # removed
    assert lst.headers_pending_count == 1
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(T0, True), b: ACTIVE(T0, requests=1)})


# -- remove --------------------------------------------------------------------


def test_remove_from_active_head_middle_tail(lst: ConnectionsList) -> None:
    a, b, c, d = lst.connect(), lst.connect(), lst.connect(), lst.connect()
    lst.remove(b)
    check(
        lst,
        all_=[a, c, d],
        active=[a, c, d],
        idle=[],
        states={a: ACTIVE(T0), b: REMOVED(T0), c: ACTIVE(T0), d: ACTIVE(T0)},
    )
    lst.remove(a)
    check(lst, all_=[c, d], active=[c, d], idle=[], states={a: REMOVED(T0), c: ACTIVE(T0), d: ACTIVE(T0)})
    lst.remove(d)
    check(lst, all_=[c], active=[c], idle=[], states={d: REMOVED(T0), c: ACTIVE(T0)})
    lst.remove(c)
    check(lst, all_=[], active=[], idle=[], states={c: REMOVED(T0)})
    # The list is usable again after being emptied.
    e = lst.connect()
    check(lst, all_=[e], active=[e], idle=[], states={e: ACTIVE(T0)})


def test_remove_from_idle(lst: ConnectionsList) -> None:
    a, b = lst.connect(), lst.connect()
    lst.message_complete(a)
    lst.message_complete(b)
    check(lst, all_=[a, b], active=[], idle=[a, b], states={a: IDLE(1), b: IDLE(1)})
    lst.remove(a)
    check(lst, all_=[b], active=[], idle=[b], states={a: REMOVED(0.0, requests=1), b: IDLE(1)})


def test_remove_expired(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.message_complete(b)
    clock.advance(6)
    assert lst.expired(5, 0) == [a]
    check(lst, all_=[a, b], active=[], idle=[b], states={a: EXPIRED(T0), b: IDLE(1)})
    lst.remove(a)
    check(lst, all_=[b], active=[], idle=[b], states={a: REMOVED(T0), b: IDLE(1)})


@pytest.mark.parametrize("state", ["active", "idle", "expired"])
def test_remove_is_idempotent(lst: ConnectionsList, clock: FakeClock, state: str) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.message_complete(c)
    if state == "idle":
        lst.message_complete(a)
        gone = REMOVED(0.0, requests=1)
    elif state == "expired":
        clock.advance(6)
        lst.message_begin(b)
        assert lst.expired(5, 0) == [a]
        gone = REMOVED(T0)
    else:
        gone = REMOVED(T0)
    b_state = ACTIVE(clock.now)
    for _ in range(3):
        lst.remove(a)
        check(lst, all_=[b, c], active=[b], idle=[c], states={a: gone, b: b_state, c: IDLE(1)})


def test_removed_connection_never_rejoins(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.remove(a)
    clock.advance(1)
    lst.message_begin(a)
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(T0), b: ACTIVE(T0)})
    lst.message_complete(a)
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(T0), b: ACTIVE(T0)})
    lst.remove(a)
    check(lst, all_=[b], active=[b], idle=[], states={a: REMOVED(T0), b: ACTIVE(T0)})
    # Removed while idle: message_begin does not make it active again either.
    lst.message_complete(b)
    lst.remove(b)
    lst.message_begin(b)
    lst.message_complete(b)
    check(lst, all_=[], active=[], idle=[], states={a: REMOVED(T0), b: REMOVED(0.0, requests=1)})


# -- iterating while removing ------------------------------------------------


def test_iter_all_removing_every_current_node(lst: ConnectionsList) -> None:
    conns = [lst.connect() for _ in range(5)]
    lst.message_complete(conns[1])
    seen = []
    for conn in lst.iter_all():
        seen.append(conn)
        lst.remove(conn)
    assert seen == conns
    check(
        lst,
        all_=[],
        active=[],
        idle=[],
        states={**{c: REMOVED(T0) for c in conns}, conns[1]: REMOVED(0.0, requests=1)},
    )


def test_iter_all_removing_some_current_nodes(lst: ConnectionsList) -> None:
    a, b, c, d = (lst.connect() for _ in range(4))
    seen = []
    for conn in lst.iter_all():
        seen.append(conn)
        if conn in (b, d):
            lst.remove(conn)
    assert seen == [a, b, c, d]
    check(lst, all_=[a, c], active=[a, c], idle=[], states={b: REMOVED(T0), d: REMOVED(T0)})


def test_iter_all_removing_a_later_node_skips_it(lst: ConnectionsList) -> None:
    a, b, c = (lst.connect() for _ in range(3))
    seen = []
    for conn in lst.iter_all():
        seen.append(conn)
        if conn is a:
            lst.remove(b)
    assert seen == [a, c]


def test_iter_all_removing_current_and_next_never_yields_a_removed_node(lst: ConnectionsList) -> None:
    a, b, c, d = (lst.connect() for _ in range(4))
    seen = []
    for conn in lst.iter_all():
        assert conn.tracked
        seen.append(conn)
        if conn is b:
            lst.remove(b)
            lst.remove(c)
    # Documented: the walk ends rather than yield a removed node or loop.
    assert seen == [a, b]
    check(lst, all_=[a, d], active=[a, d], idle=[], states={b: REMOVED(T0), c: REMOVED(T0)})


@pytest.mark.parametrize("how", ["remove", "message_complete"])
def test_iter_active_unlinking_current_node(lst: ConnectionsList, clock: FakeClock, how: str) -> None:
    conns = [lst.connect() for _ in range(4)]
    clock.advance(1)
    late = lst.connect()
    seen = []
    for conn in lst.iter_active():
        seen.append(conn)
        if conn is not late:
            getattr(lst, how)(conn)
    assert seen == [*conns, late]
    if how == "remove":
        states = {c: REMOVED(T0) for c in conns}
        check(lst, all_=[late], active=[late], idle=[], states={**states, late: ACTIVE(T0 + 1)})
    else:
        states = {c: IDLE(1) for c in conns}
        check(lst, all_=[*conns, late], active=[late], idle=conns, states={**states, late: ACTIVE(T0 + 1)})


def test_iter_active_expiring_current_node(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(a)
    clock.advance(2)
    c = lst.connect()
    clock.advance(4)
    seen = []
    for conn in lst.iter_active():
        seen.append(conn)
        if conn is b:
            assert lst.expired(5, 0) == [b]
    assert seen == [a, b, c]
    check(
        lst,
        all_=[a, b, c],
        active=[a, c],
        idle=[],
        states={a: ACTIVE(T0, headers=True), b: EXPIRED(T0), c: ACTIVE(T0 + 2)},
    )


def test_iter_active_unlinking_the_only_node(lst: ConnectionsList) -> None:
    a = lst.connect()
    seen = []
    for conn in lst.iter_active():
        seen.append(conn)
        lst.message_complete(conn)
    assert seen == [a]
    check(lst, all_=[a], active=[], idle=[a], states={a: IDLE(1)})


# -- expired -----------------------------------------------------------------


def test_expired_both_disabled_reports_nothing(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    clock.advance(1e9)
    assert lst.expired(0, 0) == []
    assert lst.expired(0.0, 0) == []
    check(lst, all_=[a], active=[a], idle=[], states={a: ACTIVE(T0)})


def test_expired_headers_only(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(b)
    clock.advance(5)
    assert lst.expired(5, 0) == []
    clock.advance(0.5)
    assert lst.expired(5, 0) == [a]
    check(
        lst,
        all_=[a, b],
        active=[b],
        idle=[],
        states={a: EXPIRED(T0), b: ACTIVE(T0, headers=True)},
    )
    # With no request timeout, a connection whose headers are in never expires.
    clock.advance(1e6)
    assert lst.expired(5, 0) == []
    check(
        lst,
        all_=[a, b],
        active=[b],
        idle=[],
        states={a: EXPIRED(T0), b: ACTIVE(T0, headers=True)},
    )


def test_expired_request_only(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(b)
    clock.advance(1)
    c = lst.connect()
    clock.advance(9)
    # a and b started exactly 10 s ago: not expired yet, headers or not.
    assert lst.expired(0, 10) == []
    clock.advance(0.5)
    assert lst.expired(0, 10) == [a, b]
    check(
        lst,
        all_=[a, b, c],
        active=[c],
        idle=[],
        states={a: EXPIRED(T0), b: EXPIRED(T0, headers=True), c: ACTIVE(T0 + 1)},
    )
    clock.advance(1)
    assert lst.expired(0, 10) == [c]
    check(
        lst,
        all_=[a, b, c],
        active=[],
        idle=[],
        states={a: EXPIRED(T0), b: EXPIRED(T0, headers=True), c: EXPIRED(T0 + 1)},
    )


def test_expired_swaps_when_headers_timeout_is_longer(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(b)
    clock.advance(6)
    # (10, 5) is (5, 10): a (headers incomplete) is over 5 s, b (headers in) is under 10 s.
    # Unswapped, b would be over the 5 s request timeout and a under the 10 s headers one.
    assert lst.expired(10, 5) == [a]
    check(lst, all_=[a, b], active=[b], idle=[], states={a: EXPIRED(T0), b: ACTIVE(T0, headers=True)})
    clock.advance(4)
    assert lst.expired(10, 5) == []
    clock.advance(0.5)
    assert lst.expired(10, 5) == [b]
    check(lst, all_=[a, b], active=[], idle=[], states={a: EXPIRED(T0), b: EXPIRED(T0, headers=True)})


def test_expired_does_not_swap_when_one_is_disabled(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(b)
    clock.advance(6)
    # Headers timeout 10 only: a is 6 s in, b has its headers.
    assert lst.expired(10, 0) == []
    # Request timeout 5 only: both are over it.
    assert lst.expired(0, 5) == [a, b]


@pytest.mark.parametrize(("headers_timeout", "request_timeout"), [(5, 0), (5, 30), (30, 5), (0, 5)])
def test_expired_boundary_is_strict(
    lst: ConnectionsList, clock: FakeClock, headers_timeout: float, request_timeout: float
) -> None:
    a = lst.connect()
    clock.advance(5)
    # Started exactly 5 s ago: not expired.
    assert lst.expired(headers_timeout, request_timeout) == []
    check(lst, all_=[a], active=[a], idle=[], states={a: ACTIVE(T0)})
    clock.advance(0.125)
    assert lst.expired(headers_timeout, request_timeout) == [a]
    check(lst, all_=[a], active=[], idle=[], states={a: EXPIRED(T0)})


def test_expired_request_boundary_with_headers_complete(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)
    clock.advance(10)
    assert lst.expired(5, 10) == []
    clock.advance(0.125)
    assert lst.expired(5, 10) == [a]


def test_headers_completed_connections_only_get_the_request_timeout(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    a, b = lst.connect(), lst.connect()
    lst.headers_complete(a)
    clock.advance(7)
    assert lst.expired(5, 10) == [b]
    check(lst, all_=[a, b], active=[a], idle=[], states={a: ACTIVE(T0, headers=True), b: EXPIRED(T0)})
    clock.advance(3.5)
    assert lst.expired(5, 10) == [a]
    check(
        lst,
        all_=[a, b],
        active=[],
        idle=[],
        states={a: EXPIRED(T0, headers=True), b: EXPIRED(T0)},
    )


def test_expired_connections_are_reported_once_and_stay_in_all(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.message_complete(c)
    clock.advance(6)
    assert lst.expired(5, 10) == [a, b]
    check(lst, all_=[a, b, c], active=[], idle=[c], states={a: EXPIRED(T0), b: EXPIRED(T0), c: IDLE(1)})
    clock.advance(100)
    assert lst.expired(5, 10) == []
    assert lst.expired(1, 1) == []
    check(lst, all_=[a, b, c], active=[], idle=[c], states={a: EXPIRED(T0), b: EXPIRED(T0), c: IDLE(1)})


def test_expired_returns_active_order_not_connection_order(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    clock.advance(1)
    lst.message_begin(a)
    clock.advance(1)
    lst.message_begin(b)
    clock.advance(10)
    assert lst.expired(5, 0) == [c, a, b]
    check(
        lst,
        all_=[a, b, c],
        active=[],
        idle=[],
        states={a: EXPIRED(T0 + 1), b: EXPIRED(T0 + 2), c: EXPIRED(T0)},
    )


def test_expired_young_connection_after_old_completed_one(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()  # headers in, old: only the request timeout applies
    lst.headers_complete(a)
    c = lst.connect()  # headers incomplete, old
    clock.advance(4)
    b = lst.connect()  # headers incomplete, young
    d = lst.connect()  # headers in, young
    lst.headers_complete(d)
    clock.advance(2)
    assert lst.expired(5, 10) == [c]
    check(
        lst,
        all_=[a, c, b, d],
        active=[a, b, d],
        idle=[],
        states={
            a: ACTIVE(T0, headers=True),
            c: EXPIRED(T0),
            b: ACTIVE(T0 + 4),
            d: ACTIVE(T0 + 4, headers=True),
        },
    )
    clock.advance(3.5)  # now T0 + 9.5: b is 5.5 s in, a 9.5 s
    assert lst.expired(5, 10) == [b]
    check(
        lst,
        all_=[a, c, b, d],
        active=[a, d],
        idle=[],
        states={a: ACTIVE(T0, True), c: EXPIRED(T0), b: EXPIRED(T0 + 4), d: ACTIVE(T0 + 4, True)},
    )
    clock.advance(1)  # T0 + 10.5
    assert lst.expired(5, 10) == [a]
    check(
        lst,
        all_=[a, c, b, d],
        active=[d],
        idle=[],
        states={a: EXPIRED(T0, True), c: EXPIRED(T0), b: EXPIRED(T0 + 4), d: ACTIVE(T0 + 4, True)},
    )


def test_expired_stops_at_the_first_young_connection(lst: ConnectionsList, clock: FakeClock) -> None:
    """White-box: the walk stops at the first connection younger than the shorter timeout.

    The tail's start is forced into the past, breaking the ordering invariant on
    purpose; a walk over the whole list would report it.
    """
    old, young, tail = lst.connect(), lst.connect(), lst.connect()
    lst.headers_complete(old)
    clock.advance(6)
    lst.message_begin(young)
    lst.message_begin(tail)
    tail.last_message_start = T0 - 100
    assert lst.expired(5, 10) == []
    assert lst.active() == [old, young, tail]


# -- next_deadline -------------------------------------------------------------


def test_next_deadline_none_when_nothing_active(lst: ConnectionsList, clock: FakeClock) -> None:
    assert lst.next_deadline(5, 10) is None
    a = lst.connect()
    lst.message_complete(a)
    b = lst.connect()
    clock.advance(6)
    assert lst.expired(5, 10) == [b]
    check(lst, all_=[a, b], active=[], idle=[a], states={a: IDLE(1), b: EXPIRED(T0)})
    assert lst.next_deadline(5, 10) is None


def test_next_deadline_none_when_both_disabled(lst: ConnectionsList) -> None:
    lst.connect()
    assert lst.next_deadline(0, 0) is None


def test_next_deadline_head_headers_deadline(lst: ConnectionsList, clock: FakeClock) -> None:
    lst.connect()
    clock.advance(1)
    lst.connect()
    assert lst.next_deadline(5, 10) == T0 + 5
    # Swapped arguments mean the same.
    assert lst.next_deadline(10, 5) == T0 + 5


def test_next_deadline_completed_head_then_earlier_incomplete(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)  # deadline T0 + 10
    clock.advance(2)
    lst.connect()  # deadline T0 + 2 + 5
    clock.advance(1)
    lst.connect()  # deadline T0 + 3 + 5
    assert lst.next_deadline(5, 10) == T0 + 7


def test_next_deadline_completed_head_is_earliest(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)  # deadline T0 + 10
    clock.advance(8)
    lst.connect()  # deadline T0 + 13
    assert lst.next_deadline(5, 10) == T0 + 10


def test_next_deadline_several_completed_then_incomplete(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)  # T0 + 20
    clock.advance(1)
    b = lst.connect()
    lst.headers_complete(b)  # T0 + 21
    clock.advance(1)
    lst.connect()  # T0 + 2 + 15
    assert lst.next_deadline(15, 20) == T0 + 17
    assert lst.next_deadline(17, 20) == T0 + 19
    assert lst.next_deadline(19, 20) == T0 + 20


def test_next_deadline_request_only(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    clock.advance(1)
    b = lst.connect()
    lst.headers_complete(a)
    assert lst.next_deadline(0, 10) == T0 + 10
    lst.message_complete(a)
    assert lst.next_deadline(0, 10) == T0 + 11
    lst.headers_complete(b)
    assert lst.next_deadline(0, 10) == T0 + 11


def test_next_deadline_headers_only_skips_completed(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)
    clock.advance(1)
    b = lst.connect()
    lst.headers_complete(b)
    clock.advance(2)
    c = lst.connect()
    clock.advance(1)
    lst.connect()
    assert lst.next_deadline(5, 0) == T0 + 8
    lst.remove(c)
    assert lst.next_deadline(5, 0) == T0 + 9


def test_next_deadline_headers_only_all_completed(lst: ConnectionsList) -> None:
    for _ in range(3):
        lst.headers_complete(lst.connect())
    assert lst.next_deadline(5, 0) is None
    assert lst.next_deadline(0, 7) == T0 + 7


def test_next_deadline_stops_at_the_first_incomplete_connection(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    """White-box: nothing after the first headers-incomplete connection is looked at.

    The tail's start is forced into the past, breaking the ordering invariant on
    purpose; a walk over the whole list would return the tail's deadline.
    """
    lst.connect()
    clock.advance(1)
    tail = lst.connect()
    tail.last_message_start = T0 - 100
    assert lst.next_deadline(5, 10) == T0 + 5
    assert lst.next_deadline(5, 0) == T0 + 5


def test_next_deadline_then_expired_at_and_after_it(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.headers_complete(a)
    clock.advance(2)
    b = lst.connect()
    deadline = lst.next_deadline(5, 10)
    assert deadline == T0 + 7
    clock.now = deadline
    assert lst.expired(5, 10) == []
    clock.advance(0.25)
    assert lst.expired(5, 10) == [b]
    assert lst.next_deadline(5, 10) == T0 + 10


# -- bad arguments -------------------------------------------------------------


@pytest.mark.parametrize("method", ["expired", "next_deadline"])
@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        ((-1, 5), ValueError, "headers_timeout"),
        ((5, -1), ValueError, "request_timeout"),
        ((-0.001, 0), ValueError, "headers_timeout"),
        ((1, "x"), TypeError, "request_timeout"),
        (("1", 5), TypeError, "headers_timeout"),
        ((None, 5), TypeError, "headers_timeout"),
        ((True, 5), TypeError, "headers_timeout"),
        ((5, False), TypeError, "request_timeout"),
        ((math.nan, 5), ValueError, "headers_timeout"),
        ((5, math.nan), ValueError, "request_timeout"),
        ((math.inf, 5), ValueError, "headers_timeout"),
        ((5, math.inf), ValueError, "request_timeout"),
        ((-math.inf, 5), ValueError, "headers_timeout"),
        ((Decimal(1), 5), TypeError, "headers_timeout"),
    ],
)
def test_bad_timeouts_are_rejected(
    lst: ConnectionsList,
    clock: FakeClock,
    method: str,
    args: tuple[object, object],
    error: type[Exception],
    name: str,
) -> None:
    a = lst.connect()
    clock.advance(100)
    with pytest.raises(error, match=name):
        getattr(lst, method)(*args)
    # Nothing happened.
    check(lst, all_=[a], active=[a], idle=[], states={a: ACTIVE(T0)})


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), (5, 5.0), (2.5, 2.5), (0.0, 0.0), (10**6, 1e6)])
def test_check_timeout_accepts(value: object, expected: float) -> None:
    result = check_timeout("some_timeout", value)
    assert type(result) is float
    assert result == expected


@pytest.mark.parametrize(
    ("value", "error", "detail"),
    [
        (True, TypeError, "got bool"),
        (False, TypeError, "got bool"),
        (None, TypeError, "got NoneType"),
        ("5", TypeError, "got str"),
        (Decimal("5"), TypeError, "got Decimal"),
        (Fraction(1, 2), TypeError, "got Fraction"),
        ([5], TypeError, "got list"),
        (-1, ValueError, "got -1"),
        (-0.5, ValueError, "got -0.5"),
        (math.nan, ValueError, "got nan"),
        (math.inf, ValueError, "got inf"),
        (-math.inf, ValueError, "got -inf"),
    ],
)
def test_check_timeout_rejects(value: object, error: type[Exception], detail: str) -> None:
    with pytest.raises(error) as info:
        check_timeout("some_timeout", value)
    message = str(info.value)
    assert message.startswith("some_timeout must be a ")
    assert detail in message


def test_headers_complete_with_the_request_marks_responding_until_response_complete(
    lst: ConnectionsList,
) -> None:
    a = lst.connect()
    lst.message_begin(a)
    lst.headers_complete(a, "GET", "/x")
    assert (a.method, a.path, a.responding, a.headers_completed) == ("GET", "/x", True, True)
    assert (lst.idle_responding_count, lst.headers_pending_count) == (0, 0)  # active: not counted as idle
    lst.message_complete(a)
    assert lst.idle_responding_count == 1  # handling
    lst.response_complete(a)
    assert (a.responding, lst.idle_responding_count) == (False, 0)
    lst.response_complete(a)  # idempotent
    assert lst.idle_responding_count == 0
    # The app answers before the body is in: not counted when it goes idle.
    lst.message_begin(a)
    lst.headers_complete(a, "POST", "/y")
    lst.response_complete(a)
    lst.message_complete(a)
    assert (a.method, a.path, a.requests, lst.idle_responding_count) == ("POST", "/y", 2, 0)
    # Responding when removed: the count goes back down.
    lst.message_begin(a)
    lst.headers_complete(a, "GET", "/z")
    lst.message_complete(a)
    assert lst.idle_responding_count == 1
    lst.remove(a)
    assert lst.idle_responding_count == 0
    # Without a method (the list's own API), headers_complete only sets the flag.
    b = lst.connect()
    lst.headers_complete(b)
    assert (b.method, b.responding, b.headers_completed) == (None, False, True)


# -- the body, stalled and closing lists ----------------------------------------


def check_extra(
    lst: ConnectionsList,
    *,
    body: list[Connection],
    stalled: list[Connection],
    closing: list[Connection],
) -> None:
    """Assert the three queues beyond Node's, both ways, their counts, and what the records say."""
    for queue, expected in ((lst.body, body), (lst.stalled, stalled), (lst.closing, closing)):
        assert list(queue) == expected
        assert list(reversed(queue)) == expected[::-1]
        assert len(queue) == len(expected)
        assert queue.head() == (expected[0] if expected else None)
        stamps = [queue.stamp(conn) for conn in expected]
        assert stamps == sorted(stamps)
    assert lst.stalled_count == len(stalled)
    for conn in lst.all():
        assert conn.receiving_body == (conn in body)
        assert conn.is_stalled == (conn in stalled)


def receiving_body(lst: ConnectionsList, clock: FakeClock) -> Connection:
    conn = lst.connect()
    lst.message_begin(conn)
    lst.headers_complete(conn, "POST", "/upload")
    lst.body_begin(conn)
    return conn


def test_body_begin_only_for_a_request_being_received(lst: ConnectionsList, clock: FakeClock) -> None:
    new = lst.connect()
    lst.body_begin(new)  # headers incomplete: no body yet
    idle = lst.connect()
    lst.message_begin(idle)
    lst.headers_complete(idle)
    lst.message_complete(idle)
    lst.body_begin(idle)  # fully received: no body to time
    check_extra(lst, body=[], stalled=[], closing=[])
    clock.advance(1)
    a = receiving_body(lst, clock)
    clock.advance(1)
    b = receiving_body(lst, clock)
    lst.body_begin(a)  # a second call for the same body does nothing
    assert (a.body_started, b.body_started) == (T0 + 1, T0 + 2)
    check_extra(lst, body=[a, b], stalled=[], closing=[])
    a.body_received += 100
    a.body_received += 50
    assert (a.body_received, b.body_received) == (150, 0)
    check(
        lst,
        all_=[new, idle, a, b],
        active=[new, a, b],
        idle=[idle],
        states={new: ACTIVE(T0), idle: IDLE(1, True), a: ACTIVE(T0 + 1, True), b: ACTIVE(T0 + 2, True)},
    )


def test_a_body_leaves_at_message_complete_begin_expiry_and_remove(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    done, again, expired, gone = (receiving_body(lst, clock) for _ in range(4))
    lst.message_complete(done)
    clock.advance(31)
    lst.message_begin(again)  # a new message: the body is over
    assert lst.expired(10, 30) == [expired, gone]
    lst.remove(gone)
    check_extra(lst, body=[], stalled=[], closing=[])
    assert again.is_active and not again.headers_completed


def test_rate_expired_walks_past_the_grace_and_stops_at_the_first_young_body(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    slow = receiving_body(lst, clock)
    fast = receiving_body(lst, clock)
    fast.body_received += 2000  # 4 s of credit at 500 bytes/s
    clock.advance(5)
    young = receiving_body(lst, clock)
    # At the end of the grace (10 s after the first two): nothing is behind (the rule is strict).
    clock.advance(5)
    assert rate_expired(lst, 500, 10, clock.now) == ([], None, T0 + 10)
    slow.body_received += 50  # 0.1 s of credit
    clock.advance(0.125)
    assert rate_expired(lst, 500, 10, clock.now) == ([slow], T0 + 14, T0 + 15)
    check_extra(lst, body=[fast, young], stalled=[], closing=[])
    # Behind: it left ``active`` and counts as timed out, like an expiry.
    check(
        lst,
        all_=[slow, fast, young],
        active=[fast, young],
        idle=[],
        states={slow: EXPIRED(T0, True), fast: ACTIVE(T0, True), young: ACTIVE(T0 + 5, True)},
    )
    assert lst.timed_out_count == 1
    clock.advance(10)
    # A limit leaves the rest for the next call.
    assert rate_expired(lst, 500, 10, clock.now, limit=1) == ([fast], None, None)
    assert rate_expired(lst, 500, 10, clock.now) == ([young], None, None)
    check_extra(lst, body=[], stalled=[], closing=[])


def test_stall_sample_unstall(lst: ConnectionsList, clock: FakeClock) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.stall(a, 1000)
    clock.advance(1)
    lst.stall(b, 500)
    lst.stall(a, 7)  # already stalled: nothing changes
    check_extra(lst, body=[], stalled=[a, b], closing=[])
    assert (a.out_since, a.out_sampled, a.out_pending) == (T0, T0, 1000)
    assert stalled_due(lst, 1, clock.now, 10) == [a]
    assert stalled_due(lst, 0, clock.now, 10) == [a, b]
    assert stalled_due(lst, 0, clock.now, 1) == [a]
    assert stalled_due(lst, 2, clock.now, 10) == []
    clock.advance(1)
    # Progress: fewer bytes unsent; the sample moves it to the tail, stamped now.
    assert stall_sample(lst, a, 400, clock.now) == 0.0
    assert (a.out_since, a.out_sampled, a.out_pending) == (T0 + 2, T0 + 2, 400)
    # No progress: as many bytes unsent (or more) as at the last sample.
    assert stall_sample(lst, b, 500, clock.now) == 1.0
    assert (b.out_since, b.out_sampled, b.out_pending) == (T0 + 1, T0 + 2, 500)
    check_extra(lst, body=[], stalled=[a, b], closing=[])
    lst.unstall(a)
    lst.unstall(c)  # not stalled: nothing happens
    assert stall_sample(lst, a, 0, clock.now) == 0.0  # not stalled any more: no sample
    check_extra(lst, body=[], stalled=[b], closing=[])
    lst.remove(b)
    check_extra(lst, body=[], stalled=[], closing=[])
    lst.stall(b, 10)  # removed: never rejoins
    check_extra(lst, body=[], stalled=[], closing=[])


def test_stall_sample_with_what_the_kernel_reports(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    # 128,000 bytes acknowledged, window zero: what the client took is a step.
    lst.stall(a, 5_000_000, (128_000, 0))
    assert (a.out_acked, a.out_step) == (128_000, 128_000)
    clock.advance(15)
    # Nothing acknowledged: no progress, even though fewer bytes are unsent
    # (with TCP_INFO only the client's acknowledgements count).
    assert stall_sample(lst, a, 4_000_000, clock.now, (128_000, 0)) == 15.0
    clock.advance(15)
    # A window opened but nothing acknowledged: a step of that size, no progress.
    assert stall_sample(lst, a, 4_000_000, clock.now, (128_000, 200_000)) == 30.0
    assert a.out_step == 200_000
    clock.advance(15)
    # 95,232 bytes acknowledged: progress; the largest step stays.
    assert stall_sample(lst, a, 3_900_000, clock.now, (223_232, 0)) == 0.0
    assert (a.out_acked, a.out_step, a.out_since) == (223_232, 200_000, clock.now)
    # The step survives the stall: the next one starts with it.
    lst.unstall(a)
    lst.stall(a, 3_000_000, (300_000, 0))
    assert a.out_step == 300_000
    # No report: progress is fewer bytes unsent, as without TCP_INFO.
    b = lst.connect()
    lst.stall(b, 1000)
    assert b.out_acked == -1
    clock.advance(1)
    assert stall_sample(lst, b, 400, clock.now) == 0.0
    assert b.out_step == 600


def test_send_allowance() -> None:
    # One send timeout per SEND_STEP of the largest step, at least one, up
    # to SEND_STEP_LIMIT.
    assert send_allowance(60.0, 0) == 60.0
    assert send_allowance(60.0, 1152) == 60.0  # a slow-read attack's window
    assert send_allowance(60.0, SEND_STEP) == 60.0
    assert send_allowance(60.0, 128_000) == 60.0 * 128_000 / SEND_STEP  # loopback's 128 KB: 234 s
    assert send_allowance(60.0, 10_000_000) == 60.0 * SEND_STEP_LIMIT
    assert send_allowance(1.0, 4 * SEND_STEP) == 4.0


def test_linger_takes_a_connection_out_of_stalled_and_lingered_returns_the_old_ones(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    a, b, c = lst.connect(), lst.connect(), lst.connect()
    lst.stall(a, 100)
    lst.linger(a)
    lst.stall(a, 100)  # closing: it does not go back to stalled
    clock.advance(0.5)
    lst.linger(b)
    lst.linger(a)  # already closing: keeps its place and its time
    check_extra(lst, body=[], stalled=[], closing=[a, b])
    assert (a.out_since, b.out_since) == (T0, T0 + 0.5)
    clock.advance(0.5)
    assert lingered(lst, 1, clock.now, 10) == [a]
    check_extra(lst, body=[], stalled=[], closing=[b])
    lst.remove(b)
    check_extra(lst, body=[], stalled=[], closing=[])
    assert lingered(lst, 0, clock.now, 10) == []
    lst.remove(c)
    lst.linger(c)  # removed: never joins
    check_extra(lst, body=[], stalled=[], closing=[])


def test_rate_boundary_is_strict(lst: ConnectionsList, clock: FakeClock) -> None:
    conn = receiving_body(lst, clock)
    conn.body_received += 250  # 0.5 s of credit at 500 bytes/s: the deadline is T0 + 10.5
    clock.advance(10.5)
    assert rate_expired(lst, 500, 10, clock.now) == ([], T0 + 10.5, None)
    clock.advance(0.125)
    assert rate_expired(lst, 500, 10, clock.now) == ([conn], None, None)


def test_rate_expired_restarts_the_clock_of_an_excused_body(lst: ConnectionsList, clock: FakeClock) -> None:
    held, behind = receiving_body(lst, clock), receiving_body(lst, clock)
    clock.advance(1)
    later = receiving_body(lst, clock)
    held.body_received += 100
    clock.advance(9.5)
    # The server stopped reading ``held``: a new grace period from now, at the tail.
    result = rate_expired(lst, 500, 10, clock.now, excused=lambda conn: conn is held)
    assert result == ([behind], None, T0 + 11)
    assert (held.body_started, held.body_received) == (T0 + 10.5, 0)
    check_extra(lst, body=[later, held], stalled=[], closing=[])
    assert held.is_active and not behind.is_active


@pytest.mark.parametrize("before", ["new", "idle", "idle_responding", "reading_headers", "timed_out"])
def test_message_is_the_three_events_at_one_instant(before: str) -> None:
    # ``message`` (a whole request in one read) leaves a connection exactly
    # as message_begin + headers_complete + message_complete + responding do.
    def setup() -> tuple[ConnectionsList, Connection]:
        lst = ConnectionsList(clock=itertools.count(1.0).__next__)
        conn = lst.connect()
        if before != "new":
            lst.message_begin(conn)
            if before != "reading_headers" and before != "timed_out":
                lst.headers_complete(conn)
                lst.message_complete(conn)
                if before == "idle_responding":
                    lst.response_begin(conn)
            if before == "timed_out":
                assert lst.expired(0.5, 0.0) == [conn]
        return lst, conn

    def state(lst: ConnectionsList, conn: Connection) -> tuple[object, ...]:
        counts = (len(lst), lst.active_count, lst.idle_count, lst.timed_out_count)
        return (
            *counts,
            lst.headers_pending_count,
            lst.idle_responding_count,
            conn.is_active,
            conn.last_message_start == 0,
            conn.headers_completed,
            conn.requests,
            conn.responding,
        )

    by_events, conn = setup()
    by_events.message_begin(conn)
    by_events.headers_complete(conn)
    by_events.message_complete(conn)
    by_events.response_begin(conn)
    at_once, other = setup()
    at_once.message(other)
    assert state(at_once, other) == state(by_events, conn)
    if before in ("idle", "idle_responding"):
        # On an idle record, a feeder's hot path writes the record's own
        # fields instead (see the module docstring): the same state.
        written, record = setup()
        record.requests += 1
        record.responding = True
        assert state(written, record) == state(at_once, other)
        # And the end of the response, written out or through the list.
        record.responding = False
        at_once.response_complete(other)
        assert state(written, record) == state(at_once, other)


# -- ASGI-only mode's requests without a body (ConnectionsList.received) -----


def test_requests_received_whole_are_counted_and_walked_as_handling_records(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    from connlist.core.records import Received
    from connlist.observe.debug import connection_state

    body = lst.connect(client=("127.0.0.1", 1), server=("127.0.0.1", 80))
    lst.headers_complete(body, "POST", "/upload")
    scope = {"method": "GET", "path": "/a", "client": ("127.0.0.1", 2), "server": ("127.0.0.1", 80)}
    # The feeder writes the entries itself: key -> (arrival, scope).
    lst.received[7] = (T0 - 2, scope)
    lst.received[5] = (T0 - 1, dict(scope, path="/b"))
    # Counted like idle connections whose response is unfinished.
    assert (len(lst), lst.active_count, lst.idle_count, lst.timed_out_count) == (3, 1, 2, 0)
    assert (lst.headers_pending_count, lst.idle_responding_count) == (0, 2)
    # Walked after the linked records, in arrival order; never active.
    walked = lst.all()
    assert walked[0] is body and [conn.id for conn in walked[1:]] == [7, 5]
    assert [conn.id for conn in lst.idle()] == [7, 5]
    assert lst.active() == [body]
    first = walked[1]
    assert isinstance(first, Received)
    assert connection_state(first) == "handling"
    assert fields(first) == S(0.0, True, 1, True, False)
    assert (first.connected_at, first.client, first.server) == (T0 - 2, ("127.0.0.1", 2), ("127.0.0.1", 80))
    assert (first.method, first.path, first.responding, first.is_stalled) == ("GET", "/a", True, False)
    # Nothing to close through: close_idle and close_all reach only records with a handle.
    assert lst.close_idle() == 0 and lst.close_all() == 0
    # The app returned: the entry goes, and so does its record.
    del lst.received[7]
    assert not first.tracked and connection_state(first) == "closed"
    assert (len(lst), lst.idle_count, lst.idle_responding_count) == (2, 1, 1)
    assert [conn.id for conn in lst.all()] == [body.id, 5]


def test_walking_the_requests_received_whole_survives_their_end(lst: ConnectionsList) -> None:
    for key in range(1, 6):
        lst.received[key] = (T0, {"method": "GET", "path": f"/{key}"})
    seen = []
    for conn in lst.iter_all():
        seen.append(conn.id)
        # Requests end and begin while the caller has the loop.
        lst.received.pop(conn.id + 1, None)
        lst.received[100 + conn.id] = (T0, {})
    # Ended ones are skipped; the ones that began after the walk started are not walked.
    assert seen == [1, 3, 5]
    assert len(lst) == 3 + 3


def test_removed_walk_does_not_reach_the_requests_received_whole(lst: ConnectionsList) -> None:
    # A walk whose next record was removed too ends early (truncated): it does not go on to the entries.
    a, b, c = (lst.connect() for _ in range(3))
    lst.received[1] = (T0, {})
    walk = lst.iter_all()
    assert next(walk) is a
    lst.remove(a)
    lst.remove(b)
    assert list(walk) == []
    assert [conn.id for conn in lst.iter_all()] == [c.id, 1]


def settings(
    headers: float, request: float, send: float = 0.0, rate: float = 0.0, grace: float = 0.0
) -> Settings:
    """The options ``deadline`` reads, 0 (off) unless given."""
    return Settings(headers, request, send, rate, grace, 0)


def test_deadline_names_the_timeout_that_cuts_first_and_when(lst: ConnectionsList, clock: FakeClock) -> None:
    # The enforcer's settings: headers, request, send, min rate, grace.
    timeouts = settings(10.0, 30.0, 60.0, 100.0, 5.0)
    new = lst.connect()
    assert deadline(new, timeouts) == ("headers", T0 + 10)
    assert deadline(new, settings(0.0, 30.0)) == ("request", T0 + 30)  # headers timeout off
    assert deadline(new, settings(0.0, 0.0)) is None
    clock.advance(2)
    upload = lst.connect()
    lst.message_begin(upload)
    lst.headers_complete(upload)
    assert deadline(upload, timeouts) == ("request", T0 + 32)  # headers in: the request timeout
    lst.body_begin(upload)
    # The rate's deadline: grace, then 1 s per 100 bytes received; it moves on as they arrive.
    assert deadline(upload, timeouts) == ("rate", T0 + 7)
    upload.body_received += 1000
    assert deadline(upload, timeouts) == ("rate", T0 + 17)
    upload.body_received += 10_000
    assert deadline(upload, timeouts) == ("request", T0 + 32)  # ahead of the rate
    assert deadline(upload, settings(10.0, 30.0, 60.0, 0.0, 5.0)) == ("request", T0 + 32)  # rate off
    lst.message_complete(upload)
    assert deadline(upload, timeouts) is None  # handling: nothing runs
    clock.advance(1)
    lst.stall(upload, 5000)
    assert deadline(upload, timeouts) == ("send", T0 + 63)  # from its last progress
    assert deadline(upload, settings(10.0, 30.0, 0.0, 100.0, 5.0)) is None  # send timeout off
    # An expired connection is cut already: none.
    clock.now = T0 + 11
    assert lst.expired(10.0, 30.0) == [new]
    assert deadline(new, timeouts) is None


def test_let_go_counts_each_record_once_whatever_it_was_doing(lst: ConnectionsList, clock: FakeClock) -> None:
    # Closed to make room: out of the budget and timed out until removed,
    # from any state; a second evict, or one of a removed record, changes nothing.
    idle = lst.connect()
    lst.message_begin(idle)
    lst.headers_complete(idle, "GET", "/")
    lst.response_begin(idle)
    lst.message_complete(idle)  # idle, its response still being written
    untimed = lst.connect()
    lst.message_begin(untimed)
    lst.headers_complete(untimed, "POST", "/upload")  # its body not timed (no rate, or 100-continue)
    expired = lst.connect()
    removed = lst.connect()
    lst.remove(removed)
    clock.advance(2)
    assert lst.expired(1, 5) == [expired]  # a new connection silent past the headers timeout
    assert lst.counts() == {
        "all": 3,
        "idle": 1,
        "active": 1,
        "reading": 0,
        "writing": 2,
        "waiting": 0,
        "timed_out": 1,
        "upgraded": 0,
        "stalled": 0,
    }
    assert lst.occupied == 3
    for conn in (idle, untimed, expired, removed, idle, untimed):
        lst.evict(conn)
    assert (idle.evicted, untimed.evicted, expired.evicted, removed.evicted) == (True, True, True, False)
    assert lst.counts() == {
        "all": 3,
        "idle": 0,
        "active": 0,
        "reading": 0,
        "writing": 0,
        "waiting": 0,
        "timed_out": 3,
        "upgraded": 0,
        "stalled": 0,
    }
    assert lst.occupied == 0 and lst.idle_responding_count == 0
    assert [connection_state(conn) for conn in lst.iter_all()] == ["timed_out"] * 3
    # Out of the lists that choose what goes next: never chosen twice.
    assert idle_oldest(lst, clock.now) is None and headers_oldest(lst) is None
    assert idle_expired(lst, 0, clock.now, 10) == []
    for conn in (idle, untimed, expired):
        lst.remove(conn)
    assert lst.counts()["all"] == lst.counts()["timed_out"] == 0


def test_a_smaller_step_at_the_next_stall_keeps_the_largest(lst: ConnectionsList, clock: FakeClock) -> None:
    a = lst.connect()
    lst.stall(a, 1_000_000, (300_000, 0))
    clock.advance(1)
    stall_sample(lst, a, 1_000_000, clock.now, (300_000, 400_000))  # a window larger than all acknowledged
    assert a.out_step == 400_000
    lst.unstall(a)
    lst.stall(a, 500_000, (310_000, 0))  # acknowledged further, less than the window: the step stays
    assert (a.out_acked, a.out_step) == (310_000, 400_000)


def test_a_record_joins_the_idle_queue_when_its_response_ends(lst: ConnectionsList, clock: FakeClock) -> None:
    # Idle (its request fully received) but its response is still being
    # written: not in the idle queue, so never closed for idleness; it joins
    # at response_complete, keyed by that time.
    done, busy = lst.connect(), lst.connect()
    for conn in (done, busy):
        lst.message_begin(conn)
        lst.headers_complete(conn, "GET", "/")
        lst.response_begin(conn)
        lst.message_complete(conn)
    assert len(lst.idle_queue) == 0
    lst.response_complete(done)
    assert list(lst.idle_queue) == [done] and done.idle_since == clock.now
    clock.advance(6)
    assert idle_expired(lst, 5, clock.now, 10) == [done]
    lst.response_complete(busy)
    assert busy.idle_since == clock.now
    assert idle_expired(lst, 5, clock.now, 10) == []
    clock.advance(5)
    assert idle_expired(lst, 5, clock.now, 10) == [busy]


def test_a_response_that_ends_before_its_request_queues_the_record_at_message_complete(
    lst: ConnectionsList, clock: FakeClock
) -> None:
    # The app answered before the body was in: the idle time begins when the message ends.
    conn = lst.connect()
    lst.message_begin(conn)
    lst.headers_complete(conn, "POST", "/upload")
    lst.response_complete(conn)  # still active: not idle, not queued
    assert len(lst.idle_queue) == 0
    clock.advance(1)
    lst.message_complete(conn)
    assert list(lst.idle_queue) == [conn]


def test_a_response_on_a_removed_or_active_record_queues_nothing(lst: ConnectionsList) -> None:
    gone, pipelined = lst.connect(), lst.connect()
    lst.message(gone)
    lst.remove(gone)
    lst.response_complete(gone)
    lst.message(pipelined)
    lst.message_begin(pipelined)  # the next request began before this response ended
    lst.response_complete(pipelined)
    assert len(lst.idle_queue) == 0


def test_body_slowest_looks_at_the_oldest_bodies_only(lst: ConnectionsList, clock: FakeClock) -> None:
    first = receiving_body(lst, clock)
    clock.advance(1)
    behind = receiving_body(lst, clock)
    first.body_received += 1000  # ahead of 100 bytes/s
    clock.advance(1)
    assert body_slowest(lst, 100, clock.now, 2) is behind
    assert body_slowest(lst, 100, clock.now, 1) is None  # only the first looked at, and it is ahead
    assert body_slowest(lst, 100, clock.now, 2, excused=lambda conn: conn is behind) is None
