"""A W8A16 decode kernel on Mosaic GPU's plain pipeline, several small CTAs an SM (session 25;
run in session 26, then made pallas_kernels.fp8_a16_decode_mgpu -- this probe keeps the
explicit (splits, stages) grid and the in-CTA finish, `fused`, that the library dropped: it
faulted the device beside other W8A16 kernels in one benchmark process, NOTES.md session 26).

Why (NOTES session 25): at M=1-2 XLA's fused GEMM of the converted codes runs ~1.5 us under
the Mosaic W8A16 kernel on the same bytes (6.1 vs 7.8 us on 4096x4096) with 8 x 64 tiles and
split-K -- about 4 CTAs an SM, whose ramps overlap -- where fp8_block_a16_mgpu runs one CTA an
SM by construction (its warp-specialized pipeline uses setmaxnreg, so ptxas launches it at the
register cap). Here: one warpgroup a CTA, 64 weight rows, K cut into `splits` ranges, a plain
`plgpu.emit_pipeline` (no setmaxnreg: ptxas allocates what the kernel uses), the e4m3 tile
converted to bf16 in registers as wgmma's A operand (swap-AB: x^T the B operand, 8..16 rows),
each range's float32 sums to its own slab; XLA sums the slabs, scales by channel and rounds.
Prediction: if several CTAs an SM are resident, within 0.9-1.0 of XLA's two-row GEMM at M=1
(below the Mosaic kernel on 4096x4096 by ~1 us); if the registers or shared memory keep one,
no better than the Mosaic kernel.

    PYTHONPATH=. python3 benchmarks/probe_decode_plain.py --out probe.json [--shapes all]
    PYTHONPATH=. python3 benchmarks/probe_decode_plain.py --check   # against float64
"""

from __future__ import annotations

import argparse
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jqlin import bench, formats
from pallas_kernels.fp8_heuristics import num_sms
from pallas_kernels.mgpu_common import (BLOCK, WG_ROWS, interpret_params, store_piece,
                                         swizzled)

F32 = jnp.float32


def splits_for(n: int, k: int, per_sm: int, sms: int) -> int:
    """The most K ranges (a power of two, at least 2 K-blocks each) whose CTAs stay within
    per_sm an SM."""
    tiles, blocks, s = n // WG_ROWS, k // BLOCK, 1
    while tiles * s * 2 <= per_sm * sms and blocks % (s * 2) == 0 and blocks // (s * 2) >= 2:
        s *= 2
    return s


def decode_plain(x: jax.Array, w: jax.Array, w_scale: jax.Array, *, splits: int,
                 stages: int = 4, interpret: bool = False, fused: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) @ (w (N, K) e4m3 * w_scale (N, 1))^T for M <= 16, N a multiple of
    64, K of 128 * splits. fused (splits 1 only): each CTA scales its sums by channel, rounds
    them and writes its (M rows, 64) piece of y itself, through a transposed staging slot --
    no XLA pass after the kernel but y's row slice."""
    m, k = x.shape
    n = w.shape[0]
    block_m = 8 if m <= 8 else 16
    if m > 16 or n % WG_ROWS or k % (BLOCK * splits):
        raise ValueError(f"decode_plain: M <= 16, N % {WG_ROWS} == 0, K % {BLOCK * splits} == 0"
                         f" (splits={splits}), got M={m}, N={n}, K={k}")
    # TMA reads rows past x's end as zeros (their outputs are sliced off); its row tiling
    # takes counts of at most 8 or multiples of 8 (as fp8_block_a16_mgpu._launch)
    xp = jnp.pad(x, ((0, 8 - m % 8), (0, 0))) if m > 8 and m % 8 else x
    if fused and splits != 1:
        raise ValueError(f"decode_plain: fused needs splits=1, got {splits}")
    steps = k // BLOCK // splits
    tiles = n // WG_ROWS
    mp = xp.shape[0] if m > 8 else block_m

    def body(w_gmem, x_gmem, ws_gmem, out_gmem):
        t = jax.lax.axis_index("tile")
        tile, split = t % tiles, t // tiles

        def scope(out_smem, a_smem):
            pl.run_scoped(lambda acc: accumulate(acc, out_smem, a_smem),
                          plgpu.ACC((WG_ROWS, block_m), F32))

        def accumulate(acc, out_smem, a_smem):
            def step(idx, w_smem, x_smem):
                a = w_smem[...].astype(F32).astype(x.dtype)  # exact: every e4m3 is a bf16
                if interpret:  # (the interpreter's wgmma reads A from shared memory)
                    a_smem[...] = a
                    plgpu.commit_smem()
                    a = a_smem
                plgpu.wgmma(acc, a, x_smem.transpose((1, 0)))
                plgpu.wgmma_wait(0)

            first = split * steps
            plgpu.emit_pipeline(
                step, grid=(steps,), max_concurrent_steps=stages,
                in_specs=[plgpu.BlockSpec((WG_ROWS, BLOCK), lambda i: (tile, first + i),
                                          transforms=swizzled(w.dtype)),
                          plgpu.BlockSpec((block_m, BLOCK), lambda i: (0, first + i),
                                          transforms=swizzled(x.dtype))])(w_gmem, x_gmem)
            if fused:  # the same float32 product as XLA's finish below, rounded here
                total = acc[...]
                col = plgpu.load(ws_gmem.at[pl.ds(tile * WG_ROWS, WG_ROWS)],
                                 layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
                store_piece(total * jax.lax.broadcast_in_dim(col, total.shape, [0]), out_smem,
                            out_gmem.at[pl.ds(0, block_m), pl.ds(tile * WG_ROWS, WG_ROWS)],
                            transposed=True)
            else:
                out_smem[...] = acc[...]
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_smem,
                                        out_gmem.at[split, pl.ds(tile * WG_ROWS, WG_ROWS)])
            plgpu.wait_smem_to_gmem(0)

        a_scratch = ([plgpu.SMEM((WG_ROWS, BLOCK), x.dtype, transforms=swizzled(x.dtype))]
                     if interpret else [])
        staging = (plgpu.SMEM((block_m, WG_ROWS), x.dtype, transforms=swizzled(x.dtype, WG_ROWS))
                   if fused else plgpu.SMEM((WG_ROWS, block_m), F32))
        pl.run_scoped(lambda out_smem, *a: scope(out_smem, *a or (None,)), staging, *a_scratch)

    out_type = (jax.ShapeDtypeStruct((mp, n), x.dtype) if fused else
                jax.ShapeDtypeStruct((splits, n, block_m), F32))
    call = plgpu.kernel(
        body, out_type=out_type, grid=(tiles * splits,),
        grid_names=("tile",),
        compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params(interpret))
    scale = jnp.broadcast_to(w_scale.astype(F32).reshape(-1), (n,))
    if fused:
        return call(w, xp, scale)[:m]
    parts = call(w, xp, scale)
    y = parts.sum(0)[:, :m].T * w_scale.reshape(1, n)  # ranges added in K order, then scaled
    return y.astype(x.dtype)


