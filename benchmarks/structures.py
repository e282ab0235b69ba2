"""Benchmark: connlist's intrusive ConnectionsList against five plain Python structures.

When Node.js replaced the two ordered ``std::set`` of its ConnectionsList with
intrusive lists, a reviewer asked "Have you benchmarked against an
unordered_set or just a plain vector?".  This script answers it for Python:
the same workload runs on six structures that implement the same small
interface (``connect``, ``message_begin``, ``headers_complete``,
``message_complete``, ``remove``, ``expired``) with Node's expiry rule.

1. ``connlist``    -- ``connlist.connections.ConnectionsList`` (intrusive doubly linked lists);
2. ``SortedList``  -- ``sortedcontainers.SortedList`` of ``(start, id, conn)``: the old
   ``std::set``; ``expired()`` walks from the smallest and stops early;
3. ``set``         -- the ``unordered_set``: ``expired()`` scans every active connection;
4. ``list``        -- the plain vector: ``message_begin``/``message_complete`` use
   ``list.remove`` (O(n)), ``expired()`` scans every active connection;
5. ``dict``        -- insertion ordered: ``message_begin`` deletes and re-inserts (moves
   to the end), ``expired()`` walks from the start and stops early;
6. ``OrderedDict`` -- ``move_to_end``; ``expired()`` walks from the start and stops early.

The five alternatives keep ``all`` in a dict (only ``active`` differs) and their
records carry the same payload fields as ``connlist.Connection``, with two
boolean flags (``tracked``, ``active``) instead of the four intrusive links, so
membership tests are an attribute read everywhere: the comparison isolates the
ordering structure.  A short differential check at start-up makes sure that all
six report the same expired connections for the same random event stream.

Workload (all deterministic: a fake clock, ``itertools.count(1.0, 1.0).__next__``,
advances by 1.0 on every read; random orders are pre-generated from ``--seed``):

(a) message cycle: one ``message_complete`` + ``message_begin`` + ``headers_complete``
    on a connection, in round-robin order and in a pre-generated random order.
    The three calls run in that rotated order so that every connection is
    mid-message between its visits: ``active`` holds N connections throughout,
    the regime in which the structures differ (a cycle from idle to idle would
    leave ``active`` almost empty).  The cost includes the Python loop.
(b) ``expired()`` with all N connections active and none expired, per call.
(c) ``expired()`` with exactly 1% of the active connections old enough (the
    oldest N/100); between timed calls (outside the timed region) the expired
    connections begin a new message, which moves them to the tail.
(d) bytes per tracked connection (``tracemalloc``, connection records included)
    for N = 10,000 just after connecting (all active), and after a pass of
    random-order message cycles (churn: dict holes, re-allocated keys).

(a)-(c) run on the same structure, in that order, so (b) and (c) see the state
that message cycles leave (for ``dict``: deleted entries ahead of the first live
one; for everyone: records and start-time floats scattered in memory by the
random order).  Each timing is repeated (7 times by default; each repeat does
as many operations as fit its time budget) and the median is reported, in ns
per operation.  All structures at all N are built up front and the repeats of
each phase are interleaved across them, so a slow spell of a shared machine
hits them all alike; the targets also show the range of the per-repeat ratios.
The garbage collector is disabled while timing, as ``timeit`` does.  N = 100,
10,000 and 100,000 (``--quick``: 100 and 10,000, 3 repeats, smaller budgets).

Run it pinned to one core, on an otherwise idle machine::

    taskset -c 1 python3 benchmarks/structures.py                  # about a minute
    taskset -c 1 python3 benchmarks/structures.py --json bench.json
    taskset -c 1 python3 benchmarks/structures.py --quick          # smoke test, seconds

The report ends with connlist's targets: message cycle at 100,000 within 1.25x
of its cost at 100; at least 3x cheaper than SortedList at 100,000;
``expired()`` with nothing expired within 1.5x from 100 to 100,000; at most 300
bytes per tracked connection.  It exits 0 whether they are met or not.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import json
import math
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from operator import attrgetter
from time import perf_counter_ns
from typing import Any

from sortedcontainers import SortedList

import connlist.connections
from connlist.connections import Address, Connection, ConnectionsList, check_timeout

# -- the alternatives ------------------------------------------------------------

_alt_ids = itertools.count(1)


class Conn:
    """A connection record for the alternatives: connlist's payload, flags instead of links."""

    __slots__ = (
        "active",
        "client",
        "connected_at",
        "handle",
        "headers_completed",
        "id",
        "last_message_start",
        "method",
        "path",
        "requests",
        "responding",
        "server",
        "tracked",
    )

    def __init__(
        self,
        *,
        client: Address = None,
        server: Address = None,
        handle: Any = None,
        connected_at: float = 0.0,
    ) -> None:
        self.tracked = False
        self.active = False
        self.id = next(_alt_ids)
        self.client = client
        self.server = server
        self.handle = handle
        self.connected_at = connected_at
        self.last_message_start = 0.0
        self.headers_completed = False
        self.requests = 0
        self.method: str | None = None
        self.path: str | None = None
        self.responding = False


