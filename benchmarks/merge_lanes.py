"""Merge the record streams (*.jsonl) of run_device_lanes.sh lanes into one results JSON.

    python benchmarks/merge_lanes.py results/h200_x.json a.jsonl b.jsonl \
        --command "LANE0=... bash benchmarks/run_device_lanes.sh" --note "..." [--plot]

Each lane is its own process (ratios are within a process); the copy bandwidth of every record
is recovered from its own figures (weight bytes / time / fraction of copy bandwidth), and the
merged file lists its range. Records of a later file replace those of an earlier one with the
same (K, N, M, label).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _copy_bw(rec: dict) -> float | None:
    frac, us = rec.get("frac_copy_bw"), rec.get("median_us")
    if not frac or not us or not rec.get("weight_bytes"):
        return None
    return rec["weight_bytes"] / (us * 1e-6) / frac


def merge(paths: list[pathlib.Path]) -> list[dict]:
    by_key: dict[tuple, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                by_key[(rec["K"], rec["N"], rec["M"], rec["label"])] = rec
    return list(by_key.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--command", required=True, help="the device command that produced them")
    p.add_argument("--machine", default="nvidia-h200-x4 (one process per GPU)")
    p.add_argument("--device", default="NVIDIA H200")
    p.add_argument("--jax-version", default="0.11.2", help="as the lanes' 'device:' lines print it")
    p.add_argument("--note", default="")
    p.add_argument("--plot", action="store_true", help="also draw <out>.png (bench_matmul.plot)")
    args = p.parse_args(argv)
    recs = merge([pathlib.Path(x) for x in args.inputs])
    if not recs:
        print("no records", file=sys.stderr)
        return 1
    bws = sorted(b for b in map(_copy_bw, recs) if b)
    out = {"device": args.device, "jax_version": args.jax_version, "machine": args.machine,
           "command": args.command, "note": args.note,
           "lanes": [{"copy_bandwidth_Bps": bws[0]}, {"copy_bandwidth_Bps": bws[-1]}],
           "copy_bandwidth_Bps": bws[len(bws) // 2], "records": recs}
    path = pathlib.Path(args.out)
    path.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}: {len(recs)} records, {len({(r['K'], r['N']) for r in recs})} shapes, "
          f"M {sorted({r['M'] for r in recs})}")
    if args.plot:
        sys.path.insert(0, str(pathlib.Path(__file__).parent))
        from bench_matmul import plot
        plot(out, path.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
