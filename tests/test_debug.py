"""The debug view's Python API on a ConnectionsList with a fake clock: snapshot(), the states, the lists.

The endpoint itself is tested in-process in tests/test_debug_endpoint.py
and on real uvicorn servers in tests/test_debug_server.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connlist.core.connections import STATES, Connection, ConnectionsList, connection_state
from connlist.core.enforcer import Enforcer
from connlist.core.kinds import resolve
from connlist.observe.debug import (
    DEFAULT_LIMIT,
    IDLE_SCAN,
    PATH_MAX,
    describe,
    parse_limit,
    snapshot,
    snapshot_steps,
)
from connlist.observe.slices import STEP
from tests.fakes import T0, FakeClock, MemoryHandle

PATH = "/_connections"
REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never loopback


def make_enforcer(clock: FakeClock) -> Enforcer:
    return Enforcer(resolve(headers_timeout=10, request_timeout=20), clock=clock)


def counts_by_walking(lst: ConnectionsList) -> dict[str, int]:
    """The counts the O(1) counters must match, from each connection's state."""
    states = [connection_state(conn) for conn in lst.iter_all()]
    return {
        "all": len(states),
        "idle": sum(state in ("handling", "idle") for state in states),
        "active": sum(state in ("new", "reading_headers", "reading_body") for state in states),
        "reading": sum(state in ("new", "reading_headers") for state in states),
        "writing": sum(state in ("reading_body", "handling") for state in states),
        "waiting": states.count("idle"),
        "timed_out": states.count("timed_out"),
        "upgraded": states.count("upgraded"),
        "stalled": states.count("stalled"),
    }


