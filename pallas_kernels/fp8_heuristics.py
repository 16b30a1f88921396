"""Default tile configs for the fp8 kernels (the last step of explicit -> cached -> heuristic).

Two regimes. Small M is memory-bound: the weight must stream once at full bandwidth, so tiles
are narrow in N and K is split until there are about two programs per SM. Large M is
compute-bound: large tiles for MMA efficiency. Deterministic mode (m=None) gets one config per
(N, K, kind) that never looks at M; `spread_k_parts` may then launch an fp8 x fp8 config's K
parts as split programs at small M (the same sums, so the same bits).
"""

from __future__ import annotations

import dataclasses

import jax

from .common import MatmulConfig, NUM_SMS_DEFAULT, cdiv, next_pow2

__all__ = ["num_sms", "k_block", "split_for", "det_k_parts", "spread_k_parts", "spread_wins",
           "spread_pays",
           "w8a16_heuristic", "w8a8_heuristic"]


def num_sms() -> int:
    try:
        return int(getattr(jax.devices()[0], "core_count", 0)) or NUM_SMS_DEFAULT
    except Exception:  # pragma: no cover
        return NUM_SMS_DEFAULT


def k_block(k: int, pref: int) -> int:
    """Largest power of two <= pref (>= 16) dividing K, so no K-step needs a mask; else pref."""
    b = pref
    while b >= 16:
        if k % b == 0:
            return b
        b //= 2
    return pref


def split_for(tiles: int, k: int, bk: int, *, target: int, min_steps: int = 4,
              max_split: int = 16) -> int:
    """Power-of-two split of the K-steps that brings tiles*split up to `target` programs."""
    steps = cdiv(k, bk)
    s = 1
    while (tiles * s * 2 <= target and steps % (s * 2) == 0 and steps // (s * 2) >= min_steps
           and s * 2 <= max_split):
        s *= 2
    return s


def _unroll(k: int, bk: int, most: int = 4) -> int:
    """Largest k_unroll <= most (power of two) that keeps K a multiple of block_k * k_unroll."""
    u = most
    while u > 1 and k % (bk * u):
        u //= 2
    return u


def _small_m(m: int, n: int, k: int, *, block_k: int, unroll: int, stages: int) -> MatmulConfig:
    bm = max(16, min(64, next_pow2(m)))
    bk = k_block(k, block_k)  # block scales run block_k > 128 as 128-wide sub-steps
    u = _unroll(k, bk, unroll)
    tiles = cdiv(m, bm) * cdiv(n, 64)
    split = split_for(tiles, k, bk * u, target=2 * num_sms())
    return MatmulConfig(bm, 64, bk, num_warps=4, num_stages=stages, split_k=split, k_unroll=u)


def _swap_mid(m: int | None, n: int, k: int, *, target_per_sm: int) -> MatmulConfig:
    """Weights as the 128-row MMA operand, 64 activation rows, integer-op e4m3 conversion."""
    bk = k_block(k, 128)
    tiles = (1 if m is None else cdiv(m, 64)) * cdiv(n, 128)
    split = split_for(tiles, k, bk, target=target_per_sm * num_sms())
    return MatmulConfig(64, 128, bk, num_warps=4, num_stages=3, split_k=split, variant="swap",
                        fast_convert=True)


def w8a16_heuristic(m: int | None, n: int, k: int, *, per_block: bool) -> MatmulConfig:
    """Session-2 sweep v3 (H200; 8192^2, 4096^2, 4096x28672; benchmarks/NOTES.md):
    M=1 gemv 1x16x256 w4 s4 at ~8 programs/SM 1.35-1.52x bf16 vs 1.21-1.56x for the 16-row MMA
    tile (gemv loses from M=2 on); sweep v4 (session 3): 1x8x256 with k_unroll 4 1.45-1.52x vs
    1.22-1.51x for 1x16x256 (same run; 8192^2, 4096^2, 4096x28672, 18432x7168); at M=2 the
    best gemv only ties the 16-row MMA tile (0.94-1.19x vs 0.87-1.26x), at M=4 it loses;
    M=64 swap-AB 64x128x128 + fast_convert 1.17-1.24x vs
    0.63-0.69x for run 1's 64x64x256; M=256 the same tile 0.52-0.63x vs 0.21-0.29x.
    M=4096 (run 2): swap-AB 256x128x64 w8 s3 449 TFLOP/s vs 371 for the best non-swapped tile;
    with fast_convert (session-2 grid, 8192x{8192,10240}) 0.69x bf16 vs 0.61x at M=4096."""
    if m is None:  # batch-invariant: one config for every M (the M=17..256 tile, split by N, K)
        return _swap_mid(None, n, k, target_per_sm=1)
    if m == 1:  # sweep v4 (session 3): 8-row tiles, 4 K-steps' loads hoisted, ~8 programs/SM
        bk = k_block(k, 256)
        u = _unroll(k, bk, 4)
        split = split_for(cdiv(n, 8), k, bk * u, target=8 * num_sms())
        return MatmulConfig(1, 8, bk, num_warps=4, num_stages=1, split_k=split, variant="gemv",
                            k_unroll=u)
    if m <= 16:
        return _small_m(m, n, k, block_k=128, unroll=4, stages=3)
    if m <= 256:
        return _swap_mid(m, n, k, target_per_sm=2)
    if per_block:  # 128-wide K-steps: one block-scale multiply per step (sweep v3: 0.43x vs 0.25x)
        return MatmulConfig(128, 128, k_block(k, 128), num_warps=8, num_stages=3, variant="swap",
                            fast_convert=True)
    if m <= 512:
        return MatmulConfig(128, 128, k_block(k, 64), num_warps=8, num_stages=4, variant="swap")
    return MatmulConfig(256, 128, k_block(k, 64), num_warps=8, num_stages=3, variant="swap",
                        fast_convert=True)


