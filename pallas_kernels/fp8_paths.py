"""Which implementation an fp8 kernel call runs: its own Triton kernel ('pallas'), one XLA GEMM
of the stored codes ('dense', fp8_dense), or a Mosaic GPU wgmma kernel ('mgpu': fp8_block_mgpu
for block-scaled W8A8, fp8_block_a16_mgpu for W8A16). One rule for both fp8 kernels, and for
describe_config.

Deterministic mode never takes the dense path (cuBLAS picks its summation order by shape),
and whichever kernel it runs, it runs at every M: the Mosaic kernels' bits differ from the
Triton kernels' even in the same K order (probe_det_mgpu.py, session 6). So W8A16 with 16-bit
x and N, K multiples of 128 runs the Mosaic kernel's M-free schedule (fp8_block_a16_mgpu.
det_params) at every M on sm_90 -- up to 16 rows of some shapes on the plain decode kernel,
which computes that schedule's sums to the bit -- block W8A8 (since session 49) fp8_block_det's
one K order by its launch for M (swap-AB decode, or fp8_block_mgpu with K parts), and
everything else the Triton kernels' M-free configs. An explicit tile config or path wins.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .fp8_a16_decode_mgpu import decode_fits, det_fold_parts
from .fp8_block_a16_mgpu import mid_m_fills
from .fp8_dense import FUSED_CONVERT_MAX_M
from .mgpu_common import BLOCK

__all__ = ["fp8_path", "mosaic_wgmma_ok", "DENSE_MIN_M", "W8A8_DENSE_MIN_M", "MGPU_MIN_M",
           "MGPU_A16_MIN_M", "DENSE_A16_DECODE_M", "DECODE_BLOCK_MAX_K", "DET_DECODE_MAX_SIDE",
           "DET_DECODE_MAX_N", "det_decode_wins", "PATHS"]

PATHS = ("pallas", "dense", "mgpu", "decode")
# From here on default mode leaves the Triton kernels (session-4/5 H200 sweeps, NOTES.md).
# Whole-K scales: 1.16-1.36x bf16 vs the Triton kernel's 1.01-1.11x (fp8 x fp8, 8192^2).
DENSE_MIN_M = 1024
# fp8 x fp8 with whole-K scales (fp8_per_tensor's static, fp8_ptpc's per-token activations)
# take the dense path from here: H200, session 19 (sweep_fp8.py --parts mid_m,mid_m_w8a8, 4
# shapes, same runs), dense over the Triton kernel at M=128-768: 1.03-1.45x (14336x4096 at
# 256: 1.45x / 1.45x), at M=64 0.93-1.08x, at M=16 0.89-1.12x (Triton keeps decode).
W8A8_DENSE_MIN_M = 128
# Block W8A8: 0.78-1.17x bf16 vs Triton's 0.70-0.97x (4 shapes, M=256..16384, session 5).
# W8A16, every scale kind: 0.71-0.86x vs Triton's 0.44-0.54x at M=256..4096 (block) and
# M=256 (per-channel; the dense path takes over at DENSE_MIN_M) (3 shapes, session 6).
MGPU_MIN_M = 256
# Below MGPU_MIN_M weight-only takes the Mosaic kernel's decode settings (small x tiles, K
# ranges): block scales 1.07-1.65x bf16 at M=1..64 vs Triton's 0.78-1.13x (6 shapes, session
# 6). Per-channel and per-tensor from M=1 too since the kernel reads the stored scales itself
# (session 9: the Triton gemv ran 1.37-1.63x at M=1, the Mosaic kernel 1.39-2.04x with
# channel scales, 11 shapes).
MGPU_A16_MIN_M = {"block": 1, "channel": 1, "tensor": 1}
# ... except at these M, where weight-only with whole-K scales takes the dense path instead: XLA
# fuses the codes' conversion into its own GEMM there (fp8_dense.FUSED_CONVERT_MAX_M). H200,
# session 24 (sweep_fp8.py --parts a16_small_m, 11 shapes, same run), dense / Mosaic time,
# per-channel (per-tensor): M=2 0.80-0.99 (0.82-1.00), geomean 0.91 (0.92); M=4 0.80-0.99
# (0.82-1.00), 0.91 (0.90); M=8 0.84-1.05 (0.86-1.04), 0.95 (0.95) -- 1.56-1.64x bf16 ->
# 1.71-1.76x (geomean). At M=1 it gains on 4096x4096 only (0.93-0.95), is even on 4096x6144 and
# 4096x28672 and behind on the rest (1.03-1.95: XLA's M=1 product is a reduction, not that
# GEMM); from M=16 it is even (geomean 1.01-1.04), from 128 behind (1.04-1.18).
DENSE_A16_DECODE_M = (2, FUSED_CONVERT_MAX_M)
# Weight-only with whole-K scales at the other M up to DECODE_MAX_M (1 and 9-16) takes the
# plain-pipeline decode kernel (fp8_a16_decode_mgpu: several CTAs an SM). H200, session 26
# (probe_decode_plain.py, same runs): at M=1 1.58-1.98x bf16 where the Mosaic kernel ran
# 1.34-1.97x (11 shapes), at M=16 1.43-1.91x vs 1.21-1.75x (4 shapes); at M=8 even with the
# dense path (0.97-1.05), which keeps M=2-8.
# 128x128 block scales take it at every M up to DECODE_MAX_M up to this K (each K-block's
# chain times its scale, added in K order), the Mosaic kernel beyond (the dense path needs
# whole-K scales). H200, Mosaic time / this kernel's at its decode_params launch, 11 shapes,
# same runs (probe_decode_plain.py --format fp8_block_a16 --rule): session 29
# (h200_decode_block_plain_s29.json) K <= 14336 (9 shapes) 0.99-1.11 at M=1 (geomean 1.05;
# 0.99 on 8192x57344), 1.00-1.09 at M=16 (1.06); beyond it 18432x7168 0.93 / 0.95, 28672x8192
# 0.99 / 1.01. Session 30 (h200_decode_block_m2_8_s30.json) M=2 / 4 / 8, K <= 14336: 1.03-1.10
# / 1.04-1.22 / 1.01-1.10 except 8192x57344 0.99 / 0.98 / 0.99; beyond: 0.93-0.98.
DECODE_BLOCK_MAX_K = 14336
# Deterministic mode runs weight-only up to DECODE_MAX_M rows on that kernel in the Mosaic
# kernel's order (fp8_a16_decode_mgpu(deterministic=True): the same bits -- the GPU test
# test_gpu_deterministic_order_is_the_mosaic_kernels_bitwise) where N or K is at most
# DET_DECODE_MAX_SIDE, and from 9 rows N at most DET_DECODE_MAX_N. H200, session 29
# (probe_decode_plain.py --grid none --det, h200_decode_det_plain_s29*.json, same runs),
# Mosaic det time / this kernel's, per-channel, M=1: 4096x{4096,6144,28672} 1.14 / 1.05 /
# 1.08, 14336x4096 1.05; but 8192x8192 0.97, 8192x57344 0.96, 28672x8192 0.91, 7168x24576
# 0.97, 7168x36864 0.98, 18432x7168 0.85 (8192x10240 1.03). M=16: 1.07 / 1.01 / 0.97 (0.97
# again in a second run), 1.04. Session 30 (h200_decode_det_m2_8_s30.json), M=2 / 8:
# 4096x6144 0.96 / 1.07, 4096x28672 1.04 / 1.00, 14336x4096 1.05 / 1.07; 8192x10240 1.07 /
# 1.03 (left to the Mosaic kernel: one shape, within 7%), 7168x24576 1.00 / 0.97, 8192x57344
# 0.94 / 0.92.
# Also, since session 46, wherever the kernel folds its parts in the CTA at default mode's K
# ranges (det_fold_parts) -- with block scales up to DECODE_BLOCK_MAX_K, as default mode. H100
# (probe_decode_finish.py --det, h100_fold_auto_s46.json, same run), per-channel, M = 1 / 16,
# the fold / default mode: 4096x28672 1.01 / 1.01, 8192x8192 1.00 / 1.01, 7168x24576 1.00 /
# 1.02, 18432x7168 0.98 / 0.98, where deterministic mode took 1.13 (the slabs) / 1.25 (the
# Mosaic kernel, as on the other three: 1.08 / 1.09, 1.10 / 1.12, 1.05 / 1.06).
# (The interpreter keeps the Mosaic kernel: there its x tile, not the GPU's, sets the bits.)
DET_DECODE_MAX_SIDE = 4096
DET_DECODE_MAX_N = 16384


def mosaic_wgmma_ok(interpret: bool) -> bool:
    """The Mosaic GPU kernel uses Hopper's wgmma: sm_90 only (its interpreter: anywhere)."""
    if interpret:
        return True
    dev = jax.devices()[0]
    return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")).startswith("9.")


