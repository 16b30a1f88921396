"""Block-scaled FP8 x FP8 (DeepSeek-V3 recipe) on Mosaic GPU: wgmma with TMA and a
warp-specialized pipeline, for prefill sizes. The fp8_block kernel's default-mode path from
M = 256 on sm_90 (fp8_paths). H200, session 5 (benchmarks/sweep_fp8.py --parts mgpu, 4 shapes):
707-868 TFLOP/s at M >= 4096 with 2 K-blocks per step and group_m=16, 1.16-1.42x the Triton
block kernel, 0.96-1.16x bf16; checked against float64 on the GPU, in Mosaic GPU's interpreter
and its race detector on CPU (tests/kernels/test_fp8_block_mgpu.py).

Why: the Triton kernel's block W8A8 reaches 0.70-1.03x bf16 (541-725 TFLOP/s) at M >= 4096 on
the H200 while cuBLASLt's per-tensor fp8 reaches 1.6-1.8x: Triton's pipeline has no warp
specialization, so the per-128-K promotion (scale and add the fp32 partial) stalls the MMAs.
Here a memory warpgroup streams A / B tiles and the scale rows with TMA while two compute
warpgroups each own 64 rows of a 128 x 128 output tile: while one promotes, the other's wgmma
runs.

Numerics per output element (m, n), K-block kb of 128: part = sum_k xq[m, k] * w[n, k] (one
wgmma chain from a zeroed accumulator, the tensor core's fp8 accumulation), then
total += part * x_scale[m, kb] * w_scale[n // 128, kb] in float32 -- the Triton block kernel's
promote_k=128 order (fp8_core: part * row scale * column scale, added in K order).

K parts (session 49, deterministic mode's order: fp8_block_det): with k_parts, each part's total
starts from zero and the parts' totals are added in K order -- in the CTA (a second running
total, or with park one in shared memory, optionally only some of its columns: park_cols) or,
spread, as CTAs of their own writing float32 slabs that XLA adds.

Layout: x (M, K) e4m3 row-major; w (N, K) e4m3 -- the K-major B operand fp8 wgmma needs;
M, N, K multiples of 128 (the caller pads M). Scales are handed over as per-K-block rows that
TMA can move: x_scale transposed to (K/128, M); w_scale as one 128-byte row a K-block per
128-wide weight tile, (K/128, N/128 * 32) (mgpu_common.block_scale_tiles; until session 51 one
value per column, (K/128, N), four times the bytes: the same bits, 1-4% slower -- H100, 7168x36864
M = 256 / 4096 171.9 / 2127.0 us against 166.6 / 2049.3, h100_scale_tiles_s51.json).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .common import current_k_shards
from .fp8_heuristics import num_sms
from .launch import sum_device_splits
from .mgpu_common import (BLOCK, TMA_ROW_F32, WG_ROWS, block_scale_tiles, mgpu_kernel,
                          pad_x_tiles, store_rows, store_wg_rows, swizzled, tile_index,
                          walk_tiles, warpgroup_pipeline, zero_total)

__all__ = ["fp8_block_matmul_mgpu", "launch_params", "BLOCK"]

F32, BF16, E4M3 = jnp.float32, jnp.bfloat16, jnp.float8_e4m3fn
PARK_STAGING_BYTES = 16384  # the output's staging with park (both compute warpgroups)
PARK_CHUNK = 32  # columns of a park close at a time (one swizzled tile of float32)


def park_add(slot, run: jax.Array) -> None:
    """slot (64 rows of float32, shared memory) += run (its first slot.shape[1] columns),
    PARK_CHUNK columns at a time -- so a close holds few more registers than the running total
    while a later K-block's accumulator is in flight."""
    for c in range(0, slot.shape[1], PARK_CHUNK):
        piece = slot.at[:, pl.ds(c, PARK_CHUNK)]
        piece[...] = plgpu.load(piece, layout=plgpu.Layout.WGMMA) + run[:, c:c + PARK_CHUNK]


