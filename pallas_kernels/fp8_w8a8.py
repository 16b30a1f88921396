"""FP8 x FP8 matmul (W8A8) on e4m3 codes with float32 accumulation.

Activations arrive already quantized (codes + float32 scales); the caller quantizes them with
its producer's rule, so the codes are exactly the reference's. Supported scale pairs:
  * weight per-tensor / per-channel  x  activation per-tensor (static or dynamic) / per-token:
    one fp8 MMA chain over all of K, scales applied once to the accumulator;
  * weight 128x128 blocks  x  activation 1x128 groups (DeepSeek-V3 recipe): each 128-column
    K-block's partial product is scaled by x_scale[m, kb] * w_scale[n // 128, kb] and added.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .common import MatmulConfig, resolve_config
from .fp8_core import fp8_matmul
from .fp8_paths import fp8_path
from .fp8_heuristics import spread_k_parts, w8a8_heuristic

__all__ = ["w8a8_matmul", "w8a8_config", "KERNEL_NAME", "BLOCK_KERNEL_NAME"]

KERNEL_NAME = "fp8_w8a8"
BLOCK_KERNEL_NAME = "fp8_block"


def w8a8_config(m: int, n: int, k: int, *, x_scale_kind: str, w_scale_kind: str,
                deterministic: bool, config: MatmulConfig | None = None
                ) -> tuple[str, MatmulConfig]:
    """(kernel name, config) w8a8_matmul runs with: explicit -> cached -> heuristic."""
    block = w_scale_kind == "block" or x_scale_kind == "group"
    if block and (w_scale_kind, x_scale_kind) != ("block", "group"):
        raise ValueError("block-scaled W8A8 pairs 128x128 weight blocks with 1x128 activation "
                         f"groups; got w_scale_kind={w_scale_kind!r}, "
                         f"x_scale_kind={x_scale_kind!r}")
    name = BLOCK_KERNEL_NAME if block else KERNEL_NAME
    cfg = resolve_config(
        name, m=m, n=n, k=k, deterministic=deterministic, explicit=config,
        extra=f"{x_scale_kind}/{w_scale_kind}",
        heuristic=functools.partial(w8a8_heuristic, per_block=block))
    return name, cfg if config is not None else spread_k_parts(cfg, m, n, k)


def w8a8_matmul(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                x_scale_kind: str, w_scale_kind: str, out_dtype=jnp.bfloat16,
                deterministic: bool = False, config: MatmulConfig | None = None,
                interpret: bool = False, poison_output: bool = False,
                path: str | None = None) -> jax.Array:
    """y (M, N) = (xq * x_scale) (M, K) @ (w * w_scale)^T, accumulated in float32.

    x_scale_kind: "tensor" (1,1) | "row" (M,1) | "group" (M, K/128, with w_scale_kind "block").
    w_scale_kind: "tensor" (1,1) | "channel" (N,1) | "block" (N/128, K/128).
    path: see fp8_paths.fp8_path (None: chosen by it).
    """
    m, k = xq.shape
    path = fp8_path(m, x_scale_kind=x_scale_kind, w_scale_kind=w_scale_kind,
                    deterministic=deterministic, config=config, path=path,
                    interpret=interpret, n=w.shape[0], k=k, x_dtype=xq.dtype)
    name, cfg = w8a8_config(m, w.shape[0], k, x_scale_kind=x_scale_kind,
                            w_scale_kind=w_scale_kind, deterministic=deterministic,
                            config=config)
    return fp8_matmul(xq, x_scale, w, w_scale, x_scale_kind=x_scale_kind,
                      w_scale_kind=w_scale_kind, config=cfg, out_dtype=out_dtype,
                      interpret=interpret, name=name, poison_output=poison_output, path=path,
                      deterministic=deterministic)
