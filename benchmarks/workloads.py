"""The micro-benchmarks' workloads: connlist's ConnectionsList and five plain Python structures.

When Node.js replaced the two ordered ``std::set`` of its ConnectionsList with
intrusive lists, a reviewer asked "Have you benchmarked against an
unordered_set or just a plain vector?".  ``structures.py`` answers it for
Python with these workloads, ``list_micro.py`` checks with them that
connlist's costs do not grow with the number of connections.  Both time them
with pyperf (calibrated loops, worker processes, warm-ups, spreads,
``python3 -m pyperf compare_to``); this module only does the work.

The five alternatives implement the list's interface (``connect``,
``message_begin``, ``headers_complete``, ``message_complete``, ``remove``,
``expired`` with Node's rule), keep ``all`` in a dict, and differ only in
``active``:

* ``SortedList``: ``sortedcontainers.SortedList`` of ``(start, id, conn)``,
  the ordered ``std::set``; ``expired()`` walks from the smallest, stops early;
* ``set``: the ``unordered_set``; ``expired()`` scans every active connection;
* ``list``: the plain vector (``list.remove`` is O(n)); ``expired()`` scans;
* ``dict``: ``message_begin`` deletes and re-inserts; walks from the start;
* ``OrderedDict``: ``move_to_end``; walks from the start.

Their records carry connlist's payload (``Connection``'s slots but the links)
and two flags, ``tracked`` and ``active``, instead of the links.  They check
their timeouts with connlist's own ``kinds.effective_timeouts``, and the methods that the
workloads time are written out, without helper calls, as connlist's are: the
comparison isolates the ordering structure.  ``self_check`` runs one random
event stream on all six and requires the same expired connections of each.

The clock is fake (1.0, 2.0, ... one tick per read: a C call, the same work
on every run) and the random orders come from a fixed seed.  A workload's
structure lives as long as the worker process that pyperf runs it in, so its
warm-up values leave it in the state a busy worker is in.  The workloads
(pyperf time functions, ``f(loops, structure, n) -> seconds``):

* ``cycle_random``, ``cycle_round_robin``: ``message_complete`` +
  ``message_begin`` + ``headers_complete`` on one connection, in that rotated
  order, so that every connection is mid-message between its visits and
  ``active`` holds all N (the regime where the structures differ);
* ``expired_none``: ``expired()`` with all N active and none expired;
* ``expired_1pct``: ``expired()`` with the oldest 1% expired; between calls
  (untimed) they begin a new message, which moves them to the tail.  Both
  ``expired`` structures first go through a pass of random cycles (0.3 s at
  most: ``list`` pays O(N) per cycle), which scatters the records and leaves
  holes at the start of the dicts;
* ``idle_in_turn``, ``idle_random`` (list_micro): ``message_begin`` +
  ``headers_complete`` + ``message_complete``, from idle through ``active``
  and back, in connection order and in random order;
* ``touch_in_turn``, ``touch_random`` (list_micro, for reference): the same
  loops writing one field of each record and nothing else, what visiting one
  of N records costs by itself (at 100,000 they no longer fit the caches).

Python's loop is included in every cost.  ``memory(structure, n)`` gives
tracemalloc bytes per tracked connection, records included.
"""

from __future__ import annotations

import gc
import itertools
import random
import sys
import time
import tracemalloc
from collections import OrderedDict, deque
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

# The connlist of this checkout (pyperf's workers do not inherit PYTHONPATH).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "middleware"))

from connlist.core.connections import Connection, ConnectionsList
from connlist.core.kinds import effective_timeouts as _effective

SEED = 20240601
_INF = float("inf")
_PAYLOAD = tuple(slot for slot in Connection.__slots__ if not slot.endswith(("_next", "_prev", "_link")))
_DEFAULTS = [(slot, getattr(Connection(), slot)) for slot in _PAYLOAD if slot != "id"]
# The payload's slots behind Connection's properties (the addresses).
_SLOT_OF = {"client": "_client", "server": "_server"}
_ids = itertools.count(1)


def fake_clock() -> Callable[[], float]:
    """Monotonic, deterministic and a C call: 1.0, 2.0, 3.0, ... one tick per read."""
    return itertools.count(1.0, 1.0).__next__


