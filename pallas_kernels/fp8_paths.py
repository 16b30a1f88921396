"""Which implementation an fp8 kernel call runs: its own Triton kernel ('pallas'), one XLA GEMM
of the stored codes ('dense', fp8_dense), or the Mosaic GPU block kernel ('mgpu',
fp8_block_mgpu). One rule for both fp8 kernels, and for describe_config.

Default mode only: both other paths fix their summation order by the shape's launch (cuBLAS's
choice, or the 128-row CTA tiles), so deterministic mode keeps the Triton kernels' M-free
schedules. An explicit tile config or path wins.
"""

from __future__ import annotations

import jax

__all__ = ["fp8_path", "mosaic_wgmma_ok", "DENSE_MIN_M", "MGPU_MIN_M", "PATHS"]

PATHS = ("pallas", "dense", "mgpu")
# From here on default mode leaves the Triton kernels (session-4/5 H200 sweeps, NOTES.md).
# Whole-K scales: 1.16-1.36x bf16 vs the Triton kernel's 1.01-1.11x (fp8 x fp8, 8192^2).
DENSE_MIN_M = 1024
# Block scales: 0.78-1.17x bf16 vs Triton's 0.70-0.97x (4 shapes, M=256..16384).
MGPU_MIN_M = 256


def mosaic_wgmma_ok(interpret: bool) -> bool:
    """The Mosaic GPU kernel uses Hopper's wgmma: sm_90 only (its interpreter: anywhere)."""
    if interpret:
        return True
    dev = jax.devices()[0]
    return dev.platform == "gpu" and str(getattr(dev, "compute_capability", "")).startswith("9.")


def fp8_path(m: int, *, x_scale_kind: str, w_scale_kind: str, deterministic: bool,
             config=None, path: str | None = None, interpret: bool = False) -> str:
    """'dense' at M >= DENSE_MIN_M when every scale is constant along K; 'mgpu' at M >=
    MGPU_MIN_M for block-scaled W8A8 (128x128 weight blocks, 1x128 activation groups) where
    wgmma exists; else 'pallas'. x_scale_kind "none": weight-only."""
    if path is not None:
        if path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {path!r}")
        return path
    if deterministic or config is not None:
        return "pallas"
    if (m >= DENSE_MIN_M and x_scale_kind in ("none", "tensor", "row")
            and w_scale_kind in ("tensor", "channel")):
        return "dense"
    if (m >= MGPU_MIN_M and (x_scale_kind, w_scale_kind) == ("group", "block")
            and mosaic_wgmma_ok(interpret)):
        return "mgpu"
    return "pallas"
