"""The block W8A8 Mosaic kernel's promotion (pallas_kernels.fp8_block_mgpu, session 50): the weight
scale as one shared-memory scalar per K-block instead of a 128-column vector -- same bits, less
work? -- and park's lazy close (deterministic mode's K parts).

fp8_block_mgpu's promotion (each K-block's wgmma chain times its x rows' scales, times its weight
block's scale, added to the total) loaded the weight scale as a row of 128 column values in
wgmma's column layout: 32 shared-memory loads per thread per K-block, for a value that is one
number, since a 128-wide output tile is one 128x128 weight block. `scalar_ws` reads that number
once (a broadcast load) and multiplies by it: the same float32 operations in the same order.

Lazy close: park (the finished K parts' sum in shared memory) adds a part's total to it when
the part ends, between MMAs -- ~1000 cycles of shared-memory traffic a close, 8 closes a tile
(H100, session 49: park ran 1.21x default mode at 4096^3). lazy_close defers it to the next
part's first step, after that step's wgmmas are issued, so it runs under them.

  1. bitwise: each launch (default mode's two K-blocks a step; deterministic mode's fold, and
     park, eager and lazy) with scalar_ws against without, and deterministic launches against
     the fold, at M = 300 and 4096 on --bitwise-shapes.
  2. time at --m over --shapes: bf16 `jnp.dot`, the dispatcher's fp8_block (both modes), and
     each launch with and without scalar_ws.
Prediction: (1) bitwise. (2) the promotion is most of the gap to the tensor core's rate (the
H100 kernel runs ~41% of fp8 peak at M = 4096): scalar_ws 5-15% faster in every launch at
M >= 1024; lazy park within 1.08x of default at M = 4096 (eager park: 1.2x).

    PYTHONPATH=. python3 benchmarks/probe_block_scale_load.py --out $OUT/scale_load.json
    PYTHONPATH=. python3 benchmarks/probe_block_scale_load.py --tiny --out /tmp/s.json  (CPU)
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
from pallas_kernels.fp8_block_mgpu import fp8_block_matmul_mgpu, launch_params
from pallas_kernels.fp8_heuristics import det_k_parts, num_sms

FMT = "fp8_block"
BITWISE_MS = (300, 4096)


def launches(k: int) -> dict[str, dict]:
    """The kernel's settings by launch name: default mode's, deterministic mode's fold (one
    K-block a step) and park (two), the parts det_k_parts gives."""
    parts = det_k_parts(k, 128)
    out = {"default": dict(launch_params(k)),
           "fold_b1": dict(blocks_per_step=1, group_m=16, programs=num_sms(), k_parts=parts)}
    park = dict(group_m=16, programs=num_sms(), k_parts=parts, park=True)
    if (k // 128 // parts) % 2 == 0:
        out["park_b2"] = dict(park, blocks_per_step=2)
        out["park_b2_lazy"] = dict(park, blocks_per_step=2, lazy_close=True)
    out["park_b1_lazy"] = dict(park, blocks_per_step=1, lazy_close=True)
    return out


def launch_fn(params: dict, scalar_ws: bool):
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        xq, xs, _ = quantize_x(x, qw, qw.spec, interpret=interpret)
        scale, _ = _weight_scale(qw, qw.spec)
        y = fp8_block_matmul_mgpu(xq, xs, qw.data, scale, out_dtype=x.dtype,
                                  scalar_ws=scalar_ws, interpret=interpret, **params)
        return qw.trim_rows(y)
    return fn


def bitwise(k: int, n: int, ms, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    qw = jqlin.quantize(rng.standard_normal((n, k)).astype(np.float32), FMT)
    out = []
    for m in ms:
        x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.2, 3, (m, 1)), jnp.bfloat16)
        rec = {"K": k, "N": n, "M": m}
        fold = None
        for name, params in launches(k).items():
            a, b = (np.asarray(jax.jit(launch_fn(params, s))(x, qw)).view(np.uint16)
                    for s in (False, True))
            rec[f"{name}_scalar_eq"] = bool(np.array_equal(a, b))
            if name == "fold_b1":
                fold = a
            elif name != "default":  # (deterministic mode's launches: one order)
                rec[f"{name}_eq_fold"] = bool(np.array_equal(a, fold))
        out.append(rec)
        print(json.dumps(rec), flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_rows_probe_args(p, m="256,1024,4096,16384")
    args = p.parse_args(argv)
    shapes, ms, bit_shapes = bench.rows_probe_sizes(p, args)
    result, save = bench.rows_probe_record(args.out)
    for k, n in bit_shapes:
        result["bitwise"] += bitwise(k, n, (130,) if args.tiny else BITWISE_MS)
        save()
    for model, k, n in shapes:
        ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_block", FMT),
               bench.kernel_op("pallas_fp8_block", FMT, deterministic=True)]
        for name, params in launches(k).items():
            ops += [bench.Op(f"{name}{'_scalar' if s else ''}", FMT, "default",
                             launch_fn(params, s)) for s in (False, True)]
        bench.run_into(result, save, (model, k, n), ms, ops, reps=args.reps, smoke=args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
