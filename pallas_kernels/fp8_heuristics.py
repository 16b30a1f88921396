"""Default tile configs for the fp8 kernels (the last step of explicit -> cached -> heuristic).

Two regimes. Small M is memory-bound: the weight must stream once at full bandwidth, so tiles
are narrow in N and K is split until there are about two programs per SM. Large M is
compute-bound: large tiles for MMA efficiency. Deterministic mode (m=None) gets one config per
(N, K, kind) that never looks at M.
"""

from __future__ import annotations

import jax

from .common import MatmulConfig, NUM_SMS_DEFAULT, cdiv, next_pow2

__all__ = ["num_sms", "k_block", "split_for", "w8a16_heuristic", "w8a8_heuristic"]


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


def w8a16_heuristic(m: int | None, n: int, k: int, *, per_block: bool) -> MatmulConfig:
    """Run 2 (H200, 8192^2): M=16 16x64x128 s3 k_unroll=4 35.6 us vs 38.8 for 16x64x256 s4;
    M=4096 swap-AB 256x128x64 w8 s3 449 TFLOP/s vs 371 for the best non-swapped tile."""
    del per_block
    if m is None:  # batch-invariant: one config for every M (run 2: best at M=1 and 4096)
        bk = k_block(k, 64)
        split = split_for(cdiv(n, 128), k, bk, target=num_sms())
        return MatmulConfig(64, 128, bk, num_warps=4, num_stages=4, split_k=split)
    if m <= 16:
        return _small_m(m, n, k, block_k=128, unroll=4, stages=3)
    if m <= 64:
        # Not k_unroll: 4 x (64x128 bf16 + 64x128 e4m3) per stage asked 272 KB of shared memory
        # (run 3, M=64; limit 227 KB). This is run 1's config, GPU-tested at M=64.
        return _small_m(m, n, k, block_k=256, unroll=1, stages=4)
    if m <= 256:
        bk = k_block(k, 128)
        split = split_for(cdiv(m, 64) * cdiv(n, 128), k, bk, target=num_sms())
        return MatmulConfig(64, 128, bk, num_warps=4, num_stages=4, split_k=split)
    if m <= 512:
        return MatmulConfig(128, 128, k_block(k, 64), num_warps=8, num_stages=4, variant="swap")
    return MatmulConfig(256, 128, k_block(k, 64), num_warps=8, num_stages=3, variant="swap")


# fp8 x fp8 at M > 32: promote the MMA accumulator every 128 K (DeepSeek-V3's interval).
# Run 2, M=4096: 64x128x128 w4 s4 p128 g16 720 TFLOP/s (8192^2 per-token), 656 (block,
# 7168x24576); Pallas' per-instruction promotion gave 331-358 in run 1. Measured error of
# p128 vs float64 of the same codes: 1.3e-4 normwise (per-instruction: 2.4e-7).
_LARGE_FP8 = dict(num_warps=4, num_stages=4, promote_k=128, group_m=16)


def w8a8_heuristic(m: int | None, n: int, k: int, *, per_block: bool) -> MatmulConfig:
    del per_block
    if m is None:  # = the large-M default, so deterministic mode costs nothing at M > 32
        return MatmulConfig(64, 128, k_block(k, 128), **_LARGE_FP8)
    if m <= 32:  # fp8 MMA with 16-row tiles (mma.sync: precise, 2.4e-7 vs float64)
        return _small_m(m, n, k, block_k=256, unroll=1, stages=4)
    bk = k_block(k, 128)
    split = split_for(cdiv(m, 64) * cdiv(n, 128), k, bk, target=num_sms())
    return MatmulConfig(64, 128, bk, split_k=split, **_LARGE_FP8)
