"""The table of kinds: every way connlist cuts a connection or lets one go, the options, and their rules.

Theory of operation.  A *kind* is one rule that ends a connection: a
timeout (``TIMEOUT_KINDS``: the headers, the request, the body's minimum
rate, the send timeout, and the keep-alive where the list times it) or a
way of making room at the connection budget (``ROOM_KINDS``).  Everything
connlist knows of a kind is its row here, and every other module reads the
rows:

* its **option**: a field of ``Settings``, with its default, its unit and
  the rule ``resolve`` checks it by, and its key in ``Options`` (the
  middleware's keyword arguments);
* its **counter**: a field of ``Totals`` (the view's totals, the metrics'
  ``kind`` label, the log summary);
* its **rule**: when a connection is due under it (``deadline``, the view's
  time left; ``send_allowance``), and how soon a clock started now can be
  due (``Kind.soonest``: how far away the enforcer's timer may ever be);
* what the views and the metrics call it (``label``, ``unit``, ``help``),
  its DEBUG line, and whether ASGI-only mode can enforce it.

The rules for numbers (``check_number`` and the rest) and the options'
defaults are ``connlist.core.checks``': every option of the package is
checked by them where it is given, and ``resolve`` checks the kinds' with
them.

This module is data and rules: it imports nothing of connlist's but
``connlist.core.checks``.  The sweep's steps that find and cut each kind
are ``connlist.core.sweep``'s; the choice of what goes at the budget is
``connlist.core.budget``'s.  ``_rows_agree`` holds the declarations to each
other at import.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, Protocol, TypedDict, get_args

from connlist.core.checks import (
    DEFAULT_BODY_GRACE,
    DEFAULT_BODY_MIN_RATE,
    DEFAULT_HEADERS_TIMEOUT,
    DEFAULT_MAX_HEADER_SIZE,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_SEND_TIMEOUT,
    check_max_connections,
    check_max_header_size,
    check_max_upgraded,
    check_number,
    check_timeout,
    default_max_connections,
    default_max_upgraded,
    nearest,
    resolve_timeouts,
)

if TYPE_CHECKING:
    # Annotations only (typing.Unpack is Python 3.11+).
    from typing_extensions import Unpack


__all__ = [
    "HEADER_OVERFLOW",
    "ROOM_KINDS",
    "SEND_STEP",
    "SEND_STEP_LIMIT",
    "TIMEOUT_KINDS",
    "UPGRADE_REFUSED",
    "Kind",
    "Options",
    "RoomKind",
    "Settings",
    "TimeoutKind",
    "Totals",
    "deadline",
    "effective_timeouts",
    "option_parameters",
    "resolve",
    "send_allowance",
]

# -- the options -----------------------------------------------------------------


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
    # Upgraded connections (websockets) per worker, counted in max_connections
    # too (0: no share of their own); None derives it (default_max_upgraded).
    max_upgraded: int = None  # type: ignore[assignment]  # set by __post_init__
    # A request's line and headers, in bytes, as they stream in (0: the server's own limits only).
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE

    def __post_init__(self) -> None:
        if self.max_upgraded is None:
            object.__setattr__(self, "max_upgraded", default_max_upgraded(self.max_connections))

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
    rule), ``max_connections=None`` from the descriptor limit, ``max_upgraded=None``
    from ``max_connections``.
    """

    headers_timeout: float | None
    request_timeout: float
    send_timeout: float
    body_min_rate: float
    body_grace: float
    max_connections: int | None
    max_upgraded: int | None
    max_header_size: int


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
    values["max_connections"] = max_connections = check_max_connections(options.get("max_connections"))
    values["max_upgraded"] = check_max_upgraded(options.get("max_upgraded"), max_connections)
    values["max_header_size"] = check_max_header_size(options.get("max_header_size", DEFAULT_MAX_HEADER_SIZE))
    if values["body_min_rate"] and not values["body_grace"]:
        # With no grace a body would be behind the moment its headers are in.
        raise ValueError("body_grace must be greater than 0 while body_min_rate is enabled (0 disables it)")
    return Settings(**values)  # type: ignore[arg-type]  # each value checked above


