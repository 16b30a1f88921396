"""Could deterministic mode run block W8A8 (`fp8_block`) on the Mosaic GPU kernel at every M?
(session 48)

Deterministic mode keeps the Triton kernels at every M (fp8_paths): the Mosaic kernel's bits
differ from Triton's (session 6), so one mode cannot mix the two by M. Default mode runs the
Mosaic kernel from M = 256, and it has grown faster since: at M = 4096 det / default measured
1.29-1.55x on an H100 (session 48, `h100_fp8_block_m4096_det_s48.json`), against the issue's
1.15x. With the Mosaic kernel at every M in deterministic mode, M >= 256 would cost what default
mode does; the open question is decode, where default mode runs Triton's split-K decode configs
while the Mosaic kernel has one CTA per 128 x 128 output tile (N / 128 CTAs up to M = 128) and
pads x to 128 rows.

This probe answers both halves on a GPU:
  1. bitwise: is the Mosaic kernel's row i at M = 1 the same bits as row i inside M = 7, 64 and
     300 (other rows random)? Each output is one wgmma chain per K-block from zero, times its
     two scales, added in K order -- nothing that depends on the other rows -- so it should be.
  2. time at --m (default 1, 16, 64, 256) over --shapes: bf16 `jnp.dot`, the dispatcher in
     default mode, in deterministic mode, and the Mosaic path forced (`path_mgpu`).
Prediction: (1) bitwise at every M. (2) path_mgpu / default <= 1.15 at M = 1-64 where N >=
24576 (>= 192 output tiles for 132 SMs), 1.5-3x where N <= 8192 (32-64 tiles: at most half
the SMs stream the weight); ~1.0 at M = 256 (the same kernel).
Measured (H100, session 48, `h100_det_w8a8_mgpu_s48.json`): (1) bitwise on both shapes at
M = 7, 64, 300. (2) wrong at decode: path_mgpu / default 1.11-2.51x at M = 1 / 16 on every
shape (4096x28672 1.11-1.15x, 14336x4096 2.38-2.51x) -- the Mosaic kernel needs a decode launch
of the same bits first; at M = 256 1.00x.

--spread (session 48): deterministic mode's own launch choice instead. Its W8A8 config (Triton,
K in det_k_parts parts) runs the parts inside each program, or -- spread_k_parts, where the
output tiles number fewer than the SMs -- as split_k programs whose float32 partials are added
after: the same bits (test_gpu_k_parts_are_the_split_k_sums), another time. The same run
measured det / default 1.69x at 4096x4096 M = 256 (128 tiles: spread, 8 slabs of 256 x 4096)
and 1.28x at 7168x36864 M = 1 / 16 (288 tiles: not spread, 3 waves on 132 SMs, the third 18%
full). Ops per format: bf16, the dispatcher in default and deterministic mode, and the
deterministic config forced both ways (`det_in_program`, `det_spread`).
Prediction: det_in_program under det_spread where the tiles fill >= ~0.9 of a wave at M >= 256
(4096x4096 M = 256: ~20 us against 42.7); det_spread under det_in_program wherever the last wave
is part-empty at M <= 64 (7168x36864 M = 1: ~96 us against 122.8).
Measured (H100, session 48, `h100_det_spread_s48.json`): both held (21.1 against 42.7 us;
102.1 against 122.8), but with T >= S tiles the program beat the split everywhere else, and at
M = 64 the split lost where the partials are large beside the weight (8192x10240: 49.6 against
42.3) -- hence fp8_heuristics.spread_wins' launch model rather than a wave-fill rule.

Not answered here: row-parallel layers. Deterministic mode promises K-sharded layers bitwise
the unsharded one (k_parts: Triton's det config sums K in up to 8 parts); the Mosaic kernel
sums K in one left fold, so it would need the same parts first.

    PYTHONPATH=. python3 benchmarks/probe_det_w8a8_mgpu.py --shapes all --out $OUT/det_w8a8.json
    PYTHONPATH=. python3 benchmarks/probe_det_w8a8_mgpu.py --spread --formats fp8_block,fp8_ptpc \
        --m 1,64,256,1024 --out $OUT/det_spread.json
    PYTHONPATH=. python3 benchmarks/probe_det_w8a8_mgpu.py --tiny [--spread] --out /tmp/d.json
        (CPU smoke)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jqlin
from jqlin import bench
from pallas_kernels.fp8_heuristics import w8a8_heuristic

FMT = "fp8_block"
W8A8_FORMATS = ("fp8_block", "fp8_ptpc", "fp8_per_tensor")
BITWISE_MS = (7, 64, 300)


def path_mgpu_op() -> bench.Op:
    return bench.fp8_op(FMT, "path_mgpu", path="mgpu")


def det_config_op(fmt: str, n: int, k: int, spread: bool) -> bench.Op:
    """Deterministic mode's W8A8 config for (N, K), its K parts in each program or (spread) as
    split_k programs -- forced, whatever spread_k_parts would choose at the M it runs."""
    cfg = w8a8_heuristic(None, n, k, per_block=fmt == "fp8_block")
    if spread:
        cfg = dataclasses.replace(cfg, split_k=cfg.k_parts, k_parts=1)
    return bench.fp8_op(fmt, "det_spread" if spread else "det_in_program", config=cfg,
                        deterministic=True)


def rows_bitwise(k: int, n: int, ms=BITWISE_MS, rows: int = 4, seed: int = 0) -> list[dict]:
    """For each M in ms: whether `rows` rows of an M-row product (the rest random) are bitwise
    the same rows computed alone (M = 1), through the Mosaic path."""
    rng = np.random.default_rng(seed)
    qw = jqlin.quantize(rng.standard_normal((n, k)).astype(np.float32), FMT)
    mgpu = path_mgpu_op().fn
    run = jax.jit(lambda x: mgpu(x, qw))
    out = []
    for m in ms:
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        y = np.asarray(run(x).astype(jnp.float32))
        picks = sorted({0, m - 1, *rng.choice(m, size=min(rows, m), replace=False).tolist()})
        same = [bool(np.array_equal(np.asarray(run(x[i:i + 1]).astype(jnp.float32))[0].view(
            np.uint32), y[i].view(np.uint32))) for i in picks]
        out.append({"K": k, "N": n, "M": m, "rows": picks, "bitwise": same,
                    "all_bitwise": all(same)})
        print(f"bitwise {k}x{n} M={m} rows {picks}: {same}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_rows_probe_args(p, m="1,16,64,256")
    p.add_argument("--spread", action="store_true", help="deterministic mode's parts in the "
                   "program against as split_k programs (no bitwise check)")
    p.add_argument("--formats", default=FMT, help="--spread: the W8A8 formats")
    args = p.parse_args(argv)
    shapes, ms, bit_shapes = bench.rows_probe_sizes(p, args)
    if bad := set(args.formats.split(",")) - set(W8A8_FORMATS):
        p.error(f"--formats: {sorted(bad)} not among the W8A8 formats {W8A8_FORMATS}")
    if args.spread:
        bit_shapes = []
    result, save = bench.rows_probe_record(args.out)

    for k, n in bit_shapes:
        result["bitwise"] += rows_bitwise(k, n, ms=(3,) if args.tiny else BITWISE_MS,
                                          rows=2 if args.tiny else 4)
        save()
    for model, k, n in shapes:  # (ops per shape: --spread's configs depend on it)
        ops = [bench.bf16_op()]
        for fmt in (args.formats.split(",") if args.spread else [FMT]):
            kernel = "pallas_fp8_block" if fmt == FMT else "pallas_fp8_w8a8"
            ops += [bench.kernel_op(kernel, fmt), bench.kernel_op(kernel, fmt, deterministic=True)]
            ops += ([det_config_op(fmt, n, k, spread) for spread in (False, True)]
                    if args.spread else [path_mgpu_op()])
        bench.run_into(result, save, (model, k, n), ms, ops, reps=args.reps, smoke=args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
