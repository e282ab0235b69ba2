"""The live view of a worker's connections: a JSON-ready snapshot and the debug endpoint.

``ConnectionsMiddleware`` serves it on ``debug_path`` (``/_connections`` by
default) and ``ConnectionsMiddleware.snapshot()`` returns the same data; see
``docs/debug-endpoint.md`` for the full reference.

What it shows
-------------

The states and counts are the list's (``connlist.core.views``: "States"),
presented here: ``all`` in connection order, ``active`` by the start of the
current message (the next to expire is near the head), ``idle`` in
connection order.  ``docs/debug-endpoint.md`` is the reference of the JSON.

Cost
----

``snapshot(limit=N)`` runs on the event loop and describes at most ``N``
connections per list (each connection is described once even if it is in
two lists).  ``all`` and ``active`` are walked from their heads and stop
after ``N``.  ``idle`` connections are looked for among the first
``IDLE_SCAN * N`` (10 N) connections of ``all``: in a worker flooded with
active connections, the idle list may then hold fewer than
``min(N, counts.idle)`` entries, and ``truncated`` is true.  So the cost is
O(N), whatever the number of connections (``benchmarks/snapshot.py``
measures it), but for two walks of every connection that read a field or
two of each: the counts' split of ``writing`` and ``waiting``, and the
bytes held unparsed (``unread_bytes``), which no request pays to keep.  The
endpoint builds and encodes the view in slices, yielding to the event loop
between them (``connlist.observe.slices``).

Every worker, and the page
--------------------------

``?workers=all`` answers with every worker of the server, each worker's own
snapshot under ``workers`` and the sums of their counts and totals
(``connlist.observe.workers`` finds and asks the siblings).  A browser (``Accept``
preferring ``text/html``) or ``?format=html`` gets the view as a page
(``connlist.observe.page``); everything else gets the JSON.

Access
------

Loopback clients only (``scope["client"]`` in 127.0.0.0/8 or ::1), or, with a
token, any client presenting ``Authorization: Bearer <token>`` (loopback
included); anyone else gets the plain 404 of an unknown path.  uvicorn's
``--proxy-headers`` rewrites ``scope["client"]`` before this check: see
``docs/debug-endpoint.md`` for when that makes every client look like
loopback, and use a token behind a proxy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import json
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, NamedTuple
from urllib.parse import parse_qsl

from starlette.types import Receive, Scope, Send

from connlist.core.checks import check_whole
from connlist.core.connections import ConnectionsList
from connlist.core.enforcer import Enforcer, shrink
from connlist.core.kinds import TIMEOUT_KINDS
from connlist.core.logs import format_address
from connlist.core.records import Connection
from connlist.core.views import connection_state
from connlist.observe import page
from connlist.observe.slices import STEP, cooperatively, json_cooperatively
from connlist.observe.workers import WorkerGroup, combine

__all__ = [
    "DEFAULT_LIMIT",
    "IDLE_SCAN",
    "MAX_LIMIT",
    "PATH_MAX",
    "QUERY_PARAMETERS",
    "DebugEndpoint",
    "Query",
    "describe",
    "enforced",
    "is_loopback",
    "not_found",
    "parse_limit",
    "parse_query",
    "snapshot",
    "snapshot_steps",
    "unread",
    "wants_html",
]

DEFAULT_LIMIT = 1000
# The idle list is looked for among the first ``IDLE_SCAN * limit``
# connections of ``all`` (see "Cost" above).
IDLE_SCAN = 10
# Paths longer than this are cut (and end with "..."): the view must stay
# small whatever clients send.
PATH_MAX = 256

# The largest ``limit`` the endpoint accepts: describing a connection costs a
# few microseconds on the event loop, so this bounds what one request can
# make the worker do (see "Cost").
MAX_LIMIT = 10_000

# The query parameters, and the values of those that take a word.
QUERY_PARAMETERS = ("limit", "workers", "format")
_PARAMETER_NAMES = ", ".join(map(repr, QUERY_PARAMETERS))
_CHOICES = {"workers": ("all",), "format": ("json", "html")}


def _short_path(path: str | None) -> str | None:
    if path is None or len(path) <= PATH_MAX:
        return path
    return path[: PATH_MAX - 3] + "..."


def describe(
    conn: Connection,
    now: float,
    servers: dict[Any, str | None] | None = None,
    deadline: Callable[[Connection], tuple[str, float] | None] | None = None,
) -> dict[str, Any]:
    """One connection as a JSON-ready dict (``now`` is a reading of the list's clock).

    ``servers`` caches formatted server addresses across calls (most
    connections share one).  ``deadline`` (``Enforcer.deadline``) gives the
    timeout that runs for the connection and when: ``timeout`` and
    ``time_left`` (seconds; null when none runs, or without ``deadline``).
    """
    start = conn.last_message_start
    due = None if deadline is None else deadline(conn)
    server = conn.server
    if servers is None:
        server_text = format_address(server)
    else:
        try:
            server_text = servers[server]
        except KeyError:
            server_text = servers[server] = format_address(server)
        except TypeError:  # unhashable: not worth caching
            server_text = format_address(server)
    return {
        "id": conn.id,
        "client": format_address(conn.client),
        "server": server_text,
        "state": connection_state(conn),
        # Milliseconds are plenty, and round(x * 1000) is much cheaper than round(x, 3).
        "age": round((now - conn.connected_at) * 1000) / 1000,
        "duration": None if start == 0 else round((now - start) * 1000) / 1000,
        "timeout": None if due is None else due[0],
        "time_left": None if due is None else round((due[1] - now) * 1000) / 1000,
        "headers_completed": conn.headers_completed,
        "requests": conn.requests,
        "unread": unread(conn),
        "method": conn.method,
        "path": _short_path(conn.path),
    }


def unread(conn: Connection) -> int:
    """The bytes connlist's protocol holds unparsed for ``conn`` (a read behind a response under way).

    Read from the protocol itself: only connlist's server classes have
    ``_connlist_unread``; any other handle, or none, holds nothing.
    """
    held = getattr(conn.handle, "_connlist_unread", None)
    return 0 if held is None else len(held)


def _keep_alive_by_list(enforcer: Enforcer) -> bool:
    """Whether the list times the server's keep-alive (never in ASGI-only mode: uvicorn's timers do)."""
    return enforcer.keep_alive_timed and enforcer.mode != "asgi"


def enforced(enforcer: Enforcer) -> list[str]:
    """The timeouts this worker enforces (on, and possible in its mode): the rows of ``TIMEOUT_KINDS``.

    The keep-alive is the server's setting: listed where the list times it.
    """
    settings = enforcer.settings
    asgi = enforcer.mode == "asgi"
    return [
        kind.name
        for kind in TIMEOUT_KINDS
        if (kind.setting is not None and getattr(settings, kind.setting) and (kind.asgi or not asgi))
        or (kind.name == "keepalive" and _keep_alive_by_list(enforcer))
    ]


def snapshot(enforcer: Enforcer, *, limit: int = DEFAULT_LIMIT) -> dict[str, Any]:
    """Everything the debug endpoint shows, as plain JSON-ready data.

    Counts are exact; each list holds at most ``limit`` connections, and
    ``truncated`` says whether any list holds fewer than its count.  Call it
    on the event loop that serves the connections (the list is not
    thread-safe).  The endpoint builds the same data in slices, yielding to
    the loop between them (``snapshot_steps``).
    """
    steps = snapshot_steps(enforcer, limit=limit)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: dict[str, Any] = done.value
            return result


def snapshot_steps(
    enforcer: Enforcer, *, limit: int = DEFAULT_LIMIT
) -> Generator[None, None, dict[str, Any]]:
    """``snapshot`` as a generator that stops every ``STEP`` connections, so the caller can yield the loop.

    Between steps the lists may change: the walks carry on safely (a
    connection removed meanwhile is skipped, and a walk whose next
    connection was removed too ends early, with ``truncated`` true); the
    counts are those of the start.
    """
    limit = check_whole("limit", limit, MAX_LIMIT)
    connections = enforcer.connections
    now = connections.clock()

    deadline = enforcer.deadline
    counts = connections.counts()
    n_all, n_active, n_idle = counts["all"], counts["active"], counts["idle"]

    # Each connection is described once; a second list gets a copy.
    describe_one = _Describer(now, deadline)
    all_list, idle_list = yield from _walk_all(connections, limit, describe_one)
    active_list = (yield from _walk_active(connections, limit, describe_one)) if limit else []
    unread_bytes = yield from _unread_bytes(connections)

    return {
        "pid": os.getpid(),
        "mode": enforcer.mode,
        "integration_off": enforcer.integration_off,
        "server_integration": enforcer.server_integration,
        **dataclasses.asdict(enforcer.settings),
        # The server's keep-alive time, and who times it: "connlist" (the
        # list, connlist.servers.uvicorn.keepalive) or "server" (its own timers).
        "keep_alive": enforcer.keep_alive,
        "keep_alive_by": "connlist" if _keep_alive_by_list(enforcer) else "server",
        "counts": counts,
        # What the worker's protocols hold unparsed, every connection's ``unread`` summed.
        "unread_bytes": unread_bytes,
        "totals": dataclasses.asdict(enforcer.totals),
        "budget": budget_view(enforcer),
        "limit": limit,
        "truncated": len(all_list) < n_all or len(idle_list) < n_idle or len(active_list) < n_active,
        # A list, so the endpoint's encoder (observe.slices) writes it with the others, after the rest.
        "enforced": enforced(enforcer),
        "all": all_list,
        "idle": idle_list,
        "active": active_list,
    }


class _Describer:
    """``describe`` for one snapshot: each connection once (a second list gets a copy)."""

    def __init__(self, now: float, deadline: Callable[[Connection], tuple[str, float] | None]) -> None:
        self.now = now
        self.deadline = deadline
        self.servers: dict[Any, str | None] = {}
        self.described: dict[int, dict[str, Any]] = {}

    def __call__(self, conn: Connection, *, keep: bool = False) -> dict[str, Any]:
        known = self.described.get(conn.id)
        if known is not None:
            return dict(known)
        entry = describe(conn, self.now, self.servers, self.deadline)
        if keep:
            self.described[conn.id] = entry
        return entry


def _walk_all(
    connections: ConnectionsList, limit: int, describe_one: _Describer
) -> Generator[None, None, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """``all`` (the first ``limit``), and ``idle`` among the first ``IDLE_SCAN * limit``."""
    all_list: list[dict[str, Any]] = []
    idle_list: list[dict[str, Any]] = []
    want_idle = min(limit, connections.idle_count)
    scan = limit * IDLE_SCAN
    for seen, conn in enumerate(connections.iter_all()):
        if seen % STEP == STEP - 1:
            yield
            if not conn.tracked:
                continue  # removed while the caller had the loop
        if seen < limit:
            entry = describe_one(conn, keep=True)
            all_list.append(entry)
            if conn.last_message_start == 0 and len(idle_list) < want_idle:
                idle_list.append(dict(entry))
        elif len(idle_list) >= want_idle or seen >= scan:
            break
        elif conn.last_message_start == 0:
            idle_list.append(describe_one(conn))
    return all_list, idle_list


def _walk_active(
    connections: ConnectionsList, limit: int, describe_one: _Describer
) -> Generator[None, None, list[dict[str, Any]]]:
    """``active``, from its head (the next to expire first), at most ``limit``."""
    active_list: list[dict[str, Any]] = []
    for seen, conn in enumerate(connections.iter_active()):
        if seen % STEP == STEP - 1:
            yield
            if not conn.is_active:
                continue
        active_list.append(describe_one(conn))
        if len(active_list) >= limit:
            break
    return active_list


def _unread_bytes(connections: ConnectionsList) -> Generator[None, None, int]:
    """Every connection's ``unread``, summed: a walk of the whole list, as the counts' split takes one."""
    total = 0
    for seen, conn in enumerate(connections.iter_all()):
        if seen % STEP == STEP - 1:
            yield
        total += unread(conn)
    return total


def budget_view(enforcer: Enforcer) -> dict[str, Any]:
    """The connection budget and the pressure on it, and the timeouts as they are now (shortened or not)."""
    pressure = enforcer.pressure
    return {
        "max_connections": enforcer.settings.max_connections,
        # A budget needs the connections, which only the server integration sees.
        "enforced": bool(enforcer.settings.max_connections) and enforcer.mode != "asgi",
        "occupied": enforcer.connections.occupied,
        # Upgraded connections (websockets; counted in occupied too) and their share.
        "upgraded": enforcer.connections.upgraded_count,
        "max_upgraded": enforcer.settings.max_upgraded,
        "pressure": round(pressure, 3),
        "pressed": enforcer.pressed,
        "headers_timeout_now": round(shrink(enforcer.settings.headers_timeout, pressure), 3),
        "keep_alive_now": round(shrink(enforcer.keep_alive, pressure), 3),
    }


# -- access ----------------------------------------------------------------


def is_loopback(client: object) -> bool:
    """Whether an ASGI ``scope["client"]`` is on 127.0.0.0/8 or ::1 (IPv4-mapped included)."""
    if not isinstance(client, (tuple, list)) or not client or not isinstance(client[0], str):
        return False  # None (e.g. a unix socket) or something unexpected
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return False  # a name such as "testclient"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _digest(token: bytes) -> bytes:
    # Comparing fixed-size digests keeps the token's length out of the timing too.
    return hashlib.sha256(token).digest()


def parse_limit(query_string: bytes) -> int:
    """The ``limit`` of a query string (``DEFAULT_LIMIT`` if absent); ValueError if bad."""
    try:
        text = query_string.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("the query string must be ASCII") from None
    limit = DEFAULT_LIMIT
    for name, value in parse_qsl(text, keep_blank_values=True):
        if name != "limit":
            if name in QUERY_PARAMETERS:
                continue  # parse_query's
            raise ValueError(f"unknown query parameter {name[:40]!r}; the parameters are {_PARAMETER_NAMES}")
        if (
            not (value.isascii() and value.isdigit())
            or len(value) > len(str(MAX_LIMIT))
            or int(value) > MAX_LIMIT
        ):
            raise ValueError(f"limit must be a whole number from 0 to {MAX_LIMIT}")
        limit = int(value)
    return limit


class Query(NamedTuple):
    """A debug request's query: ``limit``, ``workers`` (``"all"`` or None) and ``format`` (or None)."""

    limit: int
    workers: str | None
    format: str | None


