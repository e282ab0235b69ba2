"""Upgraded connections (issue #36) in the list, the option, the enforcer, the hand-over, the views.

The list's rules are the state machine's too (tests/test_connections_state_machine.py);
here each is stated once, with the views and metrics that show them.  Real
servers are tests/test_websockets.py's.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from connlist.core.checks import default_max_upgraded
from connlist.core.connections import ConnectionsList, connection_state
from connlist.core.enforcer import Enforcer
from connlist.core.kinds import Settings, resolve
from connlist.core.logs import Summary
from connlist.observe import page
from connlist.observe.debug import budget_view, describe
from connlist.prometheus import ConnlistMetrics, Exporter
from connlist.servers.seam import REFUSED, UPGRADED
from connlist.servers.uvicorn import websocket as uvicorn_websocket
from tests.fakes import RESPONSE_503, FakeClock, MemoryHandle, MockLoop

# -- the list ------------------------------------------------------------------------


def test_an_upgraded_connection_is_out_of_http_and_in_the_list_until_removed(clock: FakeClock) -> None:
    lst = ConnectionsList(clock)
    ws, other = lst.connect(), lst.connect()
    lst.message(ws)
    lst.response_complete(ws)
    assert ws in list(lst.idle_queue)
    clock.now += 2
    lst.upgrade(ws, "GET", "/chat")
    assert connection_state(ws) == "upgraded" and ws.is_upgraded and ws.tracked
    assert ws not in list(lst.idle_queue) and not ws.is_active and ws.headers_completed
    assert (ws.out_since, ws.last_message_start, ws.method, ws.path) == (clock.now, clock.now, "GET", "/chat")
    assert lst.all() == [other, ws] and lst.idle() == [] and lst.active() == [other]
    assert len(lst) == lst.occupied == 2 and lst.upgraded_count == 1
    counts = lst.counts()
    assert (counts["all"], counts["upgraded"], counts["idle"], counts["active"]) == (2, 1, 0, 1)
    # No HTTP event moves it: the ring's events are no-ops on it.
    for event in (lst.message_begin, lst.message_complete, lst.message, lst.time_out, lst.evict, lst.linger):
        event(ws)
    lst.stall(ws, 100)
    assert connection_state(ws) == "upgraded" and lst.counts() == counts and lst.occupied == 2
    # Upgraded twice: nothing more.
    lst.upgrade(ws)
    assert lst.upgraded_count == 1
    lst.remove(ws)
    assert connection_state(ws) == "closed" and not ws.tracked and not ws.is_upgraded
    assert lst.upgraded_count == 0 and len(lst) == lst.occupied == 1
    lst.remove(ws)  # idempotent
    assert lst.occupied == 1


def test_a_connection_let_go_or_removed_is_never_upgraded(clock: FakeClock) -> None:
    lst = ConnectionsList(clock)
    evicted, removed = lst.connect(), lst.connect()
    lst.evict(evicted)
    lst.remove(removed)
    for conn in (evicted, removed):
        lst.upgrade(conn)
        assert not conn.is_upgraded
    assert lst.upgraded_count == 0 and lst.occupied == 0


def test_the_view_describes_an_upgraded_connection(clock: FakeClock) -> None:
    lst = ConnectionsList(clock)
    ws = lst.connect(("127.0.0.1", 4000))
    lst.message(ws)
    lst.upgrade(ws, "GET", "/ws")
    clock.now += 1.5
    entry = describe(ws, clock.now, deadline=lambda conn: None)
    assert entry["state"] == "upgraded" and entry["path"] == "/ws" and entry["timeout"] is None
    assert entry["duration"] == 1.5


# -- the option ----------------------------------------------------------------------


def test_max_upgraded_defaults_to_half_the_budget() -> None:
    assert resolve(max_connections=832).max_upgraded == 416
    assert resolve(max_connections=1).max_upgraded == 1
    assert resolve(max_connections=0).max_upgraded == 0
    assert Settings(max_connections=160).max_upgraded == 80 == default_max_upgraded(160)
    assert resolve(max_connections=100, max_upgraded=100).max_upgraded == 100
    assert resolve(max_connections=0, max_upgraded=7).max_upgraded == 7


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (True, TypeError, "max_upgraded must be None or an int, got bool"),
        ("10", TypeError, "max_upgraded must be None or an int, got str"),
        (1.5, TypeError, "max_upgraded must be None or an int, got float"),
        (-1, ValueError, "max_upgraded must be >= 0"),
        (11, ValueError, "max_upgraded (11) must not be greater than max_connections (10)"),
    ],
)
def test_max_upgraded_is_validated(value: Any, error: type[Exception], words: str) -> None:
    with pytest.raises(error) as raised:
        resolve(max_connections=10, max_upgraded=value)
    assert words in str(raised.value)


def test_a_misspelled_max_upgraded_is_named() -> None:
    with pytest.raises(TypeError, match="did you mean 'max_upgraded'"):
        resolve(max_upgrades=3)  # type: ignore[call-arg]


# -- the enforcer --------------------------------------------------------------------


def enforcer(clock: FakeClock, **options: Any) -> Enforcer:
    return Enforcer(resolve(**options), clock=clock, loop=MockLoop(clock))


def test_upgrades_within_the_share_are_held_and_past_it_refused_with_503(clock: FakeClock) -> None:
    e = enforcer(clock, max_connections=10, max_upgraded=2)
    records = []
    for _ in range(3):
        handle = MemoryHandle()
        record = e.join(("127.0.0.1", 5000), handle=handle)
        e.connections.message(record)
        records.append((record, handle))
    answers = [e.upgrade(record, "GET", "/ws") for record, _ in records]
    assert answers == [True, True, False]
    for record, handle in records[:2]:
        assert record.is_upgraded and record.handle is None and not handle.transport.buffer
    refused, handle = records[2]
    assert not refused.is_upgraded and refused.evicted and connection_state(refused) == "timed_out"
    assert handle.transport.buffer == RESPONSE_503 and handle.transport.closed
    assert (e.totals.upgrades, e.totals.upgrades_refused) == (2, 1)
    assert e.connections.occupied == 2  # the refused one is on its way out
    view = budget_view(e)
    assert (view["upgraded"], view["max_upgraded"], view["occupied"]) == (2, 2, 2)
    # A websocket that closes frees its place in the share.
    e.connections.remove(records[0][0])
    fourth = e.join(handle=MemoryHandle())
    assert e.upgrade(fourth)


def test_a_connection_let_go_meanwhile_keeps_its_handle_for_the_linger(clock: FakeClock) -> None:
    e = enforcer(clock, max_connections=10)
    handle = MemoryHandle()
    record = e.join(handle=handle)
    e.connections.evict(record)
    assert e.upgrade(record) and not record.is_upgraded and record.handle is handle
    assert e.totals.upgrades == 0


def test_no_share_of_their_own_bounds_nothing(clock: FakeClock) -> None:
    e = enforcer(clock, max_connections=0)
    assert e.settings.max_upgraded == 0
    assert all(e.upgrade(e.join(handle=MemoryHandle())) for _ in range(5))
    assert e.connections.upgraded_count == 5


def test_the_summary_says_how_many_upgrades_were_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="connlist")
    summary = Summary()
    for port in range(2):
        summary.add("upgrade_refused", ("127.0.0.1", port), str, room=True)
    summary.flush(100.0)
    assert [r.getMessage() for r in caplog.records] == [
        "connlist: 2 websocket upgrades refused with 503 (max_upgraded); e.g. 127.0.0.1:0, 127.0.0.1:1"
    ]


# -- the hand-over (connlist.servers.uvicorn.websocket) ----------------------------------------


class _Base:
    def __init__(self) -> None:
        self.lost: Exception | str | None = "not lost"

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc


class _Transport:
    def __init__(self, protocol: object) -> None:
        self.protocol = protocol

    def get_protocol(self) -> object:
        return self.protocol


class _Http:
    """What ``hand_over`` reads of connlist's uvicorn protocol."""

    def __init__(self, e: Enforcer) -> None:
        self._connlist = e
        self._connlist_record = e.join(handle=MemoryHandle())
        self._connlist_phase = 0
        self.ws_protocol_class: type = _Base
        self.transport = _Transport(self)