class SortedConn(Conn):
    """Also remembers its current key in the SortedList, so removal builds no tuple."""

    __slots__ = ("key",)

    def __init__(self, **details: Any) -> None:
        super().__init__(**details)
        self.key: tuple[float, int, SortedConn] | None = None


def _effective(headers_timeout: float, request_timeout: float) -> tuple[float, float]:
    """The same validation and swap as ConnectionsList._effective (same cost)."""
    headers_timeout = check_timeout("headers_timeout", headers_timeout)
    request_timeout = check_timeout("request_timeout", request_timeout)
    if headers_timeout and request_timeout and headers_timeout > request_timeout:
        headers_timeout, request_timeout = request_timeout, headers_timeout
    return headers_timeout, request_timeout


class _Alternative:
    """What the alternatives share: ``all`` as an insertion-ordered dict."""

    __slots__ = ("_active", "_all", "_clock")
    _active: Any

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._all: dict[Conn, None] = {}

    def __len__(self) -> int:
        return len(self._all)

    @property
    def active_count(self) -> int:
        return len(self._active)

    def headers_complete(self, conn: Conn) -> None:
        conn.headers_completed = True


class SortedListConns(_Alternative):
    """``active`` is a SortedList of ``(last_message_start, id, conn)``: Node's old std::set."""

    __slots__ = ()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._active: SortedList = SortedList()

    def connect(self, **details: Any) -> SortedConn:
        now = self._clock()
        conn = SortedConn(connected_at=now, **details)
        self._all[conn] = None
        conn.tracked = True
        conn.last_message_start = now
        conn.key = key = (now, conn.id, conn)
        self._active.add(key)
        conn.active = True
        return conn

    def message_begin(self, conn: SortedConn) -> None:
        if not conn.tracked:
            return
        active = self._active
        if conn.active:
            active.remove(conn.key)
        else:
            conn.active = True
        conn.last_message_start = now = self._clock()
        conn.headers_completed = False
        conn.key = key = (now, conn.id, conn)
        active.add(key)

    def message_complete(self, conn: SortedConn) -> None:
        if not conn.tracked:
            return
        if conn.active:
            self._active.remove(conn.key)
            conn.active = False
        conn.last_message_start = 0.0
        conn.requests += 1

    def remove(self, conn: SortedConn) -> None:
        if conn.active:
            self._active.remove(conn.key)
            conn.active = False
        if conn.tracked:
            del self._all[conn]
            conn.tracked = False

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        young = headers_deadline if headers_timeout else request_deadline
        expired: list[Conn] = []
        active = self._active
        for key in active:  # smallest (oldest) first
            start = key[0]
            if start >= young:
                break
            conn = key[2]
            if start < request_deadline or (not conn.headers_completed and start < headers_deadline):
                expired.append(conn)
        for conn in expired:
            active.remove(conn.key)
            conn.active = False
        return expired