def plain_op(fmt: str, per_sm: int = 0, stages: int = 4, splits: int = 0,
             fused: bool = False) -> bench.Op:
    """per_sm: splits by splits_for; splits: that many K ranges (invalid ones: an error row)."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        n, k = qw.storage_shape
        return decode_plain(x, qw.data, qw.scale, interpret=interpret, stages=stages,
                            splits=splits or splits_for(n, k, per_sm, num_sms()), fused=fused)
    name = (f"plain_k{splits}_st{stages}" if splits else f"plain_s{per_sm}_st{stages}") + (
        "_fused" if fused else "")
    return bench.Op(name, fmt, "default", fn)


def check(interpret: bool) -> float:
    """Worst |y - ref| / bound over a few small cases against float64 (M=1, 3, 16)."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for m, n, k, splits, fused in ((1, 128, 512, 2, False), (3, 192, 256, 1, False),
                                   (16, 64, 1024, 4, False), (1, 128, 512, 1, True),
                                   (11, 192, 256, 1, True)):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        w = jnp.asarray(rng.standard_normal((n, k)), jnp.float8_e4m3fn)
        s = jnp.asarray(rng.uniform(0.5, 2, (n, 1)), F32)
        y = np.asarray(decode_plain(x, w, s, splits=splits, interpret=interpret, fused=fused),
                       np.float64)
        xs, ws = np.asarray(x, np.float64), np.asarray(w.astype(F32), np.float64)
        ref = xs @ (ws * np.asarray(s, np.float64)).T
        # float32 sums of exact products, one bf16 rounding of y
        bound = (np.abs(xs) @ np.abs(ws * np.asarray(s, np.float64)).T) * k * 2.0 ** -23 + \
            np.abs(ref) * 2.0 ** -8
        if not np.isfinite(y).all():  # (the interpreter starts every buffer as NaN)
            return math.inf
        worst = max(worst, float((np.abs(y - ref) / bound).max()))
    return worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    p.add_argument("--out", default="")
    p.add_argument("--shapes", default="4096x4096,8192x8192,8192x10240,4096x28672")
    p.add_argument("--m", default="1,2")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--grid", default="",
                   help="SPLITS:STAGES lists, e.g. 1,2,4,8:2,4 (explicit K ranges x stages)"
                        " in place of the per-SM ops")
    p.add_argument("--fused", action="store_true", help="with --grid: splits=1 fused too")
    p.add_argument("--shapes-all", action="store_true", help="the benchmark's 11 shapes")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    if args.check:
        worst = check(cpu)
        print(f"decode_plain vs float64: worst |y-ref|/bound {worst:.3g}")
        return 0 if worst <= 1 else 1
    fmt = "fp8_per_channel_a16"
    shapes = ([("tiny", 512, 256)] if cpu else
              [(mdl, k, n) for mdl, kn in bench.SHAPES.items() for k, n in kn]
              if args.shapes_all else
              [("probe", *map(int, s.split("x"))) for s in args.shapes.split(",")])
    ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_w8a16", fmt)]
    if args.grid:
        splits, stages = (tuple(int(v) for v in part.split(",")) for part in args.grid.split(":"))
        ops += [plain_op(fmt, stages=st, splits=sp) for sp in splits for st in stages]
        if args.fused:
            ops += [plain_op(fmt, stages=st, splits=1, fused=True) for st in stages]
    else:
        ops += [plain_op(fmt, per_sm) for per_sm in (2, 4, 8)] + [plain_op(fmt, 4, stages=2)]
    res = bench.run(shapes, tuple(int(v) for v in args.m.split(",")), ops, reps=args.reps,
                    log=print, smoke=cpu)
    print(bench.format_table(res["records"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