class Conn:
    """An alternative's record: connlist's payload, two flags instead of the links."""

    __slots__ = (*_PAYLOAD, "active", "key", "tracked")

    def __init__(self, connected_at: float, **details: Any) -> None:
        for slot, value in _DEFAULTS:
            setattr(self, slot, value)
        self.id = next(_ids)
        self.connected_at = self.last_message_start = connected_at
        self.tracked = self.active = True
        self.key: Any = None
        for name, value in details.items():
            setattr(self, _SLOT_OF.get(name, name), value)


class _Alternative:
    """``all`` as a dict.  A subclass's ``_add`` and ``_discard`` (``active``'s) serve untimed paths only."""

    __slots__ = ("_active", "_all", "_clock")
    _active: Any
    _add: Callable[[Conn], None]
    _discard: Callable[[Conn], None]

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._all: dict[Conn, None] = {}

    def __len__(self) -> int:
        return len(self._all)

    @property
    def active_count(self) -> int:
        return len(self._active)

    def connect(self, **details: Any) -> Conn:
        conn = Conn(self._clock(), **details)
        self._all[conn] = None
        self._add(conn)
        return conn

    def headers_complete(self, conn: Conn) -> None:
        conn.headers_completed = True

    def remove(self, conn: Conn) -> None:
        if conn.active:
            self._discard(conn)
            conn.active = False
        if conn.tracked:
            del self._all[conn]
            conn.tracked = False


