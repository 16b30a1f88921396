"""MXFP8 matmuls: e4m3 weights with an e8m0 exponent byte per 32 along K.

Two kernels (benchmarks/NOTES.md has the measurements):
  * bf16 dequantization (mx_core): e4m3 * 2**k is exact in bf16, bf16 MMAs. Serves weight-only
    (bf16/f16/f32 activations as exact bf16 parts) and W8A8 (the quantized activation, exact in
    bf16). Its K order does not depend on M, so it is the deterministic path for every M; at
    large M in default mode the dense path (mx_dense) runs instead.
  * fp8 MMAs per 32-wide chunk (mx_fp8mma), W8A8 only, when asked for (variant="fp8mma"):
    the per-chunk scaling makes it CUDA-core bound, measured slower than the bf16 path.
    variant="fp8mma_mgpu" ("_f4": four chunks in flight) runs the same order on Mosaic GPU's
    warp-specialized pipeline (mx_fp8_mgpu, session 52): 354-444 TFLOP/s at M = 4096, 0.47-0.66x
    bf16, where the bf16 path ran 661-771 (H100, session 53) -- so it is not dispatched.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

from .common import MatmulConfig, resolve_config
from .fp4_matmul import dequant_matmul
from .mx_decode import e8m0_to_f32
from .mx_fp8_mgpu import mxfp8_matmul_mgpu
from .mx_fp8mma import mxfp8_fp8mma_matmul
from .mx_heuristics import fp8mma_heuristic

__all__ = ["mxfp8_matmul", "mxfp8_w8a8_matmul", "fp8mma_config", "MXFP8_KERNEL",
           "MXFP8_FP8MMA_KERNEL", "FP8MMA_MIN_M"]

MXFP8_KERNEL = "mxfp8_dequant"
MXFP8_FP8MMA_KERNEL = "mxfp8_fp8mma"
FP8MMA_MIN_M = None  # never by default: measured slower than bf16 dequantization (NOTES.md)
# the Mosaic GPU fp8-MMA variants: chunks whose wgmmas are issued before the first is scaled
MGPU_VARIANTS = {"fp8mma_mgpu": 2, "fp8mma_mgpu_f4": 4}
VARIANTS = ("bf16", "fp8mma", *MGPU_VARIANTS)


def fp8mma_config(m: int, n: int, k: int, config: MatmulConfig | None = None) -> MatmulConfig:
    """explicit -> cached -> heuristic (default mode only: no batch-invariant config)."""
    return resolve_config(MXFP8_FP8MMA_KERNEL, m=m, n=n, k=k, deterministic=False,
                          explicit=config, extra="", heuristic=fp8mma_heuristic)


def mxfp8_matmul(x_parts: Sequence[jax.Array], w: jax.Array, w_scale: jax.Array, *, out_dtype,
                 deterministic: bool = False, config: MatmulConfig | None = None,
                 path: str | None = None, interpret: bool = False,
                 poison: bool = False) -> jax.Array:
    """y (M, N) = sum(x_parts) @ (e4m3(w) * 2**(w_scale - 127))^T via bf16 MMAs."""
    return dequant_matmul(MXFP8_KERNEL, x_parts, w, w_scale, None, elem="e4m3", scale="e8m0",
                          group=32, post="none", out_dtype=out_dtype,
                          deterministic=deterministic, config=config, path=path,
                          interpret=interpret, poison=poison)


def mxfp8_w8a8_matmul(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                      out_dtype=jnp.bfloat16, deterministic: bool = False,
                      variant: str | None = None, config: MatmulConfig | None = None,
                      path: str | None = None, interpret: bool = False,
                      poison: bool = False) -> jax.Array:
    """MXFP8 x MXFP8: xq e4m3 (M, K) codes with float32 scales (M, K/32) = 2**(u-127).

    variant: one of VARIANTS or None (= "bf16"; the fp8-MMA ones only when asked: each
    measured slower -- the Mosaic GPU ones take N and K multiples of 128).
    """
    m, k = xq.shape
    if variant is None:
        variant = "bf16"
    if variant in MGPU_VARIANTS:
        if deterministic or config is not None or path is not None:
            raise ValueError(f"variant {variant!r} (Mosaic GPU fp8 MMAs) takes no config or "
                             f"path and has no batch-invariant launch; deterministic MXFP8 "
                             f"runs the bf16 variant")
        return mxfp8_matmul_mgpu(xq, x_scale, w, e8m0_to_f32(w_scale), out_dtype=out_dtype,
                                 in_flight=MGPU_VARIANTS[variant], interpret=interpret)
    if variant == "fp8mma":
        if deterministic and config is None:
            raise ValueError("the fp8-MMA variant has no batch-invariant config; "
                             "deterministic MXFP8 runs the bf16 variant")
        cfg = fp8mma_config(m, w.shape[0], k, config)
        return mxfp8_fp8mma_matmul(xq, x_scale, w, w_scale, config=cfg, out_dtype=out_dtype,
                                   interpret=interpret, poison=poison, name=MXFP8_FP8MMA_KERNEL)
    if variant != "bf16":
        raise ValueError(f"variant must be one of {VARIANTS} or None, got {variant!r}")
    # The quantized activation q * 2**k is exact in bf16 (4 significant bits).
    xb = (xq.astype(jnp.float32) * jnp.repeat(x_scale, 32, axis=1)).astype(jnp.bfloat16)
    return mxfp8_matmul([xb], w, w_scale, out_dtype=out_dtype, deterministic=deterministic,
                        config=config, path=path, interpret=interpret, poison=poison)
