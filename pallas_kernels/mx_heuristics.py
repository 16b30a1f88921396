"""Default tile configs for the group-scaled (NVFP4 / MXFP4 / MXFP8) kernels.

Small M: the packed weight must stream once, so tiles are narrow in M (the weight is the MMA's
64-row A operand: "swap") and K is split until there are several programs per SM (decode is
latency-bound, see benchmarks/NOTES.md); e4m3 weights at M=1 take the no-MMA gemv instead. Large M: large tiles, one K range -- though in default
mode M >= 1024 runs the dense path (mx_dense) instead of these kernels.

Deterministic mode: the K schedule (block_k, split_k, variant, block_n, warps, stages) comes
from (N, K) alone. Only block_m follows M (det_block_m): in the swap variant block_m is the
N extent of the same wgmma chain, which changes how many columns one instruction computes but
not how any one of them is summed. That claim is what the GPU batch-invariance test checks.
"""

from __future__ import annotations

import dataclasses

from .common import MatmulConfig, cdiv, next_pow2
from .fp8_heuristics import k_block, num_sms, split_for

__all__ = ["dequant_heuristic", "det_block_m", "fp8mma_heuristic"]


def det_block_m(m: int) -> int:
    return max(16, min(128, next_pow2(m)))


def dequant_heuristic(m: int | None, n: int, k: int, *, elem_bits: int,
                      group: int) -> MatmulConfig:
    """elem_bits: 4 (e2m1) or 8 (e4m3); group: elements per scale along K."""
    decode_k = 256 if elem_bits == 4 else 128  # 128 bytes of weight per row and step
    # Decode is latency-bound (NOTES.md): more K-splits keep more loads in flight. Measured on
    # the H200 (run 2): ~8 programs per SM beat ~2 and ~4 for e2m1 (geomean over 11 shapes);
    # e4m3 weights were measured at ~4 per SM only.
    if m is None:
        bk = max(group, k_block(k, decode_k))
        split = split_for(cdiv(n, 64), k, bk, target=2 * num_sms())
        return MatmulConfig(16, 64, bk, num_warps=4, num_stages=3, split_k=split,
                            variant="swap")
    if m == 1 and elem_bits == 8:
        # Session 3 (H200, 11 shapes): the no-MMA gemv 1x16x256 at ~8 programs/SM 1.12-1.29x
        # bf16 vs 0.95-1.21x for the 16-row tile. For e2m1 both gemv tiles lost (0.71-1.23x vs
        # 1.00-1.52x; benchmarks/NOTES.md "Session 3"), so e2m1 keeps the MMA tile at M=1.
        bk = max(group, k_block(k, 256))
        split = split_for(cdiv(n, 16), k, bk, target=8 * num_sms())
        return MatmulConfig(1, 16, bk, num_warps=4, num_stages=1, split_k=split, variant="gemv")
    if m <= 64:
        bm = max(16, next_pow2(m))
        bk = max(group, k_block(k, decode_k if m <= 16 else 128))
        target = ((8 if elem_bits == 4 else 4) if m <= 16 else 2) * num_sms()
        split = split_for(cdiv(m, bm) * cdiv(n, 64), k, bk, target=target)
        return MatmulConfig(bm, 64, bk, num_warps=4, num_stages=3, split_k=split,
                            variant="swap")
    if m <= 256:
        # Session 3 (H200; 8192^2, 4096x28672, 14336x4096 at M=256): 128 activation rows per
        # program decode each weight tile half as often as 64: 0.50-0.68x bf16 (NVFP4) and
        # 0.49-0.58x (MXFP8) vs 0.21-0.38x for 64x128x64; the dense path 0.34-0.43x.
        bk = max(group, k_block(k, 128))
        split = split_for(cdiv(m, 128) * cdiv(n, 64), k, bk, target=2 * num_sms())
        return MatmulConfig(128, 64, bk, num_warps=4, num_stages=3, split_k=split,
                            variant="swap")
    return MatmulConfig(128, 128, max(group, k_block(k, 64)), num_warps=8, num_stages=3,
                        variant="swap")


SMEM_BUDGET = 200 * 1024  # of the 227 KB a Hopper block may use; the rest for Triton's scratch


def stage_bytes(cfg: MatmulConfig, *, parts: int, elem_bits: int, group: int) -> int:
    """Shared memory one pipeline stage holds: activation parts, weight bytes, scales."""
    x = cfg.block_m * cfg.block_k * 2 * parts
    w = cfg.block_n * cfg.block_k * elem_bits // 8
    return x + w + cfg.block_n * (cfg.block_k // group)


def fit_smem(cfg: MatmulConfig, *, parts: int, elem_bits: int, group: int,
             shrink_m: bool) -> MatmulConfig:
    """Fewer stages (down to 2), then (shrink_m) a smaller block_m, until the stages fit.

    Neither changes the K order: stages only pipeline loads, block_m only changes how many
    rows one program computes.
    """
    while True:
        per = stage_bytes(cfg, parts=parts, elem_bits=elem_bits, group=group)
        # never more stages than the config asks for (the gemv runs with 1: it has no pipeline)
        stages = min(cfg.num_stages, max(2, SMEM_BUDGET // max(per, 1)))
        if per * stages <= SMEM_BUDGET or not shrink_m or cfg.block_m <= 16:
            return dataclasses.replace(cfg, num_stages=stages)
        cfg = dataclasses.replace(cfg, block_m=cfg.block_m // 2)


def with_det_block_m(cfg: MatmulConfig, m: int, *, parts: int = 1, elem_bits: int = 4,
                     group: int = 16) -> MatmulConfig:
    cfg = dataclasses.replace(cfg, block_m=det_block_m(m))
    return fit_smem(cfg, parts=parts, elem_bits=elem_bits, group=group, shrink_m=True)


def fp8mma_heuristic(m: int | None, n: int, k: int) -> MatmulConfig:
    """MXFP8 with fp8 MMAs over 32-wide K chunks (large M only; see mx_fp8mma).

    Each chunk's MMA result is a second (block_m, block_n) float32 tile beside the
    accumulator: 64x128 with 4 warps is the largest tile compiled without register spills.
    """
    bk = k_block(k, 128)
    split = 1
    if m is not None and m <= 256:
        split = split_for(cdiv(m, 64) * cdiv(n, 128), k, bk, target=num_sms())
    return MatmulConfig(64, 128, bk, num_warps=4, num_stages=4, split_k=split)