# fp8 x fp8 at M > 32: promote the MMA accumulator every 128 K (DeepSeek-V3's interval).
# Run 2, M=4096: 64x128x128 w4 s4 p128 g16 720 TFLOP/s (8192^2 per-token), 656 (block,
# 7168x24576); Pallas' per-instruction promotion gave 331-358 in run 1. Measured error of
# p128 vs float64 of the same codes: 1.3e-4 normwise (per-instruction: 2.4e-7).
_LARGE_FP8 = dict(num_warps=4, num_stages=4, promote_k=128, group_m=16)


def det_k_parts(k: int, bk: int, most: int = 8) -> int:
    """K parts of a deterministic single-split schedule: the most (<= `most`, a power of two)
    that cut the K-steps evenly, so row-parallel layers over up to `most` devices can be
    bitwise the unsharded layer (common.k_shards)."""
    steps = cdiv(k, bk)
    parts = most
    while parts > 1 and steps % parts:
        parts //= 2
    return parts


# spread_k_parts' launch model, fitted to deterministic fp8_block's two launches (H100, session
# 48, benchmarks/probe_det_w8a8_mgpu.py --spread, h100_det_spread_s48.json: 11 shapes at
# M = 1 / 64 / 256 / 1024, both launches in one run). With T output tiles on S SMs (T < S):
#   in the program: max(weight bytes / (BW * min(1, SM_SHARE * T / S)), flops / (F * T / S))
#   spread:         max(weight bytes / BW, flops / F) + float32 partials written and read / BW
#                   + the partials' sum (its own launch)
# The model picks the faster launch in 15 of the 16 T < S cases measured (8192x8192 M = 64:
# spread, 6% behind). "Fewer tiles than SMs", the rule before it, spread 4096x4096 at M = 256
# (128 tiles) into 8 float32 slabs of 256 x 4096: 42.7 us against 21.1 in the program (default
# mode's Mosaic kernel: 25.5); also 14336x4096 M = 256 (76.3 / 63.6), 8192x10240 M = 64
# (49.6 / 42.3), 4096x6144 M = 64 (23.1 / 21.0). From T >= S the parts stay in the program
# (measured: 0.3-0.98x spread's time, but 7168x36864 M = 1, 288 tiles: 1.20x).
SPREAD_BW = 2.8e12  # bytes/s: the weight stream with every SM busy (~the copy figure)
SPREAD_SM_SHARE = 1.18  # one SM's program streams this many times its 1 / S share of BW
SPREAD_FLOPS = 620e12  # the deterministic fp8 x fp8 config's rate with every SM busy
SPREAD_SUM_S = 3e-6  # seconds: the partials' sum


def spread_wins(m: int, n: int, k: int, cfg: MatmulConfig) -> bool:
    """Whether cfg's k_parts run faster as split_k programs (their float32 partials summed after)
    than inside each program, by the model above; never once the tiles fill the SMs."""
    return spread_pays(m, n, k, cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n), cfg.k_parts)


def spread_pays(m: int, n: int, k: int, tiles: int, parts: int) -> bool:
    """spread_wins' model for any launch of `tiles` output tiles whose K runs in `parts` parts
    (also fp8_block_det's Mosaic launches: H100, session 49, it picked the faster of fold and
    spread at M = 256 on 4096x4096 and 14336x4096 -- 28.6 / 40.9 us modelled, 28.8 / 41.3
    measured on the first)."""
    sms = num_sms()
    if tiles >= sms:
        return False
    busy = tiles / sms
    weight, flops = n * k, 2.0 * m * n * k  # (e4m3 weights: a byte each)
    t_in = max(weight / (SPREAD_BW * min(1.0, SPREAD_SM_SHARE * busy)),
               flops / (SPREAD_FLOPS * busy))
    partials = 2 * 4 * m * n * parts
    t_spread = (max(weight / SPREAD_BW, flops / SPREAD_FLOPS) + partials / SPREAD_BW
                + SPREAD_SUM_S)
    return t_spread < t_in


def spread_k_parts(cfg: MatmulConfig, m: int, n: int, k: int) -> MatmulConfig:
    """A k_parts config launched as split_k=k_parts programs where that runs faster
    (spread_wins: its tiles alone would leave SMs idle, and the partials cost less than the
    idle SMs). The K order is the same -- each part from zero, part sums added left to right,
    scales after (bitwise on the H200: test_gpu_k_parts_are_the_split_k_sums) -- so this
    M-dependent choice keeps deterministic mode batch-invariant; only the launch changes."""
    if cfg.k_parts == 1 or cfg.split_k != 1 or not spread_wins(m, n, k, cfg):
        return cfg
    return dataclasses.replace(cfg, split_k=cfg.k_parts, k_parts=1)


def w8a8_heuristic(m: int | None, n: int, k: int, *, per_block: bool) -> MatmulConfig:
    del per_block
    if m is None:  # the large-M default tile, so deterministic mode costs ~nothing at M > 32;
        # K in up to 8 in-program parts (one more accumulator) for bitwise row parallelism
        bk = k_block(k, 128)
        return MatmulConfig(64, 128, bk, k_parts=det_k_parts(k, bk), **_LARGE_FP8)
    if m <= 32:  # fp8 MMA with 16-row tiles (mma.sync: precise, 2.4e-7 vs float64)
        return _small_m(m, n, k, block_k=256, unroll=1, stages=4)
    bk = k_block(k, 128)
    split = split_for(cdiv(m, 64) * cdiv(n, 128), k, bk, target=num_sms())
    return MatmulConfig(64, 128, bk, split_k=split, **_LARGE_FP8)
