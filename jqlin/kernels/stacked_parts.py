"""A weight-only product of a wider activation, run as bf16 rows: x (M, K) float32 (or float16)
is cut into its exact bf16 parts (pallas_kernels.mx_core.split_activation: x = p0 + p1 + p2,
each part's next 8 significant bits), the parts are stacked as (parts * M, K) rows of one
kernel call with float32 outputs, and each row's part outputs are added in part order and
rounded once to out_dtype.

Why rows and not a wider operand: the kernels' fast paths (the Mosaic GPU decode and wgmma
kernels, the dense GEMM of exact bf16 codes) take one 16-bit operand. A float32 x elsewhere ran
the Triton kernels' float32 dot on CUDA cores, or their in-kernel parts: on an H100 (session 38,
bench_out_dtype.py, 8192x8192) FP8 W8A16 per-channel with float32 x took 47.6 ms at M=256
(bf16 x: 63 us) and 1.5 ms at M=16; NVFP4 W4A16 91 us at M=1 (bf16 x: 21 us). Stacked, the
weight is read once per call whatever the part count, and prefill costs the parts' MMAs.

Each part's product is exact in float32 (8 x <= 8 significant bits) and accumulates in float32,
so the result is the float32 product up to summation order, as before. Rows stay independent:
deterministic mode's M-free orders keep each row's bits whatever else is in the batch.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.mx_core import activation_parts, split_activation

__all__ = ["part_count", "on_stacked_parts", "describe_parts"]

BF16 = jnp.bfloat16


def part_count(x_dtype, *, native: tuple = (BF16,)) -> int:
    """How many bf16 row blocks an x of x_dtype runs as: 1 where the kernel takes x_dtype
    itself (`native`), else its exact bf16 parts (2 for float16, 3 for float32)."""
    if jnp.dtype(x_dtype) in [jnp.dtype(d) for d in native]:
        return 1
    return activation_parts(x_dtype)


def on_stacked_parts(run: Callable[[jax.Array], jax.Array], x2d: jax.Array, out_dtype, *,
                     deterministic: bool) -> jax.Array:
    """run(xs) -> (parts * M, N) float32 for xs the (parts * M, K) bf16 stack of x2d's parts;
    returns their per-row sum in part order, rounded once to out_dtype."""
    m = x2d.shape[0]
    parts = split_activation(x2d)
    y = run(jnp.concatenate(parts, axis=0))
    if deterministic:
        # keeps the call's last XLA multiply (a scale in the kernel's finish; in the
        # interpreter, the kernel itself) out of the adds' fusion, where XLA contracts it into
        # an FMA for some shapes and not others (CPU: a column shard's bits differed from the
        # unsharded layer's). Default mode lets them fuse: H100, 8192x8192, M=4096, FP8 W8A16
        # (its dense path: a scale on the GEMM's result) float32 x 2327 us fused, 2605 fenced
        # (session 38, bench_out_dtype.py, separate runs).
        y = lax.optimization_barrier(y)
    total = y[:m]
    for i in range(1, len(parts)):
        total = total + y[i * m:(i + 1) * m]
    return total.astype(out_dtype)


def describe_parts(count: int, x_dtype, *, stacked: bool = True) -> dict:
    """explain()'s line for x's parts (nothing where x runs as it is); stacked=False: the
    kernel takes the parts as a list (the 4-bit / MX dense path)."""
    if count == 1:
        return {}
    how = (f"stacked as {count}*M rows of one call" if stacked else
           "each one dot of the once-dequantized weight")
    return {"activation_parts": f"{jnp.dtype(x_dtype).name} x as {count} exact bf16 parts, "
                                f"{how}; the float32 outputs added in part order, rounded once"}