# -- the counters ------------------------------------------------------------------

# The names of the rows of TIMEOUT_KINDS, as on_timeout receives them
# (all but keepalive, uvicorn's own rule, which on_timeout never sees).
TimeoutKind = Literal["headers", "request", "rate", "send", "keepalive"]
# What went to make room for a new connection at the budget (see Enforcer.admit).
RoomKind = Literal["idle", "headers", "body", "refused"]


@dataclass
class Totals:
    """Counters since the worker started: one field per row (``Kind.counter``), and the feeders' two.

    Every count is an explicit increment by the one feeder that sees the
    event: ``connections`` and ``requests`` by the server integration's
    protocols (``connlist.servers.uvicorn.protocols``), or by ASGI-only mode (``connlist.asgi.asgi_only``),
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
    # Idle keep-alive connections closed: at uvicorn's --timeout-keep-alive
    # where the list times it, and sooner under pressure.
    keepalive_timeouts: int = 0
    # Connections let go to make room at max_connections, by kind
    # (``<kind>_evictions``: RoomKind), and new ones refused with 503.
    idle_evictions: int = 0
    headers_evictions: int = 0
    body_evictions: int = 0
    refused: int = 0
    # accept() failed for want of descriptors (logged once).
    accept_failures: int = 0
    # Connections that left HTTP (websockets handed their handshake), and
    # upgrade requests refused with 503 at max_upgraded.
    upgrades: int = 0
    upgrades_refused: int = 0
    # Requests whose head (request line and headers) passed max_header_size: answered 431 and closed.
    header_overflows: int = 0


# -- the rules of the timeouts -----------------------------------------------------

_INF = math.inf


def effective_timeouts(headers_timeout: float, request_timeout: float) -> tuple[float, float]:
    """The two timeouts as Node's list applies them: checked, and the shorter one the headers timeout.

    The list's arguments are raw numbers (its methods are public), so they
    are checked here; the enforcer's validated settings pass the first,
    cheap, test (NaN and inf fail the comparisons).  Node's
    ``ConnectionsList::Expired`` swaps a headers timeout longer than the
    request timeout; ``resolve_timeouts`` rejects such a pair in the
    options, so the enforcer never passes one this changes.
    """
    if not (
        type(headers_timeout) is float
        and type(request_timeout) is float
        and 0.0 <= headers_timeout < _INF
        and 0.0 <= request_timeout < _INF
    ):
        headers_timeout = check_timeout("headers_timeout", headers_timeout)
        request_timeout = check_timeout("request_timeout", request_timeout)
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        headers_timeout, request_timeout = request_timeout, headers_timeout
    return headers_timeout, request_timeout


# The send timeout's allowance for a client whose window opens in large steps
# (see send_allowance): the step a client must take within a send timeout,
# and the longest allowance, in send timeouts.
SEND_STEP = 32768
SEND_STEP_LIMIT = 8


def send_allowance(send_timeout: float, step: int) -> float:
    """How long a stalled response may go without progress before it is cut: the send timeout's rule.

    Linux acknowledges a slowly read response in steps: a receiver whose
    buffer is full advertises a zero window until a good part of it is free
    again, and the sender sees no progress in between, however steadily the
    client reads (docs/how-it-works.md, "The send timeout").  So a client
    must take ``SEND_STEP`` bytes per ``send_timeout``: one whose largest
    step seen so far (``Connection.out_step``, bytes) is larger gets one
    send timeout per ``SEND_STEP`` of it, up to ``SEND_STEP_LIMIT``.
    """
    steps = step / SEND_STEP
    if steps <= 1.0:
        return send_timeout
    return send_timeout * (steps if steps < SEND_STEP_LIMIT else SEND_STEP_LIMIT)


class Timed(Protocol):
    """What ``deadline`` reads of a connection (``connlist.core.connections.Connection``)."""

    @property
    def is_active(self) -> bool: ...
    @property
    def receiving_body(self) -> bool: ...
    @property
    def is_stalled(self) -> bool: ...
    @property
    def last_message_start(self) -> float: ...
    @property
    def headers_completed(self) -> bool: ...
    @property
    def body_started(self) -> float: ...
    @property
    def body_received(self) -> int: ...
    @property
    def out_since(self) -> float: ...


def deadline(conn: Timed, settings: Settings) -> tuple[TimeoutKind, float] | None:
    """The timeout that cuts ``conn`` off first if nothing changes, and when (a clock value); or None.

    The rules are those the sweep applies: Node's for an active connection
    (the headers timeout while its headers are incomplete, the request
    timeout from its message's first byte), the minimum rate for a body
    being received (``t + grace + b / min_rate``; it moves on as bytes
    arrive), and for a stalled response the send timeout from its last
    progress (the earliest the sampling can cut it; the latest is a quarter
    of ``send_timeout`` later).  An idle, handling or timed-out connection
    has none.  ``settings``: ``Settings``, or anything with its attributes.
    """
    if conn.is_active:
        headers_timeout, request_timeout = effective_timeouts(
            settings.headers_timeout, settings.request_timeout
        )
        start = conn.last_message_start
        kind: TimeoutKind = "request"
        when = _INF
        if request_timeout:
            when = start + request_timeout
        if headers_timeout and not conn.headers_completed and start + headers_timeout < when:
            kind, when = "headers", start + headers_timeout
        body_min_rate = settings.body_min_rate
        if body_min_rate and conn.receiving_body:
            due = conn.body_started + settings.body_grace + conn.body_received / body_min_rate
            if due < when:
                kind, when = "rate", due
        return None if when == _INF else (kind, when)
    if conn.is_stalled and settings.send_timeout:
        return "send", conn.out_since + settings.send_timeout
    return None


# -- the rows ----------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """One row of TIMEOUT_KINDS or ROOM_KINDS."""

    # The name on_timeout, the log lines and the metrics' ``kind`` label use.
    name: str
    # Its field of Totals.
    counter: str
    # The Settings field that turns it on (a value of 0 turns it off); None:
    # on with max_connections (ROOM_KINDS), or the server's (keepalive).
    setting: str | None
    # What the views call it, and the unit of its setting's value as they write it.
    label: str
    unit: str
    # Its DEBUG line, formatted with ``s`` (the Settings) and ``now`` (the
    # headers timeout the last sweep applied, shortened under pressure).
    message: str
    # What the metrics' help says of it, and whether it is a row of
    # ROOM_KINDS (let go for max_connections: the summary's budget part).
    help: str = ""
    room: bool = False
    # Whether ASGI-only mode can enforce it: it sees a request once its
    # headers are in, and never sees the response stall (docs/how-it-works.md).
    asgi: bool = False
    # How soon a clock started now can make it due under ``Settings``
    # (0: it is off); the timer never sleeps longer than the least.
    soonest: Callable[[Settings], float] | None = None


TIMEOUT_KINDS = (
    Kind(
        name="headers",
        counter="headers_timeouts",
        setting="headers_timeout",
        label="headers timeout",
        unit="s",
        message="headers not received within {now:g}s, closing",
        soonest=lambda s: s.headers_timeout,
    ),
    Kind(
        name="request",
        counter="request_timeouts",
        setting="request_timeout",
        label="request timeout",
        unit="s",
        message="request not received within {s.request_timeout:g}s, closing",
        asgi=True,
        soonest=lambda s: s.request_timeout,
    ),
    Kind(
        name="rate",
        counter="rate_timeouts",
        setting="body_min_rate",
        label="minimum body rate",
        unit="bytes/s",
        message="body slower than {s.body_min_rate:g} bytes/s, closing",
        asgi=True,
        # A body is never behind before its grace has passed.
        soonest=lambda s: s.body_grace if s.body_min_rate else 0.0,
    ),
    Kind(
        name="send",
        counter="send_timeouts",
        setting="send_timeout",
        label="send timeout",
        unit="s",
        message="response not taken for {s.send_timeout:g}s or more, aborting",
        # A stall is sampled four times per send_timeout.
        soonest=lambda s: s.send_timeout / 4,
    ),
    Kind(
        # uvicorn's --timeout-keep-alive, where the server integration times
        # it (the enforcer's keep_alive): no soonest, the response that
        # starts an idle time brings the timer forward (Enforcer.wake_by).
        name="keepalive",
        counter="keepalive_timeouts",
        setting=None,
        label="keep-alive timeout",
        unit="s",
        message="idle keep-alive connection closed under pressure",
        help="idle for the server's keep-alive time, or for less under pressure",
    ),
)


def _room(name: str, counter: str, message: str, help: str, setting: str | None = None) -> Kind:
    # A row of ROOM_KINDS: on with max_connections (and ``setting``, if any).
    return Kind(
        name=name,
        counter=counter,
        setting=setting,
        label="max_connections",
        unit="connections",
        message=message,
        help=help,
        room=True,
    )


# In the order admit looks for room.
ROOM_KINDS = (
    _room(
        name="idle",
        counter="idle_evictions",
        message="longest-idle keep-alive connection closed at {s.max_connections} connections",
        help="closed to make room",
    ),
    _room(
        name="headers",
        counter="headers_evictions",
        message="oldest connection sending its headers cut at {s.max_connections} connections (408)",
        help="closed to make room",
    ),
    _room(
        name="body",
        counter="body_evictions",
        setting="body_min_rate",
        message="slowest body cut at {s.max_connections} connections (408)",
        help="closed to make room",
    ),
    _room(
        name="refused",
        counter="refused",
        message="refused with 503: {s.max_connections} connections all serving requests",
        help="503",
    ),
)

# An upgrade request (a websocket) refused with 503 at max_upgraded, before its
# handshake: a row of its own, not a room kind (nothing went to make room).
UPGRADE_REFUSED = Kind(
    name="upgrade_refused",
    counter="upgrades_refused",
    setting="max_upgraded",
    label="max_upgraded",
    unit="connections",
    message="websocket upgrade refused with 503: {s.max_upgraded} upgraded connections",
    help="503 before the handshake",
    room=True,
)

# A request head past max_header_size, answered 431 and closed as it streams in: a row of its
# own, neither timed nor a way of making room.
HEADER_OVERFLOW = Kind(
    name="header_overflow",
    counter="header_overflows",
    setting="max_header_size",
    label="max_header_size",
    unit="bytes",
    message="request head over {s.max_header_size} bytes, answered 431 and closed",
    help="431",
)

TIMEOUT_BY_NAME = {kind.name: kind for kind in TIMEOUT_KINDS}
ROOM_BY_NAME = {kind.name: kind for kind in ROOM_KINDS}


def _rows_agree() -> None:
    # The rows, their names for on_timeout, their counters and their options agree.
    counters = {item.name for item in fields(Totals)}
    for kind in (*TIMEOUT_KINDS, *ROOM_KINDS, UPGRADE_REFUSED, HEADER_OVERFLOW):
        if kind.counter not in counters:  # pragma: no cover - a row without its Totals field
            raise AssertionError(f"Totals has no field {kind.counter!r} for the kind {kind.name!r}")
        if kind.setting is not None and kind.setting not in OPTIONS:  # pragma: no cover
            raise AssertionError(f"Settings has no field {kind.setting!r} for the kind {kind.name!r}")
    if tuple(TIMEOUT_BY_NAME) != get_args(TimeoutKind):  # pragma: no cover - a row without its name
        raise AssertionError("TimeoutKind must list the names of TIMEOUT_KINDS, in order")
    if set(get_args(RoomKind)) - set(ROOM_BY_NAME):  # pragma: no cover
        raise AssertionError("every RoomKind must be a row of ROOM_KINDS")
    if tuple(Options.__annotations__) != OPTIONS:  # pragma: no cover - an option without its key
        raise AssertionError("Options must list the fields of Settings, in order")


_rows_agree()