def test_the_websocket_protocol_made_at_the_hand_over_removes_the_record_when_lost(clock: FakeClock) -> None:
    e = enforcer(clock, max_connections=10, max_upgraded=1)
    http = _Http(e)
    record = http._connlist_record

    def hand() -> None:
        http.transport.protocol = http.ws_protocol_class()

    uvicorn_websocket.hand_over(http, hand, "GET", "/ws")
    websocket = http.transport.protocol
    assert isinstance(websocket, uvicorn_websocket.Held) and isinstance(websocket, _Base)
    assert type(websocket).__name__ == "_Base" and http.ws_protocol_class is _Base
    assert http._connlist_phase == UPGRADED and record.is_upgraded
    assert uvicorn_websocket.holding(_Base) is type(websocket)  # one class per class
    websocket.connection_lost(None)
    assert websocket.lost is None and not record.tracked
    # Past the share: nothing is handed over.
    second = _Http(e)
    e.connections.upgrade(e.join())  # the share is taken
    uvicorn_websocket.hand_over(second, hand, "GET", "/ws")
    assert second._connlist_phase == REFUSED and second.transport.protocol is second


def test_a_hand_over_connlist_does_not_know_drops_the_record_and_says_so_once(
    clock: FakeClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uvicorn_websocket, "_warned", False)
    caplog.set_level(logging.WARNING, logger="connlist")
    e = enforcer(clock, max_connections=10)
    for makes in (False, True):
        http = _Http(e)
        made: list[Any] = []

        def hand(http: _Http = http, made: list[Any] = made, makes: bool = makes) -> None:
            # A uvicorn that keeps the transport on its HTTP protocol (making a websocket protocol, or not).
            if makes:
                made.append(http.ws_protocol_class())

        uvicorn_websocket.hand_over(http, hand, "GET", "/ws")
        assert not http._connlist_record.tracked
        assert all(websocket._connlist_held is None for websocket in made) and len(made) == makes
    assert e.connections.occupied == 0
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "websockets leave the list at their upgrade" in warnings[0]


def test_request_path_drops_the_query() -> None:
    assert uvicorn_websocket.request_path(b"/chat/room?token=secret") == "/chat/room"


# -- the page and the metrics ----------------------------------------------------------


def test_the_page_shows_the_websockets_share() -> None:
    budget = {"max_connections": 160, "occupied": 90, "pressure": 0.56, "upgraded": 80, "max_upgraded": 80}
    line = page._budget_line(budget)
    assert line == "budget 90 of 160 connections (pressure 56%), websockets 80 of 80 (max_upgraded)"


def test_prometheus_counts_the_refused_upgrades_and_the_upgraded_connections(clock: FakeClock) -> None:
    registry = CollectorRegistry()
    metrics = ConnlistMetrics(registry)
    e = enforcer(clock, max_connections=10, max_upgraded=1)
    for _ in range(3):
        e.upgrade(e.join(handle=MemoryHandle()))
    Exporter(metrics).refresh(e)
    assert registry.get_sample_value("connlist_upgrades_refused_total") == 2
    assert registry.get_sample_value("connlist_connections", {"state": "upgraded"}) == 1