def det_decode_wins(m: int, n: int, k: int, interpret: bool, out_dtype=jnp.bfloat16,
                    w_scale_kind: str = "channel") -> bool:
    """Whether deterministic mode runs this weight-only product on the plain decode kernel (in
    the Mosaic kernel's order, the same bits) rather than on the Mosaic kernel (out_dtype: the
    product's output, which decides whether the kernel can fold its parts in the CTA)."""
    if interpret or not decode_fits(m, n, k):
        return False
    if min(n, k) <= DET_DECODE_MAX_SIDE and (m <= 8 or n <= DET_DECODE_MAX_N):
        return True
    return ((w_scale_kind != "block" or k <= DECODE_BLOCK_MAX_K) and det_fold_parts(
        "fp8_a16_decode_mgpu", m, n, k, out_dtype, interpret=interpret) is not None)


def fp8_path(m: int, *, x_scale_kind: str, w_scale_kind: str, deterministic: bool,
             config=None, path: str | None = None, interpret: bool = False,
             n: int = 0, k: int = 0, x_dtype=None, out_dtype=None) -> str:
    """'dense' when every scale is constant along K, at M >= DENSE_MIN_M weight-only and at
    M >= W8A8_DENSE_MIN_M with fp8 activations; where wgmma exists,
    'mgpu' for block-scaled W8A8 (128x128 weight blocks, 1x128 activation groups) at M >=
    MGPU_MIN_M, and for weight-only (x_scale_kind "none") with 16-bit x and N, K multiples of
    BLOCK (n, k, x_dtype: the problem's) at M >= MGPU_A16_MIN_M -- whole-K scales only where
    its launch fills its waves (fp8_block_a16_mgpu.mid_m_fills) and M is outside
    DENSE_A16_DECODE_M, else 'dense', and below that 'decode' (fp8_a16_decode_mgpu) at
    M <= DECODE_MAX_M -- whole-K scales outside DENSE_A16_DECODE_M, block scales up to
    DECODE_BLOCK_MAX_K; else 'pallas'. out_dtype: the output's (None: x_dtype).
    deterministic: for that weight-only case 'mgpu' at every M, except 'decode' (the same
    order, the same bits) where det_decode_wins; for block W8A8 where wgmma exists 'mgpu'
    (fp8_block_det: its launches by M give the same bits); else 'pallas'."""
    if path is not None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        return path
    if config is not None:
        return "pallas"
    a16_mgpu = (x_scale_kind == "none" and n and k and n % BLOCK == 0 and k % BLOCK == 0
                and x_dtype is not None and jnp.dtype(x_dtype).itemsize == 2)
    if deterministic:
        if (x_scale_kind, w_scale_kind) == ("group", "block") and mosaic_wgmma_ok(interpret):
            return "mgpu"
        if not (a16_mgpu and mosaic_wgmma_ok(interpret)):
            return "pallas"
        return "decode" if det_decode_wins(m, n, k, interpret, out_dtype or x_dtype,
                                           w_scale_kind) else "mgpu"
    dense_min = DENSE_MIN_M if x_scale_kind == "none" else W8A8_DENSE_MIN_M
    whole_k = x_scale_kind in ("none", "tensor", "row") and w_scale_kind in ("tensor", "channel")
    if m >= dense_min and whole_k:
        return "dense"
    if not mosaic_wgmma_ok(interpret):
        return "pallas"
    if a16_mgpu and whole_k and not mid_m_fills(m, n):
        return "dense"  # (MID_M_MIN_FILL: the Mosaic launch would leave its last wave part-empty)
    if a16_mgpu and whole_k and DENSE_A16_DECODE_M[0] <= m <= DENSE_A16_DECODE_M[1]:
        return "dense"
    if a16_mgpu and decode_fits(m, n, k) and (  # (M <= DECODE_MAX_M)
            whole_k or w_scale_kind == "block" and k <= DECODE_BLOCK_MAX_K):
        return "decode"
    if m >= MGPU_MIN_M and (x_scale_kind, w_scale_kind) == ("group", "block"):
        return "mgpu"
    if a16_mgpu and m >= MGPU_A16_MIN_M[w_scale_kind]:
        return "mgpu"
    return "pallas"
