"""The live view of a worker's connections: a JSON-ready snapshot and the debug endpoint.

States, derived from the list (nothing extra is stored to show them)::

    new              connected, no byte of a request yet (timed by the headers timeout)
    reading_headers  a request began, its headers are incomplete
    reading_body     headers in, body still arriving
    handling         request received, response not finished
    idle             keep-alive, waiting for the next request
    timed_out        expired and being closed

nginx's ``stub_status`` phases: ``reading`` is new + reading_headers,
``writing`` is reading_body + handling, ``waiting`` is idle.

Lists: ``all`` in connection order, ``active`` by message start (oldest
first), ``idle`` in connection order.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from typing import Any

from starlette.types import Receive, Scope, Send

from connlist.connections import Connection
from connlist.enforcer import Enforcer, format_address

__all__ = ["DEFAULT_LIMIT", "DebugEndpoint", "connection_state", "snapshot"]

DEFAULT_LIMIT = 1000

_READING = ("new", "reading_headers")
_WRITING = ("reading_body", "handling")


def connection_state(conn: Connection) -> str:
    if conn.is_active:
        if conn.headers_completed:
            return "reading_body"
        if conn.requests == 0 and conn.method is None and conn.last_message_start == conn.connected_at:
            return "new"
        return "reading_headers"
    if conn.last_message_start != 0:
        return "timed_out"
    return "handling" if conn.responding else "idle"


def _describe(conn: Connection, now: float) -> dict[str, Any]:
    start = conn.last_message_start
    return {
        "id": conn.id,
        "client": format_address(conn.client),
        "server": format_address(conn.server),
        "state": connection_state(conn),
        "age": round(now - conn.connected_at, 6),
        "duration": None if start == 0 else round(now - start, 6),
        "headers_completed": conn.headers_completed,
        "requests": conn.requests,
        "method": conn.method,
        "path": conn.path,
    }


def snapshot(enforcer: Enforcer, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Everything the debug endpoint shows, as plain JSON-ready data.

    Counts are exact; each list holds at most ``limit`` connections, and
    ``truncated`` says whether any list was cut.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an integer >= 0, got {limit!r}")
    connections = enforcer.connections
    now = connections.clock()
    reading = writing = waiting = 0
    all_list: list[dict[str, Any]] = []
    idle_list: list[dict[str, Any]] = []
    for conn in connections.iter_all():
        state = connection_state(conn)
        if state in _READING:
            reading += 1
        elif state in _WRITING:
            writing += 1
        elif state == "idle":
            waiting += 1
        if len(all_list) < limit:
            all_list.append(_describe(conn, now))
        if conn.last_message_start == 0 and len(idle_list) < limit:
            idle_list.append(_describe(conn, now))
    active_list: list[dict[str, Any]] = []
    for conn in connections.iter_active():
        if len(active_list) >= limit:
            break
        active_list.append(_describe(conn, now))
    totals = enforcer.totals
    counts = {
        "all": len(connections),
        "idle": connections.idle_count,
        "active": connections.active_count,
        "reading": reading,
        "writing": writing,
        "waiting": waiting,
    }
    return {
        "pid": os.getpid(),
        "mode": enforcer.mode,
        "headers_timeout": enforcer.headers_timeout,
        "request_timeout": enforcer.request_timeout,
        "counts": counts,
        "totals": {
            "connections": totals.connections,
            "requests": totals.requests,
            "headers_timeouts": totals.headers_timeouts,
            "request_timeouts": totals.request_timeouts,
        },
        "limit": limit,
        "truncated": counts["all"] > limit or counts["active"] > limit or counts["idle"] > limit,
        "all": all_list,
        "idle": idle_list,
        "active": active_list,
    }


def _is_loopback(scope: Scope) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        return ipaddress.ip_address(client[0]).is_loopback
    except ValueError:
        return False


def _parse_limit(query_string: bytes) -> int:
    from urllib.parse import parse_qs

    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("limit")
    if not values:
        return DEFAULT_LIMIT
    raw = values[-1]
    if not raw.isdigit():
        raise ValueError("limit must be a whole number >= 0")
    return int(raw)


class DebugEndpoint:
    """Serves the snapshot as JSON to loopback clients, or to holders of the token."""

    def __init__(self, enforcer_of: Any, *, token: str | None) -> None:
        self._enforcer_of = enforcer_of
        self._token = None if token is None else token.encode()

    def allowed(self, scope: Scope) -> bool:
        """Whether the client may see the endpoint; if not, it must look as if it did not exist."""
        if self._token is None:
            return _is_loopback(scope)
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(credentials.strip(), self._token)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _send_json(send, 405, {"error": "method not allowed"}, method, [(b"allow", b"GET, HEAD")])
            return
        try:
            limit = _parse_limit(scope.get("query_string", b""))
        except ValueError as exc:
            await _send_json(send, 400, {"error": str(exc)}, method)
            return
        await _send_json(send, 200, snapshot(self._enforcer_of(), limit=limit), method)


async def _send_json(
    send: Send, status: int, data: Any, method: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps(data, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def not_found(send: Send) -> None:
    """A plain 404, as Starlette's router would answer for an unknown path."""
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"9")],
        }
    )
    await send({"type": "http.response.body", "body": b"Not Found"})
