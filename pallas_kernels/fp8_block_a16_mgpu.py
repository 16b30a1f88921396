"""Block-scaled FP8 weight-only (W8A16, ModelOpt FP8_PB_WO / `fp8_block_a16`) on Mosaic GPU, for
prefill sizes. EXPERIMENTAL (session 5, after the device time): lowers for CUDA and matches
float64 in Mosaic GPU's interpreter on CPU (tests/kernels/test_fp8_block_mgpu.py); not yet run
or timed on a GPU, so the dispatcher does not use it (`sweep_fp8.py --parts mgpu_a16` times it).

Why: the Triton W8A16 block kernel runs at 0.36-0.48x bf16 from M=1024 (session-5 grid): its
e4m3 -> bf16 conversion and a scale multiply per 128-K step sit between MMAs that nothing else
overlaps. Here, as in block_w8a8 (fp8_block_mgpu), a TMA warpgroup streams the tiles while two
compute warpgroups convert and multiply; the weights are wgmma's A operand straight from
registers (exact conversion: every e4m3 value is a bf16), so no converted copy goes back to
shared memory -- the mixed-type layout of JAX's hopper_mixed_type_matmul_mgpu example.

Swap-AB: the weight rows are the MMA's M side, so the kernel computes y^T (N, M) = W (N, K) @
x^T and the caller transposes. Numerics per output (m, n), K-block kb of 128: part = sum_k
bf16(w[n, k]) * x[m, k] (one wgmma chain from zero, float32 accumulation), then
total += part * w_scale[n // 128, kb] in float32, in K order.

Layout: w (N, K) e4m3, N and K multiples of 128 (block formats store them padded); x (M, K)
bf16 or f16 (the caller pads M to 128); the scale handed over as one row per K-block,
(K/128, N) float32, so TMA can move it beside the tiles. Per-channel and per-tensor scales
take the same route (each K-block's part times the row's one scale).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .mgpu_common import (BLOCK, WG_ROWS, mgpu_kernel, store_rows, swizzled, tile_index,
                          two_warpgroup_pipeline)

__all__ = ["fp8_block_a16_matmul_mgpu"]

F32, E4M3 = jnp.float32, jnp.float8_e4m3fn


def _kernel(w_gmem, x_gmem, ws_gmem, out_gmem, *, stages: int, group_m: int,
            a_in_registers: bool):
    n, k = w_gmem.shape
    m = x_gmem.shape[0]
    x_tiles = swizzled(x_gmem.dtype)

    def body(_, w_smem, x_smem, ws_smem, total, a_smem):
        wg = lax.axis_index("wg")
        rows = pl.ds(wg * WG_ROWS, WG_ROWS)

        def run_block(acc):  # a fresh accumulator per K-block: its sum alone
            # exact; Mosaic GPU has no direct e4m3 -> bf16 conversion with this ptxas
            w = w_smem[rows].astype(F32).astype(x_gmem.dtype)
            if not a_in_registers:  # (the interpreter's wgmma reads A from shared memory)
                a_smem[wg] = w
                plgpu.commit_smem()
                w = a_smem.at[wg]
            plgpu.wgmma(acc, w, x_smem.transpose((1, 0)))
            part = plgpu.wgmma_accumulator_load(acc, wait_n=0)
            ws = plgpu.load(ws_smem.at[0, rows], layout=plgpu.Layout.WGMMA.reduce(1))
            return total + part * lax.broadcast_in_dim(ws, part.shape, [0])

        return pl.run_scoped(run_block, plgpu.ACC((WG_ROWS, BLOCK), F32))

    def pipeline(body_fn, context):
        return two_warpgroup_pipeline(body_fn, context, steps=k // BLOCK, stages=stages,
                                      in_specs=[
            plgpu.BlockSpec((BLOCK, BLOCK), lambda i: (0, i), transforms=swizzled(E4M3)),
            plgpu.BlockSpec((BLOCK, BLOCK), lambda i: (0, i), transforms=x_tiles),
            plgpu.BlockSpec((1, BLOCK), lambda i: (i, 0)),
        ])

    unused = lambda *_, **__: None  # the allocations depend on block shapes only

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(unused, unused).get_allocations(w_gmem, x_gmem, ws_gmem),
        out_smem=plgpu.SMEM((2, WG_ROWS, BLOCK), out_gmem.dtype,
                            transforms=swizzled(out_gmem.dtype)),
        a_smem=plgpu.SMEM((2, WG_ROWS, BLOCK), x_gmem.dtype, transforms=x_tiles),
        collective_axes="wg",
    )
    def _scope(allocs, out_smem, a_smem):
        # the weight tiles play tile_index's "m" role (output rows of y^T)
        n_idx, m_idx = tile_index(lax.axis_index("tile"), n // BLOCK, m // BLOCK, group_m)
        n_slice = pl.ds(n_idx * BLOCK, BLOCK)
        m_slice = pl.ds(m_idx * BLOCK, BLOCK)
        context = functools.partial(store_rows, out_smem=out_smem, out_gmem=out_gmem,
                                    row_slice=n_slice, col_slice=m_slice)
        pipeline(functools.partial(body, a_smem=a_smem), context)(
            w_gmem.at[n_slice], x_gmem.at[m_slice], ws_gmem.at[:, n_slice],
            allocations=allocs)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def fp8_block_a16_matmul_mgpu(x: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                              scale_kind: str = "block",
                              out_dtype=None, stages: int = 3, group_m: int = 8,
                              a_in_registers: bool = True,
                              interpret: bool | plgpu.InterpretGPUParams = False) -> jax.Array:
    """y (M, N) = x (M, K) bf16/f16 @ (w (N, K) e4m3 [w_scale])^T in out_dtype (default x's
    dtype); see the module docstring for the numerics.
    scale_kind: "block" (w_scale (N/128, K/128)), "channel" ((N, 1)) or "tensor" ((1, 1)); the
    last two run the same per-128-K promotion with the row's one scale (W8A16 per-channel /
    per-tensor at prefill sizes without the dense path's converted copy of the weight).
    stages: pipeline steps in flight (48 KB of shared memory each with bf16 x).
    group_m: weight tile rows launched together (their x tiles shared in L2; see mgpu_common.tile_index).
    a_in_registers: wgmma reads the converted weights from registers (JAX's mixed-type
    example); False stores them to shared memory first (what the interpreter can run).
    interpret: run Mosaic GPU's interpreter (CPU); or its parameters."""
    m, k = x.shape
    n = w.shape[0]
    if x.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"x must be bfloat16 or float16, got {x.dtype}")
    if w.dtype != jnp.dtype(E4M3):
        raise ValueError(f"w must be float8_e4m3fn, got {w.dtype}")
    if w.shape != (n, k) or k % BLOCK or n % BLOCK:
        raise ValueError(f"w must be (N, K) with N and K multiples of {BLOCK}; got w "
                         f"{tuple(w.shape)} for x {tuple(x.shape)}")
    scale_shape = {"block": (n // BLOCK, k // BLOCK), "channel": (n, 1), "tensor": (1, 1)}
    if scale_kind not in scale_shape:
        raise ValueError(f"scale_kind must be one of {tuple(scale_shape)}, got {scale_kind!r}")
    if w_scale.shape != scale_shape[scale_kind]:
        raise ValueError(f"w_scale must be {scale_shape[scale_kind]} for scale_kind "
                         f"{scale_kind!r}, got {tuple(w_scale.shape)}")
    if not (isinstance(group_m, int) and group_m >= 1):
        raise ValueError(f"group_m must be a positive int, got {group_m!r}")
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    mp = -(-m // BLOCK) * BLOCK
    if mp != m:  # zero rows, sliced off below
        x = jnp.pad(x, ((0, mp - m), (0, 0)))
    ws = w_scale.astype(F32)  # one row of per-weight-row scales per K-block: (K/128, N)
    ws_rows = (jnp.repeat(ws.T, BLOCK, axis=1) if scale_kind == "block" else
               jnp.broadcast_to(ws.T, (k // BLOCK, n)))
    call = mgpu_kernel(
        functools.partial(_kernel, stages=stages, group_m=group_m,
                          a_in_registers=a_in_registers),
        jax.ShapeDtypeStruct((n, mp), out_dtype), n // BLOCK * (mp // BLOCK), interpret)
    yt = call(w, x, ws_rows)
    return yt.T[:m]
