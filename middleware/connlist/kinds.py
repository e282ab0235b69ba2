"""The table of kinds: every way connlist cuts a connection or lets one go, and the option that turns it on.

Theory of operation.  A *kind* is one rule that ends a connection: a
timeout (``TIMEOUT_KINDS``: the headers, the request, the body's minimum
rate, the send timeout) or a way of making room at the connection budget
(``BUDGET_KINDS``).  Everything connlist knows of a kind is its row here, and
every other module reads the rows:

* its **option**: a field of ``Settings``, with its default, its unit and
  the rule ``resolve`` checks it by, and its key in ``Options`` (the
  middleware's keyword arguments);
* its **counter**: a field of ``Totals`` (the view's totals, the metrics'
  ``kind`` label, the log summary);
* its **step**: the part of the enforcer's sweep that finds what is due in
  the row's list of ``ConnectionsList`` and cuts it, with the earliest
  moment it can next find anything (``Step.due``: where the timer is armed);
  and how soon a clock started now can be due (``Kind.soonest``: how far
  away the timer may ever be);
* what the views and the metrics call it (``label``, ``unit``, ``help``),
  its DEBUG line, and whether ASGI-only mode can enforce it.

So a new kind is a row here with its ``Settings`` field, ``Options`` key,
``Totals`` field and step; the list that holds its connections
(``connlist.connections``) if no list has them yet; and the event of the
feeder that sees it (``connlist.uvicorn``).  The enforcer, the middleware,
the views and the metrics take it from here.  ``_check_kinds`` holds the
declarations to each other at import.

The steps run inside ``Enforcer``'s sweep and use its public methods
(``drain``, ``cut``, ``record``, ``count``, ``call``); the pressure the
enforcer applies (``headers_timeout_now``, ``idle_time_now``) is set before
any step or due time is asked for.
"""

from __future__ import annotations

import inspect
import resource
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, TypedDict, get_args

from connlist.budget import idle_expired, idle_head_since
from connlist.checks import check_number, nearest
from connlist.connections import Connection, send_allowance
from connlist.sweep import lingered, rate_expired, stall_sample, stalled_due

if TYPE_CHECKING:
    # Annotations only (typing.Unpack is Python 3.11+).
    from typing_extensions import Unpack

    from connlist.enforcer import Enforcer

__all__ = [
    "BUDGET_KINDS",
    "DEFAULT_BODY_GRACE",
    "DEFAULT_BODY_MIN_RATE",
    "DEFAULT_HEADERS_TIMEOUT",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_SEND_TIMEOUT",
    "RESERVED_DESCRIPTORS",
    "STEPS",
    "TIMEOUT_KINDS",
    "Kind",
    "Options",
    "RoomKind",
    "Settings",
    "Step",
    "TimeoutKind",
    "Totals",
    "default_max_connections",
    "option_parameters",
    "reading_paused",
    "resolve",
    "resolve_timeouts",
]

# -- the options -----------------------------------------------------------------

# Node.js's requestTimeout and headersTimeout.
DEFAULT_REQUEST_TIMEOUT = 300.0
DEFAULT_HEADERS_TIMEOUT = 60.0
# nginx's send_timeout.
DEFAULT_SEND_TIMEOUT = 60.0
# Apache mod_reqtimeout's default in Debian: body=10,MinRate=500.
DEFAULT_BODY_MIN_RATE = 500.0
DEFAULT_BODY_GRACE = 10.0
# Descriptors max_connections leaves to the rest of the worker by default:
# this many (the listening socket, stdin/out/err, the event loop's epoll and
# wake-up pipe, log files, the debug endpoint's socket and its clients) plus
# one in RESERVED_SHARE of the limit (the app's own connections to databases
# and other services, its files, and the connections the event loop accepts
# in one go before the budget sees them).
RESERVED_DESCRIPTORS = 64
RESERVED_SHARE = 8


