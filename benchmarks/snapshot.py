"""Benchmark: how long the debug endpoint holds the event loop, by number of connections and limit.

The debug endpoint builds its answer on the event loop that serves the
connections, so the time it takes is a stall for every client of the worker.
The issue's budget: a few milliseconds per thousand connections listed, plus a
small constant, whatever the number of connections tracked.

For N tracked connections (1,000, 10,000 and 100,000 by default) in three
layouts, and ``limit`` = 1000, 100 and 0, this script times:

- ``snapshot``  -- ``connlist.debug.snapshot(enforcer, limit=...)``: the counts and
  the three lists;
- ``endpoint``  -- the whole ASGI call of ``DebugEndpoint`` (snapshot, JSON encoding,
  both ``send`` calls to a no-op), driven synchronously: this is the stall;

and prints, in milliseconds, the fastest and the median of ``--repeat`` runs
(on a busy machine the fastest is the better estimate of the work, the
median of what a client of the worker may see), the number of entries listed
(all + idle + active), and the endpoint's fastest time per thousand entries
listed.  The garbage collector stays on, as in a server.

Layouts (connection order is shuffled with ``--seed``):

``mixed``  60% idle, 10% handling, 15% new, 10% reading_headers, 5% reading_body;
``idle``   every connection idle (keep-alive), the most common steady state;
``flood``  every connection new (a slowloris flood) except 100 idle ones at the
           end of ``all``: the worst case for finding the idle list, which only
           scans the first ``IDLE_SCAN * limit`` connections.

Standard library only (plus connlist itself)::

    python3 benchmarks/snapshot.py              # ~1 minute
    python3 benchmarks/snapshot.py --quick      # N = 1,000 and 100,000, fewer repeats
    taskset -c 1 python3 benchmarks/snapshot.py # steadier numbers
"""

from __future__ import annotations

import argparse
import functools
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from connlist.debug import IDLE_SCAN, DebugEndpoint, snapshot
from connlist.enforcer import Enforcer

LIMITS = (1000, 100, 0)


def build(n: int, layout: str, seed: int) -> Enforcer:
    """An enforcer whose list holds ``n`` connections in the given layout."""
    enforcer = Enforcer()
    enforcer.mode = "uvicorn-httptools"
    lst = enforcer.connections
    rng = random.Random(seed)
    if layout == "mixed":
        weights = {"idle": 60, "handling": 10, "new": 15, "reading_headers": 10, "reading_body": 5}
        states = [state for state, weight in weights.items() for _ in range(n * weight // 100)]
        states += ["idle"] * (n - len(states))
        rng.shuffle(states)
    elif layout == "idle":
        states = ["idle"] * n
    elif layout == "flood":
        idle = min(100, n)
        states = ["new"] * (n - idle) + ["idle"] * idle
    else:
        raise ValueError(layout)
    for i, state in enumerate(states):
        conn = lst.connect(client=("127.0.0.1", 1024 + i % 60000), server=("127.0.0.1", 8000))
        enforcer.totals.connections += 1
        if state == "new":
            continue
        lst.message_begin(conn)
        if state == "reading_headers":
            continue
        lst.headers_complete(conn)
        conn.method, conn.path = "GET", f"/items/{i}"
        conn.responding = True
        enforcer.totals.requests += 1
        if state == "reading_body":
            continue
        lst.message_complete(conn)
        if state == "idle":
            conn.responding = False
    assert len(lst) == n
    return enforcer


def run_endpoint(endpoint: DebugEndpoint, limit: int) -> None:
    """One GET of the endpoint, driven without an event loop (nothing in it suspends)."""
    scope = {"type": "http", "method": "GET", "query_string": b"limit=%d" % limit, "headers": []}
    sent: list[Any] = []

    async def receive() -> Any:  # pragma: no cover - never called
        raise AssertionError

    async def send(message: Any) -> None:
        sent.append(message)

    coro = endpoint(scope, receive, send)
    try:
        coro.send(None)
    except StopIteration:
        pass
    else:  # pragma: no cover
        coro.close()
        raise AssertionError("the endpoint suspended")
    assert sent[0]["status"] == 200, sent[0]


def time_ms(func: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(fastest, median) of ``repeat`` runs, in milliseconds."""
    func()  # warm up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        func()
        times.append(time.perf_counter() - started)
    return min(times) * 1000, statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--layouts", nargs="+", default=["mixed", "idle", "flood"])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="N = 1,000 and 100,000, 5 repeats")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeat = [1_000, 100_000], 5

    print(f"Python {platform.python_version()} on {platform.machine()}, IDLE_SCAN = {IDLE_SCAN}")
    # A yardstick for the machine: sum() of 200,000 ints (about 0.5-1 ms on a current laptop).
    numbers = list(range(200_000))
    yardstick, _ = time_ms(functools.partial(sum, numbers), 20)
    print(f"yardstick: sum() of 200,000 ints takes {yardstick:.2f} ms here")
    print(f"{args.repeat} runs, milliseconds; listed = entries in all + idle + active\n")
    header = (
        f"{'layout':<7}{'N':>9}{'limit':>7}{'listed':>8}{'snapshot':>10}"
        f"{'endpoint':>10}{'median':>9}{'ms/1000':>9}"
    )
    print(header)
    print("-" * len(header))
    worst_constant = 0.0
    worst_per_thousand = 0.0
    for layout in args.layouts:
        for n in args.sizes:
            enforcer = build(n, layout, args.seed)
            endpoint = DebugEndpoint(functools.partial(lambda e: e, enforcer), token=None)
            for limit in LIMITS:
                data = snapshot(enforcer, limit=limit)
                listed = len(data["all"]) + len(data["idle"]) + len(data["active"])
                snap, _ = time_ms(functools.partial(snapshot, enforcer, limit=limit), args.repeat)
                whole, median = time_ms(functools.partial(run_endpoint, endpoint, limit), args.repeat)
                per = f"{whole / listed * 1000:9.2f}" if listed else f"{'-':>9}"
                print(
                    f"{layout:<7}{n:>9,}{limit:>7}{listed:>8}{snap:>10.3f}{whole:>10.3f}{median:>9.3f}{per}"
                )
                if listed >= 1000:
                    worst_per_thousand = max(worst_per_thousand, whole / listed * 1000)
                if listed == 0:
                    worst_constant = max(worst_constant, whole)
            del enforcer, endpoint
        print()
    print("snapshot and endpoint columns: fastest run")
    print(f"worst endpoint time with nothing listed (the constant): {worst_constant:.3f} ms")
    print(f"worst endpoint time per 1000 entries listed (limit=1000): {worst_per_thousand:.2f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
