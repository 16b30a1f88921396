"""Where a decode product's device time goes, kernel by kernel (session 9).

    PYTHONPATH=. python3 benchmarks/decode_breakdown.py --shapes 4096x4096,8192x8192 --m 1 \
        [--ops bf16,fp8_block_a16] [--out breakdown.json]

bench.py's figures sum every kernel an op launches; this lists them: for each (shape, M, op)
the kernels of one product (name, median duration, the idle time before it), their sum,
and the span from the first kernel's start to the last one's end (the sum plus the gaps
between launches inside one XLA executable). Ops: "bf16" (jnp.dot on bf16 weights) or a format name (jqlin.matmul on that
format with kernel="auto"), suffixed ":det" for deterministic mode or ":det_g1" for
deterministic mode with one left fold of the K parts (fp8_block_a16_mgpu.one_left_fold,
session 15). Each product reads its own weight copy (rotated), so no weight is served from
L2. --act xla / pallas: activations by XLA's rules / by pallas_kernels.act_quant's kernels
at every M.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import tempfile

import jax
import jax.numpy as jnp

import jqlin
from jqlin import bench

SETS = 4  # at least this many argument sets for the timed products to rotate through


def breakdown(k: int, n: int, m: int, op: str, reps: int = 20, chain: int = 1) -> dict:
    """chain > 1: one executable runs `chain` products (each its own weight copy, kept apart
    by an optimization barrier, as in a model's layers); figures are per product."""
    key = jax.random.key(0)
    fmt, _, mode = (None, "", "") if op == "bf16" else op.partition(":")
    weights = [bench._make_weight(jax.random.fold_in(key, 0), fmt, n, k)]
    # enough copies that no product finds its weight in L2 (bench.py's rule), one per layer
    copies = max(bench._copies(bench._nbytes(weights[0])), chain)
    weights += [bench._make_weight(jax.random.fold_in(key, i), fmt, n, k)
                for i in range(1, copies)]
    x = jax.random.normal(key, (m, k), jnp.bfloat16)
    name = f"breakdown_{op.replace(':', '_')}_{k}x{n}_m{m}_c{chain}"

    def one(x, w):
        if op == "bf16":
            return jnp.dot(x, w.T)
        if mode == "det_g1":  # (read when traced: jit caches cleared first, below)
            from pallas_kernels.fp8_block_a16_mgpu import one_left_fold
            with one_left_fold():
                return jqlin.matmul(x, w, deterministic=True)
        return jqlin.matmul(x, w, deterministic=mode == "det")

    def product(x, ws):
        out = []
        for w in ws:
            x, w = jax.lax.optimization_barrier((x, w))
            out.append(one(x, w))
        return out
    product.__name__ = product.__qualname__ = name
    if mode == "det_g1":  # the dispatcher's jitted pieces would reuse a two-group trace
        jax.clear_caches()
    fn = jax.jit(product)
    n_sets = max(SETS, -(-copies // chain))  # every copy in turn
    sets = [[weights[(i * chain + j) % copies] for j in range(chain)] for i in range(n_sets)]
    for ws in sets:  # compile, warm up
        jax.block_until_ready(fn(x, ws))
    trace_dir = tempfile.mkdtemp(prefix="jqlin_breakdown_")
    jax.profiler.start_trace(trace_dir)
    for i in range(reps):
        jax.block_until_ready(fn(x, sets[i % n_sets]))
    jax.profiler.stop_trace()
    found = [e[1:] for e in bench.kernel_events(trace_dir)]
    shutil.rmtree(trace_dir, ignore_errors=True)
    events = sorted((e for e in found if e[0] == f"jit_{name}"),
                    key=lambda e: e[2])
    if not events and jax.default_backend() == "cpu":
        return {"K": k, "N": n, "M": m, "op": op, "chain": chain, "kernels": [],
                "sum_us": float("nan"),
                "span_us": float("nan"), "note": "no GPU kernels on CPU"}
    per_call = len(events) // reps
    if per_call == 0 or len(events) % reps:
        raise RuntimeError(f"{name}: {len(events)} kernel events for {reps} products")
    calls = [events[i * per_call:(i + 1) * per_call] for i in range(reps)]
    kernels = collections.defaultdict(list)
    for call in calls:
        for j, (_, kname, _, dur) in enumerate(call):
            kernels[(j, kname)].append(dur)
    rows = [{"kernel": kname[:80], "us": statistics.median(d) / 1e3}
            for (j, kname), d in sorted(kernels.items())]
    span = statistics.median((c[-1][2] + c[-1][3] - c[0][2]) / 1e3 for c in calls)
    # the idle time before each kernel (after the previous one ended), median over products
    for j, r in enumerate(rows):
        r["gap_before_us"] = 0.0 if j == 0 else statistics.median(
            (c[j][2] - c[j - 1][2] - c[j - 1][3]) / 1e3 for c in calls)
    if chain > 1:  # per product: the kernels of the middle one, the span's share
        per = len(rows) // chain
        rows = rows[per * (chain // 2):per * (chain // 2 + 1)]
        span /= chain
    return {"K": k, "N": n, "M": m, "op": op, "chain": chain, "kernels": rows,
            "sum_us": sum(r["us"] for r in rows), "span_us": span}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x4096,8192x8192", help="KxN list")
    p.add_argument("--m", default="1")
    p.add_argument("--ops", default="bf16,fp8_block_a16")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--chain", type=int, default=1,
                   help="products per executable (a model's layers); figures per product")
    p.add_argument("--act", default="auto", choices=["auto", "xla", "pallas", "group"],
                   help="xla: W8A8 / NVFP4 / MX activations by XLA's rules, not the act_quant "
                        "kernels; pallas: by those kernels at every M (A/B of those kernels, "
                        "session 32); group: as pallas, FP8 1 x 128 groups by e4m3_group_codes "
                        "(scales in the pass, session 40)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.act != "auto":
        from jqlin.kernels import pallas_fp4, pallas_fp8
        least = 1 << 62 if args.act == "xla" else 1
        pallas_fp4.NVFP4_OPERAND_KERNEL_MIN_M = pallas_fp8.CODES_KERNEL_MIN_M = least
        pallas_fp4.MX_OPERAND_KERNEL_MIN_M = least
        pallas_fp8.GROUP_CODES_KERNEL_MIN_M = 1 if args.act == "group" else None
    results = []
    for _, k, n in bench.parse_shapes(args.shapes):
        for m in (int(v) for v in args.m.split(",")):
            for op in args.ops.split(","):
                r = breakdown(k, n, m, op, args.reps, args.chain)
                results.append(r)
                print(f"{k}x{n} M={m} {op}: sum {r['sum_us']:.1f} us, span {r['span_us']:.1f} "
                      "us: " + "; ".join(f"(+{q['gap_before_us']:.1f}) {q['kernel'][:40]} {q['us']:.1f}"
                                         for q in r["kernels"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": jax.devices()[0].device_kind, "jax_version": jax.__version__,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
