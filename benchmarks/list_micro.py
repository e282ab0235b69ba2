"""Micro-benchmark: ConnectionsList costs must not grow with the number of connections.

A quick report (stdlib only, well under 20 s) of two costs at N = 100 and
N = 100,000 tracked connections, and of their ratio:

(a) message cycle: ``message_begin`` + ``headers_complete`` + ``message_complete``
    on one connection, applied to each connection in turn (connection order),
    and in a pre-generated random order.  The connections start idle, so each
    cycle takes an idle connection through ``active`` and back: the cost is
    that of the O(1) link updates and of touching one of N records (memory
    locality), including the Python loop.  (``benchmarks/structures.py``
    measures the regime where all N stay active, against other structures.)
(b) ``expired(60, 300)`` with all N connections active and none expired, per
    call: the walk stops at the head, so it must not depend on N.

For reference (no goal), the same loops writing one attribute of each
connection and nothing else: what touching one of N records costs by itself.
At N = 100,000 the records (160 bytes each, 16 MB in all) no longer fit the
CPU's L2 cache and TLB, so visiting them in random order pays cache and TLB
misses that no data structure avoids, and the random-order message cycle
pays them too (it reads and writes about three cache lines of the record).
The list's own work is the same at both N: under cachegrind a random-order
cycle runs the same number of instructions at N = 100 and N = 100,000.

The list uses its default clock, ``time.monotonic``, whose cost is included.
Each timing is repeated (``--repeats``, 7 by default; each sample does at least
100,000 operations) and the median is reported in ns per operation; the
repeats of the four (case, N) pairs are interleaved so that a slow spell of a
shared machine hits them alike.  The garbage collector is disabled while
timing, as ``timeit`` does.

Goals (ratio of the N = 100,000 median to the N = 100 one): message cycle
within 1.25x, ``expired`` within 1.5x.  They are reported, not enforced: the
script exits 0 either way.

    python3 benchmarks/list_micro.py
    python3 benchmarks/list_micro.py --json list_micro.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from connlist.connections import Connection, ConnectionsList

SIZES = (100, 100_000)
OPS_PER_SAMPLE = 100_000
# Case -> ratio goal; None: reported for reference only.
GOALS: dict[str, float | None] = {
    "cycle_in_turn": 1.25,
    "cycle_random": 1.25,
    "expired": 1.5,
    "touch_in_turn": None,
    "touch_random": None,
}
LABELS = {
    "cycle_in_turn": "message cycle, in turn",
    "cycle_random": "message cycle, random order",
    "expired": "expired(60, 300), none expired",
    "touch_in_turn": "reference: 1 write/conn, in turn",
    "touch_random": "reference: 1 write/conn, random",
}


def make_cycle(lst: ConnectionsList, order: list[Connection]) -> tuple[Callable[[], None], int]:
    """One sample: message cycles over ``order``, repeated to reach OPS_PER_SAMPLE."""
    passes = max(1, OPS_PER_SAMPLE // len(order))
    begin, headers, complete = lst.message_begin, lst.headers_complete, lst.message_complete

    def run() -> None:
        for _ in range(passes):
            for conn in order:
                begin(conn)
                headers(conn)
                complete(conn)

    return run, passes * len(order)


def make_touch(order: list[Connection]) -> tuple[Callable[[], None], int]:
    """Reference: the same loop writing one field of each connection, without the list."""
    passes = max(1, OPS_PER_SAMPLE // len(order))

    def run() -> None:
        for _ in range(passes):
            for conn in order:
                conn.method = None

    return run, passes * len(order)


def make_expired(lst: ConnectionsList) -> tuple[Callable[[], None], int]:
    calls = OPS_PER_SAMPLE
    expired = lst.expired

    def run() -> None:
        for _ in range(calls):
            expired(60, 300)

    return run, calls


Benches = dict[str, tuple[Callable[[], None], int]]


def build(n: int, seed: int) -> tuple[Benches, dict[str, ConnectionsList]]:
    rng = random.Random(seed)
    # (a): all N connections idle, cycled in connection order or in a random one.
    cycling = ConnectionsList()
    conns = [cycling.connect() for _ in range(n)]
    for conn in conns:
        cycling.headers_complete(conn)
        cycling.message_complete(conn)
    shuffled = conns[:]
    rng.shuffle(shuffled)
    # (b): all N connections active (just connected), none older than 60 s.
    waiting = ConnectionsList()
    for _ in range(n):
        waiting.connect()
    benches = {
        "cycle_in_turn": make_cycle(cycling, conns),
        "cycle_random": make_cycle(cycling, shuffled),
        "expired": make_expired(waiting),
        "touch_in_turn": make_touch(conns),
        "touch_random": make_touch(shuffled),
    }
    lists = {"cycling": cycling, "waiting": waiting}
    check_state(lists, n)
    return benches, lists


def check_state(lists: dict[str, ConnectionsList], n: int) -> None:
    """The workloads did what they claim: (a) leaves every connection idle, (b) expired nothing."""
    cycling, waiting = lists["cycling"], lists["waiting"]
    assert (len(cycling), cycling.active_count, cycling.idle_count) == (n, 0, n)
    assert (len(waiting), waiting.active_count, waiting.idle_count) == (n, n, 0)


def measure(repeats: int, seed: int) -> dict[int, dict[str, list[float]]]:
    built = {n: build(n, seed) for n in SIZES}
    benches = {n: built[n][0] for n in SIZES}
    samples: dict[int, dict[str, list[float]]] = {n: {case: [] for case in GOALS} for n in SIZES}
    # Warm-up: one untimed sample of everything.
    for n in SIZES:
        for run, _ops in benches[n].values():
            run()
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for case in GOALS:
                for n in SIZES:
                    run, ops = benches[n][case]
                    t0 = time.perf_counter()
                    run()
                    elapsed = time.perf_counter() - t0
                    samples[n][case].append(elapsed / ops * 1e9)
    finally:
        if gc_was_enabled:
            gc.enable()
    for n in SIZES:
        check_state(built[n][1], n)
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed samples per case and N (default 7)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random order (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    started = time.perf_counter()
    samples = measure(args.repeats, args.seed)
    small, large = SIZES
    print(
        f"connlist ConnectionsList micro-benchmark: Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.machine()}, "
        f"median of {args.repeats} repeats, ns per operation"
    )
    print()
    header = (
        f"{'case':<32} {f'N={small:,}':>10} {f'N={large:,}':>12} {'ratio':>7} {'(min)':>7} {'goal':>7}  met"
    )
    print(header)
    print("-" * len(header))
    results = []
    all_met = True
    for case, goal in GOALS.items():
        med_small = statistics.median(samples[small][case])
        med_large = statistics.median(samples[large][case])
        ratio = med_large / med_small
        ratio_min = min(samples[large][case]) / min(samples[small][case])
        met = None if goal is None else ratio <= goal
        if met is not None:
            all_met &= met
        goal_text = "" if goal is None else f"{goal:.2f}x"
        met_text = {None: "-", True: "yes", False: "NO"}[met]
        print(
            f"{LABELS[case]:<32} {med_small:>10.1f} {med_large:>12.1f} {ratio:>6.2f}x {ratio_min:>6.2f}x "
            f"{goal_text:>7}  {met_text}"
        )
        results.append(
            {
                "case": case,
                "label": LABELS[case],
                "ns_per_op": {str(small): med_small, str(large): med_large},
                "samples_ns_per_op": {str(small): samples[small][case], str(large): samples[large][case]},
                "ratio": ratio,
                "ratio_of_minima": ratio_min,
                "goal": goal,
                "met": met,
            }
        )
    elapsed = time.perf_counter() - started
    print()
    print("ratio: of the medians (the goals apply to it); (min): of the fastest samples, for comparison")
    print(f"goals {'all met' if all_met else 'NOT all met'}; run time {elapsed:.1f} s")
    if args.json:
        report = {
            "benchmark": "list_micro",
            "python": sys.version,
            "platform": platform.platform(),
            "repeats": args.repeats,
            "seed": args.seed,
            "ops_per_sample": OPS_PER_SAMPLE,
            "sizes": list(SIZES),
            "results": results,
            "all_met": all_met,
            "run_time_s": elapsed,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
