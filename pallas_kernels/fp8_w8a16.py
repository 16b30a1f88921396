"""FP8 weight-only matmul (W8A16): e4m3 weights, bf16/f16/f32 activations, float32 accumulation.

Weight scales: per-tensor (1,1), per-channel (N,1) -- also fused q/k/v whose per-shard scalars
became a vector -- or 128x128 blocks (N/128, K/128), applied per K-block to float32 partials.
The e4m3 -> bf16/f16 conversion of a weight tile is exact, so the products are exact in float32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .common import MatmulConfig, resolve_config
from .fp8_core import fp8_matmul
from .fp8_paths import fp8_path
from .fp8_heuristics import w8a16_heuristic

__all__ = ["w8a16_matmul", "w8a16_config", "KERNEL_NAME"]

KERNEL_NAME = "fp8_w8a16"


def w8a16_config(m: int, n: int, k: int, *, scale_kind: str, x_dtype, deterministic: bool,
                 config: MatmulConfig | None = None) -> MatmulConfig:
    """The config w8a16_matmul runs with: explicit -> cached -> heuristic."""
    return resolve_config(
        KERNEL_NAME, m=m, n=n, k=k, deterministic=deterministic, explicit=config,
        extra=f"{scale_kind}/{jnp.dtype(x_dtype).name}",
        heuristic=functools.partial(w8a16_heuristic, per_block=scale_kind == "block"))


def w8a16_matmul(x: jax.Array, w: jax.Array, w_scale: jax.Array, *, scale_kind: str,
                 deterministic: bool = False, config: MatmulConfig | None = None,
                 interpret: bool = False, poison_output: bool = False,
                 path: str | None = None, out_dtype=None) -> jax.Array:
    """y (M, N) = x (M, K) @ (w * w_scale)^T in out_dtype (default x's): the float32
    accumulator rounded once.

    scale_kind: "tensor" | "channel" | "block" (K and N padded to multiples of 128).
    deterministic: use the config chosen from (N, K, scale kind) alone -- batch-invariant rows.
    path: see fp8_paths.fp8_path (None: chosen by it).
    """
    m, k = x.shape
    path = fp8_path(m, x_scale_kind="none", w_scale_kind=scale_kind,
                    deterministic=deterministic, config=config, path=path,
                    interpret=interpret, n=w.shape[0], k=k, x_dtype=x.dtype,
                    out_dtype=out_dtype)
    # only the Triton path has tiles (and k_shards would check them against its schedule)
    cfg = w8a16_config(m, w.shape[0], k, scale_kind=scale_kind, x_dtype=x.dtype,
                       deterministic=deterministic, config=config) if path == "pallas" else None
    return fp8_matmul(x, None, w, w_scale, x_scale_kind="none", w_scale_kind=scale_kind,
                      config=cfg, interpret=interpret, name=KERNEL_NAME,
                      poison_output=poison_output, path=path, deterministic=deterministic,
                      out_dtype=out_dtype)
