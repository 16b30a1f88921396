"""E4M3FN element numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp

E4M3_MAX = 448.0
E4M3 = jnp.float8_e4m3fn


def cast_e4m3(x: jax.Array) -> jax.Array:
    """Round to e4m3fn, saturating: e4m3fn has no infinity and `astype` maps |x| > 464 to NaN.

    The barrier keeps the rounding: with xla_allow_excess_precision (on by default on GPU) XLA
    deletes a convert(convert(x, narrow), f32) pair, i.e. would skip quantization entirely.
    """
    return jax.lax.optimization_barrier(jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3))
