"""Deterministic block-scaled W8A8 (`fp8_block`: 128x128 weight blocks, 1x128 activation groups)
on Mosaic GPU -- one K order at every M, run by the launch that suits M (session 49).

The order (a function of the unsharded K alone): K in det_k_parts(K) equal parts; within a part,
each 128-wide K-block's fp8 wgmma chain from zero, times its x rows' scales, times its weight
block's scale, added to the part's float32 total in K order (fp8_block_mgpu's per-block
arithmetic); the parts' totals added left to right (launch.fold_parts), then one rounding.

Launches (each the same sums, so a row's bits do not depend on M or on the launch):
  * "decode" (on a GPU, up to 64 rows: det_launch): swap-AB on the plain pipeline
    (fp8_a16_decode_mgpu.plain_slabs with e4m3 x): the weight tile is wgmma's A operand, x^T
    its B, one K part a CTA range; the parts' totals are added by the launch's cluster in the
    kernel (KernelFinish) or by XLA from float32 slabs. A swap-AB fp8 chain has the plain
    chain's bits (benchmarks/probe_swap_ab_bits.py, H100, session 49: 8 seeds x widths 8 / 16
    / 64).
  * "fold": fp8_block_mgpu (128 x 128 output tiles, warp-specialized, persistent) with the
    parts folded in each CTA, their sum parked in shared memory (see below).
  * "spread": the same kernel with the parts as CTAs of their own, float32 slabs added by XLA
    -- where the output tiles alone would leave most SMs idle, and inside common.k_shards
    (every device's slabs gathered and added in K order: the unsharded layer's bits).
Why not Triton's deterministic config at every M (the order before session 49): at M = 4096
it ran 613-702 TFLOP/s against the Mosaic kernel's 796-998 (H100, session 48), 1.29-1.55x
default mode's time; Mosaic's and Triton's bits differ (session 6), so one mode cannot mix them.
The interpreter (CPU) runs "fold" / "spread" at every M: there an 8-row x tile's dots round
differently from wider ones (fp8_block_a16_mgpu.DET_MIN_X_TILE), the 128-row tile's do not.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .common import current_k_shards, device_ranges
from .fp8_a16_decode_mgpu import (FP8_X_MAX_M, KernelFinish, finishes_in_kernel,
                                  plain_slabs, plain_stages)
from .fp8_block_mgpu import fp8_block_matmul_mgpu
from .fp8_heuristics import det_k_parts, num_sms, spread_pays
from .launch import sum_device_splits
from .mgpu_common import BLOCK, WG_ROWS, RowFinish

__all__ = ["fp8_block_det_mgpu", "det_launch", "DetLaunch", "LAUNCHES", "DECODE_MAX_ROWS",
           "DECODE_ALWAYS_ROWS", "CLUSTER_FINISH_MAX_M"]

F32 = jnp.float32
LAUNCHES = ("decode", "fold", "spread")
# The launch by M, from H100, session 49 (benchmarks/probe_det_block_mgpu.py, 4096x4096,
# 7168x36864, 14336x4096 at M = 1 / 16 / 64 / 256 / 4096, every launch forced, one run;
# h100_det_block_mgpu_s49.json). Times in us, default mode's (Triton's split-K decode below
# M = 256, the Mosaic kernel from there) first:
#   M = 1:  11.3 / 93.3 / 26.3 -- decode 11.6 / 93.5 / 25.5 (cluster finish), 11.6 / 102.2 /
#           26.6 (XLA's); fold 30.3 / 143.1 / 78.8, spread 21.2 / 172.2 / 40.8
#   M = 16: 12.5 / 95.5 / 27.9 -- decode 13.3 / 110.0 / 28.7 (XLA's), 15.8 / 109.9 / 31.2
#           (cluster)
#   M = 64: 14.1 / 120.7 / 32.5 -- decode 17.0 / 152.2 / 34.6, fold 31.4 / 145.5 / 80.5,
#           spread 23.7 / 198.9 / 43.4
#   M = 256: 25.1 / 174.2 / 68.6 -- fold 28.8 / 197.7 / 78.3, spread 41.3 / 395.9 / 68.5
#   M = 4096: 169.7 / 2200.9 / 555.3 -- fold 207.6 / 2777.6 / 627.8 (one K-block a step; two
#           spill the second total: 228.1 / - / 636.3), spread 545 / 5747 / 859
# So: "decode" up to DECODE_ALWAYS_ROWS rows, and up to DECODE_MAX_ROWS where the 128 x 128
# output tiles number fewer than the SMs (x tiles of 8, 16, then multiples of 16), the
# cluster's finish at 8-row tiles only; beyond, "spread" where fp8_heuristics.spread_pays'
# launch model says (it picked the faster at M = 256 on both shapes where it had to choose),
# else "fold" (session 49: at one K-block a step; since session 50 parked, below). Second
# run (h100_det_block_park_s49.json, M = 256 / 4096, with 8192x8192): fold 49.5 / 718.0
# against default's 48.1 / 596.4 there.
# park (the parts' sum in shared memory, so two K-blocks a step fit the registers) ran 1-5%
# ahead of fold at M = 4096 there; session 50 (benchmarks/probe_block_scale_load.py at
# 1c485fd, 5 shapes, M = 256 / 4096 / 16384, h100_scale_load_s50.json; K = 7168:
# h100_det_block_k7168_s50.json), with the weight scale read as one number:
# park at two K-blocks a step 3-15% ahead of the register fold at one (4096x4096 M = 4096:
# 201.3 against 206.8 us; 14336x4096 598.3 / 681.3; 18432x7168 1268.6 / 1495.2; 8192x8192
# 695.1 / 754.3; 7168x36864 / 7168x24576 at M = 4096, closing inside steps: 2490.5 / 2836.2,
# 1716.5 / 1865.7), within 3% behind it at M = 256 on 4096x4096 and 8192x8192. So the fold
# launch parks, at two K-blocks a step wherever K's K-block count is even -- K = 7168's parts
# of 7 close inside a step (fp8_block_mgpu). What park costs against default mode (1.07-1.27x
# at M = 4096) is its closes: each reads and writes the warpgroups' 64 KB of float32 totals in
# shared memory, which the wgmmas also read; deferring a close under the next MMAs (lazy,
# session 50) gained 0-2%. Parking 96 of the 128 columns (park_cols, the rest in registers;
# session 51, h100_det_block_cols_s51.json) ran 3% ahead at K = 4096 / 8192 and 1% behind at
# 14336 (M = 4096, one run). Session 53 repeated it twice (h100_det_block_c96_s53{,_2}.json,
# M = 4096, us, parked at 128 columns / 96): 4096x4096 206.8 / 199.8, 8192x8192 664.3-689.8 /
# 655.3-656.6, 8192x10240 819.0-819.2 / 791.1-791.3, 7168x24576 1693.2-1713.9 / 1639.1-1651.6
# ahead; 14336x4096 590.6-591.0 / 604.0-604.1 behind. So a part of up to PARK_COLS_MAX_BLOCKS
# K-blocks (K <= 8192 at 8 parts) parks 96 columns: with fewer K-blocks a part, closes are a
# larger share of the time, and a quarter of each close's bytes stays in registers.
DECODE_ALWAYS_ROWS = 16
DECODE_MAX_ROWS = 64
CLUSTER_FINISH_MAX_M = 8
PARK_COLS_MAX_BLOCKS = 8  # a part's K-blocks up to which the fold parks PARK_COLS_SHORT columns
PARK_COLS_SHORT = 96


class DetLaunch(NamedTuple):
    kind: str  # one of LAUNCHES
    parts: int  # the K parts on this device (inside k_shards: its share)
    blocks_per_step: int = 1  # fold / spread: K-blocks per pipeline step
    stages: int = 2  # decode: pipeline stages
    in_kernel_finish: bool = False  # decode: the cluster adds the parts and rounds
    park: bool = False  # fold: the finished parts' sum in shared memory (fp8_block_mgpu)
    park_cols: int = BLOCK  # park: its columns in shared memory, the others' in registers


def _local_parts(k: int) -> int:
    """The order's parts on this device: det_k_parts of the unsharded K (inside k_shards: this
    device's share of them; KShardError where the devices' slices would cut a part)."""
    shards = current_k_shards()
    count = 1 if shards is None else shards.count
    return device_ranges(det_k_parts(k * count, BLOCK), k * count, count)


def det_launch(m: int, n: int, k: int, *, out_dtype=jnp.bfloat16, interpret: bool = False,
               kind: str | None = None) -> DetLaunch:
    """The launch for M rows of an (N, K) product (kind: forced, else chosen by M)."""
    local = _local_parts(k)
    if kind is None:
        tiles = -(-m // BLOCK) * (n // BLOCK)
        if not interpret and (m <= DECODE_ALWAYS_ROWS
                               or m <= DECODE_MAX_ROWS and tiles < num_sms()):
            kind = "decode"
        elif current_k_shards() is not None or (
                local > 1 and spread_pays(m, n, k, tiles, local)):
            kind = "spread"
        else:
            kind = "fold"
    if kind not in LAUNCHES:
        raise ValueError(f"fp8_block_det_mgpu: launch must be one of {LAUNCHES}, got {kind!r}")
    if kind == "decode":
        stages = plain_stages(n // WG_ROWS * local, num_sms())
        return DetLaunch(kind, local, stages=stages, in_kernel_finish=(
            m <= CLUSTER_FINISH_MAX_M and finishes_in_kernel(
                m, local, out_dtype, deterministic=True, interpret=interpret)))
    if kind == "fold" and current_k_shards() is not None:
        raise ValueError("fp8_block_det_mgpu: inside k_shards the parts of every device are "
                         "added in K order after a gather: launch 'spread' (or None)")
    if kind == "spread":  # (a part's K-blocks must make whole steps)
        return DetLaunch(kind, local, blocks_per_step=2 if (k // BLOCK // local) % 2 == 0 else 1)
    park = local > 1
    short = park and k // BLOCK // local <= PARK_COLS_MAX_BLOCKS
    return DetLaunch(kind, local, blocks_per_step=2 if (k // BLOCK) % 2 == 0 else 1,
                     park=park, park_cols=PARK_COLS_SHORT if short else BLOCK)


def fp8_block_det_mgpu(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                       out_dtype=jnp.bfloat16, launch: str | DetLaunch | None = None,
                       interpret: bool = False) -> jax.Array:
    """y (M, N) = block-scaled xq (M, K) e4m3 [x_scale (M, K/128)] @ w (N, K) e4m3
    [w_scale (N/128, K/128)]^T in out_dtype, in the deterministic order above (N, K multiples
    of 128). launch: a kind of LAUNCHES or a DetLaunch (None: det_launch's choice); every
    launch gives the same bits."""
    m, k = xq.shape
    n = w.shape[0]
    if n % BLOCK or k % BLOCK or w.shape != (n, k):
        raise ValueError(f"fp8_block_det_mgpu: w must be (N, K) with N and K multiples of "
                         f"{BLOCK}, got w {tuple(w.shape)} for xq {tuple(xq.shape)}")
    if not isinstance(launch, DetLaunch):
        launch = det_launch(m, n, k, out_dtype=out_dtype, interpret=interpret, kind=launch)
    if launch.kind != "decode":
        return fp8_block_matmul_mgpu(xq, x_scale, w, w_scale, out_dtype=out_dtype,
                                     blocks_per_step=launch.blocks_per_step, group_m=16,
                                     programs=num_sms(), k_parts=launch.parts,
                                     spread=launch.kind == "spread", park=launch.park,
                                     park_cols=launch.park_cols, interpret=interpret)
    if m > FP8_X_MAX_M:
        raise ValueError(f"fp8_block_det_mgpu: the decode launch takes M <= {FP8_X_MAX_M}, "
                         f"got M={m}")
    if xq.dtype != jnp.dtype(jnp.float8_e4m3fn) or w.dtype != jnp.dtype(jnp.float8_e4m3fn):
        raise ValueError(f"fp8_block_det_mgpu: xq and w must be float8_e4m3fn, got {xq.dtype} "
                         f"and {w.dtype}")
    if x_scale.shape != (m, k // BLOCK) or w_scale.shape != (n // BLOCK, k // BLOCK):
        raise ValueError(f"fp8_block_det_mgpu: x_scale must be {(m, k // BLOCK)} and w_scale "
                         f"{(n // BLOCK, k // BLOCK)}, got {tuple(x_scale.shape)} and "
                         f"{tuple(w_scale.shape)}")
    out_dtype = jnp.dtype(out_dtype)
    finish = (KernelFinish(out_dtype, m, RowFinish(None, 1.0, "mul"))
              if launch.in_kernel_finish else None)
    # (block scales' columns padded for TMA's 16-byte rows)
    cs = jnp.pad(w_scale.astype(F32), ((0, 0), (0, -(k // BLOCK) % 4)))
    y = plain_slabs(xq, w, splits=launch.parts, stages=launch.stages, a_tile=None,
                    chains="block", chain_scales=cs, x_scales=x_scale, finish=finish,
                    interpret=interpret)
    if finish is not None:
        return y
    total = sum_device_splits(y, y.shape[0], n, y.shape[2])
    return total[:, :m].T.astype(out_dtype)

