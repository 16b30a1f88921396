"""Condense an Nsight Compute CSV (`ncu --csv --page details ...`) to one line per kernel launch.

    python3 benchmarks/ncu_summary.py ncu.csv [--kernels fp8_w8a]

Keeps the figures that decide a decode kernel's limiter: duration, DRAM / memory throughput,
SM throughput, issue activity, occupancy and registers, grid and block.
"""

from __future__ import annotations

import argparse
import collections
import csv

METRICS = ("Duration", "DRAM Throughput", "Memory Throughput", "Mem Busy", "Max Bandwidth",
           "Compute (SM) Throughput", "Issue Slots Busy", "Executed Ipc Active",
           "Warp Cycles Per Issued Instruction", "Registers Per Thread", "Achieved Occupancy",
           "Theoretical Occupancy", "Waves Per SM", "Block Size", "Grid Size", "L2 Hit Rate")


def summarize(path: str, kernels: str = "", extra: tuple[str, ...] = ()) -> list[str]:
    rows = list(csv.reader(open(path, newline="")))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return [f"{path}: no ncu CSV header (did any launch get profiled?)"]
    col = {h: j for j, h in enumerate(rows[start])}
    by_launch: dict[tuple, list[str]] = collections.OrderedDict()
    for r in rows[start + 1:]:
        if len(r) <= col["Metric Value"] or kernels not in r[col["Kernel Name"]]:
            continue
        if r[col["Metric Name"]] in METRICS + extra:
            key = (r[col["ID"]], r[col["Kernel Name"]][:60])
            by_launch.setdefault(key, []).append(
                f"{r[col['Metric Name']]}={r[col['Metric Value']]}{r[col['Metric Unit']]}")
    return [f"{i} {name}\n    " + "; ".join(v) for (i, name), v in by_launch.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv")
    p.add_argument("--kernels", default="", help="keep kernels whose name contains this")
    p.add_argument("--metrics", default="", help="more metric names to keep, comma-separated "
                   "(e.g. 'L2 Cache Throughput' for a matrix kernel)")
    args = p.parse_args(argv)
    extra = tuple(x for x in args.metrics.split(",") if x)
    print("\n".join(summarize(args.csv, args.kernels, extra)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