def parse_query(query_string: bytes) -> Query:
    """``parse_limit``, plus ``workers=all`` and ``format=json|html``; ValueError if bad."""
    limit = parse_limit(query_string)  # checks the names and the encoding too
    found: dict[str, str] = {}
    for name, value in parse_qsl(query_string.decode("ascii"), keep_blank_values=True):
        if name in _CHOICES:
            if value not in _CHOICES[name]:
                raise ValueError(f"{name} must be {' or '.join(map(repr, _CHOICES[name]))}")
            found[name] = value
    return Query(limit, found.get("workers"), found.get("format"))


def wants_html(query: Query, headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """``format`` if given, else whether ``Accept`` prefers ``text/html`` to JSON (a browser's does).

    A tie, no ``Accept`` or ``*/*`` (curl) get JSON, as before the page existed.
    """
    if query.format is not None:
        return query.format == "html"
    accept = b",".join(value for name, value in headers if name == b"accept")
    html = json_q = 0.0
    for item in accept.decode("latin-1").lower().split(","):
        media, *params = (part.strip() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, number = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(number)
                except ValueError:
                    q = 0.0
        if media in ("text/html", "application/xhtml+xml"):
            html = max(html, q)
        elif media in ("application/json", "application/*", "*/*"):
            json_q = max(json_q, q)
    return html > json_q


class DebugEndpoint:
    """Serves the snapshot as JSON to loopback clients, or, with a token, to its holders.

    ``enforcer_of`` returns the enforcer to show (the middleware's may be
    replaced at the first request); ``workers`` is this worker's group, for
    ``workers=all`` (None: this worker alone).  A browser gets the page of
    ``connlist.observe.page`` instead of the JSON.
    """

    def __init__(
        self, enforcer_of: Callable[[], Enforcer], *, token: str | None, workers: WorkerGroup | None = None
    ) -> None:
        self._enforcer_of = enforcer_of
        self._token = None if token is None else _digest(token.encode())
        self._workers = workers

    def allowed(self, scope: Scope) -> bool:
        """Whether the client may see the endpoint; if not, it must look as if it did not exist."""
        if self._token is None:
            return is_loopback(scope.get("client"))
        granted = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    granted |= hmac.compare_digest(_digest(credentials.strip()), self._token)
        return granted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer an allowed client: 405 for methods other than GET and HEAD, 400 for a bad query."""
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            await _send_json(send, 405, {"error": "method not allowed"}, method, [(b"allow", b"GET, HEAD")])
            return
        try:
            query = parse_query(scope.get("query_string", b""))
        except ValueError as exc:
            await _send_json(send, 400, {"error": str(exc)}, method)
            return
        limit = query.limit
        if query.workers is None:
            # Built in slices: a large limit on a large worker must not hold
            # the loop (its other connections) for long.
            data = await snapshot_cooperatively(self._enforcer_of(), limit=limit)
        elif self._workers is None:
            data = combine([snapshot(self._enforcer_of(), limit=limit)], limit=limit)
        else:
            data = await self._workers.gather(limit)
        if wants_html(query, scope["headers"]):
            # The page's links keep the request's own parameters.
            kept = {"limit": str(limit)} if limit != DEFAULT_LIMIT else {}
            if query.workers is not None:
                kept["workers"] = query.workers
            endpoint = scope["path"].rsplit("/", 1)[-1] or "."
            await _send_page(send, page.render(data, endpoint=endpoint, query=kept), method)
        else:
            await _send_body(send, 200, await json_cooperatively(data), method)


async def snapshot_cooperatively(enforcer: Enforcer, *, limit: int) -> dict[str, Any]:
    """``snapshot``, yielding the event loop between slices of work."""
    result: dict[str, Any] = {}

    def build() -> Iterator[None]:
        result.update((yield from snapshot_steps(enforcer, limit=limit)))

    await cooperatively(build())
    return result


async def _send_json(
    send: Send, status: int, data: Any, method: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _send_body(send, status, json.dumps(data, separators=(",", ":")).encode(), method, extra)


async def _send_body(
    send: Send, status: int, body: bytes, method: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        (b"x-content-type-options", b"nosniff"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def _send_page(send: Send, body: bytes, method: str) -> None:
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *page.HEADERS,
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


async def not_found(send: Send) -> None:
    """A plain 404, as Starlette's router answers for an unknown path."""
    await send(
        {
            "type": "http.response.start",
            "status": 404,
            "headers": [(b"content-length", b"9"), (b"content-type", b"text/plain; charset=utf-8")],
        }
    )
    await send({"type": "http.response.body", "body": b"Not Found"})
