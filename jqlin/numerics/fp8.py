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


_E4M3_MIN_NORMAL = 2.0 ** -6


def round_e4m3(x: jax.Array) -> jax.Array:
    """float32 values of cast_e4m3(x) -- round to nearest even, saturating at +-448 -- without a
    convert pair, so no barrier is needed and the rounding fuses with its neighbours:
    reduce_precision (which XLA keeps) on the normal range, whole steps of 2**-9 below it.
    Bitwise cast_e4m3's values (tests: every 997th float32 bit pattern)."""
    x = jnp.clip(x.astype(jnp.float32), -E4M3_MAX, E4M3_MAX)
    sub = jnp.round(x * 512.0) * (1.0 / 512.0)  # (exact: powers of two)
    normal = jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=3)
    return jnp.where(jnp.abs(x) < _E4M3_MIN_NORMAL, sub, normal)
