"""Prometheus metrics of the workers' connections, with ``prometheus_client`` (``connlist[prometheus]``).

::

    from starlette.middleware import Middleware
    from connlist import ConnectionsMiddleware
    from connlist.prometheus import MetricsMiddleware

    middleware = [
        Middleware(ConnectionsMiddleware, headers_timeout=10, request_timeout=30),
        Middleware(MetricsMiddleware),  # GET /metrics
    ]

The metrics are the debug view's counts and totals, for the tools that
scrape rather than look: ``connlist_connections{state}`` by phase
(``connlist.core.connections.PHASES``), counters of connections, requests and
timeouts by kind, and ``connlist_server_integration``, 0 when a worker runs
in ASGI-only mode (the debug view's ``mode`` and ``integration_off``).
Nothing is added to the hot path: a refresh copies the list's counts (O(1)
but for the split of writing and waiting, one walk: ``ConnectionsList.counts``)
and the enforcer's totals into the metric objects, on the worker's event
loop, every ``interval`` seconds and right before ``/metrics`` answers.
Why not at each event: in ``prometheus_client``'s multiprocess mode every
write takes a lock and writes an mmap.  Why not a collector
reading the list at scrape time: it would see only the worker that answers.
``docs/metrics.md`` is the reference: the metrics, the options, several
workers and dead ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import threading
import weakref
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from connlist.core.checks import check_number
from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.core.kinds import ROOM_KINDS, TIMEOUT_KINDS, Totals
from connlist.core.logs import log
from connlist.core.views import PHASES
from connlist.observe.processes import process_info
from connlist.servers.integration import POLICIES

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, make_asgi_app
    from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "connlist.prometheus needs prometheus_client: pip install 'connlist[prometheus]'"
    ) from exc

__all__ = [
    "DEFAULT_INTERVAL",
    "PHASES",
    "ConnlistMetrics",
    "Exporter",
    "MetricsMiddleware",
    "count_phases",
    "exposition_registry",
    "make_metrics_app",
    "mark_dead_processes",
    "metrics_for",
    "multiprocess_mode",
]

_TOTALS = tuple(field.name for field in dataclasses.fields(Totals))
# The ``kind`` labels of connlist_timeouts and connlist_budget: the rows of the table of kinds.
TIMEOUT_NAMES = tuple(kind.name for kind in TIMEOUT_KINDS)
ROOM_NAMES = tuple(kind.name for kind in ROOM_KINDS)
_TIMEOUTS_HELP = f"{', '.join(TIMEOUT_NAMES[:-1])} or {TIMEOUT_NAMES[-1]}"
_ROOM_HELP = ", ".join(f"{kind.name} ({kind.help})" for kind in ROOM_KINDS)
DEFAULT_INTERVAL = 1.0


def multiprocess_mode() -> bool:
    """Whether ``prometheus_client`` runs in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` is set)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def count_phases(enforcer: Enforcer) -> dict[str, int]:
    """One worker's connections by phase (``PHASES``), as the debug endpoint's ``counts`` has them."""
    counts = enforcer.connections.counts()
    return {phase: counts[phase] for phase in PHASES}


def _totals(enforcer: Enforcer) -> dict[str, int]:
    return dataclasses.asdict(enforcer.totals)


class ConnlistMetrics:
    """connlist's metric objects in one registry, and the sum of what every exporter of the process saw.

    Get it with ``metrics_for(registry)``: a metric name can be registered
    only once per registry, and in multiprocess mode one process must not
    have two objects writing the same series.
    """

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.connections = Gauge(
            "connlist_connections",
            "Open connections by phase: reading, writing, waiting (idle), timed_out, upgraded (websockets).",
            ["state"],
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.accepted = Counter("connlist_connections_accepted", "Connections accepted.", registry=registry)
        self.requests = Counter(
            "connlist_requests", "Requests whose headers were received.", registry=registry
        )
        self.timeouts = Counter(
            "connlist_timeouts",
            f"Connections cut off by a timeout, by kind ({_TIMEOUTS_HELP}).",
            ["kind"],
            registry=registry,
        )
        # 0 if any worker runs in ASGI-only mode (its headers and send
        # timeouts are not enforced): what an alert watches.
        self.integration = Gauge(
            "connlist_server_integration",
            "1 if the server integration enforces every timeout, 0 in ASGI-only mode (headers and send "
            "timeouts not enforced; see the debug view's integration_off).",
            registry=registry,
            multiprocess_mode="livemin",
        )
        # The server_integration option in force, one series per value (1 where any worker has it).
        self.integration_setting = Gauge(
            "connlist_server_integration_setting",
            "The server_integration option in force: 1 for its value (auto, required, off), 0 for "
            "the others.",
            ["setting"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.budget = Counter(
            "connlist_budget",
            f"Connections let go for max_connections, by kind: {_ROOM_HELP}.",
            ["kind"],
            registry=registry,
        )
        self.max_connections = Gauge(
            "connlist_max_connections",
            "The workers' connection budgets (max_connections; 0: none), summed.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.upgrades_refused = Counter(
            "connlist_upgrades_refused",
            "Websocket upgrade requests refused with 503 at max_upgraded, before their handshake.",
            registry=registry,
        )
        self.header_overflows = Counter(
            "connlist_header_overflows",
            "Request heads past max_header_size, answered 431 and closed.",
            registry=registry,
        )
        self.accept_failures = Counter(
            "connlist_accept_failures",
            "accept() failures for want of file descriptors.",
            registry=registry,
        )
        self._budgets: weakref.WeakKeyDictionary[Exporter, int] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Each exporter's last phases; an exporter dropped without close() leaves with it.
        self._phases: weakref.WeakKeyDictionary[Exporter, dict[str, int]] = weakref.WeakKeyDictionary()
        # Each exporter's last mode: 1 with the server integration, 0 in ASGI-only mode.
        self._integration: weakref.WeakKeyDictionary[Exporter, int] = weakref.WeakKeyDictionary()
        # Each exporter's last server_integration setting.
        self._setting: weakref.WeakKeyDictionary[Exporter, str] = weakref.WeakKeyDictionary()
        # Every series exists from the start, at 0 (in multiprocess mode a
        # value appears in the files only once written).
        for phase in PHASES:
            self.connections.labels(phase).set(0)
        self.accepted.inc(0)
        self.requests.inc(0)
        for kind in TIMEOUT_NAMES:
            self.timeouts.labels(kind).inc(0)
        for kind in ROOM_NAMES:
            self.budget.labels(kind).inc(0)
        self.max_connections.set(0)
        self.upgrades_refused.inc(0)
        self.header_overflows.inc(0)
        self.accept_failures.inc(0)
        for setting in POLICIES:
            self.integration_setting.labels(setting).set(0)

    def _publish(
        self,
        exporter: Exporter,
        phases: dict[str, int] | None,
        deltas: dict[str, int],
        integration: int | None = None,
        budget: int = 0,
        setting: str | None = None,
    ) -> None:
        """Take one exporter's state (phases None: it left) and increments; set the gauges, count."""
        with self._lock:
            if phases is None:
                for kept in (self._phases, self._integration, self._setting, self._budgets):
                    kept.pop(exporter, None)
            else:
                self._phases[exporter] = phases
                if integration is not None:
                    self._integration[exporter] = integration
                if setting is not None:
                    self._setting[exporter] = setting
                self._budgets[exporter] = budget
            self._set_gauges()
            self._count(deltas)

    def _set_gauges(self) -> None:
        """The gauges, from every exporter's last state."""
        if self._integration:
            self.integration.set(min(self._integration.values()))
        in_force = set(self._setting.values())
        for value in POLICIES:
            self.integration_setting.labels(value).set(int(value in in_force))
        self.max_connections.set(sum(self._budgets.values()))
        sums = dict.fromkeys(PHASES, 0)
        for counts in self._phases.values():
            for phase, n in counts.items():
                sums[phase] = sums.get(phase, 0) + n
        for phase, n in sums.items():
            self.connections.labels(phase).set(n)

    def _count(self, deltas: dict[str, int]) -> None:
        """The counters, by one exporter's increments."""
        for row in ROOM_KINDS:
            grew = deltas.get(row.counter, 0)
            if grew > 0:
                self.budget.labels(row.name).inc(grew)
        if deltas.get("accept_failures", 0) > 0:
            self.accept_failures.inc(deltas["accept_failures"])
        if deltas.get("upgrades_refused", 0) > 0:
            self.upgrades_refused.inc(deltas["upgrades_refused"])
        if deltas.get("header_overflows", 0) > 0:
            self.header_overflows.inc(deltas["header_overflows"])
        if deltas.get("connections", 0) > 0:
            self.accepted.inc(deltas["connections"])
        if deltas.get("requests", 0) > 0:
            self.requests.inc(deltas["requests"])
        for row in TIMEOUT_KINDS:
            grew = deltas.get(row.counter, 0)
            if grew > 0:
                self.timeouts.labels(row.name).inc(grew)


_metrics: weakref.WeakKeyDictionary[CollectorRegistry, ConnlistMetrics] = weakref.WeakKeyDictionary()
_metrics_lock = threading.Lock()


def metrics_for(registry: CollectorRegistry = REGISTRY) -> ConnlistMetrics:
    """connlist's metrics in ``registry``, created at the first call."""
    with _metrics_lock:
        metrics = _metrics.get(registry)
        if metrics is None:
            metrics = _metrics[registry] = ConnlistMetrics(registry)
        return metrics


class Exporter:
    """Copies one worker's ``Enforcer`` into ``ConnlistMetrics``.

    Call ``refresh`` on the event loop that serves the enforcer's
    connections, and ``close`` when that server stops.
    """

    def __init__(self, metrics: ConnlistMetrics) -> None:
        self.metrics = metrics
        self._enforcer: Enforcer | None = None
        self._last: dict[str, int] = dict.fromkeys(_TOTALS, 0)

    def refresh(self, enforcer: Enforcer | None) -> None:
        if enforcer is None:
            return
        if enforcer is not self._enforcer:
            # A new enforcer (a new server, or the middleware adopted the
            # protocol's): its totals start from 0.
            self._enforcer = enforcer
            self._last = dict.fromkeys(_TOTALS, 0)
        phases = count_phases(enforcer)
        totals = _totals(enforcer)
        deltas = {name: value - self._last[name] for name, value in totals.items()}
        self._last = totals
        mode = int(enforcer.mode != "asgi")
        self.metrics._publish(
            self, phases, deltas, mode, enforcer.settings.max_connections, enforcer.server_integration
        )

    def close(self, enforcer: Enforcer | None) -> None:
        """Count the last increments and take this worker's connections out of the gauges."""
        self.refresh(enforcer)
        self.metrics._publish(self, None, {})
        self._enforcer = None


# prometheus_client's file of one process's "live" gauges (livesum, liveall, ...): gauge_livesum_<pid>.db
_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]*_(\d+)\.db")


def _exists(pid: int) -> bool:
    """Whether process ``pid`` is there (not gone, not a zombie; another user's too): observe.processes."""
    return process_info(pid) is not None


def mark_dead_processes(path: str | None = None) -> list[int]:
    """``mark_process_dead`` for each process with live gauges in the multiprocess directory that is gone.

    ``path`` defaults to ``PROMETHEUS_MULTIPROC_DIR``.  Returns the pids
    dropped.  Safe to run in several workers at once.
    """
    path = path or os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return []
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return []
    pids = {int(m.group(1)) for m in map(_LIVE_GAUGE_FILE.fullmatch, names) if m is not None}
    dead = sorted(pid for pid in pids if pid != os.getpid() and not _exists(pid))
    for pid in dead:
        # Another worker's scrape may remove the same files first.
        with contextlib.suppress(FileNotFoundError):
            mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    if dead:
        log.info("dropped the Prometheus gauges of dead processes %s", dead)
    return dead


class _LiveMultiProcessCollector(MultiProcessCollector):
    """``MultiProcessCollector`` that first drops the gauges of processes that no longer exist."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)  # type: ignore[no-untyped-call]

    def collect(self) -> Any:
        mark_dead_processes(self._path)
        return super().collect()  # type: ignore[no-untyped-call]


def exposition_registry(registry: CollectorRegistry = REGISTRY) -> CollectorRegistry:
    """What to serve: ``registry``, or in multiprocess mode a registry merging every live process's files."""
    if not multiprocess_mode():
        return registry
    merged = CollectorRegistry()
    _LiveMultiProcessCollector(merged)
    return merged


def make_metrics_app(registry: CollectorRegistry = REGISTRY) -> ASGIApp:
    """``prometheus_client.make_asgi_app`` over ``registry``, or over all processes in multiprocess mode.

    To mount at a path of your own; the values are then as fresh as the
    last periodic refresh (``MetricsMiddleware`` also refreshes right before
    its own endpoint answers).
    """
    app: ASGIApp = make_asgi_app(exposition_registry(registry))
    return app


class MetricsMiddleware:
    """Exports this worker's connections to Prometheus and serves ``/metrics``.

    Use it with ``ConnectionsMiddleware`` in the same app, in either order:
    it finds the worker's enforcer where ``ConnectionsMiddleware`` hands it
    over (``connlist.core.handover``), once a lifespan (or, with the lifespan
    off, a first request) started it.  ``interval`` is the period of the
    background refresh in seconds (``0`` or ``None``: only at scrape time,
    enough with one process); ``path=None`` serves no endpoint (mount
    ``make_metrics_app()`` yourself, or use ``prometheus_client``'s own
    server).  ``registry`` is where the metrics are registered and what the
    endpoint serves, besides connlist's metrics, in single-process mode.
    The endpoint has no access control of its own: expose it as you would any
    ``/metrics``.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        path: str | None = "/metrics",
        interval: float | None = DEFAULT_INTERVAL,
        registry: CollectorRegistry = REGISTRY,
    ) -> None:
        if path is not None and (not isinstance(path, str) or not path.startswith("/")):
            raise ValueError(f"path must be None or a path starting with '/', got {path!r}")
        self.app = app
        self.path = path
        self.interval = check_number("interval", interval, "seconds", none_disables=True)
        self.metrics = metrics_for(registry)
        self.exporter = Exporter(self.metrics)
        self._endpoint = make_metrics_app(registry) if path is not None else None
        # Whether a lifespan (or, with the lifespan off, a first request) started it.
        self._started = False
        self._task: asyncio.Task[None] | None = None

    # -- the worker's enforcer ------------------------------------------------

    @property
    def enforcer(self) -> Enforcer | None:
        """The worker's enforcer handed over, once the lifespan (or a first request) started this."""
        return HANDOVER.enforcer if self._started else None

    def refresh(self) -> None:
        """Copy this worker's view into the metrics now (on the server's event loop)."""
        self.exporter.refresh(self.enforcer)

    # -- background refresh ---------------------------------------------------

    def _start(self) -> None:
        if self._task is not None and not self._task.done():
            return
        if self.interval:
            self._task = asyncio.get_running_loop().create_task(self._run(self.interval))

    async def _run(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.refresh()
            except Exception:  # pragma: no cover - never let the exporter die
                log.exception("refreshing the Prometheus metrics failed")

    async def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.exporter.close(self.enforcer)

    # -- ASGI -----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type == "lifespan":
            # ConnectionsMiddleware hands the enforcer over (before or after us).
            self._started = True
            self._start()
            try:
                await self.app(scope, receive, send)
            finally:
                await self._stop()
            return
        if scope_type == "http":
            if not self._started:
                # The lifespan is off: the enforcer handed over is the one the protocol made.
                self._started = True
                self._start()
            if self._endpoint is not None and scope["path"] == self.path:
                self.refresh()
                await self._endpoint(scope, receive, send)
                return
        await self.app(scope, receive, send)
