"""E2M1 (fp4) element numerics and the on-disk nibble packing.

Packing order (every producer): byte j of a row holds element 2j in the low nibble and element
2j+1 in the high nibble. `lax.bitcast_convert_type` of uint8 -> float4_e2m1fn yields a trailing
axis ordered [low, high], which is exactly that order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

E2M1 = jnp.float4_e2m1fn
E2M1_MAX = 6.0
# Exclusive rounding thresholds between consecutive e2m1 magnitudes (0, .5, 1, 1.5, 2, 3, 4, 6).
_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def cast_e2m1(x: jax.Array, *, ties: str = "even") -> jax.Array:
    """Round to e2m1, saturating at +-6.

    ties="even": round half to even (compressed-tensors, ModelOpt NVFP4, `astype`).
    ties="zero": ties toward zero (ModelOpt's MX fp4 cast: its thresholds are exclusive).
    """
    x = x.astype(jnp.float32)
    if ties == "even":  # barrier: see cast_e4m3 (XLA may delete a narrowing convert pair)
        return jax.lax.optimization_barrier(jnp.clip(x, -E2M1_MAX, E2M1_MAX).astype(E2M1))
    if ties != "zero":
        raise ValueError(f"ties must be 'even' or 'zero', got {ties!r}")
    mag = jnp.abs(x)
    idx = jnp.sum(mag[..., None] > jnp.asarray(_BOUNDS, jnp.float32), axis=-1)
    val = jnp.asarray(_GRID, jnp.float32)[idx]
    return jnp.where(jnp.signbit(x), -val, val).astype(E2M1)


def round_e2m1(x: jax.Array) -> jax.Array:
    """float32 values of cast_e2m1(x) (ties to even, saturating at +-6) without a convert
    pair, so no barrier is needed and the rounding fuses with its neighbours: reduce_precision
    from 1 on, whole steps of 0.5 below; NaN (e2m1 has none) -> -0, as XLA's convert gives.
    Bitwise cast_e2m1's values (tests: every 997th float32 bit pattern)."""
    x = jnp.clip(x.astype(jnp.float32), -E2M1_MAX, E2M1_MAX)
    sub = jnp.round(x * 2.0) * 0.5
    normal = jax.lax.reduce_precision(x, exponent_bits=5, mantissa_bits=1)
    return jnp.where(jnp.isnan(x), -0.0, jnp.where(jnp.abs(x) < 1.0, sub, normal))


def pack_e2m1(q: jax.Array) -> jax.Array:
    """(..., K) float4_e2m1fn -> (..., K/2) uint8 in on-disk nibble order."""
    if q.dtype != E2M1:
        raise TypeError(f"pack_e2m1 expects float4_e2m1fn codes, got {q.dtype}")
    if q.shape[-1] % 2:
        raise ValueError(f"pack_e2m1 needs an even last dimension, got {q.shape}")
    return jax.lax.bitcast_convert_type(q.reshape(*q.shape[:-1], q.shape[-1] // 2, 2), jnp.uint8)


def unpack_e2m1(packed: jax.Array) -> jax.Array:
    """(..., K/2) uint8 -> (..., K) float4_e2m1fn, low nibble first."""
    if packed.dtype != jnp.uint8:
        raise TypeError(f"unpack_e2m1 expects uint8 bytes, got {packed.dtype}")
    q = jax.lax.bitcast_convert_type(packed, E2M1)
    return q.reshape(*packed.shape[:-1], packed.shape[-1] * 2)