class SortedListConns(_Alternative):
    __slots__ = ()

    def __init__(self, clock: Callable[[], float]) -> None:
        from sortedcontainers import SortedList

        super().__init__(clock)
        self._active = SortedList()

    def _add(self, conn: Conn) -> None:
        conn.key = (conn.last_message_start, conn.id, conn)
        self._active.add(conn.key)

    def _discard(self, conn: Conn) -> None:
        self._active.remove(conn.key)

    def message_begin(self, conn: Conn) -> None:
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

    def message_complete(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if conn.active:
            self._active.remove(conn.key)
            conn.active = False
        conn.last_message_start = 0.0
        conn.requests += 1

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -_INF
        request_deadline = now - request_timeout if request_timeout else -_INF
        young = headers_deadline if headers_timeout else request_deadline
        expired = []
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


class _Scanned(_Alternative):
    """The set and the list: ``remove(conn)`` by value, ``expired()`` scans every active one."""

    __slots__ = ()
    _drop: Callable[[list[Conn]], None]

    def message_complete(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if conn.active:
            self._active.remove(conn)
            conn.active = False
        conn.last_message_start = 0.0
        conn.requests += 1

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -_INF
        request_deadline = now - request_timeout if request_timeout else -_INF
        young = headers_deadline if headers_timeout else request_deadline
        expired = []
        for conn in self._active:
            start = conn.last_message_start
            if start < young and (
                start < request_deadline or (not conn.headers_completed and start < headers_deadline)
            ):
                expired.append(conn)
        if expired:
            for conn in expired:
                conn.active = False
            self._drop(expired)
        return expired


class SetConns(_Scanned):
    __slots__ = ()

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self._active: set[Conn] = set()

    def _add(self, conn: Conn) -> None:
        self._active.add(conn)

    def _discard(self, conn: Conn) -> None:
        self._active.remove(conn)

    def _drop(self, expired: list[Conn]) -> None:
        self._active.difference_update(expired)

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        if not conn.active:
            self._active.add(conn)
            conn.active = True
        conn.last_message_start = self._clock()
        conn.headers_completed = False


class ListConns(_Scanned):
    __slots__ = ()

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self._active: list[Conn] = []

    def _add(self, conn: Conn) -> None:
        self._active.append(conn)

    def _discard(self, conn: Conn) -> None:
        self._active.remove(conn)

    def _drop(self, expired: list[Conn]) -> None:
        # Erase-remove in one pass, not one O(n) list.remove per expired connection.
        self._active[:] = [conn for conn in self._active if conn.active]

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


class DictConns(_Alternative):
    """Insertion order is message-start order: ``message_begin`` deletes and re-inserts."""

    __slots__ = ()
    _new: Callable[[], dict[Conn, None]] = dict

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__(clock)
        self._active = self._new()

    def _add(self, conn: Conn) -> None:
        self._active[conn] = None

    def _discard(self, conn: Conn) -> None:
        del self._active[conn]

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

    def expired(self, headers_timeout: float, request_timeout: float) -> list[Conn]:
        headers_timeout, request_timeout = _effective(headers_timeout, request_timeout)
        if not headers_timeout and not request_timeout:
            return []
        now = self._clock()
        headers_deadline = now - headers_timeout if headers_timeout else -_INF
        request_deadline = now - request_timeout if request_timeout else -_INF
        young = headers_deadline if headers_timeout else request_deadline
        expired = []
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
    """The dict variant on an OrderedDict, with ``move_to_end`` in ``message_begin``."""

    __slots__ = ()
    _new = OrderedDict

    def message_begin(self, conn: Conn) -> None:
        if not conn.tracked:
            return
        conn.last_message_start = self._clock()
        conn.headers_completed = False
        if conn.active:
            self._active.move_to_end(conn)  # type: ignore[attr-defined]
        else:
            self._active[conn] = None
            conn.active = True


STRUCTURES: dict[str, Callable[[Callable[[], float]], Any]] = {
    "connlist": ConnectionsList,
    "SortedList": SortedListConns,
    "set": SetConns,
    "list": ListConns,
    "dict": DictConns,
    "OrderedDict": OrderedDictConns,
}


def self_check(steps: int = 5000, seed: int = SEED) -> None:
    """All six structures must expire the same connections for the same random event stream."""
    rng = random.Random(seed)
    timeouts = [0.0, 0.0, 3.0, 10.0, 25.0, 60.0, 150.0, 400.0]
    events: list[tuple[Any, ...]] = []
    n = 0
    for _ in range(steps):
        r = rng.random()
        if r < 0.15 or n == 0:
            events.append(("connect",))
            n += 1
        elif r < 0.9:
            event = rng.choice(("message_begin", "headers_complete", "message_complete", "remove"))
            events.append((event, rng.randrange(n)))
        else:
            events.append(("expired", rng.choice(timeouts), rng.choice(timeouts)))
    traces = {}
    for name, factory in STRUCTURES.items():
        s = factory(fake_clock())
        conns: list[Any] = []
        index: dict[Any, int] = {}
        trace: list[Any] = []
        for event in events:
            if event[0] == "connect":
                conn = s.connect(client=("127.0.0.1", 1))
                index[conn] = len(conns)
                conns.append(conn)
            elif event[0] == "expired":
                trace.append(sorted(index[conn] for conn in s.expired(event[1], event[2])))
            else:
                getattr(s, event[0])(conns[event[1]])
            trace.append((len(s), s.active_count))
        traces[name] = trace
    for name, trace in traces.items():
        if trace != traces["connlist"]:
            first = next(i for i, (a, b) in enumerate(zip(trace, traces["connlist"], strict=True)) if a != b)
            raise AssertionError(f"{name} disagrees with connlist at trace entry {first}")


# -- the workloads ------------------------------------------------------------------

WARM_S = 0.3


class _State:
    """One structure with N connections, all active (idle for ``idle_*``), for the process's lifetime."""

    def __init__(self, workload: str, name: str, n: int) -> None:
        self.s = s = STRUCTURES[name](fake_clock())
        self.conns = [s.connect() for _ in range(n)]
        # With replacement: a permutation would, from its second pass on, visit
        # the active connections in their order (the head of ``list`` each time).
        random_order = random.Random(SEED + n).choices(self.conns, k=max(10_000, n))
        self.order = itertools.cycle(random_order if workload.endswith("random") else self.conns)
        if workload.startswith(("idle", "touch")):
            for conn in self.conns:
                s.headers_complete(conn)
                s.message_complete(conn)
        if workload.startswith("expired"):
            # A busy worker's state: records scattered, dict holes ahead of the first live entry.
            deadline = time.perf_counter() + WARM_S
            mc, mb, hc = s.message_complete, s.message_begin, s.headers_complete
            for conn in random_order[:n]:
                mc(conn)
                mb(conn)
                hc(conn)
                if time.perf_counter() > deadline:
                    break
            self.by_start: deque[Any] = deque(sorted(self.conns, key=attrgetter("last_message_start")))


_states: dict[tuple[str, str, int], _State] = {}


def _state(workload: str, name: str, n: int) -> _State:
    key = (workload, name, n)
    if key not in _states:
        _states[key] = _State(workload, name, n)
    return _states[key]


def _events(loops: int, name: str, n: int, workload: str, events: tuple[str, str, str]) -> float:
    """Three of the list's events, in the order given, on each of the next ``loops`` connections."""
    state = _state(workload, name, n)
    chunk = list(itertools.islice(state.order, loops))
    first, second, third = (getattr(state.s, event) for event in events)
    t0 = time.perf_counter()
    for conn in chunk:
        first(conn)
        second(conn)
        third(conn)
    return time.perf_counter() - t0


# A message cycle on a connection kept active; an idle connection's whole request.
_CYCLE = ("message_complete", "message_begin", "headers_complete")
_IDLE = ("message_begin", "headers_complete", "message_complete")


def _cycles(loops: int, name: str, n: int, workload: str) -> float:
    return _events(loops, name, n, workload, _CYCLE)


def cycle_random(loops: int, name: str, n: int) -> float:
    return _cycles(loops, name, n, "cycle_random")


def cycle_round_robin(loops: int, name: str, n: int) -> float:
    return _cycles(loops, name, n, "cycle_round_robin")


def expired_none(loops: int, name: str, n: int) -> float:
    s = _state("expired_none", name, n).s
    # Each call reads the clock once: a timeout this long expires nothing.
    timeout = 1e12
    expired = s.expired
    t0 = time.perf_counter()
    for _ in range(loops):
        expired(timeout, 2 * timeout)
    elapsed = time.perf_counter() - t0
    if s.active_count != n:
        raise AssertionError(f"{name}: {s.active_count} active, expected {n}")
    return elapsed


def expired_1pct(loops: int, name: str, n: int) -> float:
    state = _state("expired_1pct", name, n)
    s, by_start = state.s, state.by_start
    k = max(1, n // 100)
    elapsed = 0.0
    for _ in range(loops):
        # Both rules at one deadline, between the k-th and the (k+1)-th oldest start.
        now = s._clock() + 1.0  # the value expired() reads next
        timeout = now - (by_start[k - 1].last_message_start + 0.5)
        t0 = time.perf_counter()
        result = s.expired(timeout, timeout)
        elapsed += time.perf_counter() - t0
        if len(result) != k:
            raise AssertionError(f"{name}: {len(result)} expired, expected {k}")
        for _ in range(k):
            conn = by_start.popleft()
            s.message_begin(conn)
            by_start.append(conn)
    return elapsed


def _idle(loops: int, name: str, n: int, workload: str) -> float:
    return _events(loops, name, n, workload, _IDLE)


def idle_in_turn(loops: int, name: str, n: int) -> float:
    return _idle(loops, name, n, "idle_in_turn")


def idle_random(loops: int, name: str, n: int) -> float:
    return _idle(loops, name, n, "idle_random")


def _touch(loops: int, name: str, n: int, workload: str) -> float:
    chunk = list(itertools.islice(_state(workload, name, n).order, loops))
    t0 = time.perf_counter()
    for conn in chunk:
        conn.headers_completed = True
    return time.perf_counter() - t0


def touch_in_turn(loops: int, name: str, n: int) -> float:
    return _touch(loops, name, n, "touch_in_turn")


def touch_random(loops: int, name: str, n: int) -> float:
    return _touch(loops, name, n, "touch_random")


WORKLOADS: dict[str, Callable[[int, str, int], float]] = {
    "cycle_random": cycle_random,
    "cycle_round_robin": cycle_round_robin,
    "expired_none": expired_none,
    "expired_1pct": expired_1pct,
    "idle_in_turn": idle_in_turn,
    "idle_random": idle_random,
    "touch_in_turn": touch_in_turn,
    "touch_random": touch_random,
}


def memory(name: str, n: int) -> tuple[float, float, int]:
    """tracemalloc bytes per tracked connection: just connected, after random cycles; one record's size."""
    indices = random.Random(SEED).choices(range(n), k=n)
    conns: list[Any] = [None] * n
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        s = STRUCTURES[name](fake_clock())
        for i in range(n):
            conns[i] = s.connect()
        fresh = tracemalloc.get_traced_memory()[0] - before
        for i in indices:
            s.message_complete(conns[i])
            s.message_begin(conns[i])
            s.headers_complete(conns[i])
        gc.collect()
        churned = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    return fresh / n, churned / n, sys.getsizeof(conns[0])
