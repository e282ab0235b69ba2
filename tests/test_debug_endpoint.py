"""The debug endpoint in-process, with httpx's ASGITransport: access control, methods, queries, the answer.

The transport sets ``scope["client"]``, so that non-loopback clients can be
simulated; uvicorn's proxy-headers middleware is put in front as uvicorn
does.  The view's API: tests/test_debug.py; real servers:
tests/test_debug_server.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from connlist import ConnectionsMiddleware
from connlist.observe.debug import (
    MAX_LIMIT,
    is_loopback,
)

PATH = "/_connections"
REMOTE = ("203.0.113.7", 40000)  # TEST-NET-3: never loopback


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

    from connlist.observe import slices

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


def test_workers_all_without_a_group_is_this_worker_alone() -> None:
    mw = ConnectionsMiddleware(App(), headers_timeout=3, request_timeout=7)
    mw.connections.connect(client=("127.0.0.1", 1))
    data = request(mw, url=PATH + "?workers=all&limit=5").json()
    # The combined answer's shape (connlist.observe.workers), with one worker: this one.
    assert (data["unreachable"], data["limit"], data["truncated"]) == (0, 5, False)
    (worker,) = data["workers"]
    assert worker["pid"] == data["pid"] == os.getpid()
    assert data["counts"] == worker["counts"] and data["counts"]["all"] == 1
    assert data["totals"] == worker["totals"]


def test_snapshot_method_is_what_the_endpoint_serves() -> None:
    app = App()
    mw = ConnectionsMiddleware(app, headers_timeout=3, request_timeout=7)
    served = request(mw, url=PATH + "?limit=5").json()
    local = mw.snapshot(limit=5)
    assert served.keys() == local.keys()
    assert list(served) == [
        "pid",
        "mode",
        "integration_off",
        "server_integration",
        "headers_timeout",
        "request_timeout",
        "send_timeout",
        "body_min_rate",
        "body_grace",
        "max_connections",
        "max_upgraded",
        "max_header_size",
        "keep_alive",
        "keep_alive_by",
        "counts",
        "unread_bytes",
        "totals",
        "budget",
        "limit",
        "truncated",
        "enforced",
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


def test_an_endpoint_without_a_worker_group_answers_workers_all_for_this_worker_alone() -> None:
    # DebugEndpoint on its own (mounted by an app, no WorkerGroup): the
    # workers=all answer has the same shape, with one worker in it.
    from connlist.core.enforcer import Enforcer
    from connlist.observe.debug import DebugEndpoint

    enforcer = Enforcer()
    enforcer.connections.connect(client=("127.0.0.1", 4000))
    endpoint = DebugEndpoint(lambda: enforcer, token=None)
    answer = request(endpoint, url=f"{PATH}?workers=all&limit=5").json()
    (only,) = answer["workers"]
    assert only["pid"] == answer["pid"] == os.getpid()
    assert answer["counts"] == only["counts"] and answer["counts"]["all"] == 1
    assert [conn["client"] for conn in only["all"]] == ["127.0.0.1:4000"]
    assert answer["limit"] == 5 and answer["unreachable"] == 0
