"""The debug endpoint on real uvicorn servers on 127.0.0.1, both parsers, raw sockets.

Each state as a real client produces it, the counts and totals as
connections come, time out and go, and ASGI-only mode on uvicorn's own
protocols.  The app is ``tests.servers.echo_app`` (``/hold`` answers once
released).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from connlist import ConnectionsMiddleware
from connlist.observe.debug import (
    DEFAULT_LIMIT,
)
from tests.servers import (
    INTEGRATED,
    PLAIN,
    Running,
    close_sockets,
    connect,
    echo_app,
    read_response,
    read_until_closed,
    serve,
    wait_for,
)

PATH = "/_connections"

# Nothing here reaches the connection budget (max_connections), nor upgrades, nor max_header_size:
# their totals stay 0.
NO_BUDGET_TOTALS = {
    "idle_evictions": 0,
    "headers_evictions": 0,
    "body_evictions": 0,
    "refused": 0,
    "accept_failures": 0,
    "upgrades": 0,
    "upgrades_refused": 0,
    "header_overflows": 0,
}


def by_id(entries: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {entry["id"]: entry for entry in entries}


# -- real uvicorn servers --------------------------------------------------------


class Server:
    """A real uvicorn with echo_app behind the middleware; on exit, held requests are
    released and client sockets closed first, so that it stops at once."""

    running: Running
    port: int

    def __init__(self, http: str, *, headers_timeout: float = 2.0, request_timeout: float = 4.0) -> None:
        # uvicorn's own protocol (PLAIN) is for ASGI-only mode: the option keeps it.
        self.mw = ConnectionsMiddleware(
            echo_app,
            headers_timeout=headers_timeout,
            request_timeout=request_timeout,
            server_integration="off" if http in PLAIN.values() else "auto",
        )
        self._serve = serve(self.mw, http, timeout_graceful_shutdown=3)

    def __enter__(self) -> Server:
        self.running = self._serve.__enter__()
        self.port = self.running.port
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self.running.release()
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
            "upgraded": 0,
            "stalled": 0,
        }
        assert data["totals"] == {
            "connections": 6,
            "requests": 4,
            "headers_timeouts": 0,
            "request_timeouts": 0,
            "rate_timeouts": 0,
            "send_timeouts": 0,
            "keepalive_timeouts": 0,
            **NO_BUDGET_TOTALS,
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
        server.running.release()
        assert read_response(handling).endswith(b"ok 3")
        after = server.wait_counts(waiting=3)
        assert by_id(after["all"])[entries[port_of(handling)]["id"]]["state"] == "idle"


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
            "upgraded": 0,
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
            "keepalive_timeouts": 0,
            **NO_BUDGET_TOTALS,
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
            "keepalive_timeouts": 0,
            **NO_BUDGET_TOTALS,
        }
        # An idle connection is not timed out before uvicorn's keep-alive (5 s); a second request counts.
        time.sleep(0.6)
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(client).endswith(b"ok 0")
        assert server.wait_counts(all=1, waiting=1)["totals"]["requests"] == 3
        assert server.snapshot()["all"][0]["requests"] == 2
        client.close()
        data = server.wait_counts(all=0)
        assert data["counts"] == zero
        assert data["totals"]["connections"] == 3


def test_real_server_shows_what_it_holds_unparsed_and_counts_heads_too_long(parser: str) -> None:
    with Server(INTEGRATED[parser]) as server:
        client = connect(server.port)
        client.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        server.wait_state(client, "handling")
        pipelined = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 3
        client.sendall(pipelined)
        # Behind the response under way: read, and held unparsed until it ends.
        assert wait_for(lambda: server.snapshot()["unread_bytes"] == len(pipelined)), server.snapshot()
        entries = {entry["client"]: entry for entry in server.snapshot()["all"]}
        assert (entries[port_of(client)]["unread"], entries[port_of(client)]["path"]) == (
            len(pipelined),
            "/hold",
        )
        server.running.release()
        assert [read_response(client).endswith(b"ok 0") for _ in range(4)] == [True] * 4
        assert wait_for(lambda: server.snapshot()["unread_bytes"] == 0)
        # A head past max_header_size (16 KiB): 431, closed, counted as its own kind.
        big = connect(server.port)
        big.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        assert read_until_closed(big)[0].startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
        totals = server.snapshot()["totals"]
        assert (totals["header_overflows"], totals["headers_timeouts"], totals["requests"]) == (1, 0, 4)


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
        assert server.running.calls == ["/"] * 4


def test_real_server_forwarded_remote_client_gets_404(parser: str) -> None:
    # uvicorn trusts X-Forwarded-For from 127.0.0.1 by default: this looks like a remote client.
    with Server(INTEGRATED[parser]) as server:
        sock = connect(server.port)
        sock.sendall(f"GET {PATH} HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n".encode())
        response = read_response(sock)
        assert response.startswith(b"HTTP/1.1 404") and response.endswith(b"Not Found")
        assert server.running.calls == []
        # The record shows the TCP peer, not the forwarded address.
        assert server.snapshot()["all"][0]["client"] == port_of(sock)


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
        server.running.release()
        assert read_response(pending).endswith(b"ok 0")
        server.wait_counts(all=2, waiting=2)
        # close_all closes everything, idle or not.
        pending.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        server.wait_counts(all=2, reading=1, waiting=1)
        assert server.running.call(server.mw.connections.close_all) == 2
        for sock in (reading, pending):
            assert read_until_closed(sock)[0] == b""
        assert server.wait_counts(all=0)["totals"]["connections"] == 4


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
            "upgraded": 0,
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
        server.running.release()
        assert read_response(holding).endswith(b"ok 0")
        assert server.wait_counts(all=0)["totals"]["requests"] == 3