def by_id(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {entry["id"]: entry for entry in entries}


# -- unit: states, lists, orders, counts ---------------------------------------


CONNECTED = ("timed_out", "idle", "reading_body", "new", "handling", "reading_headers")


def build_one_of_each(clock: FakeClock, enforcer: Enforcer) -> dict[str, Connection]:
    """One connection in each state; at the end the clock reads T0 + 14.5.

    Connected in the order of CONNECTED: the first at T0 (it sends nothing
    and runs out of headers time: 10 s), the others at T0 + 5, + 6, ... + 9.
    Messages begin at T0 + 10, + 11, ... in another order.
    """
    lst = enforcer.connections
    conns: dict[str, Connection] = {}
    for i, name in enumerate(CONNECTED):
        clock.now = T0 if i == 0 else T0 + 4 + i
        conns[name] = lst.connect(client=("127.0.0.1", 5000 + i), server=("127.0.0.1", 80))
    for i, name in enumerate(("reading_headers", "idle", "handling", "reading_body")):
        clock.now = T0 + 10 + i
        lst.message_begin(conns[name])
    for name in ("idle", "handling", "reading_body"):
        lst.headers_complete(conns[name])
        conns[name].method, conns[name].path = "POST", f"/{name}"
        lst.response_begin(conns[name])
    for name in ("idle", "handling"):
        lst.message_complete(conns[name])
    lst.response_complete(conns["idle"])  # its response went out
    clock.now = T0 + 14.5
    assert lst.expired(enforcer.headers_timeout, enforcer.request_timeout) == [conns["timed_out"]]
    return conns


def test_each_state_in_the_right_lists_with_the_right_fields() -> None:
    clock = FakeClock()
    enforcer = make_enforcer(clock)
    conns = build_one_of_each(clock, enforcer)
    for name, conn in conns.items():
        assert connection_state(conn) == name
    data = snapshot(enforcer)
    ids = {name: conn.id for name, conn in conns.items()}
    # all: connection order; active: message start order (the new one started at connect).
    assert [e["id"] for e in data["all"]] == [ids[n] for n in CONNECTED]
    assert [e["id"] for e in data["active"]] == [ids[n] for n in ("new", "reading_headers", "reading_body")]
    assert [e["id"] for e in data["idle"]] == [ids[n] for n in ("idle", "handling")]
    # The Python API sees the same lists.
    assert [c.id for c in enforcer.connections.all()] == [e["id"] for e in data["all"]]
    assert [c.id for c in enforcer.connections.active()] == [e["id"] for e in data["active"]]
    assert [c.id for c in enforcer.connections.idle()] == [e["id"] for e in data["idle"]]
    entries = by_id(data["all"])
    assert {name: entries[ids[name]]["state"] for name in ids} == {name: name for name in ids}
    assert entries[ids["new"]] == {
        "id": ids["new"],
        "client": "127.0.0.1:5003",
        "server": "127.0.0.1:80",
        "state": "new",
        "age": 7.5,
        "duration": 7.5,
        "timeout": "headers",  # 10 s from its connect, at T0 + 7
        "time_left": 2.5,
        "headers_completed": False,
        "requests": 0,
        "unread": 0,
        "method": None,
        "path": None,
    }
    assert entries[ids["reading_body"]] | {"id": 0} == {
        "id": 0,
        "client": "127.0.0.1:5002",
        "server": "127.0.0.1:80",
        "state": "reading_body",
        "age": 8.5,
        "duration": 1.5,  # began at T0 + 13
        "timeout": "request",  # 20 s from then
        "time_left": 18.5,
        "headers_completed": True,
        "requests": 0,
        "unread": 0,
        "method": "POST",
        "path": "/reading_body",
    }
    assert (entries[ids["reading_headers"]]["timeout"], entries[ids["reading_headers"]]["time_left"]) == (
        "headers",
        5.5,
    )
    for name in ("idle", "handling", "timed_out"):
        assert (entries[ids[name]]["timeout"], entries[ids[name]]["time_left"]) == (None, None)
    for name in ("idle", "handling"):
        assert entries[ids[name]]["duration"] is None
        assert entries[ids[name]]["requests"] == 1
    assert entries[ids["timed_out"]]["duration"] == 14.5
    assert entries[ids["reading_headers"]]["duration"] == 4.5
    assert data["counts"] == {
        "all": 6,
        "idle": 2,
        "active": 3,
        "reading": 2,
        "writing": 2,
        "waiting": 1,
        "timed_out": 1,
        "upgraded": 0,
        "stalled": 0,
    }
    assert data["counts"] == counts_by_walking(enforcer.connections)
    assert data["truncated"] is False and data["limit"] == DEFAULT_LIMIT
    assert (data["pid"], data["mode"], data["headers_timeout"], data["request_timeout"]) == (
        os.getpid(),
        "asgi",
        10.0,
        20.0,
    )
    # A later message moves a connection to the tail of active.
    enforcer.connections.message_begin(conns["new"])
    assert connection_state(conns["new"]) == "reading_headers"
    assert [e["id"] for e in snapshot(enforcer)["active"]] == [
        ids[n] for n in ("reading_headers", "reading_body", "new")
    ]
    # Gone: in no list, and the state says so.
    enforcer.connections.remove(conns["timed_out"])
    assert connection_state(conns["timed_out"]) == "closed"
    assert snapshot(enforcer)["counts"]["timed_out"] == 0
    json.dumps(snapshot(enforcer))  # JSON-ready


def test_limit_caps_every_list_and_counts_stay_exact() -> None:
    clock = FakeClock()
    enforcer = make_enforcer(clock)
    lst = enforcer.connections
    conns = [lst.connect(client=("127.0.0.1", 6000 + i), server=None) for i in range(9)]
    for conn in conns[:5]:
        lst.message_begin(conn)
        lst.headers_complete(conn)
        lst.message_complete(conn)
    data = snapshot(enforcer, limit=2)
    assert [len(data[name]) for name in ("all", "idle", "active")] == [2, 2, 2]
    assert [e["id"] for e in data["active"]] == [conns[5].id, conns[6].id]
    assert data["truncated"] is True and data["limit"] == 2
    assert data["counts"] == {
        "all": 9,
        "idle": 5,
        "active": 4,
        "reading": 4,
        "writing": 0,
        "waiting": 5,
        "timed_out": 0,
        "upgraded": 0,
        "stalled": 0,
    }
    empty = snapshot(enforcer, limit=0)
    assert (empty["all"], empty["idle"], empty["active"], empty["truncated"]) == ([], [], [], True)
    assert empty["counts"] == data["counts"]
    exact = snapshot(enforcer, limit=9)
    assert exact["truncated"] is False and len(exact["all"]) == 9
    for bad in (-1, 1.5, "10", True, None):
        with pytest.raises(ValueError, match="limit"):
            snapshot(enforcer, limit=bad)  # type: ignore[arg-type]


def test_snapshot_work_is_bounded_by_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 5,000 connections, the walks stop after what the limit needs (no timing involved)."""
    enforcer = make_enforcer(FakeClock())
    lst = enforcer.connections
    # A flood: 4,990 new connections, then 10 idle ones at the end of ``all``.
    conns = [lst.connect() for _ in range(5000)]
    for conn in conns[-10:]:
        lst.message_begin(conn)
        lst.message_complete(conn)
    # The connections each walk visits, walk by walk.
    walks: dict[str, list[int]] = {"all": [], "active": []}
    iter_all, iter_active = ConnectionsList.iter_all, ConnectionsList.iter_active

    def counting(name: str, inner: Any) -> Any:
        def wrapper(self: ConnectionsList) -> Iterator[Connection]:
            walks[name].append(0)
            for conn in inner(self):
                walks[name][-1] += 1
                yield conn

        return wrapper

    monkeypatch.setattr(ConnectionsList, "iter_all", counting("all", iter_all))
    monkeypatch.setattr(ConnectionsList, "iter_active", counting("active", iter_active))

    data = snapshot(enforcer, limit=3)
    # all and active: 3 each; idle: looked for among the first IDLE_SCAN * 3 only.  Then the
    # one walk of every connection, unread_bytes (as the counts' split takes one), and no other.
    assert walks == {"all": [IDLE_SCAN * 3 + 1, 5000], "active": [3]}
    assert (len(data["all"]), len(data["active"]), data["idle"]) == (3, 3, [])
    assert data["truncated"] is True
    assert data["counts"]["all"] == 5000 and data["counts"]["waiting"] == 10

    walks.update(all=[], active=[])
    data = snapshot(enforcer, limit=500)  # scans 5,000: finds the idle ones
    assert [e["id"] for e in data["idle"]] == [c.id for c in conns[-10:]]
    assert walks == {"all": [5000, 5000], "active": [500]}

    walks.update(all=[], active=[])
    data = snapshot(enforcer, limit=0)
    assert walks == {"all": [1, 5000], "active": []}
    assert data["counts"]["reading"] == 4990


class Holding(MemoryHandle):
    """A handle as connlist's server protocols are one: what it holds unparsed, in ``_connlist_unread``."""

    def __init__(self, unread: bytes | None) -> None:
        super().__init__()
        self._connlist_unread = unread


def test_unread_is_what_each_protocol_holds_and_the_worker_sums_every_connection() -> None:
    enforcer = make_enforcer(FakeClock())
    lst = enforcer.connections
    pipelined = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    # Held, none held, a handle that is not connlist's protocol, no handle at all.
    for handle in (Holding(pipelined), Holding(None), MemoryHandle(), None):
        lst.connect(handle=handle)
    beyond = [lst.connect(handle=Holding(b"x" * 100)) for _ in range(3)]
    data = snapshot(enforcer, limit=4)
    assert [entry["unread"] for entry in data["all"]] == [len(pipelined), 0, 0, 0]
    # The worker's sum is every connection's, those past the limit too.
    assert data["truncated"] and data["unread_bytes"] == len(pipelined) + 300
    # Read when asked: what the protocols hold now.
    beyond[0].handle._connlist_unread = None  # type: ignore[union-attr]
    assert snapshot(enforcer, limit=0)["unread_bytes"] == len(pipelined) + 200
    json.dumps(data)  # JSON-ready


def test_long_paths_are_cut() -> None:
    enforcer = make_enforcer(FakeClock())
    conn = enforcer.connections.connect()
    conn.path = "/" + "a" * 1000
    (entry,) = snapshot(enforcer)["all"]
    assert len(entry["path"]) == PATH_MAX and entry["path"].endswith("...")


def test_requests_received_whole_are_listed_and_counted_as_handling() -> None:
    # ASGI-only mode's requests without a body: entries of the list, each
    # shown and counted like a connection handling its one request.
    clock = FakeClock()
    enforcer = make_enforcer(clock)
    lst = enforcer.connections
    body = lst.connect(client=("127.0.0.1", 1), server=("127.0.0.1", 80))
    lst.headers_complete(body, "POST", "/upload")
    scope = {
        "method": "GET",
        "path": "/" + "a" * 1000,
        "client": ("127.0.0.1", 2),
        "server": ("127.0.0.1", 80),
    }
    lst.received[42] = (T0 + 1, scope)
    clock.now = T0 + 3.5
    data = snapshot(enforcer)
    assert [e["id"] for e in data["all"]] == [body.id, 42]
    assert [e["id"] for e in data["idle"]] == [42]
    assert [e["id"] for e in data["active"]] == [body.id]
    assert (
        data["all"][1]
        == data["idle"][0]
        == {
            "id": 42,
            "client": "127.0.0.1:2",
            "server": "127.0.0.1:80",
            "state": "handling",
            "age": 2.5,
            "duration": None,
            "timeout": None,
            "time_left": None,
            "headers_completed": True,
            "requests": 1,
            "unread": 0,
            "method": "GET",
            "path": "/" + "a" * (PATH_MAX - 4) + "...",
        }
    )
    assert data["counts"] == {
        "all": 2,
        "idle": 1,
        "active": 1,
        "reading": 0,
        "writing": 2,
        "waiting": 0,
        "timed_out": 0,
        "upgraded": 0,
        "stalled": 0,
    }
    assert data["counts"] == counts_by_walking(lst)
    assert data["truncated"] is False
    # One listed, both counted.
    assert snapshot(enforcer, limit=1)["truncated"] is True
    del lst.received[42]
    assert snapshot(enforcer)["counts"]["writing"] == 1


# -- unit: the O(1) counts always match a walk (hypothesis) --------------------

OPS = ("connect", "begin", "headers", "complete", "respond", "remove", "expire")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(0, 5), st.booleans(), st.sampled_from([0.0, 0.4, 1.1])),
        max_size=60,
    )
)
def test_counts_match_the_states_after_any_events(steps: list[tuple[str, int, bool, float]]) -> None:
    clock = FakeClock()
    enforcer = Enforcer(resolve(headers_timeout=0.5, request_timeout=1.0), clock=clock)
    lst = enforcer.connections
    conns: list[Connection] = []
    for op, index, flag, delay in steps:
        clock.now += delay
        conn = conns[index % len(conns)] if conns else None
        if op == "connect" or conn is None:
            conns.append(lst.connect())
        elif op == "begin":
            lst.message_begin(conn)
        elif op == "headers":
            lst.headers_complete(conn)
        elif op == "complete":
            lst.message_complete(conn)
        elif op == "respond":
            if flag:
                lst.response_begin(conn)
            else:
                lst.response_complete(conn)
        elif op == "remove":
            lst.remove(conn)
        else:
            lst.expired(enforcer.headers_timeout, enforcer.request_timeout)
        data = snapshot(enforcer, limit=3)
        assert data["counts"] == counts_by_walking(lst)
        for entry in data["active"]:
            assert entry["state"] in ("new", "reading_headers", "reading_body")
        for entry in data["idle"]:
            assert entry["state"] in ("handling", "idle")
        for entry in data["all"]:
            assert entry["state"] in STATES
        assert data["truncated"] is (len(lst) > 3 or lst.active_count > 3 or lst.idle_count > 3)


