"""The debug endpoint and the Python API behind it: snapshot(), the states, the lists, access control.

Unit tests drive a ConnectionsList with a fake clock; the endpoint is tested
in-process with httpx's ASGITransport (which sets scope["client"], so
non-loopback clients can be simulated) and against real uvicorn servers on
127.0.0.1, both parsers, with raw sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.types import Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from connlist import ConnectionsMiddleware
from connlist.connections import Connection, ConnectionsList
from connlist.debug import (
    DEFAULT_LIMIT,
    IDLE_SCAN,
    MAX_LIMIT,
    PATH_MAX,
    STATES,
    connection_state,
    is_loopback,
    parse_limit,
    snapshot,
)
from connlist.enforcer import Enforcer
from connlist.settings import resolve
from tests.servers import (
    INTEGRATED,
    PLAIN,
    Running,
    close_sockets,
    connect,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)

T0 = 1000.0
PATH = "/_connections"
REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never loopback


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


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
        conns[name].responding = True
    for name in ("idle", "handling"):
        lst.message_complete(conns[name])
    conns["idle"].responding = False  # its response went out
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
        "headers_completed": False,
        "requests": 0,
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
        "headers_completed": True,
        "requests": 0,
        "method": "POST",
        "path": "/reading_body",
    }
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
    visited = {"all": 0, "active": 0}
    iter_all, iter_active = ConnectionsList.iter_all, ConnectionsList.iter_active

    def counting(name: str, inner: Any) -> Any:
        def wrapper(self: ConnectionsList) -> Iterator[Connection]:
            for conn in inner(self):
                visited[name] += 1
                yield conn

        return wrapper

    monkeypatch.setattr(ConnectionsList, "iter_all", counting("all", iter_all))
    monkeypatch.setattr(ConnectionsList, "iter_active", counting("active", iter_active))

    data = snapshot(enforcer, limit=3)
    # all and active: 3 each; idle: looked for among the first IDLE_SCAN * 3 only.
    assert visited == {"all": IDLE_SCAN * 3 + 1, "active": 3}
    assert (len(data["all"]), len(data["active"]), data["idle"]) == (3, 3, [])
    assert data["truncated"] is True
    assert data["counts"]["all"] == 5000 and data["counts"]["waiting"] == 10

    visited.update(all=0, active=0)
    data = snapshot(enforcer, limit=500)  # scans 5,000: finds the idle ones
    assert [e["id"] for e in data["idle"]] == [c.id for c in conns[-10:]]
    assert visited == {"all": 5000, "active": 500}

    visited.update(all=0, active=0)
    data = snapshot(enforcer, limit=0)
    assert visited == {"all": 1, "active": 0}
    assert data["counts"]["reading"] == 4990


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
            "headers_completed": True,
            "requests": 1,
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
            conn.responding = flag
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


# -- the endpoint in-process (httpx ASGITransport) ------------------------------


class App:
    """A small app that records the paths it was called for."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        self.calls.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"3")]})
        await send({"type": "http.response.body", "body": b"app"})


