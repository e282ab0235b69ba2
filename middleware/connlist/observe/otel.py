"""OpenTelemetry metrics of the workers' connections (``connlist[opentelemetry]``).

::

    from connlist import ConnectionsMiddleware
    from connlist.otel import MetricsMiddleware

    app.add_middleware(MetricsMiddleware)  # the global meter provider, or meter_provider=...
    app.add_middleware(ConnectionsMiddleware, headers_timeout=10, request_timeout=30)

For services that export with OpenTelemetry instead of ``prometheus_client``:
the instruments are registered with the OpenTelemetry API's meter provider
(the global one, or the one passed in), so the service's own reader and
exporter carry them.  They are *observable* instruments: nothing is written
while requests are served; when the SDK collects, the callbacks read the
same numbers as the debug view (the list's counts by phase, the enforcer's
totals), on the worker's event loop.  The names follow Kestrel's connection
metrics in OpenTelemetry's semantic conventions (``kestrel.active_connections``,
``kestrel.rejected_connections``) under a ``connlist.`` namespace;
``docs/metrics.md`` maps them to the Prometheus names.

Each process reports its own connections: with several workers, each one's
SDK exports them under its own resource, and the backend adds them up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from connlist.core.enforcer import Enforcer
from connlist.core.handover import HANDOVER
from connlist.core.kinds import ROOM_KINDS, TIMEOUT_KINDS, Totals
from connlist.core.version import __version__
from connlist.core.views import PHASES

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("connlist.otel needs opentelemetry-api: pip install 'connlist[opentelemetry]'") from exc

__all__ = ["HOP_TIMEOUT", "Instruments", "MetricsMiddleware", "Reading", "instruments_for", "read"]

_TOTALS = tuple(field.name for field in dataclasses.fields(Totals))
# The budget's kinds but the refusals, which are Kestrel's rejected_connections.
_EVICTIONS = tuple(kind for kind in ROOM_KINDS if kind.name != "refused")
_REFUSED = next(kind.counter for kind in ROOM_KINDS if kind.name == "refused")
# How long a collection waits for the worker's event loop; past that (the loop
# is stuck in a handler) it reports the last reading rather than stall the exporter.
HOP_TIMEOUT = 1.0
# The instruments' callbacks run one after the other in a collection: they
# share one reading, so the numbers of one collection agree with each other.
_FRESH = 0.1


@dataclasses.dataclass(frozen=True)
class Reading:
    """One worker's numbers at one moment: what the debug view shows."""

    phases: dict[str, int]
    totals: dict[str, int]
    integration: int
    max_connections: int


def read(enforcer: Enforcer) -> Reading:
    """Read ``enforcer`` (on its event loop: the list is not thread-safe)."""
    counts = enforcer.connections.counts()
    return Reading(
        {phase: counts[phase] for phase in PHASES},
        dataclasses.asdict(enforcer.totals),
        int(enforcer.mode != "asgi"),
        enforcer.settings.max_connections,
    )