def _multiple(count, of: int):
    """count (a traced step index) is a multiple of `of` -- the remainder by a floor divide."""
    return count - (count // of) * of == 0


def _kernel(x_gmem, w_gmem, xs_gmem, ws_gmem, out_gmem, *, stages: int, blocks: int,
            group_m: int, persistent: bool, k_parts: int, spread: bool, park: bool,
            park_cols: int):
    m, k = x_gmem.shape
    n = w_gmem.shape[0]
    m_tiles, n_tiles = m // BLOCK, n // BLOCK
    step_k = blocks * BLOCK  # K per pipeline step
    # spread: each K part is a CTA's whole K range (its own float32 slab of out_gmem)
    k_range = k // k_parts if spread else k
    steps = k_range // step_k
    folded = k_parts > 1 and not spread  # the CTA adds K parts
    part_blocks = k // BLOCK // k_parts  # K-blocks per part
    fp8_tiles = swizzled(E4M3)

    def body(idx, x_smem, w_smem, xs_smem, ws_smem, carry, park_smem=None):
        wg = lax.axis_index("wg")
        rows = pl.ds(wg * WG_ROWS, WG_ROWS)

        def scaled(part, j):  # block j's part times its row scales, times its weight scale
            xs = plgpu.load(xs_smem.at[j, rows], layout=plgpu.Layout.WGMMA.reduce(1))
            # The tile's 128 columns are one weight block: its scale is one number, read by a
            # broadcast load rather than as 128 column values (32 loads a thread a K-block) --
            # the same products, 2-6% faster at M >= 256 (H100, session 50).
            return part * lax.broadcast_in_dim(xs, part.shape, [0]) * ws_smem[j, 0]

        def run_blocks(total, *accs, after=None):  # a fresh accumulator per K-block
            for j, acc in enumerate(accs):  # all wgmmas issued first (asynchronous)
                cols = pl.ds(j * BLOCK, BLOCK)
                plgpu.wgmma(acc, x_smem.at[rows, cols], w_smem.at[:, cols].transpose((1, 0)))
            for j, acc in enumerate(accs):  # promote block j while later ones still run
                part = scaled(plgpu.wgmma_accumulator_load(acc, wait_n=len(accs) - 1 - j), j)
                # (park: the carry is (running total, the finished parts' kept columns))
                total = (total[0] + part, total[1]) if park else total + part
                if after is not None:
                    total = after(j, total)
            return total

        def step(total, after=None):
            return pl.run_scoped(functools.partial(run_blocks, total, after=after),
                                 *[plgpu.ACC((WG_ROWS, BLOCK), F32)] * blocks)

        if not folded:  # one K part here: one running total
            return step(carry)
        if park:  # after a part's last K-block its total joins the finished parts' sum: in
            # the park (park_context) its first park_cols columns, in registers the rest
            def close(run, kept):
                park_add(park_smem.at[wg, :, pl.ds(0, park_cols)], run)
                return zero_total(run.shape), None if kept is None else kept + run[:, park_cols:]

            def after(j, carry):
                if part_blocks % blocks == 0 and j != blocks - 1:
                    return carry  # (parts of whole steps close after a step's last block)
                done = idx[0] * blocks + j + 1  # K-blocks promoted
                return lax.cond(_multiple(done, part_blocks), close, lambda r, k: (r, k), *carry)
            return step(carry, after)
        ends = _multiple(idx[0] + 1, part_blocks // blocks)  # (steps done)
        run, grand = carry  # this part's running total; the finished parts' sum
        run = step(run)
        zero = zero_total(run.shape)
        return lax.cond(ends, lambda r, g: (zero, g + r), lambda r, g: (r, g), run, grand)

    def pipeline(body_fn, context, first=0):  # K-steps from `first` on (a spread part's)
        return warpgroup_pipeline(body_fn, context, steps=steps, stages=stages, in_specs=[
            plgpu.BlockSpec((BLOCK, step_k), lambda i: (0, first + i), transforms=fp8_tiles),
            plgpu.BlockSpec((BLOCK, step_k), lambda i: (0, first + i), transforms=fp8_tiles),
            plgpu.BlockSpec((blocks, BLOCK), lambda i: (first + i, 0)),
            plgpu.BlockSpec((blocks, TMA_ROW_F32), lambda i: (first + i, 0)),
        ])

    unused = lambda *_, **__: None  # the allocations depend on block shapes only
    tiles = m_tiles * n_tiles
    ranges = k_parts if spread else 1

    # park: the output staged 16 KB at a time (64 bf16 or 32 float32 columns), so the float32
    # park (64 KB) fits -- a whole 128-column float32 staging did not (233536 bytes of 232448,
    # H100, session 49); swizzled as the staging is, so its rows' loads and stores spread over
    # the banks
    staged = PARK_STAGING_BYTES // (2 * WG_ROWS * out_gmem.dtype.itemsize) if park else BLOCK
    scratch = dict(park_smem=plgpu.SMEM((2, WG_ROWS, BLOCK), F32,
                                        transforms=swizzled(F32))) if park else {}

    def park_context(run, *, out_smem, park_smem, out_gmem, row_slice, col_slice):
        # the parts' sum from zero in the park (and the kept columns' in registers); the last
        # part's close leaves the total there (the kept columns joining it at the end)
        slot = park_smem.at[lax.axis_index("wg")]
        slot[...] = zero_total((WG_ROWS, BLOCK))
        kept = zero_total((WG_ROWS, BLOCK - park_cols)) if park_cols < BLOCK else None
        _, kept = run((zero_total((WG_ROWS, BLOCK)), kept))
        if kept is not None:  # (each thread reads back the elements it wrote: no barrier)
            slot.at[:, pl.ds(park_cols, BLOCK - park_cols)][...] = kept
        store_wg_rows(plgpu.load(slot, layout=plgpu.Layout.WGMMA), out_smem=out_smem,
                      out_gmem=out_gmem, row_slice=row_slice, col_slice=col_slice)

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(unused, unused).get_allocations(x_gmem, w_gmem, xs_gmem, ws_gmem),
        out_smem=plgpu.SMEM((2, WG_ROWS, staged), out_gmem.dtype,
                            transforms=swizzled(out_gmem.dtype, staged)),
        **scratch,
        collective_axes="wg",
    )
    def _scope(allocs, out_smem, park_smem=None):
        def run_tile(t):
            tile, part = (t % tiles, t // tiles) if spread else (t, 0)
            m_idx, n_idx = tile_index(tile, m_tiles, n_tiles, group_m)
            m_slice = pl.ds(m_idx * BLOCK, BLOCK)
            n_slice = pl.ds(n_idx * BLOCK, BLOCK)
            # (spread: part p's slab is out_gmem's rows p * M ...; its K range starts at step
            # p * steps -- offsets in the TMA coordinates, not in sliced K views)
            rows = pl.ds(part * m + m_idx * BLOCK, BLOCK)
            if park:
                context = functools.partial(park_context, out_smem=out_smem,
                                            park_smem=park_smem, out_gmem=out_gmem,
                                            row_slice=rows, col_slice=n_slice)
                body_fn = functools.partial(body, park_smem=park_smem)
            else:
                context = functools.partial(store_rows, out_smem=out_smem, out_gmem=out_gmem,
                                            row_slice=rows, col_slice=n_slice,
                                            parts=folded)
                body_fn = body
            pipeline(body_fn, context, part * steps)(
                x_gmem.at[m_slice], w_gmem.at[n_slice], xs_gmem.at[:, m_slice],
                ws_gmem.at[:, pl.ds(n_idx * TMA_ROW_F32, TMA_ROW_F32)], allocations=allocs)

        walk_tiles(run_tile, tiles * ranges, persistent)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def launch_params(k: int) -> dict:
    """The dispatcher's settings for a K: two K-blocks per pipeline step overlap one block's
    promotion with the next block's wgmma (session 5: +2-13% over one block per step); 16 tile
    rows per launch group share their operands in L2 (+0-15% over row-by-row order); one
    persistent CTA per SM (session 6: +0-6% over one CTA per tile, 4 shapes, M=256..16384)."""
    return dict(blocks_per_step=2 if k % (2 * BLOCK) == 0 else 1, group_m=16,
                programs=num_sms())


def fp8_block_matmul_mgpu(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array,
                          *, out_dtype=BF16, stages: int | None = None,
                          blocks_per_step: int = 1, group_m: int = 1,
                          programs: int | None = None, k_parts: int = 1, spread: bool = False,
                          park: bool = False, park_cols: int = BLOCK,
                          interpret: bool | plgpu.InterpretGPUParams = False) -> jax.Array:
    """y (M, N) = block-scaled xq (M, K) e4m3 [x_scale (M, K/128)] @ w (N, K) e4m3
    [w_scale (N/128, K/128)]^T in out_dtype; see the module docstring for the numerics.
    blocks_per_step: 128-wide K-blocks per pipeline step (1 or 2). With 2, both blocks' wgmmas
    are issued before the first is promoted, so a promotion overlaps the next block's MMAs
    (one more 64x128 f32 accumulator per warpgroup); K must be a multiple of 256.
    stages: pipeline steps in flight (shared memory: 32 KB per 128-wide K-block; the 227 KB
    of an H100/H200 block hold 6 blocks); None: 4 K-blocks' worth (4 steps, or 2 of 2 blocks).
    group_m: output tile rows launched together (1: row by row; see mgpu_common.tile_index).
    programs: None launches one CTA per 128 x 128 output tile; an int launches that many
    persistent CTAs (e.g. the SM count), each looping over every programs-th tile.
    k_parts: K in this many equal parts (of whole pipeline steps, but with park of whole
    K-blocks: K = 7168's 8 parts of 7 at two K-blocks a step), each part's total from zero,
    the parts' totals added in K order (deterministic mode's order: fp8_block_det). spread:
    the parts run as CTAs of their own (tiles x k_parts of them), each writing its part's
    float32 total to a slab of its own, which XLA adds in K order (sum_device_splits: inside
    common.k_shards every device's) before the rounding -- the same sums as the CTA's fold.
    park (folded parts): the finished parts' sum waits in shared memory (64 KB; the output is
    then staged 64 columns at a time) rather than in registers, where with two K-blocks a
    step it spilled (H100, session 49: 228 us against one block a step's 208 at 4096^3); a
    part's close (the park += its total) follows its last K-block, inside a step or at its end.
    park_cols: the park's columns (a multiple of 32, up to 128); the others' sum stays in
    registers, so a close moves park_cols / 128 of the shared-memory bytes (with two K-blocks
    a step: 64 x (128 - park_cols) / 128 more registers a thread).
    interpret: run Mosaic GPU's interpreter (CPU); or its parameters (e.g. race detection)."""
    if blocks_per_step not in (1, 2):
        raise ValueError(f"blocks_per_step must be 1 or 2, got {blocks_per_step}")
    if not (isinstance(group_m, int) and group_m >= 1):
        raise ValueError(f"group_m must be a positive int, got {group_m!r}")
    if programs is not None and not (isinstance(programs, int) and programs >= 1):
        raise ValueError(f"programs must be None or a positive int, got {programs!r}")
    stages = stages or 4 // blocks_per_step
    m, k = xq.shape
    n = w.shape[0]
    if xq.dtype != jnp.dtype(E4M3) or w.dtype != jnp.dtype(E4M3):
        raise ValueError(f"xq and w must be float8_e4m3fn, got {xq.dtype} and {w.dtype}")
    if w.shape != (n, k) or k % (BLOCK * blocks_per_step) or n % BLOCK:
        raise ValueError(f"w must be (N, K) with N a multiple of {BLOCK} and K of "
                         f"{BLOCK * blocks_per_step}; got w {tuple(w.shape)} for xq "
                         f"{tuple(xq.shape)}")
    if x_scale.shape != (m, k // BLOCK) or w_scale.shape != (n // BLOCK, k // BLOCK):
        raise ValueError(f"x_scale must be {(m, k // BLOCK)} and w_scale "
                         f"{(n // BLOCK, k // BLOCK)}, got {tuple(x_scale.shape)} and "
                         f"{tuple(w_scale.shape)}")
    # (park closes a part after any K-block; the others, after whole pipeline steps)
    units, unit = ((k // BLOCK, "K-blocks") if park else
                   (k // (BLOCK * blocks_per_step), f"pipeline steps of {blocks_per_step} "
                    "K-block(s)"))
    if not (isinstance(k_parts, int) and k_parts >= 1 and units % k_parts == 0):
        raise ValueError(f"k_parts must cut K={k}'s {units} {unit} into equal parts, got "
                         f"{k_parts!r}")
    if spread and current_k_shards() is None and k_parts == 1:
        raise ValueError("spread runs K parts as CTAs: it needs k_parts > 1")
    if not (isinstance(park_cols, int) and 0 < park_cols <= BLOCK
            and park_cols % PARK_CHUNK == 0):
        raise ValueError(f"park_cols must be a multiple of {PARK_CHUNK} in (0, {BLOCK}], got "
                         f"{park_cols!r}")
    if park and (spread or k_parts == 1):
        raise ValueError("park holds the sum of K parts folded in the CTA: it needs "
                         "k_parts > 1 and spread=False")
    xq, x_scale, mp = pad_x_tiles(xq, x_scale)  # (the padding rows sliced off below)
    ctas = mp // BLOCK * (n // BLOCK) * (k_parts if spread else 1)
    xs_rows = x_scale.astype(F32).T  # (K/128, M): one TMA row per K-block
    ws_tiles = block_scale_tiles(w_scale)  # (K/128, N/128 * 32)
    out = (jax.ShapeDtypeStruct((k_parts * mp, n), F32) if spread else
           jax.ShapeDtypeStruct((mp, n), jnp.dtype(out_dtype)))
    call = mgpu_kernel(
        functools.partial(_kernel, stages=stages, blocks=blocks_per_step, group_m=group_m,
                          persistent=programs is not None, k_parts=k_parts, spread=spread,
                          park=park, park_cols=park_cols),
        out, min(programs or ctas, ctas), interpret)
    y = call(xq, w, xs_rows, ws_tiles)
    if spread:  # (inside k_shards: every device's slabs, in K order)
        y = sum_device_splits(y, k_parts, mp, n).astype(out_dtype)
    return y[:m] if mp != m else y