class _RemovedByValue(_Alternative):
    """``active`` is a container with ``remove(conn)``: the set and the list."""

    __slots__ = ()

    def message_complete(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if conn.active:
            self._active.remove(conn)
            conn.active = False
        conn.last_message_start = 0.0
        conn.requests += 1

    def remove(self, conn: Conn) -> None:
        if conn.active:
            self._active.remove(conn)
            conn.active = False
        if conn.tracked:
            del self._all[conn]
            conn.tracked = False


class SetConns(_RemovedByValue):
    """``active`` is a set (the unordered_set): ``expired()`` scans all of it."""

    __slots__ = ()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._active: set[Conn] = set()

    def connect(self, **details: Any) -> Conn:
        now = self._clock()
        conn = Conn(connected_at=now, **details)
        self._all[conn] = None
        conn.tracked = True
        conn.last_message_start = now
        self._active.add(conn)
        conn.active = True
        return conn

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if not conn.active:
            self._active.add(conn)
            conn.active = True
        conn.last_message_start = self._clock()
        conn.headers_completed = False

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        young = headers_deadline if headers_timeout else request_deadline
        expired: list[Conn] = []
        active = self._active
        for conn in active:
            start = conn.last_message_start
            if start < young and (
                start < request_deadline or (not conn.headers_completed and start < headers_deadline)
            ):
                expired.append(conn)
        if expired:
            active.difference_update(expired)
            for conn in expired:
                conn.active = False
        return expired


class ListConns(_RemovedByValue):
    """``active`` is a plain list (the vector): ``list.remove`` is O(n), ``expired()`` scans."""

    __slots__ = ()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._active: list[Conn] = []

    def connect(self, **details: Any) -> Conn:
        now = self._clock()
        conn = Conn(connected_at=now, **details)
        self._all[conn] = None
        conn.tracked = True
        conn.last_message_start = now
        self._active.append(conn)
        conn.active = True
        return conn

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        active = self._active
        if conn.active:
            active.remove(conn)
        else:
            conn.active = True
        conn.last_message_start = self._clock()
        conn.headers_completed = False
        active.append(conn)

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        young = headers_deadline if headers_timeout else request_deadline
        expired: list[Conn] = []
        active = self._active
        for conn in active:
            start = conn.last_message_start
            if start < young and (
                start < request_deadline or (not conn.headers_completed and start < headers_deadline)
            ):
                expired.append(conn)
        if expired:
            for conn in expired:
                conn.active = False
            # Erase-remove in one pass (not one O(n) list.remove per expired connection).
            active[:] = [conn for conn in active if conn.active]
        return expired


class DictConns(_Alternative):
    """``active`` is an insertion-ordered dict: delete + re-insert moves to the end."""

    __slots__ = ()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._active: dict[Conn, None] = {}

    def connect(self, **details: Any) -> Conn:
        now = self._clock()
        conn = Conn(connected_at=now, **details)
        self._all[conn] = None
        conn.tracked = True
        conn.last_message_start = now
        self._active[conn] = None
        conn.active = True
        return conn

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        active = self._active
        if conn.active:
            del active[conn]
        else:
            conn.active = True
        conn.last_message_start = self._clock()
        conn.headers_completed = False
        active[conn] = None

    def message_complete(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if conn.active:
            del self._active[conn]
            conn.active = False
        conn.last_message_start = 0.0
        conn.requests += 1

    def remove(self, conn: Conn) -> None:
        if conn.active:
            del self._active[conn]
            conn.active = False
        if conn.tracked:
            del self._all[conn]
            conn.tracked = False

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -math.inf
        request_deadline = now - request_timeout if request_timeout else -math.inf
        young = headers_deadline if headers_timeout else request_deadline
        expired: list[Conn] = []
        active = self._active
        for conn in active:  # insertion order: oldest message start first
            start = conn.last_message_start
            if start >= young:
                break
            if start < request_deadline or (not conn.headers_completed and start < headers_deadline):
                expired.append(conn)
        for conn in expired:
            del active[conn]
            conn.active = False
        return expired


class OrderedDictConns(DictConns):
    """``active`` is a collections.OrderedDict: ``move_to_end`` on message_begin.

    Everything but ``message_begin`` is the dict variant's, on an OrderedDict.
    """

    __slots__ = ()

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self._active = OrderedDict()

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        conn.last_message_start = self._clock()
        conn.headers_completed = False
        if conn.active:
            self._active.move_to_end(conn)
        else:
            self._active[conn] = None
            conn.active = True


STRUCTURES: dict[str, Callable[..., Any]] = {
    "connlist": ConnectionsList,
    "SortedList": SortedListConns,
    "set": SetConns,
    "list": ListConns,
    "dict": DictConns,
    "OrderedDict": OrderedDictConns,
}


def _fake_clock() -> Callable[[], float]:
    """Monotonic, deterministic and cheap (a C call): 1.0, 2.0, 3.0, ... one tick per read."""
    return itertools.count(1.0, 1.0).__next__


def _active_count(s: Any) -> int:
    return int(s.active_count)


# -- differential check ------------------------------------------------------------


def self_check(seed: int, steps: int = 5000) -> None:
    """All six structures must expire the same connections for the same event stream."""
    rng = random.Random(seed)
    events: list[tuple[Any, ...]] = []
    n = 0
    timeouts = [0, 0, 3, 10, 25, 60, 150, 400]
    for _ in range(steps):
        r = rng.random()
        if r < 0.15 or n == 0:
            events.append(("connect",))
            n += 1
        elif r < 0.45:
            events.append(("begin", rng.randrange(n)))
        elif r < 0.65:
            events.append(("headers", rng.randrange(n)))
        elif r < 0.85:
            events.append(("complete", rng.randrange(n)))
        elif r < 0.90:
            events.append(("remove", rng.randrange(n)))
        else:
            events.append(("expired", float(rng.choice(timeouts)), float(rng.choice(timeouts))))
    reference: list[Any] | None = None
    for name, factory in STRUCTURES.items():
        s = factory(clock=_fake_clock())
        conns: list[Any] = []
        index: dict[Any, int] = {}
        trace: list[Any] = []
        for event in events:
            kind = event[0]
            if kind == "connect":
                conn = s.connect(client="127.0.0.1:1")
                index[conn] = len(conns)
                conns.append(conn)
            elif kind == "begin":
                s.message_begin(conns[event[1]])
            elif kind == "headers":
                s.headers_complete(conns[event[1]])
            elif kind == "complete":
                s.message_complete(conns[event[1]])
            elif kind == "remove":
                s.remove(conns[event[1]])
            else:
                trace.append(sorted(index[c] for c in s.expired(event[1], event[2])))
            trace.append((len(s), _active_count(s)))
        if reference is None:
            reference = trace
        elif trace != reference:
            first = next(i for i, (a, b) in enumerate(zip(trace, reference, strict=True)) if a != b)
            raise AssertionError(f"{name} disagrees with connlist at trace entry {first}")


# -- timing ----------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _timer_overhead_ns() -> float:
    samples = []
    for _ in range(2000):
        t0 = perf_counter_ns()
        samples.append(perf_counter_ns() - t0)
    return _median([float(x) for x in samples])


def _empty_loop_ns(n: int = 200_000) -> float:
    chunk = [None] * n
    runs = []
    for _ in range(5):
        t0 = perf_counter_ns()
        for _c in chunk:
            pass
        runs.append((perf_counter_ns() - t0) / n)
    return _median(runs)


def _run_cycles(s: Any, chunk: list[Any]) -> int:
    mc = s.message_complete
    mb = s.message_begin
    hc = s.headers_complete
    t0 = perf_counter_ns()
    for c in chunk:
        mc(c)
        mb(c)
        hc(c)
    return perf_counter_ns() - t0


PHASES = ("cycle_round_robin", "cycle_random", "expired_none", "expired_1pct")


class _Bench:
    """One structure holding N connections, measured phase by phase.

    ``prepare(phase)`` warms up and picks how many operations one timed run
    does (to fit the phase's time budget); ``run(phase)`` does one timed run
    and records ns per operation.  The driver interleaves the runs of the six
    structures, so a slow spell of the machine hits them all alike.
    """

    def __init__(self, name: str, n: int, random_indices: list[int], budgets: dict[str, float]) -> None:
        self.name = name
        self.n = n
        self.budgets = budgets
        self.clock = _fake_clock()
        self.s = STRUCTURES[name](clock=self.clock)
        self.conns = [self.s.connect() for _ in range(n)]
        self.random_indices = random_indices
        self.source: Iterator[Any] = iter(())
        self.order: deque[Any] = deque()
        self.size: dict[str, int] = {}
        self.runs: dict[str, list[float]] = {phase: [] for phase in PHASES}

    def result(self) -> dict[str, Any]:
        out = {}
        for phase in PHASES:
            runs = self.runs[phase]
            unit = "ops_per_run" if phase.startswith("cycle") else "calls_per_run"
            out[phase] = {
                "median_ns": _median(runs),
                "min_ns": min(runs),
                "runs_ns": runs,
                unit: self.size[phase],
            }
            if phase == "expired_1pct":
                out[phase]["expired_per_call"] = self.n // 100
        return out

    def check_active(self, when: str) -> None:
        if _active_count(self.s) != self.n:
            raise AssertionError(f"{self.name}: {_active_count(self.s)} active {when}, expected {self.n}")

    # -- (a) message cycles

    def _cycles(self, count: int) -> float:
        chunk = list(itertools.islice(self.source, count))
        return _run_cycles(self.s, chunk) / count

    def _prepare_cycles(self, warm_s: float) -> int:
        per = max(self._cycles(32), 1.0)
        warm = min(self.n, int(warm_s * 1e9 / per))
        if warm > 32:
            per = max(self._cycles(warm), 1.0)
        return max(16, min(200_000, int(self.budgets["cycle"] * 1e9 / per)))

    # -- (b) expired(), nothing expired

    def _expired_none(self, calls: int) -> float:
        exp = self.s.expired
        # Every call reads the clock once: pick the timeout so that even the
        # last call's deadline stays below the oldest start.
        peek = self.clock()
        headers_timeout = peek + calls + 2 - self.order[0].last_message_start + 0.5
        request_timeout = 2 * headers_timeout
        loop = range(calls)
        t0 = perf_counter_ns()
        for _ in loop:
            exp(headers_timeout, request_timeout)
        elapsed = perf_counter_ns() - t0
        self.check_active("after the nothing-expired run")
        return elapsed / calls

    # -- (c) expired(), oldest 1% expired

    def _expired_some_once(self) -> int:
        """Time one call that expires exactly the oldest 1%, then put those back (untimed).

        ``order`` holds the active connections by message start, oldest first:
        the timeout puts the deadline between the k-th and (k+1)-th oldest
        start; afterwards the k expired connections begin a new message, which
        moves them to the tail.
        """
        k = self.n // 100
        order = self.order
        now = self.clock() + 1.0  # the value expired() will read
        cutoff = order[k - 1].last_message_start + 0.5
        timeout = now - cutoff  # both rules at the same deadline: exactly k expire
        exp = self.s.expired
        t0 = perf_counter_ns()
        result = exp(timeout, timeout)
        elapsed = perf_counter_ns() - t0
        if len(result) != k:
            raise AssertionError(f"{self.name}: expected {k} expired, got {len(result)}")
        mb = self.s.message_begin
        for _ in range(k):
            conn = order.popleft()
            mb(conn)
            order.append(conn)
        return elapsed

    def _expired_some(self, rounds: int) -> float:
        return sum(self._expired_some_once() for _ in range(rounds)) / rounds

    # -- driver interface

    def prepare(self, phase: str) -> None:
        if phase == "cycle_round_robin":
            # Connect order is already the active order: every visit takes
            # the oldest (the head) from the start, no warm-up needed.
            self.source = itertools.cycle(self.conns)
            self.size[phase] = self._prepare_cycles(0.0)
        elif phase == "cycle_random":
            random_conns = [self.conns[i] for i in self.random_indices]
            self.source = itertools.cycle(random_conns)
            self.size[phase] = self._prepare_cycles(self.budgets["warm"])
        elif phase == "expired_none":
            self.source = iter(())
            self.check_active("after the message cycles")
            self.order = deque(sorted(self.conns, key=attrgetter("last_message_start")))
            per = max(self._expired_none(3), 1.0)
            self.size[phase] = max(3, min(100_000, int(self.budgets["expired_none"] * 1e9 / per)))
        else:
            per = max(float(self._expired_some_once()), 1.0)
            self.size[phase] = max(5, min(2000, int(self.budgets["expired_some"] * 1e9 / per)))

    def run(self, phase: str) -> None:
        size = self.size[phase]
        if phase.startswith("cycle"):
            value = self._cycles(size)
        elif phase == "expired_none":
            value = self._expired_none(size)
        else:
            value = self._expired_some(size)
        self.runs[phase].append(value)


def bench_all(sizes: list[int], seed: int, repeats: int, budgets: dict[str, float]) -> dict[str, Any]:
    """Every structure at every N, alive together; each phase's repeats interleaved across all of them.

    Interleaving makes a slow spell of a shared machine hit every structure and
    every N alike, so that ratios (across structures and across N) hold up.
    """
    benches = []
    for n in sizes:
        random_indices = random.Random(seed * 1_000_003 + n).choices(range(n), k=max(200_000, n))
        benches.extend(_Bench(name, n, random_indices, budgets) for name in STRUCTURES)
    gc.collect()
    for phase in PHASES:
        t0 = time.perf_counter()
        for b in benches:
            b.prepare(phase)
        for _ in range(repeats):
            for b in benches:
                b.run(phase)
        print(f"  {phase}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    results: dict[str, dict[str, dict[int, Any]]] = {name: {} for name in STRUCTURES}
    for b in benches:
        for metric, value in b.result().items():
            results[b.name].setdefault(metric, {})[b.n] = value
    del benches
    gc.collect()
    return results


def measure_memory(name: str, n: int, random_indices: list[int]) -> dict[str, float]:
    """tracemalloc bytes per tracked connection, records included (the driver's list excluded)."""
    factory = STRUCTURES[name]
    clock = _fake_clock()
    conns: list[Any] = [None] * n
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s = factory(clock=clock)
        for i in range(n):
            conns[i] = s.connect()
        fresh = tracemalloc.get_traced_memory()[0] - before
        mc, mb, hc = s.message_complete, s.message_begin, s.headers_complete
        for i in random_indices[:n]:
            conn = conns[i]
            mc(conn)
            mb(conn)
            hc(conn)
        gc.collect()
        churned = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    record = sys.getsizeof(Connection() if name == "connlist" else conns[0])
    del s
    return {"fresh": fresh / n, "after_cycles": churned / n, "record_getsizeof": float(record)}


# -- report ----------------------------------------------------------------------------

TABLES = [
    ("cycle_random", "(a) message cycle, random order: ns per cycle (complete + begin + headers)"),
    ("cycle_round_robin", "(a) message cycle, round-robin order: ns per cycle"),
    ("expired_none", "(b) expired(), all N active, none expired: ns per call"),
    ("expired_1pct", "(c) expired(), oldest 1% of N expired: ns per call"),
]


def _fmt_ns(value: float) -> str:
    if value >= 100_000:
        return f"{value / 1000:,.0f} us"
    return f"{value:,.0f}"


def _table(title: str, sizes: list[int], rows: dict[str, dict[int, float]], ratio_at: int) -> list[str]:
    head = f"{'structure':<12}" + "".join(f"{'N=' + format(n, ','):>14}" for n in sizes)
    head += f"{'x connlist @' + format(ratio_at, ','):>20}"
    lines = [title, head, "-" * len(head)]
    base = rows["connlist"][ratio_at]
    for name, by_n in rows.items():
        cells = "".join(f"{_fmt_ns(by_n[n]):>14}" for n in sizes)
        lines.append(f"{name:<12}{cells}{by_n[ratio_at] / base:>19.2f}x")
    return lines


def _ratio(num: dict[str, Any], den: dict[str, Any]) -> dict[str, Any]:
    """Ratio of two medians, with the range of the per-repeat ratios (repeats ran interleaved)."""
    per_repeat = [a / b for a, b in zip(num["runs_ns"], den["runs_ns"], strict=True)]
    return {
        "value": num["median_ns"] / den["median_ns"],
        "per_repeat_min": min(per_repeat),
        "per_repeat_max": max(per_repeat),
        # Noise only adds time: on a busy machine the ratio of the fastest runs is a useful second look.
        "ratio_of_mins": min(num["runs_ns"]) / min(den["runs_ns"]),
    }


def _ratio_target(text: str, ratio: dict[str, Any], met: bool, prefix: str = "") -> dict[str, Any]:
    shown = (
        f"{prefix}{ratio['value']:.2f}x "
        f"(per-repeat {ratio['per_repeat_min']:.2f}-{ratio['per_repeat_max']:.2f}x, "
        f"fastest runs {ratio['ratio_of_mins']:.2f}x)"
    )
    return {"target": text, **ratio, "shown": shown, "met": met}


def evaluate_targets(
    results: dict[str, Any], memory: dict[str, Any], sizes: list[int]
) -> list[dict[str, Any]]:
    small, big = sizes[0], sizes[-1]
    cl = results["connlist"]
    sl = results["SortedList"]
    targets = []
    for order in ("cycle_random", "cycle_round_robin"):
        label = order.removeprefix("cycle_").replace("_", "-")
        ratio = _ratio(cl[order][big], cl[order][small])
        text = f"message cycle ({label}) at {big:,} within 1.25x of its cost at {small:,}"
        targets.append(_ratio_target(text, ratio, ratio["value"] <= 1.25))
    for order in ("cycle_random", "cycle_round_robin"):
        label = order.removeprefix("cycle_").replace("_", "-")
        ratio = _ratio(sl[order][big], cl[order][big])
        text = f"message cycle ({label}) at {big:,} at least 3x cheaper than SortedList"
        targets.append(_ratio_target(text, ratio, ratio["value"] >= 3.0, "SortedList/connlist = "))
    ratio = _ratio(cl["expired_none"][big], cl["expired_none"][small])
    text = f"expired() with nothing expired at {big:,} within 1.5x of its cost at {small:,}"
    targets.append(_ratio_target(text, ratio, ratio["value"] <= 1.5))
    per = memory["connlist"]["fresh"]
    targets.append(
        {
            "target": f"at most 300 bytes per tracked connection (N={memory['n']:,})",
            "value": per,
            "shown": f"{per:.0f} B",
            "met": per <= 300,
        }
    )
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke test: N up to 10,000, fewer repeats")
    parser.add_argument("--json", metavar="PATH", help="write every number to PATH as JSON")
    parser.add_argument("--repeats", type=int, help="timed repeats per measurement (default 7, quick 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the pre-generated random orders")
    args = parser.parse_args(argv)

    sizes = [100, 10_000] if args.quick else [100, 10_000, 100_000]
    repeats = args.repeats or (3 if args.quick else 7)
    scale = 0.25 if args.quick else 1.0
    budgets = {
        "cycle": 0.12 * scale,
        "warm": 0.3 * scale,
        "expired_none": 0.06 * scale,
        "expired_some": 0.08 * scale,
    }
    mem_n = 10_000
    started = time.perf_counter()
    # Which connections.py was measured (the working tree of an editable install may be mid-edit).
    source_path = connlist.connections.__file__ or "?"
    with open(source_path, "rb") as f:
        source_sha = hashlib.sha256(f.read()).hexdigest()

    self_check(args.seed)
    timer_ns = _timer_overhead_ns()
    loop_ns = _empty_loop_ns()

    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        results = bench_all(sizes, args.seed, repeats, budgets)
    finally:
        if gc_was_enabled:
            gc.enable()

    mem_indices = random.Random(args.seed).choices(range(mem_n), k=mem_n)
    memory: dict[str, Any] = {name: measure_memory(name, mem_n, mem_indices) for name in STRUCTURES}
    memory["n"] = mem_n
    targets = evaluate_targets(results, memory, sizes)
    elapsed = time.perf_counter() - started

    out: list[str] = []
    out.append(
        f"connlist structures benchmark -- Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.machine()}, "
        f"repeats={repeats} (median), seed={args.seed}{', QUICK' if args.quick else ''}"
    )
    out.append(f"connlist: {source_path} (sha256 {source_sha[:12]})")
    out.append(
        f"timer overhead {timer_ns:.0f} ns per timed region; empty loop {loop_ns:.1f} ns per "
        "iteration (both included, not subtracted)"
    )
    for metric, title in TABLES:
        rows = {name: {n: results[name][metric][n]["median_ns"] for n in sizes} for name in STRUCTURES}
        out.append("")
        out.extend(_table(title, sizes, rows, sizes[-1]))
    out.append("")
    title = f"(d) memory, tracemalloc bytes per tracked connection (N={mem_n:,}, records included)"
    head = f"{'structure':<12}{'connected':>12}{'after cycles':>14}{'record':>9}{'structure':>11}"
    out.extend([title, head, "-" * len(head)])
    for name in STRUCTURES:
        m = memory[name]
        out.append(
            f"{name:<12}{m['fresh']:>12.0f}{m['after_cycles']:>14.0f}{m['record_getsizeof']:>9.0f}"
            f"{m['fresh'] - m['record_getsizeof']:>11.0f}"
        )
    out.append(
        "  (record = sys.getsizeof of one record; structure = connected - record: float, id, containers)"
    )
    out.append("")
    out.append("connlist targets" + (" (QUICK: largest N is 10,000, not 100,000)" if args.quick else ""))
    for t in targets:
        out.append(f"  [{'MET' if t['met'] else 'NOT MET':>7}] {t['target']}: {t['shown']}")
    out.append(f"\ntotal {elapsed:.0f}s")
    print("\n".join(out))

    if args.json:
        payload = {
            "meta": {
                "python": platform.python_version(),
                "implementation": platform.python_implementation(),
                "machine": platform.machine(),
                "platform": platform.platform(),
                "repeats": repeats,
                "seed": args.seed,
                "quick": args.quick,
                "sizes": sizes,
                "timer_overhead_ns": timer_ns,
                "empty_loop_ns": loop_ns,
                "elapsed_s": elapsed,
                "connlist_source": source_path,
                "connlist_source_sha256": source_sha,
            },
            "results": {
                name: {metric: {str(n): v for n, v in by_n.items()} for metric, by_n in metrics.items()}
                for name, metrics in results.items()
            },
            "memory": memory,
            "targets": targets,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
