"""Deterministic block W8A8 on Mosaic GPU (pallas_kernels.fp8_block_det, session 49): are its
launches bitwise each other and across M, and what does each cost beside default mode?

Deterministic `fp8_block` ran Triton's M-free config at every M: 1.29-1.55x default mode's time
at M = 4096 (H100, session 48), where default mode runs the Mosaic kernel. fp8_block_det runs
one K order (det_k_parts parts, each K-block's chain times its scales, added in K order) by
three launches: "decode" (swap-AB plain pipeline, M <= 16; its parts' sum in the kernel -- a
cluster -- or by XLA from slabs), "fold" (fp8_block_mgpu, the parts folded in each CTA) and
"spread" (the parts as CTAs, float32 slabs added by XLA); blocks_per_step 1 or 2.

  1. bitwise: per --bitwise-shapes, rows of M = 7, 64, 300 (other rows random) against the same
     rows alone (M = 1), each launch that takes the M against "fold" at that M; and the error
     against float64 of the dequantized operands (normwise).
  2. time at --m over --shapes: bf16 `jnp.dot`, the dispatcher's fp8_block in default and
     deterministic mode, and each launch forced.
Prediction: (1) bitwise everywhere (the interpreter agrees, tests/kernels/test_fp8_block_det.py;
the swap-AB chain: benchmarks/probe_swap_ab_bits.py). (2) fold within ~1.05x default at M >= 1024
(the same kernel, parts closed by a cond every K/8), ~1.1x at M = 256 where tiles fill the
SMs; decode within 1.15x of default (Triton's split-K decode) at M = 1 / 16; spread ahead of
fold where the tiles fill under half the SMs.

    PYTHONPATH=. python3 benchmarks/probe_det_block_mgpu.py --out $OUT/det_block.json
    PYTHONPATH=. python3 benchmarks/probe_det_block_mgpu.py --tiny --out /tmp/d.json  (CPU smoke)
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jqlin
from jqlin import bench
from jqlin.kernels.pallas_fp8 import _weight_scale, quantize_x
from pallas_kernels.fp8_block_det import det_launch, fp8_block_det_mgpu

FMT = "fp8_block"
BITWISE_MS = (7, 64, 300)


def launch_fn(kind: str, **changes):
    """fn(x, qw): fp8_block through fp8_block_det with its launch forced: det_launch's for
    `kind`, with `changes` (DetLaunch fields: blocks_per_step, in_kernel_finish, park,
    park_cols) replaced."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        xq, xs, _ = quantize_x(x, qw, qw.spec, interpret=interpret)
        scale, _ = _weight_scale(qw, qw.spec)
        m, k = xq.shape
        launch = det_launch(m, qw.data.shape[0], k, out_dtype=x.dtype, interpret=interpret,
                            kind=kind)._replace(**changes)
        y = fp8_block_det_mgpu(xq, xs, qw.data, scale, out_dtype=x.dtype, launch=launch,
                               interpret=interpret)
        return qw.trim_rows(y)
    return fn


def launch_ops(k: int, tiny: bool) -> list[bench.Op]:
    def op(name, kind, max_m=None, **changes):
        return bench.Op(name, FMT, "det", launch_fn(kind, **changes), max_m=max_m)
    ops = []
    if not tiny:  # (the interpreter runs no decode launch at M <= 8: its x tile's bits)
        ops += [op("decode_xla", "decode", 128, in_kernel_finish=False),
                op("decode_cluster", "decode", 16, in_kernel_finish=True)]
    two = (k // 128 // det_launch(1, 128, k, kind="fold").parts) % 2 == 0
    for kind in ("fold", "spread"):
        ops += [op(f"{kind}_b{b}", kind, blocks_per_step=b, park=False)
                for b in ((1, 2) if two else (1,))]
    # (the parts' sum in shared memory: session 49; closes inside a step, so two K-blocks a
    # step also where a part's K-blocks are odd: session 50)
    if k % 256 == 0:  # (the whole park: det_launch parks 96 columns where parts are short)
        ops.append(op("fold_park_b2", "fold", blocks_per_step=2, park=True, park_cols=128))
        # (session 51: part of the parts' sum kept in registers -- 32 of its 128 columns a
        # warpgroup row, 16 registers a thread -- so a close moves 3/4 the bytes; 64 columns
        # ran behind 96 on 4 of 5 shapes, session 53, where 96 became det_launch's choice at
        # K <= 8192)
        ops.append(op("fold_park_b2_c96", "fold", blocks_per_step=2, park=True, park_cols=96))
    ops.append(op("fold_park_b1", "fold", blocks_per_step=1, park=True, park_cols=128))
    return ops


def rows_bitwise(k: int, n: int, ms, tiny: bool, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    qw = jqlin.quantize(rng.standard_normal((n, k)).astype(np.float32), FMT)
    wf = np.asarray(qw.dequantize_storage(), np.float64)
    out = []
    for m in ms:
        x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.2, 3, (m, 1)), jnp.bfloat16)
        fold = np.asarray(jax.jit(launch_fn("fold"))(x, qw).astype(jnp.float32))
        xq, xs, _ = quantize_x(x, qw, qw.spec)
        xf = (np.asarray(xq.astype(jnp.float32), np.float64)
              * np.repeat(np.asarray(xs, np.float64), 128, 1))
        ref = xf @ wf.T
        rec = {"K": k, "N": n, "M": m,
               "fold_rel_err": float(np.linalg.norm(fold - ref) / np.linalg.norm(ref))}
        kinds = ["spread"] + (["decode"] if m <= 128 and not tiny else [])
        for kind in kinds:
            y = np.asarray(jax.jit(launch_fn(kind))(x, qw).astype(jnp.float32))
            rec[f"{kind}_eq_fold"] = bool(np.array_equal(y.view(np.uint32), fold.view(np.uint32)))
        picks = sorted({0, m - 1, *rng.choice(m, size=min(3, m), replace=False).tolist()})
        alone_kind = "fold" if tiny else "decode"  # (M = 1's own launch on the GPU)
        rec["rows"] = picks
        rec["rows_alone_eq"] = [bool(np.array_equal(np.asarray(jax.jit(launch_fn(alone_kind))(
            x[i:i + 1], qw).astype(jnp.float32))[0].view(np.uint32), fold[i].view(np.uint32)))
            for i in picks]
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_rows_probe_args(p, m="1,16,64,256,1024,4096")
    p.add_argument("--no-time", action="store_true", help="the bitwise check alone")
    args = p.parse_args(argv)
    shapes, ms, bit_shapes = bench.rows_probe_sizes(p, args)
    result, save = bench.rows_probe_record(args.out)

    for k, n in bit_shapes:
        result["bitwise"] += rows_bitwise(k, n, (130,) if args.tiny else BITWISE_MS, args.tiny)
        save()
    if args.no_time:
        return 0
    for model, k, n in shapes:
        ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_block", FMT),
               bench.kernel_op("pallas_fp8_block", FMT, deterministic=True),
               *launch_ops(k, args.tiny)]
        bench.run_into(result, save, (model, k, n), ms, ops, reps=args.reps, smoke=args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