def default_max_connections(limit: int | None = None) -> int:
    """The default budget: the descriptor limit less ``RESERVED_DESCRIPTORS`` and 1/``RESERVED_SHARE`` of it.

    ``limit`` defaults to the process's soft ``RLIMIT_NOFILE`` (``ulimit -n``);
    an unlimited one gives 0 (no budget).  1024 gives 832, 4096 gives 3,520.
    At least 1.
    """
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY or limit < 0:
        return 0
    return max(1, limit - RESERVED_DESCRIPTORS - limit // RESERVED_SHARE)


def _option(default: float, unit: str) -> float:
    # A kind's option: a number of ``unit`` >= 0, 0 disables it (check_number's rule).
    return field(default=default, metadata={"unit": unit})


@dataclass(frozen=True)
class Settings:
    """The effective, validated options of one enforcer (seconds, bytes per second): built by ``resolve``."""

    headers_timeout: float = _option(DEFAULT_HEADERS_TIMEOUT, "seconds")
    request_timeout: float = _option(DEFAULT_REQUEST_TIMEOUT, "seconds")
    send_timeout: float = _option(DEFAULT_SEND_TIMEOUT, "seconds")
    body_min_rate: float = _option(DEFAULT_BODY_MIN_RATE, "bytes per second")
    body_grace: float = _option(DEFAULT_BODY_GRACE, "seconds")
    # Connections per worker (0: no budget); read from RLIMIT_NOFILE when built.
    max_connections: int = field(default_factory=default_max_connections)

    @property
    def shortest(self) -> float:
        """The shortest time in which anything that starts now can be due (0: nothing is ever due).

        The enforcer's timer never sleeps longer than this, so an event that
        starts a clock (a request, a body, a stall) never has to re-arm it:
        the least of the timeouts' ``soonest``.
        """
        enabled = [value for kind in TIMEOUT_KINDS if kind.soonest and (value := kind.soonest(self))]
        return min(enabled) if enabled else 0.0


class Options(TypedDict, total=False):
    """The options as ``ConnectionsMiddleware`` and ``resolve`` take them (every one optional).

    ``headers_timeout=None`` derives it from the request timeout (Node's
    rule), ``max_connections=None`` from the descriptor limit.
    """

    headers_timeout: float | None
    request_timeout: float
    send_timeout: float
    body_min_rate: float
    body_grace: float
    max_connections: int | None


OPTIONS = tuple(item.name for item in fields(Settings))


def option_parameters() -> list[inspect.Parameter]:
    """The options as keyword-only parameters with their defaults, for a signature that shows them.

    An option that may be None (``Options``) defaults to None (derived by
    ``resolve``); the others to their ``Settings`` field's default.
    """
    annotations = Options.__annotations__
    result = []
    for item in fields(Settings):
        # A string: the annotations are postponed (a ForwardRef in a TypedDict).
        annotation = str(getattr(annotations[item.name], "__forward_arg__", annotations[item.name]))
        default = None if "None" in annotation else item.default
        result.append(
            inspect.Parameter(
                item.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    return result


def resolve_timeouts(headers_timeout: float | None, request_timeout: float) -> tuple[float, float]:
    """Validate the two options as Node.js's ``http.createServer`` does; return the effective values."""
    request_timeout = check_number("request_timeout", request_timeout, "seconds")
    if headers_timeout is None:
        # Node: headersTimeout defaults to min(60 s, requestTimeout); with
        # the request timeout disabled, to 60 s.
        headers_timeout = min(DEFAULT_HEADERS_TIMEOUT, request_timeout) or DEFAULT_HEADERS_TIMEOUT
    headers_timeout = check_number("headers_timeout", headers_timeout, "seconds")
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        raise ValueError(
            f"headers_timeout ({headers_timeout:g}) must not be greater than "
            f"request_timeout ({request_timeout:g}) when both are enabled"
        )
    return headers_timeout, request_timeout


def _check_max_connections(value: object) -> int:
    if value is None:
        return default_max_connections()
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be None or an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(
            f"max_connections must be >= 0 (0 disables the budget, None derives it), got {value!r}"
        )
    return value


def resolve(**options: Unpack[Options]) -> Settings:
    """Validate every option (``ValueError``/``TypeError`` naming it) and return the effective settings.

    Each kind's option is a number of its unit (``check_number``); the
    rules between options are Node's for the two request timeouts
    (``resolve_timeouts``) and a grace for the body rate.  An unknown name is
    a ``TypeError`` naming the nearest option.
    """
    for name in options:
        if name not in OPTIONS:
            raise TypeError(f"unknown option {name!r}; {nearest(name, OPTIONS)}")
    given: dict[str, object] = dict(options)
    values: dict[str, object] = {}
    values["headers_timeout"], values["request_timeout"] = resolve_timeouts(
        options.get("headers_timeout"), options.get("request_timeout", DEFAULT_REQUEST_TIMEOUT)
    )
    for item in fields(Settings):
        if item.name in values or "unit" not in item.metadata:
            continue
        values[item.name] = check_number(item.name, given.get(item.name, item.default), item.metadata["unit"])
    values["max_connections"] = _check_max_connections(options.get("max_connections"))
    if values["body_min_rate"] and not values["body_grace"]:
        # With no grace a body would be behind the moment its headers are in.
        raise ValueError("body_grace must be greater than 0 while body_min_rate is enabled (0 disables it)")
    return Settings(**values)  # type: ignore[arg-type]  # each value checked above


# -- the counters ------------------------------------------------------------------

# The names of the rows of TIMEOUT_KINDS, as on_timeout receives them.
TimeoutKind = Literal["headers", "request", "rate", "send"]
# What went to make room for a new connection at the budget (see Enforcer.admit).
RoomKind = Literal["idle", "headers", "body", "refused"]


@dataclass
class Totals:
    """Counters since the worker started: one field per row (``Kind.counter``), and the feeders' two.

    Every count is an explicit increment by the one feeder that sees the
    event: ``connections`` and ``requests`` by the server integration's
    protocols (``connlist.uvicorn``), or by ASGI-only mode (``connlist.asgi``),
    which counts each request once in each (a request is a connection of its
    own there); the kinds' by the enforcer.  So the counts stay exact when
    one feeder takes over from the other at a lifespan restart.
    """

    connections: int = 0
    requests: int = 0
    headers_timeouts: int = 0
    request_timeouts: int = 0
    rate_timeouts: int = 0
    send_timeouts: int = 0
    # Connections let go to make room at max_connections, by kind
    # (``<kind>_evictions``: RoomKind), idle ones closed under pressure (the
    # keep-alive idle time shrunk), and new ones refused with 503.
    idle_evictions: int = 0
    headers_evictions: int = 0
    body_evictions: int = 0
    keepalive_evictions: int = 0
    refused: int = 0
    # accept() failed for want of descriptors (logged once).
    accept_failures: int = 0


# -- the steps of the sweep ----------------------------------------------------------

# A timer that fires exactly at a deadline finds nothing expired: Node's rule
# is strict (``start < now - timeout``).  Fire this much later.
SLACK = 0.001
# A body that keeps just ahead of the minimum rate is looked at again no
# sooner than this: the cost of watching it stays bounded, the cut-off at most
# this late.
RATE_RESOLUTION = 0.1


@dataclass(frozen=True)
class Step:
    """One step of the enforcer's sweep, over one list of ``ConnectionsList``.

    ``run(enforcer, now, stop)`` cuts what is due, within the sweep's
    budget (``stop``, a clock value), and says whether it finished (see
    ``Enforcer.drain``); ``due(enforcer, now)`` is the earliest clock value
    at which it can find anything (None: nothing in its list can be due).
    """

    run: Callable[[Enforcer, float, float], bool]
    due: Callable[[Enforcer, float], float | None]


def reading_paused(conn: Connection) -> bool:
    """A body behind the rate is excused while the server, not the client, holds it up."""
    handle = conn.handle
    return handle is not None and handle.connlist_reading_paused()


def _run_keepalive(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Under pressure: keep-alive connections idle longer than the shrunk idle time, closed."""
    idle_time = enforcer.idle_time_now
    if idle_time >= enforcer.keep_alive:
        return True
    connections = enforcer.connections
    kind = BUDGET_BY_NAME["keepalive"]

    def close(conn: Connection) -> None:
        connections.let_go(conn)
        enforcer.count(kind, conn)
        if conn.handle is not None:
            enforcer.call(conn.handle.connlist_close_idle)

    return enforcer.drain(lambda n: idle_expired(connections, idle_time, now, n), close, stop)


def _due_keepalive(enforcer: Enforcer, now: float) -> float | None:
    # Unstamped records are stamped at the next sweep, which the pressure's
    # tick (Enforcer._next_due) brings.
    idle_time = enforcer.idle_time_now
    since = idle_head_since(enforcer.connections)
    if idle_time >= enforcer.keep_alive or since is None:
        return None
    return since + idle_time + SLACK


def _run_active(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Headers and request timeouts, one walk of ``active`` (Node's rule)."""
    settings = enforcer.settings
    headers_timeout = enforcer.headers_timeout_now
    if not (headers_timeout or settings.request_timeout):
        return True
    connections = enforcer.connections

    def cut(conn: Connection) -> None:
        headers = settings.headers_timeout and not conn.headers_completed
        enforcer.cut(conn, "headers" if headers else "request")

    return enforcer.drain(
        lambda n: connections.expired(headers_timeout, settings.request_timeout, n), cut, stop
    )


def _due_active(enforcer: Enforcer, now: float) -> float | None:
    deadline = enforcer.connections.next_deadline(
        enforcer.headers_timeout_now, enforcer.settings.request_timeout
    )
    return None if deadline is None else deadline + SLACK


def _run_rate(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Bodies behind the minimum rate, past their grace (``body``)."""
    settings = enforcer.settings
    if not settings.body_min_rate:
        return True
    connections = enforcer.connections

    def take(n: int) -> list[Connection]:
        batch, enforcer.rate_next, enforcer.grace_end = rate_expired(
            connections, settings.body_min_rate, settings.body_grace, now, n, reading_paused
        )
        return batch

    return enforcer.drain(take, lambda conn: enforcer.cut(conn, "rate"), stop)


def _due_rate(enforcer: Enforcer, now: float) -> float | None:
    # From the last sweep: the earliest rate deadline of the bodies it kept,
    # and the end of the next grace period.  Bodies begun since cannot be
    # due before ``Settings.shortest`` from now, which bounds every delay.
    if not enforcer.settings.body_min_rate:
        return None
    candidates = []
    if enforcer.rate_next is not None:
        candidates.append(max(enforcer.rate_next + SLACK, now + RATE_RESOLUTION))
    if enforcer.grace_end is not None:
        candidates.append(enforcer.grace_end + SLACK)
    return min(candidates) if candidates else None


def _run_send(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Stalled responses: sampled, and those without progress for their allowance aborted."""
    send_timeout = enforcer.settings.send_timeout
    if not send_timeout:
        return True
    connections = enforcer.connections
    # Samples are stamped now, and a stall that began during this sweep (a
    # callback wrote) may be stamped later than its start.
    now = enforcer.clock()

    def sample(conn: Connection) -> None:
        handle = conn.handle
        if handle is None:
            pending, acked = 0, None
        else:
            pending, acked = handle.connlist_pending(), handle.connlist_acked()
        still = stall_sample(connections, conn, pending, now, acked)
        if still >= send_allowance(send_timeout, conn.out_step):
            connections.unstall(conn)
            enforcer.record(conn, "send")
            if handle is not None:
                enforcer.call(handle.connlist_abort)

    return enforcer.drain(lambda n: stalled_due(connections, send_timeout / 4, now, n), sample, stop)


def _due_send(enforcer: Enforcer, now: float) -> float | None:
    # A stalled connection is sampled every send_timeout / 4.
    send_timeout = enforcer.settings.send_timeout
    sampled = enforcer.connections.stalled.head_stamp() if send_timeout else None
    return None if sampled is None else sampled + send_timeout / 4


def _run_linger(enforcer: Enforcer, now: float, stop: float) -> bool:
    """Closed connections that did not go within the linger, aborted."""
    connections = enforcer.connections

    # Read again: the steps before may have taken a while.
    now = enforcer.clock()

    def abort(conn: Connection) -> None:
        if conn.handle is not None:
            enforcer.call(conn.handle.connlist_abort)

    return enforcer.drain(lambda n: lingered(connections, enforcer.linger, now, n), abort, stop)


def _due_linger(enforcer: Enforcer, now: float) -> float | None:
    since = enforcer.connections.closing.head_stamp()
    return None if since is None else since + enforcer.linger


KEEPALIVE = Step(_run_keepalive, _due_keepalive)
ACTIVE = Step(_run_active, _due_active)
RATE = Step(_run_rate, _due_rate)
SEND = Step(_run_send, _due_send)
# Not a kind: what was cut, and did not go within the linger, is aborted.
LINGER_STEP = Step(_run_linger, _due_linger)


# -- the rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One row of TIMEOUT_KINDS or BUDGET_KINDS."""

    # The name on_timeout, the log lines and the metrics' ``kind`` label use.
    name: str
    # Its field of Totals.
    counter: str
    # The Settings field that turns it on (a value of 0 turns it off), and
    # what the views call it; None: on with max_connections.
    setting: str | None
    label: str
    # The unit of the setting's value, as the views write it.
    unit: str
    # The ConnectionsList list its connections are found in.
    list: str
    # Its DEBUG line, formatted with ``s`` (the Settings) and ``now`` (the
    # headers timeout the last sweep applied, shortened under pressure).
    message: str
    # What the metrics' help says of it, and whether it is a row of
    # BUDGET_KINDS (let go for max_connections: the summary's budget part).
    help: str = ""
    room: bool = False
    # Whether ASGI-only mode can enforce it: it sees a request once its
    # headers are in, and never sees the response stall (docs/how-it-works.md).
    asgi: bool = False
    # The sweep's step that finds and cuts it (None: admit's, Enforcer._make_room).
    step: Step | None = None
    # How soon a clock started now can make it due under ``Settings``
    # (0: it is off); the timer never sleeps longer than the least.
    soonest: Callable[[Settings], float] | None = None

    def detail(self, enforcer: Enforcer) -> Callable[[], str]:
        """Its DEBUG line for ``enforcer``, built only if it is written."""
        return lambda: self.message.format(s=enforcer.settings, now=enforcer.headers_timeout_now)


TIMEOUT_KINDS = (
    Kind(
        "headers",
        "headers_timeouts",
        "headers_timeout",
        "headers timeout",
        "s",
        "active",
        "headers not received within {now:g}s, closing",
        step=ACTIVE,
        soonest=lambda s: s.headers_timeout,
    ),
    Kind(
        "request",
        "request_timeouts",
        "request_timeout",
        "request timeout",
        "s",
        "active",
        "request not received within {s.request_timeout:g}s, closing",
        asgi=True,
        step=ACTIVE,
        soonest=lambda s: s.request_timeout,
    ),
    Kind(
        "rate",
        "rate_timeouts",
        "body_min_rate",
        "minimum body rate",
        "bytes/s",
        "body",
        "body slower than {s.body_min_rate:g} bytes/s, closing",
        asgi=True,
        step=RATE,
        # A body is never behind before its grace has passed.
        soonest=lambda s: s.body_grace if s.body_min_rate else 0.0,
    ),
    Kind(
        "send",
        "send_timeouts",
        "send_timeout",
        "send timeout",
        "s",
        "stalled",
        "response not taken for {s.send_timeout:g}s or more, aborting",
        step=SEND,
        # A stall is sampled four times per send_timeout.
        soonest=lambda s: s.send_timeout / 4,
    ),
)

# In the order admit looks for room (keepalive is the sweep's, under pressure).
BUDGET_KINDS = (
    Kind(
        "idle",
        "idle_evictions",
        None,
        "max_connections",
        "connections",
        "idle",
        "longest-idle keep-alive connection closed at {s.max_connections} connections",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "headers",
        "headers_evictions",
        None,
        "max_connections",
        "connections",
        "active",
        "oldest connection sending its headers cut at {s.max_connections} connections (408)",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "body",
        "body_evictions",
        "body_min_rate",
        "max_connections",
        "connections",
        "body",
        "slowest body cut at {s.max_connections} connections (408)",
        help="closed to make room",
        room=True,
    ),
    Kind(
        "keepalive",
        "keepalive_evictions",
        None,
        "max_connections",
        "connections",
        "idle",
        "idle keep-alive connection closed under pressure",
        help="idle past the keep-alive time shortened under pressure",
        room=True,
        step=KEEPALIVE,
    ),
    Kind(
        "refused",
        "refused",
        None,
        "max_connections",
        "connections",
        "all",
        "refused with 503: {s.max_connections} connections all serving requests",
        help="503",
        room=True,
    ),
)

TIMEOUT_BY_NAME = {kind.name: kind for kind in TIMEOUT_KINDS}
BUDGET_BY_NAME = {kind.name: kind for kind in BUDGET_KINDS}
# The sweep's steps, in order: each list once, the closing connections last.
STEPS: tuple[Step, ...] = (
    *dict.fromkeys(kind.step for kind in (*BUDGET_KINDS, *TIMEOUT_KINDS) if kind.step is not None),
    LINGER_STEP,
)


def _check_kinds() -> None:
    # The rows, their names for on_timeout, their counters and their options agree.
    counters = {item.name for item in fields(Totals)}
    for kind in (*TIMEOUT_KINDS, *BUDGET_KINDS):
        if kind.counter not in counters:  # pragma: no cover - a row without its Totals field
            raise AssertionError(f"Totals has no field {kind.counter!r} for the kind {kind.name!r}")
        if kind.setting is not None and kind.setting not in OPTIONS:  # pragma: no cover
            raise AssertionError(f"Settings has no field {kind.setting!r} for the kind {kind.name!r}")
    if tuple(TIMEOUT_BY_NAME) != get_args(TimeoutKind):  # pragma: no cover - a row without its name
        raise AssertionError("TimeoutKind must list the names of TIMEOUT_KINDS, in order")
    if set(get_args(RoomKind)) - set(BUDGET_BY_NAME):  # pragma: no cover
        raise AssertionError("every RoomKind must be a row of BUDGET_KINDS")
    if tuple(Options.__annotations__) != OPTIONS:  # pragma: no cover - an option without its key
        raise AssertionError("Options must list the fields of Settings, in order")


_check_kinds()
