"""FP8 weight-only (W8A16: e4m3 weights with 128x128 block, per-channel or per-tensor scales,
bf16/f16 activations) on Mosaic GPU -- the default-mode path of `pallas_fp8_w8a16` on sm_90 for
16-bit activations (pallas_kernels.fp8_paths): at every M where the dense path does not run
(whole-K scales take it at M = 2-8, at mid M where this launch's waves would run part-empty, and
from M=1024); in deterministic mode at every M. H200, 11 shapes (NOTES.md,
sessions 6-10): fp8_block_a16 1.73x bf16 at M=1 and 1.64x at M=16 (geomean; 1.21-1.97x,
session 10), 0.73-0.77x at M=256 to 1024, where the Triton kernel ran 0.83x / 0.81x and
0.45x / 0.42x.

Why not Triton: its W8A16 block kernel ran at 0.36-0.48x bf16 from M=1024 (session-5 grid):
its e4m3 -> bf16 conversion and a scale multiply per 128-K step sit between MMAs that nothing
else overlaps; at decode its loads are not pipelined. Here, as in fp8_block_mgpu, a TMA
warpgroup streams the tiles while two compute warpgroups convert and multiply; the weights
are wgmma's A operand straight from registers (exact conversion: every e4m3 value is a bf16),
so no converted copy goes back to shared memory -- the mixed-type layout of JAX's
hopper_mixed_type_matmul_mgpu example.

Swap-AB: the weight rows are the MMA's M side, so the kernel computes y^T (N, M) = W (N, K) @
x^T; launches whose CTAs finish one output tile each write y itself (the epilogue stores each
tile through a transposed view of its staging slot, `out_t`), the others float32 slabs of y^T
that the caller sums and transposes. Numerics per output (m, n), K-block kb of 128: part = sum_k
bf16(w[n, k]) * x[m, k] (one wgmma chain from zero, float32 accumulation), then
total += part * w_scale[n // 128, kb] in float32, in K order. With k_splits ranges of K, each
range's total starts from zero and the ranges' totals are added in K order afterwards; with
stream-K (`programs`) the ranges are the pieces of a tile that each CTA's equal run of steps
covers (Stream), added the same way.

Layout: w (N, K) e4m3, N and K multiples of 128 (block formats store them padded); x (M, K)
bf16 or f16 (its last tile of block_m rows read past its end as zeros by TMA); scales read
as stored, each CTA loading its tile's once (_scale_operand; block scales of a K TMA cannot
move in one row go as one float32 row per K-block, (K/128, N), beside the tiles). Per-channel
and per-tensor scales multiply each K-block's part by the row's one scale, as block scales do.

NVFP4, MXFP4 and MXFP8 (group_a16_mgpu) run this kernel too: codes (int4 for e2m1) and their
group scales as stored per step (scales="groups", group_fmt), decoded in registers by
mgpu_group_decode; the group scales are in the weights, so the K-blocks' parts are added
unscaled.

Deterministic mode runs this kernel at every M too (det_params: the K order a function of K
alone), never the Triton kernels for some M and this one for others: their bits differ even
in the same K order (benchmarks/probe_det_mgpu.py on the H200: 33-46% of outputs equal).
Its decode streams the tiles' whole K parts (Stream with parts; session 11: det/default
1.08x at M=1, 1.10x at M=16 geomean, from 1.17x / 1.15x). Since session 15 weights of up to
DET_GROUPS_MAX_N rows sum the parts as two groups (k_groups), so that deterministic mode can
run default mode's two K ranges where those fill the SMs. Since session 16 its in-CTA parts at
128-row x tiles multiply each K-block in two halves (wgmma_halves: the same sums), which keeps
their three accumulators from spilling (halves_pay). Since session 17 from PREDECODE_MIN_M rows
the weights are decoded to bf16 by XLA first (predecode), and CTAs holding both groups store
the first's sum (groups_sum); since session 18, up to RELOAD_MAX_K, they read it back and
write the rounded output themselves ("reload").
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dtypes  # itemsize_bits: the public dtype API has no sub-byte sizes
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .common import cdiv, current_det_rows, current_k_shards, device_ranges
from .fp8_heuristics import det_k_parts, num_sms
from .fp8_widen import widen_e4m3
from .launch import sum_device_splits, writes_partials
from .mgpu_group_decode import FORMATS as GROUP_FORMATS, decode as decode_groups
from .mgpu_group_decode import decode_jnp as decode_groups_jnp, decode_words
from .mgpu_relabel import permute_cols, permute_k, relabel
from .mgpu_common import (BLOCK, COMPUTE_WGS, SMEM_BYTES, WG_ROWS, RowFinish, div_full,
                          finish_rows, mgpu_kernel, store_piece, store_rows, store_wg_rows,
                          swizzled, tile_index, warpgroup_pipeline, weight_scale_rows, zero_total)

__all__ = ["fp8_block_a16_matmul_mgpu", "check_launch", "decode_params", "range_params", "det_params",
           "det_stream_params", "det_groups", "DET_GROUPS_MAX_N", "holds_both_groups",
           "one_left_fold", "group_pieces", "halves_pay", "HALVES_MIN_X_TILE",
           "launch_params", "check_predecode", "PREDECODE_MIN_M", "RELOAD_MAX_K",
           "stream_params", "stream_programs", "blocks_per_step",
           "with_two_block_steps", "step_unit", "stream_slabs", "Stream",
           "X_TILES", "DET_MIN_X_TILE", "DET_GPU_MIN_X_TILE"]

F32, E4M3 = jnp.float32, jnp.float8_e4m3fn
HALF = BLOCK // 2  # wgmma_halves: K columns per wgmma batch
X_TILES = (8, 16, 32, 64, 128)  # x rows per CTA tile: wgmma's N (multiples of 8)
X_ROWS_TILING = 8  # TMA row tiling of x in shared memory (see _launch)
# K ranges only up to here: their float32 partials (ranges x M x N) stay small against the weight
SPLIT_MAX_M = 256
# Deterministic mode's narrowest x tile: in the CPU interpreter a row's bits differ between
# 8-row tiles and wider ones (XLA:CPU's dot takes another route for N=8), so the schedule that
# CI checks bitwise starts at 16 rows there. On the GPU wgmma gives a row the same bits at
# N=8 as wider (test_gpu_x_tile_width_does_not_change_a_row), and 8 rows halve M=1's slabs.
DET_MIN_X_TILE, DET_GPU_MIN_X_TILE = 16, 8
TWO_BLOCK_MAX_X_TILE = 16  # launch_params: two K-blocks per step up to this x tile (measured)
# Group scales per pipeline step (scales="groups"): each K-block's (8 for NVFP4, 4 for MX),
# for at least the K-blocks whose bytes make the 16 a TMA box row needs; with fewer K-blocks a
# step, consecutive steps share a tile
def group_tile_blocks(blocks: int, scale_bytes: int) -> int:
    return max(blocks, 16 // scale_bytes)
# how a warpgroup reads its weight tile (see a_load; "words": group_a16_mgpu's e2m1 codes)
A_LOADS = ("wgmma", "relabel_4x")
GROUP_A_LOADS = ("wgmma", "words")
PARTS_SUMS = ("cond", "store")  # how in-CTA K parts are closed (see parts_sum)
GROUPS_SUMS = ("park", "store", "reload")  # how a CTA's two groups of parts meet (groups_sum)
# Four compute warpgroups (256-row weight tiles) hold x tiles up to this many rows: wider ones
# need more registers than the 104 per thread four warpgroups get (mgpu_common._register_budget)
FOUR_WG_MAX_X_TILE = 32


def holds_both_groups(k_groups: int, k_splits: int, k_parts: int, parts_sum: str,
                      streamed: bool) -> bool:
    """Whether a launch's CTAs each hold both groups of a two-group order in their in-CTA parts
    (k_splits=1, parts folded): the first group's float32 sum then waits in shared memory for
    the second's, or goes to a slab of its own (groups_sum; _kernel), and the kernel writes
    float32 (_launch)."""
    return k_groups > k_splits and k_parts > 1 and parts_sum == "cond" and not streamed


def _kernel(w_gmem, x_gmem, ws_gmem, post_gmem, out_gmem, first_gmem=None, *, stages: int,
            group_m: int, a_in_registers: bool, block_m: int, k_splits: int, k_parts: int,
            blocks: int, wgs: int, a_load: str, parts_sum: str, scales: str,
            stream: "Stream | None", group_fmt: str | None = None, k_groups: int = 1,
            group_slabs: int = 0, wgmma_halves: bool = False, first_sum: str | None = None,
            out_t: bool = False, row_post: tuple[float, str] | None = None):
    # row_post: (factor, op) of a RowFinish the CTAs apply to their float32 totals before
    # rounding them (post_gmem: its column values, (N,) float32); None: post_gmem is not read
    n, k = w_gmem.shape
    tile_rows = wgs * WG_ROWS  # weight rows per CTA tile
    # x's rows in whole tiles (x itself is not padded: see _launch); out_t: the kernel writes
    # y (1, M, N) itself, transposed in its epilogue, instead of y^T (slabs, N, M)
    m = out_gmem.shape[1 if out_t else 2]
    # pipeline steps per split, or per streamed CTA
    steps = stream.steps if stream else k // BLOCK // k_splits // blocks
    per_part = steps // k_parts
    step_k = blocks * BLOCK
    x_tiles = swizzled(x_gmem.dtype)
    # wgmma_halves reads half a K-block's codes at a time: whole swizzle atoms of half the width
    wgmma_halves = wgmma_halves and a_in_registers
    # converted weights stored to shared memory for wgmma (the interpreter); a_load="smem"'s
    # decoded weights are wgmma's A operand where the pipeline put them
    a_copy = not a_in_registers and a_load != "smem"
    w_tiles = swizzled(w_gmem.dtype, HALF if wgmma_halves else BLOCK)
    if scales == "groups":
        fmt = GROUP_FORMATS[group_fmt]
        gb = fmt.scale_bytes  # scale bytes per K-block and row
        g_tile = group_tile_blocks(blocks, gb)  # K-blocks per scale tile

    # first_sum (_launch): where a CTA holding both groups of parts keeps the first's sum --
    # in shared memory (park_smem) for the second's ("park"), in a float32 slab of its own
    # beside the second's, added after ("store"), or in first_gmem, read back by the CTA to
    # add to the second's ("reload", _scope); None: no CTA holds both
    both = first_sum is not None
    parked, stored_groups, reloaded = (first_sum == v for v in ("park", "store", "reload"))
    staged = store_cols(block_m, first_sum)  # output staging columns

    def body(idx, w_smem, x_smem, *refs, a_smem, ws_tile, first, store_part, store_first,
             park_smem):
        # refs: (ws_smem, carry) with scales="rows" (a K-block's scale row per step), else
        # (carry,) with this tile's scales in ws_tile, loaded once (_scope; "tensor": the value)
        ws = ((refs[0], None, 0) if scales == "rows" else
              (refs[0], (first + idx[0]) * blocks, 0) if scales == "groups" else
              (ws_tile, (first + idx[0]) * blocks, 0))
        carry = refs[-1]
        if k_parts == 1:
            return one_block(w_smem, x_smem, ws, carry, a_smem)
        i = idx[0] + 1
        ends = i - (i // per_part) * per_part == 0  # (lax.rem: see _scope)
        if parts_sum == "store":  # each part to its own output slab, then from zero again
            run = one_block(w_smem, x_smem, ws, carry, a_smem)
            pl.when(ends)(lambda: store_part(run, idx[0] // per_part))
            return jnp.where(lax.broadcast_in_dim(ends, run.shape, ()), zero_total(run.shape),
                             run)
        run, grand = carry  # this part's running total; the finished parts' sum
        run = one_block(w_smem, x_smem, ws, run, a_smem)
        zero = zero_total(run.shape)
        if not both:
            def close(r, g):
                return zero, g + r
        else:  # the first group's last part: its sum parked (or stored: store_first), the
            # second from zero
            mid = idx[0] // per_part == k_parts // 2 - 1

            def close(r, g):
                g = g + r

                @pl.when(mid)
                def _():
                    if parked:
                        park_smem[lax.axis_index("wg")] = g
                    else:
                        store_first(g)
                return zero, jnp.where(lax.broadcast_in_dim(mid, g.shape, ()), zero, g)
        return lax.cond(ends, close, lambda r, g: (r, g), run, grand)

    def one_block(w_smem, x_smem, ws, total, a_smem, closes=None):
        # one step: `blocks` K-blocks added to total in K order. closes: {j: fn} for
        # K parts that may end inside the step (streamed parts, below): total is then
        # a tuple (run, ...), each block added to run, and fn(total) after block j
        wg = lax.axis_index("wg")
        rows = pl.ds(wg * WG_ROWS, WG_ROWS)
        # k_block: the step's first K-block (scales="block"); held: which of the tiles whose
        # scales the CTA holds (a streamed CTA holds several, _scope)
        ws_smem, k_block, held = ws

        def scale(j, shape):  # K-block j of the step: its scale for this warpgroup's rows
            if scales == "tensor":  # one value, loaded once (_scope)
                return lax.broadcast_in_dim(ws_smem, shape, ())
            first = held * tile_rows + wg * WG_ROWS  # the warpgroup's first row of those held
            if scales == "block":  # one value per 128 weight rows
                v = ws_smem[first // BLOCK, k_block + j]
                return lax.broadcast_in_dim(v, shape, ())
            at = (ws_smem.at[j, rows] if scales == "rows" else  # channel: (N/128, 128) rows
                  ws_smem.at[first // BLOCK, pl.ds(first - first // BLOCK * BLOCK, WG_ROWS)])
            v = plgpu.load(at, layout=plgpu.Layout.WGMMA.reduce(1))
            return lax.broadcast_in_dim(v, shape, [0])

        def decoded(cols, off, half=None):  # codes of `cols` (a K-block or, with `half`,
            # one of its halves) and the K-block's group scales at `off`, decoded in registers
            sc = ws_smem.at[rows, pl.ds(off, gb)]
            if a_load == "words":  # 8 codes a load, K permuted (x alike: _launch)
                return decode_words(plgpu.load(w_smem.at[rows, cols],
                                               layout=plgpu.Layout.WGMMA_UPCAST_4X), sc, fmt,
                                    half)
            if fmt.elem == "e2m1":
                return decode_groups(plgpu.load(w_smem.at[rows, cols],
                                                layout=plgpu.Layout.WGMMA), sc, fmt, half)
            # e4m3 converted as below, then times its scales
            return decode_groups(w_smem[rows, cols].astype(F32).astype(x_gmem.dtype), sc, fmt,
                                 half)

        def run_blocks(*accs):  # a fresh accumulator per K-block: its sum alone
            for j, acc in enumerate(accs):  # every block's wgmma issued first (asynchronous)
                cols = pl.ds(j * BLOCK, BLOCK)
                # (a scale tile may hold several steps' K-blocks: group_tile_blocks)
                off = (gb * (j if blocks == g_tile else (k_block + j) % g_tile)
                       if scales == "groups" else None)
                # exact; Mosaic GPU has no direct e4m3 -> bf16 conversion with this ptxas (the
                # int4 weights of benchmarks/probe_w4_mgpu.py convert directly). Not the
                # limiter: one PTX cvt per pair plus integer ops instead ran 0-13% slower
                # (session 8, NOTES.md)
                if wgmma_halves:  # (one K-block a step, registers: checked)
                    for h in range(2):  # each half's wgmmas done before the next is converted
                        hc = pl.ds(j * BLOCK + h * HALF, HALF)
                        w = (decoded(hc, off, h) if scales == "groups" else
                             w_smem[rows, hc].astype(F32).astype(x_gmem.dtype))
                        plgpu.wgmma(acc, w, x_smem.at[:, hc].transpose((1, 0)))
                        if h == 0:
                            plgpu.wgmma_wait(0)
                    continue
                if scales == "groups":  # codes and their K-block's group scales
                    if not a_in_registers:  # the interpreter: the same values by jnp
                        w = decode_groups_jnp(w_smem[rows, cols], ws_smem[rows, pl.ds(off, gb)],
                                              fmt)
                        if a_load == "words":  # the columns as decode_words hands them over
                            w = permute_cols(w, "halves")
                    else:
                        w = decoded(cols, off)
                elif a_load == "smem":  # decoded bf16 weights: wgmma's A from shared memory
                    w = w_smem.at[rows, cols]
                elif a_load == "wgmma":  # pairs of 8-bit values: 32 16-bit loads per thread
                    w = w_smem[rows, cols]
                else:  # relabel_4x: 8 64-bit loads per thread, K permuted (mgpu_relabel)
                    w = relabel(plgpu.load(w_smem.at[rows, cols],
                                           layout=plgpu.Layout.WGMMA_UPCAST_4X))
                if scales != "groups" and a_load != "smem":
                    w = (w.astype(F32) if w.dtype == E4M3 else w).astype(x_gmem.dtype)
                if a_copy:  # (the interpreter's wgmma reads A from shared memory)
                    a_smem[wg * blocks + j] = w
                    plgpu.commit_smem()
                    w = a_smem.at[wg * blocks + j]
                plgpu.wgmma(acc, w, x_smem.at[:, cols].transpose((1, 0)))
            t = total
            for j, acc in enumerate(accs):  # in K order: block j while later ones still run
                part = plgpu.wgmma_accumulator_load(acc, wait_n=len(accs) - 1 - j)
                # (group scales are in the weights already; "none": decoded weights)
                part = part if scales in ("groups", "none") else part * scale(j, part.shape)
                if closes is None:
                    t = t + part
                    continue
                t = (t[0] + part, *t[1:])
                if j in closes:
                    t = closes[j](t)
            return t

        return pl.run_scoped(run_blocks, *[plgpu.ACC((WG_ROWS, block_m), F32)] * blocks)

    def pipeline(body_fn, context, where=lambda i: (0, i)):
        # where(i): step i's (weight tile of the weight operand, K-step) -- a split's own tile
        # from its first K-step on, or a streamed CTA's way through its share (streamed)
        return warpgroup_pipeline(body_fn, context, steps=steps, stages=stages, compute_wgs=wgs,
                                  in_specs=[
            plgpu.BlockSpec((tile_rows, step_k), where, transforms=w_tiles),
            plgpu.BlockSpec((block_m, step_k), lambda i: (0, where(i)[1]), transforms=x_tiles),
        ] + ([plgpu.BlockSpec((blocks, tile_rows), lambda i: where(i)[::-1])]
             if scales == "rows" else
             [plgpu.BlockSpec((tile_rows, g_tile * gb),
                              lambda i: (where(i)[0], where(i)[1] * blocks // g_tile))]
             if scales == "groups" else []))

    def held_scales(lo, held, ws_tile, ws_bar):
        """The scales of weight tiles lo .. lo + held - 1 as one_block reads them, loaded once
        per CTA: "tensor" the value (a (1, 1) is too small for TMA: read from global memory);
        "block" / "channel" their rows of 128 weight rows' scales (_scale_operand), by TMA
        from the TMA warpgroup; "rows" none (they go with the pipeline's steps)."""
        if scales == "tensor":
            return ws_gmem[0, 0]
        if scales in ("block", "channel"):
            per_tile = tile_rows // BLOCK

            @pl.when(lax.axis_index("wg") == 0)
            def _():
                plgpu.copy_gmem_to_smem(ws_gmem.at[pl.ds(lo * per_tile, held * per_tile)],
                                        ws_tile, ws_bar)
            plgpu.barrier_wait(ws_bar)
        return ws_tile

    def streamed(allocs, out_smem, a_smem, ws_tile, ws_bar):
        # stream-K: CTA c runs steps c*L .. c*L + L - 1 of the tile-major sequence of (weight
        # tile, K-step); a tile's steps may span CTAs, each storing its piece of the tile's sum
        # to slab (c - the tile's first CTA) when the piece ends (summed in K order: _sum_pieces)
        # -- or, with K parts (deterministic mode), each whole part to slab (part), summed in
        # part order as K ranges are
        tile_steps, c = k // step_k, lax.axis_index("tile")
        first = c * steps

        def where(i):
            g = first + i
            tile = g // tile_steps
            return tile, g - tile * tile_steps

        lo = jnp.minimum(first // tile_steps, n // tile_rows - stream.held)  # first tile held
        ws_tile = held_scales(lo, stream.held, ws_tile, ws_bar)
        ws_refs = (ws_gmem,) if scales in ("rows", "groups") else ()

        fold = stream.parts > 1 and parts_sum == "cond"
        # K parts may end inside a step (a part's K-blocks need not be a multiple of `blocks`:
        # K=7168's parts of 7): after block j of a step wherever j + 1 is a multiple of
        # gcd(blocks, part_blocks); each closes there, the next part's sum starting from zero
        # at the step's next block -- the same adds, in the same order, as one block a step
        part_blocks = tile_steps * blocks // stream.parts
        unit = math.gcd(blocks, part_blocks)
        part_ends = [j for j in range(blocks) if (j + 1) % unit == 0]

        def store(tile, r, slab):  # a piece (part) ends: to its slab
            store_wg_rows(r, out_smem=out_smem, out_gmem=out_gmem.at[slab],
                          row_slice=pl.ds(tile * tile_rows, tile_rows),
                          col_slice=pl.ds(0, block_m))

        def close_part(tile, k_step, j, total):  # after block j of the step at k_step
            b = k_step * blocks + j
            part = b // part_blocks
            ends = b - part * part_blocks == part_blocks - 1
            if fold:  # to the tile's first CTA's sum, or stored (fold_part)
                return lax.cond(ends, functools.partial(fold_part, tile, part,
                                                        functools.partial(store, tile)),
                                lambda r, g: (r, g), *total)
            # K parts: a CTA runs whole ones, each to slab (its part)
            return (lax.cond(ends, lambda r: (store(tile, r, part), zero_total(r.shape))[1],
                             lambda r: r, total[0]),)

        def step(idx, w_smem, x_smem, *refs):
            tile, k_step = where(idx[0])
            ws = ((refs[0], None, 0) if scales == "rows" else
                  (refs[0], k_step * blocks, 0) if scales == "groups" else
                  (ws_tile, k_step * blocks, tile - lo))
            carry = refs[-1]
            if stream.parts > 1:
                closes = {j: functools.partial(close_part, tile, k_step, j) for j in part_ends}
                run = one_block(w_smem, x_smem, ws, tuple(carry) if fold else (carry,),
                                a_smem, closes)
                return run if fold else run[0]
            run = one_block(w_smem, x_smem, ws, carry, a_smem)
            # pieces: to slab (this CTA - the tile's first)
            ends = (k_step == tile_steps - 1) | (idx[0] == steps - 1)
            # stored, and the next piece from zero (a select over the accumulator every step
            # instead: 4-12% slower with 64-row x tiles, equal with 8-16, session 10)
            return lax.cond(ends, lambda r: (store(tile, r, c - tile * tile_steps // steps),
                                             zero_total(r.shape))[1], lambda r: r, run)

        def fold_part(tile, part, store, run, grand):
            # parts_sum="cond": the CTA that holds a group's first part (k_groups groups of a
            # tile's parts, each its own left fold; one group: the tile) adds its parts of the
            # group to their sum in registers and stores that prefix once, to the group's
            # slab 0; the group's later parts (other CTAs) go to its slabs 1.. in order
            zero = zero_total(run.shape)
            gp = stream.parts // k_groups  # parts per group
            grp = part // gp
            vt, vpart = tile * k_groups + grp, part - grp * gp  # the group as a tile of its own
            first_c = vt * gp // stream.run_parts
            prefix = jnp.minimum(gp, (first_c + 1) * stream.run_parts - vt * gp)
            base = grp * group_slabs

            def in_prefix(r, g):
                g = g + r
                return lax.cond(vpart == prefix - 1, lambda g: (store(g, base), zero)[1],
                                lambda g: g, g)

            def later(r, g):
                store(r, base + 1 + vpart - prefix)
                return g
            return zero, lax.cond(c == first_c, in_prefix, later, run, grand)

        def context(run):
            zero = zero_total(out_smem.shape[1:])
            run((zero, zero) if fold else zero)
        pipeline(step, context, where)(w_gmem, x_gmem.at[pl.ds(0, block_m)], *ws_refs,
                                       allocations=allocs)

    unused = lambda *_, **__: None  # the allocations depend on block shapes only
    scratch = {} if not a_copy else dict(
        a_smem=plgpu.SMEM((wgs * blocks, WG_ROWS, BLOCK), x_gmem.dtype, transforms=x_tiles))
    if scales in ("block", "channel"):
        scratch.update(ws_tile=plgpu.SMEM(_tile_scales(scales, tile_rows, k,
                                                       stream.held if stream else 1), F32),
                       ws_bar=plgpu.Barrier(num_arrivals=1))
    pipeline_refs = (w_gmem, x_gmem) + ((ws_gmem,) if scales in ("rows", "groups") else ())

    if reloaded:  # the first group's float32 sum comes back through the staging buffer;
        # narrower outputs are staged in the first half of each warpgroup's slot, aliased
        staging = plgpu.SMEM((wgs, WG_ROWS, staged), F32, transforms=swizzled(F32, staged))
        if out_gmem.dtype != F32:  # (out_t: each slot's output transposed, as below)
            staging = plgpu.RefUnion(staging, plgpu.SMEM(
                (wgs, 4 // out_gmem.dtype.itemsize) + ((staged, WG_ROWS) if out_t else
                                                       (WG_ROWS, staged)), out_gmem.dtype,
                transforms=swizzled(out_gmem.dtype, WG_ROWS if out_t else staged)))
        scratch.update(reload_bar=plgpu.Barrier(num_arrivals=1, num_barriers=wgs))
    elif out_t:  # a slot holds its warpgroup's tile transposed: (x rows, 64 weight rows)
        staging = plgpu.SMEM((wgs, staged, WG_ROWS), out_gmem.dtype,
                             transforms=swizzled(out_gmem.dtype, WG_ROWS))
    else:
        staging = plgpu.SMEM((wgs, WG_ROWS, staged), out_gmem.dtype,
                             transforms=swizzled(out_gmem.dtype, staged))

    @functools.partial(
        pl.run_scoped,
        allocs=pipeline(unused, unused).get_allocations(*pipeline_refs),
        out_smem=staging, collective_axes="wg", **scratch,
    )
    def _scope(allocs, out_smem, a_smem=None, ws_tile=None, ws_bar=None, reload_bar=None):
        # parked: the first group's float32 sum waits in out_smem (the kernel then writes
        # float32: _launch) -- a buffer of its own would cost one of the three pipeline stages
        # at 128-row x tiles. (Both spill without wgmma_halves: NOTES.md sessions 15-16)
        # Reloaded: out_smem is the float32 staging, out_view the output's (the same bytes)
        park_smem = out_smem if parked else None
        out_view = out_smem  # where the output is staged
        if reloaded and out_gmem.dtype != F32:
            out_smem, out_view = out_smem[0], out_smem[1].at[:, 0]
        if stream is not None:
            return streamed(allocs, out_smem, a_smem, ws_tile, ws_bar)
        t = lax.axis_index("tile")
        tile = t // k_splits
        split = t - tile * k_splits  # (lax.rem here hangs Mosaic GPU's interpreter)
        # the weight tiles play tile_index's "m" role (output rows of y^T)
        n_idx, m_idx = tile_index(tile, n // tile_rows, m // block_m, group_m)
        n_slice = pl.ds(n_idx * tile_rows, tile_rows)
        m_slice = pl.ds(m_idx * block_m, block_m)
        ws_tile = held_scales(n_idx, 1, ws_tile, ws_bar)
        ws_refs = ((ws_gmem.at[:, n_slice],) if scales == "rows" else
                   (ws_gmem.at[n_slice],) if scales == "groups" else ())

        def post_rows():  # this warpgroup's column values (RowFinish) in the accumulator's
            # row layout, read from global memory once, at the epilogue
            first = n_slice.start + lax.axis_index("wg") * WG_ROWS
            return plgpu.load(post_gmem.at[pl.ds(first, WG_ROWS)],
                              layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)

        def finished(total, col):  # RowFinish in the CTA (none: as it is)
            if row_post is None:
                return total
            return finish_rows(total, lax.broadcast_in_dim(col, total.shape, [0]), *row_post,
                               divide=functools.partial(div_full, interpret=not a_in_registers))
        # output slabs per CTA (stored groups: k_splits is 1)
        slabs = k_parts if parts_sum == "store" and k_parts > 1 else 2 if stored_groups else 1

        def store_part(total, part):  # this warpgroup's rows of the tile to slab `part`
            store_wg_rows(total, out_smem=out_smem, out_gmem=out_gmem.at[split * slabs + part],
                          row_slice=n_slice, col_slice=m_slice)

        def store_first(total):  # the first group's sum (stored_groups: slab 0)
            if reloaded:
                store_wg_rows(total, out_smem=out_smem, out_gmem=first_gmem,
                              row_slice=n_slice, col_slice=m_slice)
            else:
                store_part(total, 0)

        if stored_groups:  # the first group's sum went to slab 0 (body), the second's to 1
            def context(run):
                zero = zero_total((WG_ROWS, block_m))  # (out_smem holds half the columns)
                store_part(run((zero, zero))[1], 1)
        elif reloaded:  # the first group's sum read back, piece by piece, and added
            def context(run):
                zero = zero_total((WG_ROWS, block_m))
                second = run((zero, zero))[1]
                col = post_rows() if row_post is not None else None
                wg = lax.axis_index("wg")
                rows = pl.ds(wg * WG_ROWS, WG_ROWS)
                for c in range(0, block_m, staged):
                    cols = pl.ds(m_slice.start + c, staged)
                    # first: the first group's slab written whole (not only read out); then the
                    # slot's last store read
                    plgpu.wait_smem_to_gmem(0, wait_read_only=c > 0)
                    plgpu.copy_gmem_to_smem(first_gmem.at[n_slice].at[rows, cols],
                                            out_smem.at[wg], reload_bar.at[wg])
                    plgpu.barrier_wait(reload_bar.at[wg])
                    # (park's order: first + second; then the row finish, if any)
                    total = finished(plgpu.load(out_smem.at[wg], layout=plgpu.Layout.WGMMA)
                                     + second[:, c:c + staged], col)
                    if out_view is not out_smem:  # every thread's read done: the narrower
                        plgpu.commit_smem()  # output overwrites the same bytes
                    store_piece(total, out_view.at[wg],  # (out_t: y's rows, not y^T's)
                                out_gmem.at[split].at[cols, n_slice].at[:, rows] if out_t else
                                out_gmem.at[split].at[n_slice].at[rows, cols], out_t)
        elif slabs > 1:  # every part stored as it ends (store_part)
            def context(run):
                run(zero_total(out_smem.shape[1:]))
        elif parked:  # the second group's sum, then the first's parked one added to it
            def context(run):
                zero = zero_total(out_smem.shape[1:])
                second = run((zero, zero))[1]
                first_sum = plgpu.load(park_smem.at[lax.axis_index("wg")],
                                       layout=plgpu.Layout.WGMMA)
                # (store_wg_rows waits for no store: none left the slot since the park)
                store_wg_rows(first_sum + second, out_smem=out_smem,
                              out_gmem=out_gmem.at[split], row_slice=n_slice,
                              col_slice=m_slice)
        else:
            context = functools.partial(store_rows, out_smem=out_smem,
                                        out_gmem=out_gmem.at[split], row_slice=n_slice,
                                        col_slice=m_slice, parts=k_parts > 1,
                                        transposed=out_t,
                                        finish=None if row_post is None else
                                        lambda total: finished(total, post_rows()))
        step_body = functools.partial(body, a_smem=a_smem, ws_tile=ws_tile, first=split * steps,
                                      store_part=store_part, store_first=store_first,
                                      park_smem=park_smem)
        # x's last tile may reach past its rows: TMA fills those with zeros
        pipeline(step_body, context, lambda i: (0, split * steps + i))(
            w_gmem.at[n_slice], x_gmem.at[m_slice], *ws_refs, allocations=allocs)

    plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def store_cols(block_m: int, first_sum: str | None) -> int:
    """Columns of a warpgroup's output staging buffer: stored (or reloaded) groups' float32
    sums go in halves of the x tile, so that at 128-row x tiles a third pipeline stage of
    predecoded bf16 tiles fits beside it (3 x 64 KB + 32 KB); else the whole tile at once."""
    halved = first_sum in ("store", "reload")
    return block_m // 2 if halved and block_m >= 16 else block_m


def first_sum_kept(groups_sum: str, k_groups: int, k_splits: int, k_parts: int,
                   parts_sum: str, streamed: bool) -> str | None:
    """Where a launch's CTAs keep the first group's sum: groups_sum where they hold both groups
    (holds_both_groups), else None (nothing to keep)."""
    both = holds_both_groups(k_groups, k_splits, k_parts, parts_sum, streamed)
    return groups_sum if both else None


def _x_tile(m: int) -> int:
    """The smallest x tile (X_TILES) holding m rows, 128 from 128 rows on."""
    return next(b for b in X_TILES if b >= min(m, BLOCK))


def wave_fill(ctas: int, sms: int) -> float:
    """The fraction of the SM slots of its waves (one CTA per SM at a time) that `ctas` fill."""
    return ctas / (cdiv(ctas, sms) * sms)


def range_params(m: int, n: int, k: int, sms: int, compute_wgs: int = 2) -> dict:
    """K ranges for small M (weight-streaming): the smallest x tile holding M's rows, and K cut
    into ranges (their results summed afterwards) so that the CTAs fill whole waves of SMs:
    the fewest ranges whose wave fill is within 0.2 of the best, each range at least eight
    K-blocks long. (Fitted on session 6's H200 sweeps, 26 cases of 10 shapes at M=1..256 with
    1/2/4/8 ranges: 1.01x the fastest choice on geomean, 1.26x at worst (4096x6144, M=256);
    filling every SM at any cost was 1.06x / 1.39x.) Deterministic mode's decode launch
    (det_params), and default mode's where stream-K does not apply (decode_params)."""
    block_m = _x_tile(m)
    ctas, k_blocks = n // (compute_wgs * WG_ROWS) * cdiv(m, block_m), k // BLOCK
    options = [s for s in (1, 2, 4, 8, 16) if k_blocks % s == 0 and k_blocks // s >= 8] or [1]
    fill = {s: wave_fill(ctas * s, sms) for s in options}
    best = max(fill.values())
    return dict(block_m=block_m, k_splits=min(s for s in options if fill[s] >= best - 0.2),
                compute_wgs=compute_wgs)


# Default mode's one K range past SPLIT_MAX_M rows runs (N / 128) x ceil(M / 128) CTAs, one per
# SM at a time, with no K ranges to fill its last wave: below the dense paths' M (fp8_paths,
# fp4_matmul) the paths that could take such an M ask whether those CTAs fill at least this
# fraction of their waves' SM slots, and go to the dense XLA GEMM where they do not. H200,
# session 19 (sweep_fp8.py --parts mid_m,mid_m_a16 and bench_fp4_mx.py --parts midm, 3-4
# shapes at M=512-1024, same runs): M=768 on N=4096 fills 0.73 (192 CTAs, two waves) -- dense
# 1.2-1.4x this kernel there for fp8 whole-K scales, 1.05-1.16x for the 4-bit formats; every
# case that filled >= 0.97 ran this kernel within 1% of dense or ahead (4-bit: 1.3-1.5x at
# M=512).
MID_M_MIN_FILL = 0.8


def prefill_fill(m: int, n: int, sms: int, compute_wgs: int = 2) -> float:
    """The fraction of its waves' SM slots that default mode's one K range fills at M rows."""
    return wave_fill(n // (compute_wgs * WG_ROWS) * cdiv(m, BLOCK), sms)


def mid_m_fills(m: int, n: int) -> bool:
    """Whether default mode's launch at M rows fills MID_M_MIN_FILL of its waves: always up to
    SPLIT_MAX_M (decode_params' K ranges or stream-K fill them), past it prefill_fill's."""
    return m <= SPLIT_MAX_M or prefill_fill(m, n, num_sms()) >= MID_M_MIN_FILL


def _range_ctas(params: dict, m: int, n: int) -> int:
    """The CTAs of range_params' launch."""
    return (n // (params["compute_wgs"] * WG_ROWS) * cdiv(m, params["block_m"])
            * params["k_splits"])


def blocks_per_step(block_m: int, part_blocks: int) -> int:
    """Two K-blocks per pipeline step with x tiles of up to TWO_BLOCK_MAX_X_TILE rows where
    every K part (or streamed step run) holds an even number of K-blocks, else one."""
    return 2 if block_m <= TWO_BLOCK_MAX_X_TILE and part_blocks % 2 == 0 else 1


def step_unit(p: dict, n: int, k: int) -> int:
    """The K-blocks that launch p's pipeline steps must divide: one K part's (K ranges,
    in-CTA parts, streamed pieces: a step never crosses a part); with streamed K parts, which
    may end inside a step, the gcd of a tile's K-blocks and each CTA's run."""
    kb = k // BLOCK
    if p.get("programs") is None or p.get("k_parts", 1) == 1:
        return kb // p.get("k_splits", 1) // p.get("k_parts", 1)
    tiles = n // (p.get("compute_wgs", 2) * WG_ROWS)
    return math.gcd(kb, tiles * kb // p["programs"])


def with_two_block_steps(small: dict, n: int, k: int) -> dict:
    """Launch settings with blocks_per_step=2 added where blocks_per_step allows it for their
    steps (step_unit; settings that carry their own, as streams do, are left as they are)."""
    if "programs" in small or "blocks_per_step" in small:
        return small
    blocks = blocks_per_step(small.get("block_m", BLOCK), step_unit(small, n, k))
    return {**small, "blocks_per_step": 2} if blocks == 2 else small


def stream_programs(tiles: int, tile_steps: int, sms: int, min_steps: int) -> int:
    """The most CTAs, at most one per SM, that share tiles x tile_steps pipeline steps equally
    with at least min_steps each (else 1)."""
    total = tiles * tile_steps
    return next((c for c in range(min(sms, total), 1, -1)
                 if total % c == 0 and total // c >= min_steps), 1)


def stream_params(m: int, n: int, k: int, sms: int, compute_wgs: int = 2) -> dict | None:
    """A stream-K launch for one x tile (M <= 128; else None): the most CTAs, at most one per
    SM, sharing the (weight tile, K-step) steps equally with at least eight K-blocks each; two
    K-blocks per step with x tiles of up to TWO_BLOCK_MAX_X_TILE rows."""
    block_m, k_blocks = _x_tile(m), k // BLOCK
    if cdiv(m, block_m) > 1:
        return None
    blocks = blocks_per_step(block_m, k_blocks)
    programs = stream_programs(n // (compute_wgs * WG_ROWS), k_blocks // blocks, sms,
                               cdiv(min(8, k_blocks), blocks))
    return dict(block_m=block_m, programs=programs, blocks_per_step=blocks,
                compute_wgs=compute_wgs)


# range_params' K ranges kept where they run in one wave on at least this fraction of the
# SMs (H200, session 10, 11 shapes at M=1/16: stream-K 0-4% slower there -- the same
# partition, or DRAM already the bound -- and 2-24% faster elsewhere)
ONE_WAVE_FILL = 0.8
# With wider x tiles the cond that closes a piece costs ~15% of a step (8192x8192 at M=64,
# the same partition: 30.3 vs 26.2 us), so stream-K only replaces ranges that run >= 3 waves
# of CTAs shorter than 32 K-blocks, each wave paying its ramp (session 10 at M=64: 1.28x vs
# 1.01x bf16 on 8192x10240, 1.28x vs 1.15x on 7168x36864, equal on 7168x24576; ranges
# 3-8% faster on 8192x57344, 4096x28672, 4096x6144 -- in-sample, 11 shapes)
WIDE_MIN_WAVES, WIDE_MAX_RANGE_BLOCKS = 3, 32


def decode_params(m: int, n: int, k: int, sms: int, compute_wgs: int = 2) -> dict:
    """Default mode's settings up to SPLIT_MAX_M rows: stream-K (stream_params) or
    range_params' K ranges. With x tiles of up to TWO_BLOCK_MAX_X_TILE rows, stream-K unless
    the ranges run in one wave on >= ONE_WAVE_FILL of the SMs (or stream-K would use fewer
    SMs); wider, only where the ranges run >= WIDE_MIN_WAVES waves of CTAs of fewer than
    WIDE_MAX_RANGE_BLOCKS K-blocks."""
    ranges, stream = range_params(m, n, k, sms, compute_wgs), stream_params(m, n, k, sms,
                                                                          compute_wgs)
    if stream is None:
        return ranges
    ctas = _range_ctas(ranges, m, n)
    waves, fill = cdiv(ctas, sms), wave_fill(ctas, sms)
    if ranges["block_m"] <= TWO_BLOCK_MAX_X_TILE:
        keep = (waves == 1 and fill >= ONE_WAVE_FILL) or stream["programs"] < fill * sms
    else:
        keep = (waves < WIDE_MIN_WAVES
                or k // BLOCK // ranges["k_splits"] >= WIDE_MAX_RANGE_BLOCKS)
    return ranges if keep else stream


def det_stream_params(m: int, n: int, k: int, sms: int, parts: int, compute_wgs: int = 2,
                      min_x_tile: int = DET_MIN_X_TILE, groups: int = 1) -> dict | None:
    """Deterministic mode's stream-K launch for one x tile (M <= 128; else None): the weight
    tiles' `parts` K parts shared out whole, the most CTAs (at most one per SM) running equal
    runs of at least eight K-blocks (or one part) each; each part stored to its own slab (or,
    up to FOLD_MAX_X_TILE rows, a tile's first CTA folding its parts into one prefix slab) and
    the slabs added in part order -- bitwise `parts` K ranges, as the other launches of
    det_params give them, whatever the CTA count (with `groups` groups of parts, each group
    folded and summed so, then the groups: det_groups). Steps of two K-blocks (x tiles <= 16 rows)
    wherever the CTAs' runs and the tiles' K hold them, across parts' ends too (step_unit)."""
    block_m = max(min_x_tile, _x_tile(m))
    if m > block_m or parts == 1:
        return None
    part_blocks = k // BLOCK // parts
    programs = stream_programs(n // (compute_wgs * WG_ROWS), parts, sms,
                               cdiv(min(8, k // BLOCK), part_blocks))
    if programs == 1:
        return None
    return dict(block_m=block_m, k_splits=1, k_parts=parts, programs=programs,
                blocks_per_step=blocks_per_step(block_m, step_unit(
                    dict(k_splits=1, k_parts=parts, programs=programs,
                         compute_wgs=compute_wgs), n, k)),
                parts_sum="cond" if block_m <= FOLD_MAX_X_TILE else "store",
                compute_wgs=compute_wgs, **({"k_groups": groups} if groups > 1 else {}))


def group_pieces(tiles: int, k_steps: int, programs: int, parts: int, groups: int,
                 folded: bool) -> np.ndarray:
    """The slabs each group of a streamed launch's weight tiles comes in: pieces[t * groups +
    g] for group g of tile t's K parts -- each group streamed as a tile of its own would be
    (the CTAs' runs are the same), its parts folded by the CTA holding its first one or not
    (Stream.folded). One group of one part: stream-K's pieces."""
    st = Stream.of(tiles * groups, k_steps, programs, parts // groups)
    return (st.folded() if folded else st).pieces


def stream_slabs(p: dict, n: int, k: int) -> float:
    """The mean float32 slabs a weight tile's sum comes in under streamed-parts launch p: its
    P parts, or with parts folded by the tile's first CTA (parts_sum="cond") that prefix's
    one plus one per part the tile's later CTAs run (Stream.folded) -- per group of parts
    (k_groups), summed over the groups."""
    g = p.get("k_groups", 1)
    pieces = group_pieces(n // (p.get("compute_wgs", 2) * WG_ROWS),
                          k // BLOCK // p["blocks_per_step"], p["programs"], p["k_parts"], g,
                          folded=p.get("parts_sum") == "cond")
    return float(pieces.mean() * g)


# Streamed parts are folded by each tile's first CTA (parts_sum="cond", Stream.folded) up to
# this x tile. H200, session 12 (benchmarks/sweep_fp8.py --parts det_fold, 11 shapes, same
# run): fold / store 0.94-1.03 at M=1 and 16 (det/default geomean 1.073 -> 1.057 and 1.099 ->
# 1.080, max 1.16 -> 1.12); at M=64 (64-row tiles) 0.94-1.41 -- the prefix's second live
# accumulator and nested cond cost more there than the slabs it saves.
FOLD_MAX_X_TILE = 16


# Deterministic mode streams whole K parts (det_stream_params) where that costs less than
# this fraction of in-CTA parts, by a model of bytes over filled SM slots: in-CTA parts
# stream the weight's bytes (K * w_bits / 8 per row) on tiles / (waves * SMs) of the slots;
# the stream fills programs / SMs of them and adds its slabs' round trip, 8 * S * x-tile rows
# bytes per weight row (S: stream_slabs, a tile's mean slabs as folded). H200, session 11 (11
# shapes at M=1/16/64, benchmarks/sweep_fp8.py --parts det_stream, S = P then): where it
# picks the stream, session 10's launch was at most 1-3% faster; where it keeps in-CTA
# parts, the stream was 3-40% slower (the margin: 8192x57344 at M=1, model 1.16 vs 1.18,
# measured 3% slower) -- in-sample. Session 14 (bench_fp4_mx.py --parts detstream, folded
# slabs since session 12): the stream 10-11% faster on 8192x57344 at M=16 (model now 1.06 vs
# 1.12) and 4-10% on 4096x28672 at M=1; at M=16 there 2-3% slower for 4-bit weights (whose
# bytes the slabs cost twice as much of: the model keeps in-CTA parts) and 4% faster for MXFP8.
DET_STREAM_MARGIN = 0.95


# narrowest x tile det_params' in-CTA parts narrow to (GPU: x tile width keeps a row's bits)
DET_NARROW_MIN_X_TILE = 32


def _narrow_x_tile(m: int, tiles: int, block_m: int, sms: int) -> int:
    """The narrowest x tile of at least DET_NARROW_MIN_X_TILE rows (and at most block_m) whose
    CTAs (weight tiles x x tiles, each over all of K) run in no more waves than block_m's: the
    same waves of CTAs with fewer rows each, on more of the SMs; each weight tile is then read
    by its x tiles' CTAs together (tile_index: L2)."""
    waves = cdiv(tiles * cdiv(m, block_m), sms)
    return min((b for b in X_TILES if DET_NARROW_MIN_X_TILE <= b <= block_m
                and cdiv(tiles * cdiv(m, b), sms) <= waves), default=block_m)


# Deterministic mode's K order for weights of up to this many rows is two groups of parts --
# each half of K the left fold of its P / 2 parts, the halves' sums added after -- so that it
# can run as default mode's two K ranges where the weight tiles alone leave SMs idle (H200,
# session 15, benchmarks/sweep_fp8.py --parts det_halves: det/default 1.30-1.35x -> 1.04x at
# M=64 on 8192x8192 / 18432x7168, 1.21-1.35x -> 1.10-1.12x at M=256 on 4096x4096 / 14336x4096
# / 8192x10240); wider weights keep one left fold of P parts (their launches fill the SMs).
DET_GROUPS_MAX_N = 16384
# the two-range launch of a two-group order where its CTAs fill at least this fraction of one
# wave's SMs (H200, session 15: 64 CTAs of 4096x4096 / 14336x4096 at M=16/64 ran 1.22-1.89x
# default against the stream's 1.04-1.21x; 96-128 CTAs 0.93-1.16x)
TWO_RANGE_MIN_FILL = 0.75


# one_left_fold's override, per thread: benchmarks trace their variants concurrently
# (jqlin.bench compiles cases in a thread pool), and a module-level patch raced there --
# session 16's first det_groups sweep traced deterministic mode's launch with one fold
_ORDER = threading.local()


@contextlib.contextmanager
def one_left_fold() -> Iterator[None]:
    """Within, in this thread (at trace time): deterministic launches sum K as one left fold
    of its parts at every N (the order before session 15, DET_GROUPS_MAX_N = 0) -- for
    comparisons. Traces made outside are cached by jit and keep their order."""
    saved = getattr(_ORDER, "max_n", None)
    _ORDER.max_n = 0
    try:
        yield
    finally:
        _ORDER.max_n = saved


def det_groups(n: int, parts: int) -> int:
    """The groups of K parts in deterministic mode's order for a weight of n rows (the
    unsharded N of an enclosing `deterministic_rows`): 2 up to DET_GROUPS_MAX_N rows where the
    parts pair up, else 1. A function of N and K only (through the parts), never of M."""
    rows = current_det_rows() or n
    max_n = getattr(_ORDER, "max_n", None)
    return 2 if parts % 2 == 0 and rows <= (DET_GROUPS_MAX_N if max_n is None else max_n) else 1


def _two_ranges(m: int, sms: int, block_m: int, ctas: int, parts: int,
                compute_wgs: int) -> dict | None:
    """A two-group order's two K ranges (each its group's P / 2 parts folded in the CTA) on
    block_m-row x tiles, up to SPLIT_MAX_M rows (their two float32 slabs), where their 2 * ctas
    CTAs fill TWO_RANGE_MIN_FILL of the SMs and take fewer waves per CTA's work than the ctas
    CTAs of in-CTA parts; else None."""
    two = 2 * ctas
    if (m > SPLIT_MAX_M or two < TWO_RANGE_MIN_FILL * sms
            or cdiv(two, sms) / two >= cdiv(ctas, sms) / ctas):
        return None
    return dict(block_m=block_m, k_splits=2, k_parts=parts // 2, k_groups=2,
                compute_wgs=compute_wgs)


def det_params(m: int, n: int, k: int, sms: int, compute_wgs: int = 2,
               streamed: bool = True, min_x_tile: int = DET_MIN_X_TILE,
               narrow: bool = False, w_bits: float = 8) -> dict:
    """Deterministic mode's settings: K always summed as P = det_k_parts(K) contiguous parts,
    each from zero, added in K order -- up to DET_GROUPS_MAX_N rows as two groups (det_groups:
    each half of K's parts added in order, then the halves' sums), where the two halves may
    run as two K ranges (_two_ranges) and in-CTA parts park the first half's sum in shared
    memory (k_groups). Only the launch follows M, never the order. With one x
    tile (M <= 128) the tiles' P parts are shared out whole over up to one CTA per SM
    (det_stream_params) where DET_STREAM_MARGIN's model of bytes over filled SM slots says so
    (slabs of 8 * stream_slabs * x-tile rows bytes per weight row against in-CTA parts' waves;
    w_bits: the weight's stored bits per value, 8 for e4m3, 4.5 for NVFP4 with its scales).
    Else the P parts run as P in-CTA parts, or as P ranges (CTAs; float32 partials summed after) where
    that is cheaper by bytes: in-CTA parts stream the weight (K bytes per weight row) on the fraction
    f = min(1, tiles / SMs) of the SMs their tiles occupy; ranges stream it on all of them
    plus the partials' round trip (8 * P * rows bytes per weight row) -- ranges iff
    8 * P * rows < K * (1/f - 1), up to SPLIT_MAX_M rows. The ranges run as default mode's
    decode CTAs (R = decode_params' K ranges, at most P), each storing its P / R parts as
    slabs of their own (parts_sum="store"), so the launch is default mode's. Both give the same sums
    (test_interpreter_fixed_k_order_..., on the GPU test_gpu_fixed_k_order_...). Inside
    `common.k_shards` (k: one device's slice) every device runs its P / count parts as ranges;
    their partials are gathered and added in order. min_x_tile: the narrowest x tile
    (DET_MIN_X_TILE; launch_params gives DET_GPU_MIN_X_TILE on the GPU). narrow: in-CTA parts
    take _narrow_x_tile's x tiles (launch_params: on the GPU, where x tile width keeps a row's
    bits; the interpreter's time grows with the CTAs)."""
    shards = current_k_shards()
    count = 1 if shards is None else shards.count
    parts = det_k_parts(k * count, BLOCK)
    local = device_ranges(parts, k * count, count)
    block_m = max(min_x_tile, _x_tile(m))
    rows = cdiv(m, block_m) * block_m
    tiles = n // (compute_wgs * WG_ROWS)
    ctas = tiles * cdiv(m, block_m)
    fill = min(1.0, ctas / sms)
    ranges = m <= SPLIT_MAX_M and 8 * parts * rows < k * count * (1 / fill - 1)
    groups = det_groups(n, parts)
    grouped = {"k_groups": groups} if groups > 1 else {}
    if shards is not None:
        return dict(block_m=block_m, k_splits=local, k_parts=1, compute_wgs=compute_wgs,
                    **grouped)
    two = _two_ranges(m, sms, block_m, ctas, parts, compute_wgs) if groups == 2 else None
    stream = (det_stream_params(m, n, k, sms, parts, compute_wgs, min_x_tile, groups)
              if streamed else None)
    if stream is not None:
        in_cta = (cdiv(ctas, sms) * sms / ctas if two is None else
                  cdiv(2 * ctas, sms) * sms / (2 * ctas))
        slabs = stream_slabs(stream, n, k)
        cheaper = ((1 + 8 * slabs * block_m / (k * w_bits / 8)) * sms / stream["programs"]
                   < DET_STREAM_MARGIN * in_cta)
        # (where K ranges would win, the stream does: the same slabs on more of the SMs;
        # the two ranges of a two-group order write two slabs, not P)
        if cheaper or (ranges and two is None):
            return stream
    if two is not None:
        return two
    if ranges:  # as many CTAs per tile as default mode's decode settings, each storing its
        # P / R parts as slabs (parts_sum="store"): the P ranges' bits (session 9)
        r = min(parts, range_params(m, n, k, sms, compute_wgs)["k_splits"])
        if r == parts:
            return dict(block_m=block_m, k_splits=parts, k_parts=1, compute_wgs=compute_wgs,
                        **grouped)
        return dict(block_m=block_m, k_splits=r, k_parts=parts // r, parts_sum="store",
                    compute_wgs=compute_wgs, **grouped)
    # (narrowed only here: against streamed parts, 32-row in-CTA parts ran 1.2-1.6x slower
    # at M=64-128, session 11)
    return dict(block_m=_narrow_x_tile(m, tiles, block_m, sms) if narrow else block_m,
                k_splits=1, k_parts=parts, compute_wgs=compute_wgs, **grouped)


# The weights decoded to bf16 by one pass first (fp8_widen for e4m3 weights since session 20,
# XLA's dequantization for the group formats), wgmma reading them from shared memory
# (predecode), from this many rows of x on, in both modes -- bitwise the converted weights'
# sums (test_gpu_predecoded_weights_give_the_same_bits), so M may choose it. At prefill sizes
# the kernel converts each weight tile once per x tile (32 times at M=4096) inside its
# MMA-bound loop; the pass moves ~3 bytes a weight once. H200, session 17 (sweep_fp8.py
# --parts predecode,predecode_m, fp8_block_a16, same runs), time with / without: default
# mode's launch M=1024 1.06-1.27 (11 shapes), 2048 1.01-1.11 (6), 4096 0.86-0.99 (11),
# 16384 0.84-0.93 (6); deterministic mode's M=4096 0.76-1.05 (N > 16384: 0.76-0.80; the
# parked launches of N <= 16384, two pipeline stages of bf16 tiles: 0.92-1.05), 16384
# 0.77-0.96.
PREDECODE_MIN_M = 4096


def launch_params(m: int, n: int, k: int, interpret: bool | plgpu.InterpretGPUParams,
                  deterministic: bool = False, compute_wgs: int = 2, w_bits: float = 8,
                  halves: bool = True,
                  predecode_min_m: int | None = PREDECODE_MIN_M) -> dict:
    """The dispatcher's settings: registers as wgmma's A operand on a GPU (session 6: 1.3-1.6x
    the shared-memory variant; the interpreter runs only the latter); deterministic mode:
    det_params; else up to SPLIT_MAX_M rows decode_params' x tiles (small below 128 rows) and
    K ranges. With x tiles of <= TWO_BLOCK_MAX_X_TILE rows, two K-blocks per pipeline step
    where every K part holds an even number (the same sums; session 7 call 6 on 4 shapes at
    M=1 and 16: -1 to +4% for fp8 weights, +7-15% for a 4-bit stream; at 128-row tiles only
    one stage of two blocks fits: 0.37x). compute_wgs: warpgroups per CTA for the tile count
    (the dispatcher: 2). halves: whether the weights' decode takes wgmma_halves where
    halves_pay says (group_a16_mgpu: not for e2m1 codes). predecode_min_m: from how many rows
    it takes the predecoded weights (None: never; group_a16_mgpu: det_predecode_min_m for the
    formats of PREDECODE_FORMATS) -- then never the halves (a register conversion), a CTA
    holding both groups then reloading the first's sum up to RELOAD_MAX_K, else storing it
    (groups_sum); default mode's one K range then runs as PREFILL_K_PARTS in-CTA parts."""
    if deterministic:
        small = det_params(m, n, k, num_sms(), compute_wgs, min_x_tile=(
            DET_MIN_X_TILE if interpret else DET_GPU_MIN_X_TILE), narrow=not interpret,
            w_bits=w_bits)
    else:
        small = decode_params(m, n, k, num_sms(), compute_wgs) if m <= SPLIT_MAX_M else {}
    small = with_two_block_steps(small, n, k)
    if predecode_min_m is not None and m >= predecode_min_m:
        small = {**small, "predecode": True}
        if (not deterministic and "k_parts" not in small
                and (k // BLOCK) % PREFILL_K_PARTS == 0):  # (PREFILL_K_PARTS)
            small["k_parts"] = PREFILL_K_PARTS
        if holds_both_groups(small.get("k_groups", 1), small.get("k_splits", 1),
                             small.get("k_parts", 1), small.get("parts_sum", "cond"),
                             "programs" in small):  # (STORED_GROUPS, RELOAD_MAX_K)
            small["groups_sum"] = "reload" if k <= RELOAD_MAX_K else "store"
    elif halves and not interpret and halves_pay(small):
        small = {**small, "wgmma_halves": True}
    return dict(a_in_registers=not interpret, **small)


# Default mode's predecoded launches run their one K range as this many in-CTA parts (each
# part from zero, the parts added in order: another rounding than one range's, so default
# mode's bits at M >= PREDECODE_MIN_M change; it is not batch-invariant anyway). Why it pays
# is not known -- more work a step (a lax.cond closing the part, a third accumulator live),
# yet faster: a schedule effect, not profiled. H200, session 19 (sweep_fp8.py --parts
# default_parts, fp8_block_a16, 5 shapes, calls 1 and 2, same run each), time over one range:
# M=4096 0.92-1.00 (geomean 0.966 / 0.946), M=16384 0.90-1.06 (0.980 / 0.975; 14336x4096
# 1.058 / 1.026 the one loss); 4 parts 0.94-1.09, 8 parts 0.94-1.10, group_m 4 / 16 no gain.
PREFILL_K_PARTS = 2
# STORED_GROUPS: predecoded launches whose CTAs hold both groups of a two-group order store
# each group's sum to a float32 slab of their own (groups_sum="store") instead of parking the
# first in shared memory: three pipeline stages of bf16 tiles instead of two. H200, session
# 17 (sweep_fp8.py --parts groups_store, fp8_block_a16, the 7 shapes of N <= 16384, same run),
# det/default at M=4096 1.20-1.29 -> 0.96-1.22 (4096x4096 / 4096x6144 1.21 / 1.22, the rest
# 0.96-1.08), at M=16384 1.17-1.40 -> 0.97-1.23; MX det (bench_fp4_mx.py --parts
# detgroupsstore, 4 shapes) 1.40-1.49 -> 1.18-1.42 at M=4096.
# RELOAD_MAX_K: up to this K they reload instead (groups_sum="reload": the first group's sum
# read back by its CTA, the 16-bit output written whole) -- the XLA pass that reads two float32
# slabs goes, and at short K the first group's slab is still in L2 when it is read back; at
# longer K the read-back's latency, paid in every CTA's epilogue, costs more than the pass.
# H200, session 18 (sweep_fp8.py --parts groups_reload, fp8_block_a16 det, M=4096, same run),
# time reload / store: K=4096 0.92-0.93 (det/default 1.20 -> 1.10, 1.20 -> 1.11), K=8192
# 0.98-0.99, K=14336 1.00, K=18432 / 28672 1.01; MX det (bench_fp4_mx.py --parts
# detgroupsreload, K >= 8192) 1.00-1.02.
RELOAD_MAX_K = 8192


# In-CTA parts folded in registers (parts_sum="cond", not streamed) hold three float32
# accumulators -- the K-block's wgmma one, the part's and the finished parts' sum -- of
# x-tile / 2 registers a thread each; from this x tile on they spill with the converted weights
# (ptxas: 24 bytes with one fold of 8 parts, 52 with the two-group park; SASS 3 STL + 6 LDL a
# step, benchmarks/sass_parts.py) unless wgmma_halves frees 16 (none spill then). H200,
# session 16: det/default with them (sweep_fp8.py --parts det_groups, 7 shapes of N <= 16384)
# 0.87-1.11x at M=256, 1.11-1.22x at M=4096 (session 15 without: 0.97-1.25x / 1.08-1.32x);
# the 4 wider shapes 0.97-1.05x / 1.05-1.11x (through the dispatcher). Default mode's one range
# with the halves is 2-16% slower (a wgmma wait more a step), so only these launches take them.
HALVES_MIN_X_TILE = 128


def halves_pay(p: dict) -> bool:
    """Whether launch settings p are in-CTA parts folded in registers at x tiles of at least
    HALVES_MIN_X_TILE rows, one K-block a step (wgmma_halves' launches)."""
    return (p.get("k_parts", 1) > 1 and p.get("parts_sum", "cond") == "cond"
            and "programs" not in p and p.get("block_m", BLOCK) >= HALVES_MIN_X_TILE
            and p.get("blocks_per_step", 1) == 1)


def _tile_scales(scales: str, tile_rows: int, k: int, held: int = 1) -> tuple[int, int]:
    """The shared-memory copy of the scales of a CTA's `held` weight tiles as stored, loaded
    once: their rows of the block scales (N/128, K/128) or of the channel scales viewed
    (N/128, 128); "tensor" (a value) and "rows" (a row per step, in the pipeline's stages)
    keep none."""
    return {"block": (held * tile_rows // BLOCK, k // BLOCK),
            "channel": (held * tile_rows // BLOCK, BLOCK)}.get(scales, (0, 0))


class Stream(NamedTuple):
    """A stream-K launch (fp8_block_a16_matmul_mgpu's `programs`): `programs` CTAs, each
    running `steps` consecutive pipeline steps of the tile-major (weight tile, K-step)
    sequence. pieces[t]: how many slabs weight tile t's sum comes in -- with parts == 1, one
    per CTA sharing the tile (each stores its piece of the tile's sum to its own slab); with
    parts > 1, every tile's `parts` K parts (each CTA runs whole parts, each stored to slab
    (part)); held: the most tiles one CTA runs (their scales in shared memory)."""
    programs: int
    steps: int
    pieces: np.ndarray
    held: int
    parts: int = 1
    run_parts: int = 0  # K parts per CTA (parts > 1)

    @classmethod
    def of(cls, tiles: int, tile_steps: int, programs: int, parts: int = 1) -> "Stream":
        steps = tiles * tile_steps // programs
        t, c = np.arange(tiles), np.arange(programs)
        pieces = (np.full(tiles, parts) if parts > 1 else
                  ((t + 1) * tile_steps - 1) // steps - t * tile_steps // steps + 1)
        held = int(np.max((c * steps + steps - 1) // tile_steps - c * steps // tile_steps + 1))
        return cls(programs, steps, pieces, held, parts, tiles * parts // programs)

    def folded(self) -> "Stream":
        """The same launch with the parts of each tile's first CTA folded in registers
        (parts_sum="cond"): pieces[t] becomes that prefix's slab plus one per later part."""
        t = np.arange(len(self.pieces))
        prefix = np.minimum(self.parts, (t * self.parts // self.run_parts + 1) * self.run_parts
                            - t * self.parts)
        return self._replace(pieces=1 + self.parts - prefix)


def _sum_pieces(y: jax.Array, pieces: np.ndarray, tile_rows: int, groups: int = 1) -> jax.Array:
    """(slabs, N, M) float32 pieces -> (groups, N, M): each weight tile's pieces added in K
    order (slab j holds piece j where the tile has one; the others were never written), by
    group: slabs [g * S, (g + 1) * S) (S = slabs / groups) hold group g's pieces,
    pieces[t * groups + g] of them (group_pieces). The groups' sums are added by the caller."""
    slabs, n, m = y.shape
    per = slabs // groups
    y = y.reshape(groups, per, n // tile_rows, tile_rows, m)
    sums = []
    for g in range(groups):
        part = y[g, 0]
        for j in range(1, per):
            held = jnp.asarray(pieces[g::groups] > j)[:, None, None]
            part = part + jnp.where(held, y[g, j], 0.0)
        sums.append(part.reshape(n, m))
    return jnp.stack(sums)


def _stages(requested: int | None, block_m: int, x_bytes: int, out_bytes: int,
            a_in_registers: bool, blocks: int = 1, wgs: int = 2, scales: str = "rows",
            k: int = 0, held: int = 1, w_bits: int = 8, group_bytes: int = 0,
            out_cols: int | None = None) -> int:
    # w, x (and with scales="rows", scale) tiles of `blocks` K-blocks; the tile's scales once;
    # "groups": a scale tile of group_bytes per K-block and row per step
    tile_rows = wgs * WG_ROWS
    per_step = blocks * (tile_rows * BLOCK * w_bits // 8 + block_m * BLOCK * x_bytes
                         + (tile_rows * 4 if scales == "rows" else 0))
    if scales == "groups":
        per_step += tile_rows * group_tile_blocks(blocks, group_bytes) * group_bytes
    fixed = wgs * WG_ROWS * (out_cols or block_m) * out_bytes + (0 if a_in_registers else
                                                   wgs * blocks * WG_ROWS * BLOCK * x_bytes)
    fixed += 4 * int(np.prod(_tile_scales(scales, tile_rows, k, held)))
    fit = (SMEM_BYTES - fixed) // per_step
    if requested is None:
        return min(fit, max(2, (3 if block_m == BLOCK else 8) // blocks))
    if not (isinstance(requested, int) and 1 <= requested <= fit):
        raise ValueError(f"stages must be an int in [1, {fit}] for x tiles of {block_m} rows "
                         f"({per_step} bytes of shared memory per stage), got {requested!r}")
    return requested


def fp8_block_a16_matmul_mgpu(x: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                              scale_kind: str = "block", out_dtype=None,
                              stages: int | None = None, group_m: int = 8,
                              block_m: int = BLOCK, k_splits: int = 1, k_parts: int = 1,
                              blocks_per_step: int = 1, compute_wgs: int = 2,
                              a_load: str = "wgmma", parts_sum: str = "cond",
                              programs: int | None = None, k_groups: int = 1,
                              wgmma_halves: bool = False, a_in_registers: bool = True,
                              predecode: bool = False, groups_sum: str = "park",
                              interpret: bool | plgpu.InterpretGPUParams = False) -> jax.Array:
    """y (M, N) = x (M, K) bf16/f16 @ (w (N, K) e4m3 [w_scale])^T in out_dtype (default x's
    dtype); see the module docstring for the numerics.
    scale_kind: "block" (w_scale (N/128, K/128)), "channel" ((N, 1)) or "tensor" ((1, 1)); the
    last two run the same per-128-K promotion with the row's one scale (W8A16 per-channel /
    per-tensor at prefill sizes without the dense path's converted copy of the weight).
    stages: pipeline steps in flight; None: 3 with 128-row x tiles, else as many as fit up to
    8, each halved (at least 2) with two blocks per step (a step holds blocks_per_step weight
    tiles of 64 * compute_wgs rows x 128 bytes and block_m x 128 x tiles).
    group_m: weight tile rows launched together (their x tiles shared in L2; see
    mgpu_common.tile_index).
    block_m: x rows per CTA tile, one of X_TILES (wgmma's N): small for decode (M padded to it).
    k_splits: K cut into this many equal ranges of whole K-blocks, each its own CTA, their
    float32 results summed in range order afterwards (decode: more CTAs than weight tiles).
    k_parts: each K range summed as this many contiguous parts inside the CTA, each part from
    zero, the parts added in order -- bitwise what k_parts ranges (k_splits=k_parts) give,
    without partials in memory. For a deterministic schedule whose K order is fixed by (K, N)
    at every M: P ranges at small M, P in-CTA parts at large M (det_params).
    blocks_per_step: 128-wide K-blocks per pipeline step (1 or 2): with 2, both blocks' wgmmas
    are issued before the first is waited on; the sums are the same (blocks added in K order).
    A K range's parts hold whole steps; streamed K parts (programs, k_parts > 1) may end inside
    one -- the part is closed after its last block and the next starts from zero -- so there
    steps need only divide K's blocks and each CTA's run (K=7168: parts of 7, steps of 2).
    compute_wgs: compute warpgroups per CTA, 2 or 4 (64 weight rows each; N a multiple of
    64 * compute_wgs): four stream twice the weight bytes per pipeline step; their 104
    registers per thread hold x tiles of up to FOUR_WG_MAX_X_TILE rows. The sums are the same
    either way. H200, session 8 at M=1/16: no faster for e4m3 weights (0-12% slower), +9-17%
    for a 4-bit stream on large shapes (benchmarks/probe_w4_mgpu.py --wgs), so the dispatcher
    keeps two.
    a_load: how a compute warpgroup reads its 64 x 128 weight tile from shared memory:
      "wgmma" straight into wgmma's register layout (two 8-bit values per load: 32 loads per
      thread and K-block); "relabel_4x" through WGMMA_UPCAST_4X (eight per load: 8 loads) with
      the registers declared as wgmma's layout as they are, which permutes K inside every 32
      columns; x is permuted to match (mgpu_relabel: the same products, summed in another
      order -- bits may differ from "wgmma"; the interpreter permutes w instead). H200,
      session 9: no faster for e4m3 weights (the loads are not the decode floor). The
      dispatcher uses "wgmma" here; group_a16_mgpu's e2m1 codes take the same UPCAST_4X loads
      as a_load="words" (decode_words; its own pairing of a word's codes, session 13). (Session 8's "upcast_2x", WGMMA_UPCAST_2X loads plus a shuffle
      per register, measured no faster either and was removed.)
    parts_sum: how each in-CTA K part (k_parts > 1) is closed at its last K-block: "cond" (a
      lax.cond per step adds it to the finished parts' sum; ~15% against k_parts=1 at M >=
      1024, session 7; session 8's branch-free selects were slower still, session 9, and were
      removed) or "store" (written to its own float32 slab: k_splits * k_parts slabs, summed in
      K order afterwards as K ranges are) -- bitwise what k_splits * k_parts ranges give, from
      fewer and longer CTAs (deterministic mode at decode: det_params).
    programs: stream-K (one x tile, k_splits = 1): this many CTAs, each running an equal run
      of consecutive pipeline steps of the tile-major (weight tile, K-step) sequence, so
      every CTA streams the same bytes whatever the tile count (K ranges fill the SMs only
      where tiles x ranges is near a multiple of them). With k_parts = 1, a tile whose steps
      span CTAs is summed in pieces, one per CTA, each from zero, added in K order
      afterwards: K ranges whose bounds follow (tiles, K-steps, programs) -- so M, through
      the x tile's blocks per step, too (default mode); programs must divide tiles x K-steps.
      With k_parts = P > 1, every CTA runs whole K parts of the (weight tile, K part)
      sequence; parts_sum="store" stores each part to its own slab (deterministic mode's
      decode, det_params), "cond" has each tile's first CTA add its parts of the tile in
      registers (the left fold from part 0) and store that prefix once, the tile's later
      parts (other CTAs) each to a slab of its own -- fewer slab bytes (det_stream_params
      folds up to FOLD_MAX_X_TILE rows, session 12); summed in part order either way:
      bitwise P K ranges at every launch. programs must divide tiles x P.
    k_groups: 1, or 2 -- the K order of two groups of the k_splits * k_parts parts: each
      half's parts added in order (as above), then the second half's sum added to the first's
      (deterministic mode up to DET_GROUPS_MAX_N rows: det_groups). K ranges and stored parts
      are summed so afterwards; folded in-CTA parts need k_splits 1 (a CTA holds both groups:
      holds_both_groups, groups_sum) or 2 (a range a group); streamed parts fold
      by group (each group's first CTA its prefix of it).
    groups_sum: where a CTA holding both groups (k_splits 1, parts folded) keeps the first
      group's sum: "park" (in shared memory, added to the second's at the end; the kernel
      writes float32) or "store" (each group's sum to a float32 slab of its own, the slabs
      added after as K ranges' are, the stores staged in halves of the x tile: one 64 KB
      pipeline stage more at 128-row tiles) or "reload" (the first group's sum to a float32
      buffer of its own, read back by the CTA at the end, added to the second's there and the
      output written in out_dtype; staged in halves too, 16-bit outputs aliased with the
      float32 pieces' bytes). The same sums either way.
    wgmma_halves: each K-block's weights converted and multiplied in two halves of 64 columns,
      the first half's wgmmas waited on before the second is converted (blocks_per_step=1,
      a_load="wgmma"): the same wgmma chain, so the same sums, with 16 fewer registers live
      for the converted weights -- room for in-CTA parts' third accumulator at 128-row x
      tiles, which spills without it (benchmarks/sass_parts.py). Registers only: the
      interpreter's shared-memory operands run the block whole.
    a_in_registers: wgmma reads the converted weights from registers (JAX's mixed-type
    example); False stores them to shared memory first (what the interpreter can run).
    predecode: the weights widened to bf16 by one pass first (fp8_widen; exact: 2 bytes a weight
    written, then streamed instead of 1), wgmma's A operand then read straight from the
    pipeline's shared memory -- no conversion, no weight registers (a_in_registers does not
    apply). The same values in the same wgmma chain, so the same sums at every launch
    (test_gpu_predecoded_weights_give_the_same_bits); for prefill sizes, where each weight
    tile is converted once per x tile (PREDECODE_MIN_M).
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
    if a_load not in A_LOADS:
        raise ValueError(f"a_load must be one of {A_LOADS}, got {a_load!r}")
    if wgmma_halves and a_load != "wgmma":
        raise ValueError(f"wgmma_halves reads the weights with a_load='wgmma', got {a_load!r}")
    check_predecode(predecode, a_load, wgmma_halves, ("wgmma",), groups_sum)
    scale_shape = {"block": (n // BLOCK, k // BLOCK), "channel": (n, 1), "tensor": (1, 1)}
    if scale_kind not in scale_shape:
        raise ValueError(f"scale_kind must be one of {tuple(scale_shape)}, got {scale_kind!r}")
    if w_scale.shape != scale_shape[scale_kind]:
        raise ValueError(f"w_scale must be {scale_shape[scale_kind]} for scale_kind "
                         f"{scale_kind!r}, got {tuple(w_scale.shape)}")
    check_launch(m, n, k, block_m=block_m, k_splits=k_splits, k_parts=k_parts,
                 blocks_per_step=blocks_per_step, programs=programs, compute_wgs=compute_wgs,
                 group_m=group_m, parts_sum=parts_sum, k_groups=k_groups,
                 wgmma_halves=wgmma_halves, groups_sum=groups_sum)
    ws, scales = _scale_operand(w_scale, scale_kind, n, k)
    if predecode:  # exact: every e4m3 value is a bf16 / f16 one (fp8_widen: XLA's convert
        # ran at half of DRAM bandwidth)
        w, a_load = widen_e4m3(w, x.dtype, interpret=bool(interpret)), "smem"
    return _launch(x, w, ws, out_dtype=jnp.dtype(out_dtype or x.dtype), stages=stages,
                   group_m=group_m, block_m=block_m, k_splits=k_splits, k_parts=k_parts,
                   blocks_per_step=blocks_per_step, compute_wgs=compute_wgs, a_load=a_load,
                   parts_sum=parts_sum, scales=scales, programs=programs, k_groups=k_groups,
                   wgmma_halves=wgmma_halves, a_in_registers=a_in_registers,
                   groups_sum=groups_sum, interpret=interpret)


def check_predecode(predecode: bool, a_load: str, wgmma_halves: bool,
                    loads: tuple[str, ...], groups_sum: str = "park") -> None:
    """predecode (bool) with the other weight-reading settings: the decoded weights are read
    by wgmma itself, so neither the halves' register conversion nor a load other than `loads`
    (those whose K order the decoded weights can take) applies. groups_sum="reload" runs on
    predecoded weights only: with weights decoded in registers it was no faster (H200, session
    18: 1.00-1.02x the park at M=1024), and Mosaic GPU's interpreter deadlocks on that form
    with 16-bit outputs (unexplained; the GPU gave the park's bits)."""
    if not isinstance(predecode, bool):
        raise ValueError(f"predecode must be a bool, got {predecode!r}")
    if predecode and (a_load not in loads or wgmma_halves):
        raise ValueError(f"predecode reads decoded weights from shared memory: it takes neither "
                         f"a_load={a_load!r} nor wgmma_halves={wgmma_halves}")
    if groups_sum == "reload" and not predecode:
        raise ValueError("groups_sum='reload' runs on predecoded weights only (predecode=True)")


def check_launch(m: int, n: int, k: int, *, block_m: int, k_splits: int, k_parts: int,
                 blocks_per_step: int, programs: int | None, compute_wgs: int, group_m: int,
                 parts_sum: str, step_blocks: tuple[int, ...] = (1, 2),
                 k_groups: int = 1, wgmma_halves: bool = False,
                 groups_sum: str = "park") -> None:
    """The launch settings of fp8_block_a16_matmul_mgpu (see there) for an (M, N, K) problem,
    or a ValueError naming the one that is wrong. step_blocks: the K-blocks a pipeline step may
    hold (group_a16_mgpu's 4-bit codes: also 4)."""
    if compute_wgs not in COMPUTE_WGS or n % (compute_wgs * WG_ROWS):
        raise ValueError(f"compute_wgs must be one of {COMPUTE_WGS} with N={n} a multiple of "
                         f"{WG_ROWS} * compute_wgs, got {compute_wgs!r}")
    if parts_sum not in PARTS_SUMS:
        raise ValueError(f"parts_sum must be one of {PARTS_SUMS}, got {parts_sum!r}")
    if groups_sum not in GROUPS_SUMS:
        raise ValueError(f"groups_sum must be one of {GROUPS_SUMS}, got {groups_sum!r}")
    if compute_wgs == 4 and block_m > FOUR_WG_MAX_X_TILE:
        raise ValueError(f"compute_wgs=4 holds x tiles of up to {FOUR_WG_MAX_X_TILE} rows "
                         f"(104 registers per thread), got block_m={block_m}")
    if not (isinstance(group_m, int) and group_m >= 1):
        raise ValueError(f"group_m must be a positive int, got {group_m!r}")
    if block_m not in X_TILES:
        raise ValueError(f"block_m must be one of {X_TILES}, got {block_m!r}")
    if not (isinstance(k_splits, int) and k_splits >= 1 and (k // BLOCK) % k_splits == 0):
        raise ValueError(f"k_splits must be a positive int dividing K/{BLOCK}={k // BLOCK}, "
                         f"got {k_splits!r}")
    if not (isinstance(k_parts, int) and k_parts >= 1 and (k // BLOCK // k_splits) % k_parts == 0):
        raise ValueError(f"k_parts must be a positive int dividing the K-blocks of a K range "
                         f"({k // BLOCK // k_splits}), got {k_parts!r}")
    if wgmma_halves and blocks_per_step != 1:
        raise ValueError(f"wgmma_halves splits one K-block a step; got blocks_per_step="
                         f"{blocks_per_step}")
    if k_groups not in (1, 2) or (k_splits * k_parts) % k_groups:
        raise ValueError(f"k_groups must be 1 or 2 and divide the {k_splits * k_parts} K "
                         f"parts (k_splits x k_parts), got {k_groups!r}")
    if (k_groups > 1 and parts_sum == "cond" and k_parts > 1 and programs is None
            and k_splits not in (1, k_groups)):
        raise ValueError(f"k_groups={k_groups} with parts folded in the CTA (parts_sum='cond') "
                         f"needs k_splits 1 or {k_groups} (a range's parts in one group, or "
                         f"all of them), got k_splits={k_splits}")
    per_part = k // BLOCK // k_splits // k_parts
    streamed_parts = programs is not None and k_parts > 1  # (parts may end inside a step)
    launch = dict(k_splits=k_splits, k_parts=k_parts, programs=programs,
                  compute_wgs=compute_wgs)
    if blocks_per_step not in step_blocks or (per_part % blocks_per_step
                                              and not streamed_parts):
        raise ValueError(f"blocks_per_step must be 1, or {' or '.join(map(str, step_blocks[1:]))}"
                         f" where a K part holds a multiple of it ({per_part} K-blocks), got "
                         f"{blocks_per_step!r}")
    if programs is not None:
        tiles = n // (compute_wgs * WG_ROWS)
        total, unit = ((tiles * k // BLOCK // blocks_per_step, "pipeline steps (weight tiles x "
                        "K-steps)") if k_parts == 1 else
                       (tiles * k_parts, "K parts (weight tiles x k_parts)"))
        if not (isinstance(programs, int) and 1 <= programs and total % programs == 0):
            raise ValueError(f"programs must be a positive int dividing the {total} {unit}, "
                             f"got {programs!r}")
        if k_splits != 1 or m > block_m:
            raise ValueError(f"programs (stream-K) needs one x tile (M <= block_m) and "
                             f"k_splits=1; got M={m}, block_m={block_m}, k_splits={k_splits}")
        if streamed_parts and step_unit(launch, n, k) % blocks_per_step:
            raise ValueError(f"blocks_per_step must divide K/{BLOCK}={k // BLOCK} and the "
                             f"{tiles * (k // BLOCK) // programs} K-blocks each of the "
                             f"{programs} CTAs runs (streamed K parts), got {blocks_per_step!r}")


def _scale_operand(w_scale: jax.Array, kind: str, n: int, k: int) -> tuple[jax.Array, str]:
    """The weight scale as the kernel reads it, and how (_kernel's `scales`): block scales as
    stored, (N/128, K/128), each CTA loading its rows once -- where TMA can move such a row
    (K/128 a multiple of 4 and at most 256); channel scales as stored, viewed (N/128, 128) --
    a row per 128 weight rows, as block scales (a TMA box holds <= 256 per dimension, and a
    streamed CTA loads several tiles'); the
    per-tensor scale as stored, (1, 1), read once from global memory; else (block scales of
    other K) weight_scale_rows' (K/128, N) rows, one per pipeline step. The same values
    multiply the same partial sums either way. Session 9: the rows cost an XLA pass of
    1.2-2.8 us per call on the H200 (benchmarks/decode_breakdown.py) and, for block scales,
    another 3% of the weight's bytes read."""
    kb = k // BLOCK
    if kind == "block" and kb % 4 == 0 and kb <= 256:
        return w_scale.astype(F32), "block"
    if kind == "channel":
        return w_scale.astype(F32).reshape(n // BLOCK, BLOCK), "channel"
    if kind == "tensor":
        return w_scale.astype(F32), "tensor"
    return weight_scale_rows(w_scale, kind, n, k), "rows"


def _launch(x: jax.Array, w: jax.Array, ws: jax.Array, *, out_dtype, stages, group_m,
            block_m, k_splits, k_parts, a_in_registers, interpret,
            blocks_per_step: int = 1, compute_wgs: int = 2, a_load: str = "wgmma",
            parts_sum: str = "cond", scales: str = "rows",
            programs: int | None = None,
            group_fmt: str | None = None, k_groups: int = 1,
            wgmma_halves: bool = False, k_perm: str | None = None,
            groups_sum: str = "park", row_finish: RowFinish | None = None) -> jax.Array:
    """The kernel on checked operands: ws float32 as _scale_operand gives it for `scales`
    ("rows": (K/128, N), weight_scale_rows; "groups": group_fmt's scales as stored, (N,
    K/group) viewed uint8; "none": not read); w e4m3, or int4 (e2m1 codes with
    scales="groups", or benchmarks/probe_w4_mgpu.py's 4-bit weight stream), or bf16 decoded
    weights with a_load="smem" (predecoded). row_finish: applied by the CTAs where they round
    16-bit output themselves (out_t), else by XLA to the float32 sums (N, M) before the
    transpose and the rounding to out_dtype (the same bits either way). k_perm: x's K-blocks
    permuted so (mgpu_relabel.permute_k), as the decoded weights' were."""
    m, k = x.shape
    n = w.shape[0]
    if a_load == "relabel_4x":
        if dtypes.itemsize_bits(w.dtype) != 8:  # (numpy reports int4 as one byte)
            raise ValueError(f"a_load='relabel_4x' reads 8-bit weights, got {w.dtype}")
        x = permute_k(x)
        if interpret:  # the interpreter cannot run inline Mosaic GPU: the same tile, by jnp
            w, a_load = permute_k(w), "wgmma"
    elif a_load == "words":  # e2m1 codes (checked by group_a16_matmul_mgpu, the one caller
        # that may ask for them); the kernel permutes in both modes
        k_perm = "halves"
    if k_perm is not None:  # x's K as the weights' reach the MMA (decode_words' pairing, or
        # predecoded weights permuted so)
        x = permute_k(x, k_perm)
    tile_rows = compute_wgs * WG_ROWS
    tiles, k_steps = n // tile_rows, k // BLOCK // blocks_per_step
    stream = None if programs is None else Stream.of(tiles, k_steps, programs, k_parts)
    first_sum = first_sum_kept(groups_sum, k_groups, k_splits, k_parts, parts_sum,
                               stream is not None)
    parked, stored_groups, reloaded = (first_sum == v for v in ("park", "store", "reload"))
    # split (and K-sharded) results are summed in float32 and rounded once; TMA stores rows
    # of >= 32 bytes (reloaded groups store pieces of the staging's columns; stored groups
    # write float32 slabs anyway)
    narrow = store_cols(block_m, first_sum) * out_dtype.itemsize < 32
    group_slabs, sum_groups = 0, 1 if parked or reloaded else k_groups
    if stream is not None:
        pieces = group_pieces(tiles, k_steps, programs, k_parts, k_groups,
                              folded=k_parts > 1 and parts_sum == "cond")
        group_slabs = int(pieces.max())
        slabs = group_slabs * k_groups
    else:
        slabs = k_splits * (k_parts if parts_sum == "store" else k_groups if stored_groups else 1)
    finished = not (writes_partials(slabs) or narrow or parked)
    # the row finish rides the CTAs' own rounding (16-bit y written by unstreamed launches)
    in_cta = row_finish is not None and finished and out_dtype.itemsize == 2 and stream is None
    kernel_out = (out_dtype if finished and (row_finish is None or in_cta) else jnp.dtype(F32))
    # a 16-bit kernel output is a finished one (float32 whenever slabs are added, XLA applies
    # the row finish or a first group is parked; reloaded groups finish theirs in the CTA):
    # unless streamed, the kernel then writes y, not y^T -- no XLA transpose of the output (H200,
    # session 20: 32 us of 896 at M=4096 on 8192x8192, benchmarks/profile_prefill.py)
    out_t = kernel_out.itemsize == 2 and stream is None
    stages = _stages(stages, block_m, x.dtype.itemsize, 4 if reloaded else kernel_out.itemsize,
                     a_in_registers or a_load == "smem",
                     blocks_per_step, compute_wgs, scales, k, stream.held if stream else 1,
                     dtypes.itemsize_bits(w.dtype),
                     GROUP_FORMATS[group_fmt].scale_bytes if scales == "groups" else 0,
                     store_cols(block_m, first_sum))
    # x is not padded to whole tiles (an XLA pass of 1-2 us at decode, session 9): TMA reads
    # the rows past its end as zeros, and their outputs are sliced off below. Mosaic GPU's
    # TMA tiling takes row counts of at most 8 or multiples of 8: others are padded to those.
    mp = cdiv(m, block_m) * block_m
    if m > X_ROWS_TILING and m % X_ROWS_TILING:
        x = jnp.pad(x, ((0, X_ROWS_TILING - m % X_ROWS_TILING), (0, 0)))
    out_type = jax.ShapeDtypeStruct((1, mp, n) if out_t else (slabs, n, mp), kernel_out)
    call = mgpu_kernel(
        functools.partial(_kernel, stages=stages, group_m=group_m,
                          a_in_registers=a_in_registers, block_m=block_m, k_splits=k_splits,
                          k_parts=k_parts, blocks=blocks_per_step, wgs=compute_wgs,
                          a_load=a_load, parts_sum=parts_sum, scales=scales, stream=stream,
                          group_fmt=group_fmt, k_groups=k_groups, group_slabs=group_slabs,
                          wgmma_halves=wgmma_halves, first_sum=first_sum, out_t=out_t,
                          row_post=(row_finish.factor, row_finish.op) if in_cta else None),
        out_type if not reloaded else
        (out_type, jax.ShapeDtypeStruct((n, mp), F32)),  # (the first groups' sums: read back,
        # dropped)
        n // tile_rows * (mp // block_m) * k_splits if stream is None else stream.programs,
        interpret, compute_wgs)
    # (the column values as the CTAs load them; unread without an in-CTA finish)
    post = row_finish.col if in_cta else jnp.zeros((BLOCK,), F32)
    y = call(w, x, ws, post)
    if reloaded:
        y = y[0]
    if out_t:
        return y[0, :m]
    if stream is not None:  # a tile's pieces (or parts) in K order: one slab a group
        y, slabs = _sum_pieces(y, pieces, tile_rows, k_groups), k_groups
        sum_groups = 1  # (the groups' sums, added in order below)
    # ranges (parts) in K order -- by group -- after (k_shards) the devices' are gathered
    yt = sum_device_splits(y, slabs, n, mp, groups=sum_groups)
    if row_finish is not None:  # (not in the CTAs: they wrote float32)
        yt = row_finish.xla(yt)
    return yt.T[:m].astype(out_dtype)
