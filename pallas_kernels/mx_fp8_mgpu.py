"""MXFP8 x MXFP8 with fp8 wgmma on Mosaic GPU (experimental, not dispatched): the
warp-specialized pipeline of fp8_block_mgpu, promoting every 32-wide K chunk instead of every
128-wide K-block.

Why: issue 4 asks for MXFP8's fp8-MMA route measured beside the bf16 one. The Triton variant
(mx_fp8mma) serialises each chunk's MMA and its float32 scaling in one program (169-177
TFLOP/s on the H200, session 22); here a TMA warpgroup streams the operands while two compute
warpgroups each own 64 rows of a 128 x 128 output tile, each issuing two chunks' wgmmas before
scaling the first. The bound (docs/targets.md): per output element and 32-deep chunk, 32 fp8
MACs on the tensor cores against >= 2 FP32 instructions on the CUDA cores -- the scaling takes
at least twice the MMAs' time, so ~half the fp8 peak with perfect overlap.
Measured (H100, session 53, `bench_fp4_mx.py --parts mxmma`, h100_mxmma_s53.json): 354-430
TFLOP/s at M = 4096 (four chunks in flight: 362-444, 2-6% ahead) on 4 shapes, 0.47-0.66x bf16
`jnp.dot`, where the dispatcher's bf16 route ran 661-771 (0.88-1.14x) -- under half the bound
above, and not enough to dispatch: the scaling's FP32 instructions share the compute
warpgroups' issue slots with the scale loads and the wgmma waits.

Numerics per output element (m, n), chunk c of 32: part = sum_k xq[m, k] * w[n, k] (one
32-deep wgmma from a zeroed accumulator), then total += part * (x_scale[m, c] * w_scale[n, c])
in float32, chunks in K order -- mx_fp8mma's order. Both scales are powers of two, so their
product and the scaling are exact (outside float32's range ends) and only the adds round.

Layout: xq (M, K) and w (N, K) e4m3, K-major (fp8 wgmma takes both operands so); M, N and K
multiples of 128 (the caller pads M). Scales as float32 (the caller decodes e8m0), handed to
TMA as one row per chunk: x_scale transposed (K/32, M), w_scale transposed (K/32, N).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .fp8_heuristics import num_sms
from .mgpu_common import (BLOCK, WG_ROWS, mgpu_kernel, pad_x_tiles, store_rows, swizzled,
                          tile_index, walk_tiles, warpgroup_pipeline)

__all__ = ["mxfp8_matmul_mgpu", "CHUNK"]

F32, BF16, E4M3 = jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn
CHUNK = 32  # K per scale, and one fp8 wgmma k-step
CHUNKS = BLOCK // CHUNK  # chunks per pipeline step (a 128-wide K-block)


def _kernel(x_gmem, w_gmem, xs_gmem, ws_gmem, out_gmem, *, stages: int, in_flight: int,
            group_m: int, persistent: bool):
    m, k = x_gmem.shape
    n = w_gmem.shape[0]
    m_tiles, n_tiles = m // BLOCK, n // BLOCK
    # 32-byte swizzled tiles of 32 columns: a chunk is then whole tiles, which wgmma can take
    # (slices inside fp8_block_mgpu's 128-byte swizzle are refused)
    fp8_tiles = swizzled(E4M3, CHUNK)

    def body(_, x_smem, w_smem, xs_smem, ws_smem, total):
        wg = lax.axis_index("wg")
        rows = pl.ds(wg * WG_ROWS, WG_ROWS)

        def scaled(part, c):  # chunk c's part times the outer product of its two scales
            xs = plgpu.load(xs_smem.at[c, rows], layout=plgpu.Layout.WGMMA.reduce(1))
            ws = plgpu.load(ws_smem.at[c], layout=plgpu.Layout.WGMMA.reduce(0))
            return part * (lax.broadcast_in_dim(xs, part.shape, [0])
                           * lax.broadcast_in_dim(ws, part.shape, [1]))

        def run_chunks(first, total, *accs):  # a fresh accumulator per chunk
            for j, acc in enumerate(accs):  # all of them issued first (asynchronous)
                cols = pl.ds((first + j) * CHUNK, CHUNK)
                plgpu.wgmma(acc, x_smem.at[rows, cols], w_smem.at[:, cols].transpose((1, 0)))
            for j, acc in enumerate(accs):  # scale chunk j while later ones still run
                part = plgpu.wgmma_accumulator_load(acc, wait_n=len(accs) - 1 - j)
                total = total + scaled(part, first + j)
            return total

        for first in range(0, CHUNKS, in_flight):
            total = pl.run_scoped(functools.partial(run_chunks, first, total),
                                  *[plgpu.ACC((WG_ROWS, BLOCK), F32)] * in_flight)
        return total

    def pipeline(body_fn, context):
        return warpgroup_pipeline(body_fn, context, steps=k // BLOCK, stages=stages, in_specs=[
            plgpu.BlockSpec((BLOCK, BLOCK), lambda i: (0, i), transforms=fp8_tiles),
            plgpu.BlockSpec((BLOCK, BLOCK), lambda i: (0, i), transforms=fp8_tiles),
            plgpu.BlockSpec((CHUNKS, BLOCK), lambda i: (i, 0)),
            plgpu.BlockSpec((CHUNKS, BLOCK), lambda i: (i, 0)),
        ])

    unused = lambda *_, **__: None  # the allocations depend on block shapes only
    tiles = m_tiles * n_tiles

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(unused, unused).get_allocations(x_gmem, w_gmem, xs_gmem, ws_gmem),
        out_smem=plgpu.SMEM((2, WG_ROWS, BLOCK), out_gmem.dtype,
                            transforms=swizzled(out_gmem.dtype)),
        collective_axes="wg",
    )
    def _scope(allocs, out_smem):
        def run_tile(t):
            m_idx, n_idx = tile_index(t, m_tiles, n_tiles, group_m)
            m_slice = pl.ds(m_idx * BLOCK, BLOCK)
            n_slice = pl.ds(n_idx * BLOCK, BLOCK)
            context = functools.partial(store_rows, out_smem=out_smem, out_gmem=out_gmem,
                                        row_slice=m_slice, col_slice=n_slice)
            pipeline(body, context)(x_gmem.at[m_slice], w_gmem.at[n_slice],
                                    xs_gmem.at[:, m_slice], ws_gmem.at[:, n_slice],
                                    allocations=allocs)

        walk_tiles(run_tile, tiles, persistent)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def mxfp8_matmul_mgpu(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array,
                      *, out_dtype=BF16, stages: int = 4, in_flight: int = 2,
                      group_m: int = 16, programs: int | None = None,
                      interpret: bool | plgpu.InterpretGPUParams = False) -> jax.Array:
    """y (M, N) = (xq * x_scale) @ (w * w_scale)^T in out_dtype, float32 sums (module
    docstring). xq (M, K), w (N, K) e4m3; x_scale (M, K/32), w_scale (N, K/32) float32 powers
    of two (decoded e8m0). N and K multiples of 128; M any (padded to 128-row tiles).
    stages: pipeline steps (128-wide K-blocks) in flight. in_flight: chunks whose wgmmas are
    issued before the first is scaled (1, 2 or 4; each a 64 x 128 float32 accumulator a
    warpgroup, 64 registers a thread beside the total's 64: with 4, 320 against the 232 a
    compute thread gets -- expect spills). group_m: tile rows launched together
    (mgpu_common.tile_index). programs: None, one CTA per 128 x 128 tile; an int, that many
    persistent CTAs (None on a GPU: the SMs).
    interpret: Mosaic GPU's interpreter (CPU), or its parameters."""
    m, k = xq.shape
    n = w.shape[0]
    if xq.dtype != jnp.dtype(E4M3) or w.dtype != jnp.dtype(E4M3):
        raise ValueError(f"mxfp8_matmul_mgpu: xq and w must be float8_e4m3fn, got {xq.dtype} "
                         f"and {w.dtype}")
    if w.shape != (n, k) or k % BLOCK or n % BLOCK or k == 0:
        raise ValueError(f"mxfp8_matmul_mgpu: w must be (N, K) with N and K positive multiples "
                         f"of {BLOCK}; got w {tuple(w.shape)} for xq {tuple(xq.shape)}")
    want_xs, want_ws = (m, k // CHUNK), (n, k // CHUNK)
    if (x_scale.shape != want_xs or w_scale.shape != want_ws
            or x_scale.dtype != jnp.dtype(F32) or w_scale.dtype != jnp.dtype(F32)):
        raise ValueError(f"mxfp8_matmul_mgpu: x_scale must be float32 {want_xs} and w_scale "
                         f"float32 {want_ws}, got {x_scale.dtype}{tuple(x_scale.shape)} and "
                         f"{w_scale.dtype}{tuple(w_scale.shape)}")
    if in_flight not in (1, 2, 4):
        raise ValueError(f"mxfp8_matmul_mgpu: in_flight must be 1, 2 or 4, got {in_flight!r}")
    if not (isinstance(stages, int) and stages >= 1):
        raise ValueError(f"mxfp8_matmul_mgpu: stages must be a positive int, got {stages!r}")
    if programs is not None and not (isinstance(programs, int) and programs >= 1):
        raise ValueError(f"mxfp8_matmul_mgpu: programs must be None or a positive int, got "
                         f"{programs!r}")
    xq, x_scale, mp = pad_x_tiles(xq, x_scale)  # (the padding rows sliced off below)
    ctas = mp // BLOCK * (n // BLOCK)
    if programs is None and not interpret:
        programs = num_sms()
    call = mgpu_kernel(
        functools.partial(_kernel, stages=stages, in_flight=in_flight, group_m=group_m,
                          persistent=programs is not None),
        jax.ShapeDtypeStruct((mp, n), jnp.dtype(out_dtype)), min(programs or ctas, ctas),
        interpret)
    y = call(xq, w, x_scale.T, w_scale.T)
    return y[:m] if mp != m else y