class _Source:
    """One middleware's worker: its enforcer, its event loop, and what earlier enforcers counted."""

    def __init__(self) -> None:
        # Whether a lifespan (or, with the lifespan off, a first request) bound it to its worker.
        self.bound = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.serving = False
        self._lock = threading.Lock()
        self._enforcer: Enforcer | None = None
        self._last: Reading | None = None
        self._at = -float("inf")
        # The final totals of the enforcers this source had before (a lifespan
        # restart makes a new one): counters never go back.
        self._base = dict.fromkeys(_TOTALS, 0)

    @property
    def enforcer(self) -> Enforcer | None:
        return HANDOVER.enforcer if self.bound else None

    def _take(self, enforcer: Enforcer, reading: Reading) -> None:
        with self._lock:
            if enforcer is not self._enforcer and self._last is not None:
                for name, value in self._last.totals.items():
                    self._base[name] += value
            self._enforcer, self._last, self._at = enforcer, reading, time.monotonic()

    def _read(self, enforcer: Enforcer) -> Reading | None:
        """``read(enforcer)`` on the worker's loop: at once from its thread, else by a hop to it."""
        loop = self.loop
        with contextlib.suppress(RuntimeError):
            if asyncio.get_running_loop() is loop:
                return read(enforcer)
        assert loop is not None  # set when bound
        future: concurrent.futures.Future[Reading] = concurrent.futures.Future()

        def on_loop() -> None:
            # A caller that gave up cancelled the future.
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_result(read(enforcer))

        try:
            loop.call_soon_threadsafe(on_loop)
            return future.result(timeout=HOP_TIMEOUT)
        except (RuntimeError, concurrent.futures.TimeoutError):  # the loop is closed, or stuck
            future.cancel()
            return None

    def refresh(self) -> None:
        """A new reading if the last is not fresh (the hop to the loop is made without the lock)."""
        enforcer = self.enforcer
        if not self.serving or enforcer is None:
            return
        if enforcer is self._enforcer and time.monotonic() - self._at < _FRESH:
            return
        reading = self._read(enforcer)
        if reading is not None:
            self._take(enforcer, reading)

    def close(self) -> None:
        """The server stops (on its loop): the last totals are kept, the connections leave."""
        enforcer = self.enforcer
        if enforcer is not None:
            self._take(enforcer, read(enforcer))
        self.serving = False

    def observe(self) -> tuple[Reading, bool] | None:
        """The last reading with the earlier enforcers' totals added, and whether the server runs."""
        with self._lock:
            last = self._last
            if last is None:
                return None
            totals = {name: self._base[name] + value for name, value in last.totals.items()}
            return dataclasses.replace(last, totals=totals), self.serving


