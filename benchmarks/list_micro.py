"""Micro-benchmark on pyperf: ConnectionsList's costs must not grow with the number of connections.

Workloads of ``benchmarks/workloads.py`` on connlist alone, at N = 100 and
N = 100,000 tracked connections: a message cycle from idle through ``active``
and back (``idle_in_turn``, ``idle_random``: the O(1) link updates and
touching one of N records), ``expired()`` with all N active and none expired
(``expired_none``: the walk stops at the head), and for reference the same
loops writing one field of each record and nothing else (``touch_*``): at
N = 100,000 the records (16 MB and more) no longer fit the CPU's caches and
TLB, so a random order pays misses that no data structure avoids, and the
random-order cycle pays them too.

The goals are ratios of the N = 100,000 cost to the N = 100 one: the cycles
within 1.25x, ``expired()`` within 1.5x.  They are reported, not enforced::

    python3 benchmarks/list_micro.py --fast
    python3 benchmarks/list_micro.py -o new.json     # then: python3 -m pyperf compare_to old.json new.json
"""

from __future__ import annotations

import pyperf

import workloads

SIZES = (100, 100_000)
GOALS = {
    "idle_in_turn": 1.25,
    "idle_random": 1.25,
    "expired_none": 1.5,
    "touch_in_turn": None,
    "touch_random": None,
}


def main() -> None:
    runner = pyperf.Runner()
    args = runner.parse_args()
    results = {}
    for workload in GOALS:
        for n in SIZES:
            results[workload, n] = runner.bench_time_func(
                f"{workload} N={n}", workloads.WORKLOADS[workload], "connlist", n
            )
    if args.worker or None in results.values():
        return
    for workload, goal in GOALS.items():
        small, big = results[workload, SIZES[0]], results[workload, SIZES[1]]
        ratio = big.mean() / small.mean()
        verdict = "reference" if goal is None else f"goal {goal}x: {'met' if ratio <= goal else 'NOT met'}"
        print(f"{workload}: N={SIZES[1]:,} / N={SIZES[0]} = {ratio:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