def test_parse_limit() -> None:
    assert parse_limit(b"") == DEFAULT_LIMIT
    assert parse_limit(b"limit=0") == 0
    assert parse_limit(b"limit=7&limit=3") == 3
    assert parse_limit(b"limit=007") == 7
    with pytest.raises(ValueError, match="ASCII"):
        parse_limit("limit=\u00e9".encode())


def test_describe_formats_the_server_address_with_or_without_a_cache() -> None:
    clock = FakeClock()
    lst = make_enforcer(clock).connections
    conn = lst.connect(client=("127.0.0.1", 5000), server=("::1", 8000))
    listed = lst.connect(server=["127.0.0.1", 80])  # a list, as some ASGI servers give: not hashable
    assert describe(conn, clock.now)["server"] == "[::1]:8000"
    servers: dict[Any, str | None] = {}
    assert describe(conn, clock.now, servers)["server"] == "[::1]:8000"
    assert servers == {("::1", 8000): "[::1]:8000"}
    assert describe(listed, clock.now, servers)["server"] == "127.0.0.1:80"
    assert list(servers) == [("::1", 8000)]


def test_a_connection_removed_between_steps_is_left_out() -> None:
    clock = FakeClock()
    enforcer = make_enforcer(clock)
    lst = enforcer.connections
    conns = [lst.connect(client=("127.0.0.1", i)) for i in range(2 * STEP)]
    # The walk pauses at every STEP-th connection of ``all`` (twice), then of
    # ``active``, then of ``all`` again (unread_bytes); the server closes one
    # while the caller has the loop.
    removals = {0: conns[STEP - 1], 2: conns[STEP]}
    steps = snapshot_steps(enforcer, limit=len(conns))
    pauses = 0
    with pytest.raises(StopIteration) as done:
        while True:
            next(steps)
            if pauses in removals:
                lst.remove(removals[pauses])
            pauses += 1
    assert pauses == 4
    data = done.value.value
    ids = [conn.id for conn in conns]
    # Removed at the pause in ``all``: in neither list.  Removed at the pause
    # in ``active``: listed in ``all`` (described before), not in ``active``.
    assert [e["id"] for e in data["all"]] == ids[: STEP - 1] + ids[STEP:]
    assert [e["id"] for e in data["active"]] == ids[: STEP - 1] + ids[STEP + 1 :]
    assert data["counts"]["all"] == 2 * STEP  # the counts are those of the start