def request(
    app: Any,
    method: str = "GET",
    url: str = PATH,
    *,
    client: tuple[str, int] = ("127.0.0.1", 50000),
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            return await http.request(method, url, headers=headers)

    return asyncio.run(run())


def test_remote_clients_get_a_plain_404_and_the_app_is_not_called() -> None:
    app = App()
    mw = ConnectionsMiddleware(app)
    for method in ("GET", "HEAD", "POST", "DELETE"):
        response = request(mw, method, client=REMOTE)
        assert response.status_code == 404, method
        assert response.headers["content-type"] == "text/plain; charset=utf-8"
        assert response.content == (b"" if method == "HEAD" else b"Not Found")
    response = request(mw, url=PATH + "?limit=5", client=("10.0.0.1", 1))
    assert response.status_code == 404
    assert app.calls == []
    # Other paths still reach the app; loopback clients are served.
    assert request(mw, url="/other", client=REMOTE).content == b"app"
    assert app.calls == ["/other"]
    assert request(mw).json()["mode"] == "asgi"
    assert app.calls == ["/other"]


@pytest.mark.parametrize(
    ("host", "served"),
    [
        ("127.0.0.1", True),
        ("127.45.6.7", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("203.0.113.7", False),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1", False),
        ("testclient", False),
        ("", False),
    ],
)
def test_who_counts_as_loopback(host: str, served: bool) -> None:
    assert is_loopback((host, 1234)) is served
    app = App()
    response = request(ConnectionsMiddleware(app), client=(host, 1234))
    assert response.status_code == (200 if served else 404)
    assert app.calls == []


def test_no_client_address_is_not_loopback() -> None:
    assert is_loopback(None) is False  # a unix socket
    assert is_loopback(()) is False
    assert is_loopback([b"127.0.0.1", 1]) is False


def test_token_is_required_from_everyone_and_compared_exactly() -> None:
    app = App()
    mw = ConnectionsMiddleware(app, debug_token="s3cret-token")
    assert request(mw).status_code == 404  # loopback still needs it
    assert request(mw, client=REMOTE).status_code == 404
    for value in ("Bearer s3cret-token", "bearer s3cret-token", "BEARER   s3cret-token  "):
        for client in (("127.0.0.1", 1), REMOTE):
            response = request(mw, headers={"Authorization": value}, client=client)
            assert response.status_code == 200, (value, client)
            assert response.json()["counts"]["all"] == 0
    for value in (
        "Bearer s3cret-toke",
        "Bearer s3cret-token2",
        "Bearer S3CRET-TOKEN",
        "Bearer",
        "Basic s3cret-token",
        "s3cret-token",
        "Bearer  ",
    ):
        assert request(mw, headers={"Authorization": value}).status_code == 404, value
    # Wrong token with another method: still 404, not 405.
    assert request(mw, "POST", headers={"Authorization": "Bearer nope"}).status_code == 404
    assert app.calls == []


def test_debug_path_none_turns_the_endpoint_off() -> None:
    app = App()
    mw = ConnectionsMiddleware(app, debug_path=None)
    assert request(mw).content == b"app"
    assert app.calls == [PATH]
    custom = ConnectionsMiddleware(app, debug_path="/internal/conns")
    assert request(custom, url="/internal/conns").json()["mode"] == "asgi"
    assert request(custom).content == b"app"


def test_only_get_and_head_other_methods_get_405() -> None:
    app = App()
    mw = ConnectionsMiddleware(app)
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        response = request(mw, method)
        assert response.status_code == 405, method
        assert response.headers["allow"] == "GET, HEAD"
        assert response.json() == {"error": "method not allowed"}
    head = request(mw, "HEAD")
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(request(mw).content)
    assert head.headers["content-type"] == "application/json"
    assert head.headers["cache-control"] == "no-store"
    assert app.calls == []


@pytest.mark.parametrize(
    "query",
    [
        "limit=-1",
        "limit=abc",
        "limit=",
        "limit",
        "limit=1.5",
        "limit=1e3",
        "limit=%C2%B2",  # a superscript two: str.isdigit() says yes
        "limit=%FF",
        "limit=+5",
        "limit=1234567890123",
        "limit=10001",
        "limit=999999999999",
        "limt=5",
        "limit=5&pretty=1",
    ],
)
def test_bad_query_values_get_400_with_a_json_error(query: str) -> None:
    app = App()
    mw = ConnectionsMiddleware(app)
    response = request(mw, url=f"{PATH}?{query}")
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert isinstance(error, str) and ("limit" in error or "parameter" in error)
    assert app.calls == []


def test_limit_has_a_maximum_and_the_400_names_it() -> None:
    mw = ConnectionsMiddleware(App())
    response = request(mw, url=f"{PATH}?limit=10001")
    assert response.status_code == 400
    assert response.json() == {"error": f"limit must be a whole number from 0 to {MAX_LIMIT}"}
    assert MAX_LIMIT == 10_000
    assert request(mw, url=f"{PATH}?limit=10000").json()["limit"] == MAX_LIMIT
    with pytest.raises(ValueError, match="from 0 to 10000"):
        mw.snapshot(limit=MAX_LIMIT + 1)


def test_the_endpoint_yields_the_loop_while_it_builds_a_large_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic: a clock that says each step took a slice, so every step yields (no timing)."""
    import asyncio
    import itertools

    from connlist import slices

    mw = ConnectionsMiddleware(App(), headers_timeout=10, request_timeout=20)
    connections = mw.connections
    for _ in range(2000):
        connections.connect(client=("127.0.0.1", 1), server=("127.0.0.1", 2))
    ticks = itertools.count()
    monkeypatch.setattr(slices.time, "perf_counter", lambda: next(ticks) * slices.SLICE * 2)
    ran: list[int] = []

    async def main() -> bytes:
        async def other_client() -> None:
            while True:
                ran.append(1)
                await asyncio.sleep(0)

        other = asyncio.create_task(other_client())
        sent: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                sent.append(message["body"])

        scope = {
            "type": "http",
            "method": "GET",
            "path": PATH,
            "query_string": b"limit=2000",
            "headers": [],
            "client": ("127.0.0.1", 9),
        }
        await mw(scope, receive, send)
        other.cancel()
        return b"".join(sent)

    body = asyncio.run(main())
    # 2,000 entries in each of two lists, STEP at a time, and the JSON in pieces: the
    # other client ran between the slices, and the answer is whole.
    assert len(ran) >= 2 * 2000 // slices.STEP
    data = json.loads(body)
    assert len(data["all"]) == len(data["active"]) == 2000 and data["truncated"] is False
    assert [entry["id"] for entry in data["all"]] == [conn.id for conn in connections.all()]
    assert data["counts"] == mw.snapshot(limit=0)["counts"]


def test_parse_limit() -> None:
    assert parse_limit(b"") == DEFAULT_LIMIT
    assert parse_limit(b"limit=0") == 0
    assert parse_limit(b"limit=7&limit=3") == 3
    assert parse_limit(b"limit=007") == 7
    with pytest.raises(ValueError, match="ASCII"):
        parse_limit("limit=\u00e9".encode())


def test_snapshot_method_is_what_the_endpoint_serves() -> None:
    app = App()
    mw = ConnectionsMiddleware(app, headers_timeout=3, request_timeout=7)
    served = request(mw, url=PATH + "?limit=5").json()
    local = mw.snapshot(limit=5)
    assert served.keys() == local.keys()
    assert list(served) == [
        "pid",
        "mode",
        "headers_timeout",
        "request_timeout",
        "send_timeout",
        "body_min_rate",
        "body_grace",
        "counts",
        "totals",
        "limit",
        "truncated",
        "all",
        "idle",
        "active",
    ]
    assert served == local
    assert served["headers_timeout"] == 3.0 and served["request_timeout"] == 7.0


# -- uvicorn's proxy headers (what docs/debug-endpoint.md says) -----------------


def behind_proxy_headers(mw: ConnectionsMiddleware, trusted: str = "127.0.0.1,::1") -> Any:
    """The app as uvicorn serves it with --proxy-headers (on by default)."""
    return ProxyHeadersMiddleware(mw, trusted_hosts=trusted)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("peer", "forwarded", "trusted", "served"),
    [
        # A remote peer is not trusted: its X-Forwarded-For is ignored.
        ("203.0.113.7", "127.0.0.1", "127.0.0.1,::1", False),
        # A local proxy that appends the real client: the client is the remote one.
        ("127.0.0.1", "203.0.113.7", "127.0.0.1,::1", False),
        ("127.0.0.1", "127.0.0.1, 203.0.113.7", "127.0.0.1,::1", False),
        # A local proxy that forwards no X-Forwarded-For, or passes the client's
        # own unchanged: every client looks like loopback.
        ("127.0.0.1", None, "127.0.0.1,::1", True),
        ("127.0.0.1", "127.0.0.1", "127.0.0.1,::1", True),
        # --forwarded-allow-ips='*': any client can claim to be loopback.
        ("203.0.113.7", "127.0.0.1", "*", True),
        ("127.0.0.1", "127.0.0.1, 203.0.113.7", "*", True),
    ],
)
def test_proxy_headers_decide_who_is_loopback(
    peer: str, forwarded: str | None, trusted: str, served: bool
) -> None:
    app = App()
    headers = {} if forwarded is None else {"X-Forwarded-For": forwarded}
    open_mw = ConnectionsMiddleware(app)
    response = request(behind_proxy_headers(open_mw, trusted), headers=headers, client=(peer, 1))
    assert response.status_code == (200 if served else 404)
    # With a token, the client address does not matter.
    guarded = behind_proxy_headers(ConnectionsMiddleware(app, debug_token="tok"), trusted)
    assert request(guarded, headers=headers, client=(peer, 1)).status_code == 404
    with_token = headers | {"Authorization": "Bearer tok"}
    assert request(guarded, headers=with_token, client=(peer, 1)).status_code == 200
    assert app.calls == []


# -- real uvicorn servers --------------------------------------------------------


class HoldApp:
    """Answers "ok <body size>"; ``/hold`` waits for ``release()`` before answering."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self._release: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self._release = asyncio.Event()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.calls.append(scope["path"])
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if scope["path"] == "/hold":
            assert self._release is not None
            await self._release.wait()
        body = b"ok %d" % size
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def release(self, running: Running) -> None:
        assert self._release is not None
        running.call(self._release.set)


class Server:
    """A real uvicorn with HoldApp behind the middleware; on exit, held requests are
    released and client sockets closed first, so that it stops at once."""

    running: Running
    port: int

    def __init__(self, http: str, *, headers_timeout: float = 2.0, request_timeout: float = 4.0) -> None:
        self.app = HoldApp()
        self.mw = ConnectionsMiddleware(
            self.app, headers_timeout=headers_timeout, request_timeout=request_timeout
        )
        self._serve = serve(self.mw, http, timeout_graceful_shutdown=3)

    def __enter__(self) -> Server:
        self.running = self._serve.__enter__()
        self.port = self.running.port
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.app.release(self.running)
            close_sockets()
        finally:
            self._serve.__exit__(*exc)

    def snapshot(self, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
        return self.running.call(lambda: self.mw.snapshot(limit=limit))  # type: ignore[no-any-return]

    def wait_counts(self, **expected: int) -> dict[str, Any]:
        """Wait until the counts include ``expected``; return that snapshot."""
        last: dict[str, Any] = {}

        def check() -> bool:
            last.update(self.snapshot())
            return all(last["counts"][name] == value for name, value in expected.items())

        assert wait_for(check), (expected, last.get("counts"))
        return last

    def wait_state(self, sock: socket.socket, state: str) -> None:
        client = port_of(sock)

        def check() -> bool:
            return any(e["client"] == client and e["state"] == state for e in self.snapshot()["all"])

        assert wait_for(check), (client, state, self.snapshot()["all"])

    def get(self, query: str = "", *, sock: socket.socket | None = None, method: str = "GET") -> Any:
        """The endpoint over HTTP on a keep-alive connection: (status, headers, decoded JSON or body)."""
        sock = sock or connect(self.port)
        sock.sendall(f"{method} {PATH}{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        if method == "HEAD":  # no body follows, whatever Content-Length says
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
        else:
            data = read_response(sock)
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ")[1])
        is_json = b"application/json" in head.lower() and body
        return status, head.decode("latin-1").lower(), json.loads(body) if is_json else body


def port_of(sock: socket.socket) -> str:
    return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_real_server_each_state_in_the_right_lists(parser: str) -> None:
    with Server(INTEGRATED[parser]) as server:
        # Connected in this order; messages begin in another.
        socks: dict[str, socket.socket] = {}
        for name in ("reading_headers", "new", "idle", "reading_body", "handling"):
            socks[name] = connect(server.port)
            server.wait_counts(all=len(socks))
        reading_headers, new, idle, reading_body, handling = socks.values()
        idle.sendall(b"GET /items?secret=hunter2 HTTP/1.1\r\nHost: x\r\nX-Api-Key: k3y\r\n\r\n")
        assert read_response(idle).endswith(b"ok 0")
        reading_headers.sendall(b"GET /partial HTTP/1.1\r\nHost: x\r\nX-Secret-Hea")
        server.wait_state(reading_headers, "reading_headers")
        reading_body.sendall(b"POST /upload?token=abc HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        server.wait_state(reading_body, "reading_body")
        handling.sendall(b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        server.wait_counts(all=5, active=3, idle=2, reading=2, writing=2, waiting=1)

        status, headers, data = server.get()  # from a sixth connection
        assert status == 200 and "application/json" in headers and "no-store" in headers
        assert data["mode"] == f"uvicorn-{parser}"
        assert (data["pid"], data["headers_timeout"], data["request_timeout"]) == (os.getpid(), 2.0, 4.0)
        # The requesting connection itself is handling its request.
        assert data["counts"] == {
            "all": 6,
            "idle": 3,
            "active": 3,
            "reading": 2,
            "writing": 3,
            "waiting": 1,
            "timed_out": 0,
            "stalled": 0,
        }
        assert data["totals"] == {
            "connections": 6,
            "requests": 4,
            "headers_timeouts": 0,
            "request_timeouts": 0,
            "rate_timeouts": 0,
            "send_timeouts": 0,
        }
        entries = {entry["client"]: entry for entry in data["all"]}
        clients = [entry["client"] for entry in data["all"]]
        # all: connection order (the requester connected last).
        assert clients[:5] == [port_of(s) for s in socks.values()]
        requester = entries[clients[5]]
        assert (requester["state"], requester["method"], requester["path"]) == ("handling", "GET", PATH)
        for name, sock in socks.items():
            entry = entries[port_of(sock)]
            assert entry["state"] == name, (name, entry)
            assert entry["server"] == f"127.0.0.1:{server.port}"
        # active: by message start -- new (at connect), then reading_headers, then reading_body.
        assert [e["client"] for e in data["active"]] == [
            port_of(s) for s in (new, reading_headers, reading_body)
        ]
        assert [e["client"] for e in data["idle"]] == [port_of(idle), port_of(handling), requester["client"]]
        assert {e["state"] for e in data["idle"]} == {"idle", "handling"}
        fields = {
            name: {
                key: entries[port_of(sock)][key]
                for key in ("headers_completed", "requests", "method", "path")
            }
            for name, sock in socks.items()
        }
        assert fields == {
            "reading_headers": {"headers_completed": False, "requests": 0, "method": None, "path": None},
            "new": {"headers_completed": False, "requests": 0, "method": None, "path": None},
            "idle": {"headers_completed": True, "requests": 1, "method": "GET", "path": "/items"},
            "reading_body": {"headers_completed": True, "requests": 0, "method": "POST", "path": "/upload"},
            "handling": {"headers_completed": True, "requests": 1, "method": "POST", "path": "/hold"},
        }
        for name in ("idle", "handling"):
            assert entries[port_of(socks[name])]["duration"] is None
        for name in ("new", "reading_headers", "reading_body"):
            entry = entries[port_of(socks[name])]
            assert 0 <= entry["duration"] <= entry["age"] < 5
        # Never the query string, never a header.
        text = json.dumps(data)
        for secret in ("hunter2", "secret", "token", "abc", "k3y", "X-Secret"):
            assert secret not in text, secret
        # The Python API agrees with the endpoint.
        ids = server.running.call(
            lambda: [[c.id for c in getattr(server.mw.connections, n)()] for n in ("all", "idle", "active")]
        )
        assert ids[0][:5] == [e["id"] for e in data["all"][:5]]
        assert ids[2] == [e["id"] for e in data["active"]]

        # The held response finishes: that connection becomes idle.
        server.app.release(server.running)
        assert read_response(handling).endswith(b"ok 3")
        after = server.wait_counts(waiting=3)
        assert by_id(after["all"])[entries[port_of(handling)]["id"]]["state"] == "idle"


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_real_server_counts_and_totals_move(parser: str) -> None:
    with Server(INTEGRATED[parser], headers_timeout=0.5, request_timeout=1.0) as server:
        zero = {
            "all": 0,
            "idle": 0,
            "active": 0,
            "reading": 0,
            "writing": 0,
            "waiting": 0,
            "timed_out": 0,
            "stalled": 0,
        }
        assert server.snapshot()["counts"] == zero
        client = connect(server.port)
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(client).endswith(b"ok 0")
        stalled = connect(server.port)
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        server.wait_counts(all=2, writing=1)
        silent = connect(server.port)  # last: its 0.5 s run from here
        data = server.wait_counts(all=3, reading=1, writing=1, waiting=1)
        assert data["totals"] == {
            "connections": 3,
            "requests": 2,
            "headers_timeouts": 0,
            "request_timeouts": 0,
            "rate_timeouts": 0,
            "send_timeouts": 0,
        }
        # The silent one is cut off at 0.5 s, the stalled body at 1 s.
        assert b"408" in read_until_closed(silent)[0]
        data = server.wait_counts(all=2, reading=0)
        assert data["totals"]["headers_timeouts"] == 1
        assert b"408" in read_until_closed(stalled)[0]
        data = server.wait_counts(all=1, writing=0, waiting=1)
        assert data["totals"] == {
            "connections": 3,
            "requests": 2,
            "headers_timeouts": 1,
            "request_timeouts": 1,
            "rate_timeouts": 0,
            "send_timeouts": 0,
        }
        # Idle connections are never timed out; a second request counts.
        time.sleep(0.6)
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(client).endswith(b"ok 0")
        assert server.wait_counts(all=1, waiting=1)["totals"]["requests"] == 3
        assert server.snapshot()["all"][0]["requests"] == 2
        client.close()
        data = server.wait_counts(all=0)
        assert data["counts"] == zero
        assert data["totals"]["connections"] == 3


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_real_server_limit_head_and_400(parser: str) -> None:
    with Server(INTEGRATED[parser]) as server:
        for _ in range(4):
            sock = connect(server.port)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"ok 0")
        server.wait_counts(all=4, waiting=4)
        requester = connect(server.port)
        status, _, data = server.get("?limit=2", sock=requester)
        assert status == 200
        assert (len(data["all"]), len(data["idle"]), len(data["active"])) == (2, 2, 0)
        assert data["truncated"] is True and data["limit"] == 2
        assert data["counts"]["all"] == 5 and data["counts"]["idle"] == 5
        status, _, data = server.get("?limit=0", sock=requester)
        assert (data["all"], data["truncated"], data["counts"]["waiting"]) == ([], True, 4)
        status, _, data = server.get("?limit=5", sock=requester)
        assert data["truncated"] is False and len(data["all"]) == 5
        # HEAD: the headers of a GET, no body; the connection stays usable.
        status, headers, body = server.get(method="HEAD", sock=requester)
        assert status == 200 and body == b"" and "content-length: 0" not in headers
        status, _, data = server.get("?limit=x", sock=requester)
        assert status == 400 and "limit" in data["error"]
        status, headers, data = server.get(method="DELETE", sock=requester)
        assert status == 405 and "allow: get, head" in headers
        assert server.get(sock=requester)[2]["totals"]["requests"] == 11
        assert server.app.calls == ["/"] * 4


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_real_server_forwarded_remote_client_gets_404(parser: str) -> None:
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: this looks like a remote client.
    with Server(INTEGRATED[parser]) as server:
        sock = connect(server.port)
        sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n".encode())
        response = read_response(sock)
        assert response.startswith(b"HTTP/1.1 404") and response.endswith(b"Not Found")
        assert server.app.calls == []
        # The record shows the TCP peer, not the forwarded address.
        assert server.snapshot()["all"][0]["client"] == port_of(sock)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_close_idle_leaves_active_connections_and_pending_responses_alone(parser: str) -> None:
    with Server(INTEGRATED[parser]) as server:
        idle = [connect(server.port) for _ in range(2)]
        for sock in idle:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock).endswith(b"ok 0")
        reading = connect(server.port)
        reading.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        pending = connect(server.port)
        pending.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        server.wait_counts(all=4, reading=1, writing=1, waiting=2)

        assert server.running.call(server.mw.connections.close_idle) == 2
        for sock in idle:
            assert read_until_closed(sock)[0] == b""
        data = server.wait_counts(all=2)
        assert {e["state"] for e in data["all"]} == {"reading_headers", "handling"}
        # Nothing else was closed: both finish normally.
        reading.sendall(b"\r\n")
        assert read_response(reading).endswith(b"ok 0")
        server.app.release(server.running)
        assert read_response(pending).endswith(b"ok 0")
        server.wait_counts(all=2, waiting=2)
        # close_all closes everything, idle or not.
        pending.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        server.wait_counts(all=2, reading=1, waiting=1)
        assert server.running.call(server.mw.connections.close_all) == 2
        for sock in (reading, pending):
            assert read_until_closed(sock)[0] == b""
        assert server.wait_counts(all=0)["totals"]["connections"] == 4


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_asgi_only_mode(parser: str) -> None:
    """Plain uvicorn protocols: the middleware sees requests, not connections."""
    with Server(PLAIN[parser]) as server:
        idle = connect(server.port)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(idle).endswith(b"ok 0")
        uploading = connect(server.port)
        uploading.sendall(b"POST /upload?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        server.wait_counts(all=1)
        holding = connect(server.port)
        holding.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        server.wait_counts(all=2)
        status, _, data = server.get()
        assert status == 200 and data["mode"] == "asgi"
        # Only requests in flight are records (the endpoint's own request is not one).
        assert data["counts"] == {
            "all": 2,
            "idle": 1,
            "active": 1,
            "reading": 0,
            "writing": 2,
            "waiting": 0,
            "timed_out": 0,
            "stalled": 0,
        }
        assert [(e["state"], e["method"], e["path"]) for e in data["all"]] == [
            ("reading_body", "POST", "/upload"),
            ("handling", "GET", "/hold"),
        ]
        assert [e["client"] for e in data["all"]] == [port_of(uploading), port_of(holding)]
        assert data["totals"]["requests"] == 3
        uploading.sendall(b"56789")
        assert read_response(uploading).endswith(b"ok 10")
        server.app.release(server.running)
        assert read_response(holding).endswith(b"ok 0")
        assert server.wait_counts(all=0)["totals"]["requests"] == 3
