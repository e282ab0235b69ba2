"""Benchmark: how long the debug endpoint holds the event loop, by number of connections and limit.

The debug endpoint builds its answer on the event loop that serves the
connections, so the time it takes is a stall for every client of the worker.
The issue's budget: a few milliseconds per thousand connections listed, plus a
small constant, whatever the number of connections tracked.

For N tracked connections (1,000, 10,000 and 100,000 by default) in three
layouts, and ``limit`` = 10,000 (the maximum), 1000, 100 and 0, this script times:

- ``snapshot``  -- ``connlist.observe.debug.snapshot(enforcer, limit=...)``: the counts and
  the three lists;
- ``endpoint``  -- the whole ASGI call of ``DebugEndpoint`` (snapshot, JSON encoding,
  both ``send`` calls to a no-op) on an event loop;
- ``stall``     -- the longest the endpoint held that loop at a time: it yields
  between slices of work, so this, not the whole call, is what other clients
  of the worker wait (the goal: under about 50 ms at 100,000 connections with
  the largest limit);

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
import asyncio
import functools
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from connlist.core.enforcer import Enforcer
from connlist.observe.debug import IDLE_SCAN, MAX_LIMIT, DebugEndpoint, snapshot

LIMITS = (MAX_LIMIT, 1000, 100, 0)


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


def run_endpoint(endpoint: DebugEndpoint, limit: int, stalls: list[float] | None = None) -> None:
    """One GET of the endpoint on an event loop; appends to ``stalls`` the longest time it held the loop.

    The endpoint yields the loop between slices of work; a task that runs
    whenever it can measures the gaps between its turns.
    """
    scope = {"type": "http", "method": "GET", "query_string": b"limit=%d" % limit, "headers": []}
    sent: list[Any] = []

    async def receive() -> Any:  # pragma: no cover - never called
        raise AssertionError

    async def send(message: Any) -> None:
        sent.append(message)

    async def main() -> float:
        longest = 0.0
        done = False

        async def other_client() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not done:
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now

        other = asyncio.create_task(other_client())
        await asyncio.sleep(0)
        await endpoint(scope, receive, send)
        done = True
        await other
        return longest

    longest = asyncio.run(main())
    if stalls is not None:
        stalls.append(longest)
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
        f"{'endpoint':>10}{'median':>9}{'ms/1000':>9}{'stall':>8}"
    )
    print(header)
    print("-" * len(header))
    worst_constant = 0.0
    worst_per_thousand = 0.0
    worst_stall = 0.0
    for layout in args.layouts:
        for n in args.sizes:
            enforcer = build(n, layout, args.seed)
            endpoint = DebugEndpoint(functools.partial(lambda e: e, enforcer), token=None)
            for limit in LIMITS:
                data = snapshot(enforcer, limit=limit)
                listed = len(data["all"]) + len(data["idle"]) + len(data["active"])
                snap, _ = time_ms(functools.partial(snapshot, enforcer, limit=limit), args.repeat)
                stalls: list[float] = []
                whole, median = time_ms(functools.partial(run_endpoint, endpoint, limit, stalls), args.repeat)
                worst_stall = max(worst_stall, min(stalls))
                per = f"{whole / listed * 1000:9.2f}" if listed else f"{'-':>9}"
                print(
                    f"{layout:<7}{n:>9,}{limit:>7}{listed:>8}{snap:>10.3f}{whole:>10.3f}{median:>9.3f}{per}"
                    f"{min(stalls) * 1000:8.1f}"
                )
                if listed >= 1000:
                    worst_per_thousand = max(worst_per_thousand, whole / listed * 1000)
                if listed == 0:
                    worst_constant = max(worst_constant, whole)
            del enforcer, endpoint
        print()
    print("snapshot and endpoint: fastest run; stall: the longest the endpoint held the loop (fastest run)")
    print(f"worst stall: {worst_stall * 1000:.1f} ms")
    print(f"worst endpoint time with nothing listed (the constant): {worst_constant:.3f} ms")
    print(f"worst endpoint time per 1000 entries listed (limit=1000): {worst_per_thousand:.2f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