class Instruments:
    """connlist's instruments on one meter provider, and the sources they read.

    Get it with ``instruments_for(meter_provider)``: an instrument name is
    registered once per meter, and every ``MetricsMiddleware`` of the process
    using that provider adds its worker to the same instruments.
    """

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter("connlist", __version__)
        self._sources: weakref.WeakSet[_Source] = weakref.WeakSet()
        self._sources_lock = threading.Lock()
        counter = meter.create_observable_counter
        meter.create_observable_up_down_counter(
            "connlist.active_connections",
            [self._active],
            unit="{connection}",
            description="Open connections by phase (connlist.connection.state): reading, writing, "
            "waiting (idle keep-alive), timed_out, upgraded (websockets).",
        )
        meter.create_observable_up_down_counter(
            "connlist.upgraded_connections",
            [self._upgraded],
            unit="{connection}",
            description="Open upgraded connections (websockets), as Kestrel's upgraded_connections.",
        )
        counter(
            "connlist.accepted_connections",
            [self._total("connections")],
            unit="{connection}",
            description="Connections accepted.",
        )
        counter(
            "connlist.requests",
            [self._total("requests")],
            unit="{request}",
            description="Requests whose headers were received.",
        )
        counter(
            "connlist.timed_out_connections",
            [self._by_kind(TIMEOUT_KINDS, "connlist.timeout.kind")],
            unit="{connection}",
            description="Connections cut off by a timeout, by kind (connlist.timeout.kind): "
            + ", ".join(kind.name for kind in TIMEOUT_KINDS)
            + ".",
        )
        counter(
            "connlist.rejected_connections",
            [self._total(_REFUSED)],
            unit="{connection}",
            description="New connections refused with 503 at max_connections.",
        )
        counter(
            "connlist.evicted_connections",
            [self._by_kind(_EVICTIONS, "connlist.eviction.kind")],
            unit="{connection}",
            description="Connections closed to make room at max_connections, by kind "
            "(connlist.eviction.kind): "
            + ", ".join(f"{kind.name} ({kind.help})" for kind in _EVICTIONS)
            + ".",
        )
        counter(
            "connlist.rejected_upgrades",
            [self._total("upgrades_refused")],
            unit="{connection}",
            description="Websocket upgrade requests refused with 503 at max_upgraded, before the handshake.",
        )
        counter(
            "connlist.header_overflows",
            [self._total("header_overflows")],
            unit="{request}",
            description="Request heads past max_header_size, answered 431 and closed.",
        )
        counter(
            "connlist.accept_failures",
            [self._total("accept_failures")],
            unit="{failure}",
            description="accept() failures for want of file descriptors.",
        )
        meter.create_observable_up_down_counter(
            "connlist.max_connections",
            [self._max_connections],
            unit="{connection}",
            description="The connection budget (max_connections; 0: none), summed over the servers.",
        )
        meter.create_observable_gauge(
            "connlist.server_integration",
            [self._integration],
            unit="1",
            description="1 if the server integration enforces every timeout, 0 in ASGI-only mode "
            "(headers and send timeouts not enforced; see the debug view's integration_off).",
        )

    def add(self, source: _Source) -> None:
        with self._sources_lock:
            self._sources.add(source)

    def _readings(self) -> Iterator[tuple[Reading, bool]]:
        with self._sources_lock:
            sources = list(self._sources)
        for source in sources:
            source.refresh()
            observed = source.observe()
            if observed is not None:
                yield observed

    def _active(self, options: CallbackOptions) -> Iterable[Observation]:
        sums = dict.fromkeys(PHASES, 0)
        for reading, serving in self._readings():
            if serving:
                for phase, n in reading.phases.items():
                    sums[phase] += n
        return [Observation(n, {"connlist.connection.state": phase}) for phase, n in sums.items()]

    def _upgraded(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(r.phases["upgraded"] for r, serving in self._readings() if serving))]

    def _total(self, counter: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(sum(reading.totals[counter] for reading, _ in self._readings()))]

        return observe

    def _by_kind(self, kinds: Iterable[Any], key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        rows = [(kind.name, kind.counter) for kind in kinds]

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            readings = [reading for reading, _ in self._readings()]
            return [
                Observation(sum(r.totals[counter] for r in readings), {key: name}) for name, counter in rows
            ]

        return observe

    def _max_connections(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(sum(r.max_connections for r, serving in self._readings() if serving))]

    def _integration(self, options: CallbackOptions) -> Iterable[Observation]:
        # The lowest: 0 if any server of the process runs without the integration.
        modes = [reading.integration for reading, serving in self._readings() if serving]
        return [Observation(min(modes))] if modes else []


_instruments: weakref.WeakKeyDictionary[MeterProvider, Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def instruments_for(meter_provider: MeterProvider | None = None) -> Instruments:
    """connlist's instruments on ``meter_provider`` (default: the global one), created at the first call."""
    provider = otel_metrics.get_meter_provider() if meter_provider is None else meter_provider
    with _instruments_lock:
        instruments = _instruments.get(provider)
        if instruments is None:
            instruments = _instruments[provider] = Instruments(provider)
        return instruments


class MetricsMiddleware:
    """Reports this worker's connections through OpenTelemetry's metrics API.

    Use it with ``ConnectionsMiddleware`` in the same app, in either order:
    it finds the worker's enforcer where ``ConnectionsMiddleware`` hands it
    over (``connlist.core.handover``).  ``meter_provider`` is the provider
    the instruments are registered with; ``None`` (the default) takes the
    API's global one (``opentelemetry.metrics.set_meter_provider``), so the
    service's own readers and exporters collect them.  Nothing runs per
    request: the numbers are read when the SDK collects.
    """

    def __init__(self, app: ASGIApp, *, meter_provider: MeterProvider | None = None) -> None:
        self.app = app
        self.instruments = instruments_for(meter_provider)
        self.source = _Source()
        self.instruments.add(self.source)

    def _bind(self) -> None:
        self.source.bound = True
        self.source.loop = asyncio.get_running_loop()
        self.source.serving = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            # ConnectionsMiddleware hands the enforcer over (before or after us).
            self._bind()
            try:
                await self.app(scope, receive, send)
            finally:
                self.source.close()
            return
        if scope["type"] == "http" and not self.source.bound:
            # The lifespan is off: the enforcer handed over is the one the protocol made.
            self._bind()
        await self.app(scope, receive, send)
