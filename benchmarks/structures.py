"""Benchmark on pyperf: connlist's intrusive ConnectionsList against five plain Python structures.

The answer to Node.js's reviewer ("Have you benchmarked against an
unordered_set or just a plain vector?") for Python; the structures, the
workloads and the differential check are in ``benchmarks/workloads.py``.  One
run measures one structure at N = 100, 10,000 and 100,000 (``--sizes``), after
checking that all six expire the same connections; pyperf's ``compare_to``
sets the runs side by side, ``--table`` renders them as docs/benchmarks.md
shows them::

    for s in connlist SortedList set list dict OrderedDict; do
        taskset -c 1 python3 benchmarks/structures.py --structure $s -o $s.json
    done
    python3 -m pyperf compare_to connlist.json SortedList.json set.json list.json dict.json \\
        OrderedDict.json --table
    python3 benchmarks/structures.py --table connlist.json SortedList.json set.json list.json \\
        dict.json OrderedDict.json
    python3 benchmarks/structures.py --memory       # bytes per tracked connection

pyperf's own options apply: ``--fast`` for a quicker look, ``--rigorous`` for
a careful one (``python3 -m pyperf system tune`` first, where you can).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect

import pyperf

import workloads

WORKLOADS = ("cycle_random", "cycle_round_robin", "expired_none", "expired_1pct")
TITLES = {
    "cycle_random": "**(a) message cycle, random order**, ns per cycle (complete + begin + headers):",
    "cycle_round_robin": "**(a) message cycle, round-robin order**, ns per cycle:",
    "expired_none": "**(b) `expired()`, all N active, none expired**, ns per call:",
    "expired_1pct": "**(c) `expired()`, oldest 1% expired**, ns per call:",
}


def add_cmdline_args(cmd: list[str], args: argparse.Namespace) -> None:
    cmd.extend(("--structure", args.structure, "--sizes", *map(str, args.sizes)))


def ns(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs" if seconds >= 1e-4 else f"{seconds * 1e9:,.0f}"


def times(ratio: float) -> str:
    return f"{ratio:.2f}" if ratio < 10 else f"{ratio:.1f}" if ratio < 100 else f"{ratio:,.0f}"


def table(paths: list[str]) -> None:
    """Markdown tables of the runs' means, by structure and N; the ratio to connlist's at the largest N."""
    runs = {}
    for path in paths:
        suite = pyperf.BenchmarkSuite.load(path)
        runs[suite.get_benchmarks()[0].get_metadata()["structure"]] = {
            bench.get_name(): bench.mean() for bench in suite.get_benchmarks()
        }
    names = next(iter(runs.values()))
    sizes = sorted({int(name.split("N=")[1]) for name in names})
    for workload in WORKLOADS:
        print(f"\n{TITLES[workload]}\n")
        print("| structure | " + " | ".join(f"N={n:,}" for n in sizes) + " | x connlist |")
        print("| --- |" + " ---: |" * (len(sizes) + 1))
        big = f"{workload} N={sizes[-1]}"
        for structure, means in runs.items():
            cells = [ns(means[f"{workload} N={n}"]) for n in sizes]
            ratio = means[big] / runs["connlist"][big]
            print(f"| {structure} | " + " | ".join(cells) + f" | {times(ratio)} |")


def memory() -> None:
    print("| structure | connected | after cycles | record | structure |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in workloads.STRUCTURES:
        fresh, churned, record = workloads.memory(name, 10_000)
        print(f"| {name} | {fresh:.0f} | {churned:.0f} | {record} | {fresh - record:.0f} |")


def main() -> None:
    runner = pyperf.Runner(add_cmdline_args=add_cmdline_args)
    parser = runner.argparser
    parser.add_argument("--structure", choices=list(workloads.STRUCTURES), default="connlist")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--memory", action="store_true", help="bytes per tracked connection (N = 10,000)")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="render runs (-o files) as tables")
    args = runner.parse_args()
    if args.memory:
        return memory()
    if args.table:
        return table(args.table)
    if not args.worker:
        workloads.self_check()
    runner.metadata["structure"] = args.structure
    with open(inspect.getfile(workloads.ConnectionsList), "rb") as source:
        runner.metadata["connections_sha256"] = hashlib.sha256(source.read()).hexdigest()[:12]
    for workload in WORKLOADS:
        for n in args.sizes:
            runner.bench_time_func(f"{workload} N={n}", workloads.WORKLOADS[workload], args.structure, n)


if __name__ == "__main__":
    main()
