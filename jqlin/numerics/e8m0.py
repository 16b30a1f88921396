"""E8M0 (UE8M0) scales, stored as their biased exponent byte u: value = 2**(u - 127).

Exponents are computed with explicit integer/log2 arithmetic: a float -> float8_e8m0fnu cast
rounds and maps 0 to NaN, which is neither producer's rule.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .exact import div


def e8m0_to_f32(u: jax.Array) -> jax.Array:
    """Biased exponent bytes -> float32 scales. u=0 is 2**-127 (an f32 subnormal), 255 is NaN."""
    u32 = u.astype(jnp.uint32)
    bits = jnp.where(u32 == 0, jnp.uint32(0x00400000), u32 << 23)
    bits = jnp.where(u32 == 255, jnp.uint32(0x7FC00000), bits)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def e8m0_reciprocal(u: jax.Array) -> jax.Array:
    """1 / 2**(u - 127) = 2**(127 - u), exactly.

    Dividing by an e8m0 scale is done as this multiplication (identical for powers of two):
    XLA flushes subnormals, so the scale 2**-127 of an all-zero block would read as 0 and turn
    0 / scale into NaN, while its reciprocal 2**127 is a normal number.
    """
    return e8m0_to_f32((254 - u.astype(jnp.int32)).astype(jnp.uint8))


def exponent_ct(amax: jax.Array, elem_emax: int) -> jax.Array:
    """compressed-tensors: u = 127 + floor(log2(p2(amax))) - emax, clipped to [0, 254].

    p2 rounds amax's float32 mantissa to a power of two (add 1<<21 to the bits, keep sign and
    exponent), so floor(log2(p2)) is the biased exponent field minus 127.
    """
    bits = jax.lax.bitcast_convert_type(amax.astype(jnp.float32), jnp.uint32)
    exp_field = ((bits + jnp.uint32(1 << 21)) >> 23) & jnp.uint32(0xFF)
    # amax == 0: log2(0) = -inf, clipped to u = 0 by the producer.
    u = exp_field.astype(jnp.int32) - elem_emax
    u = jnp.where(amax > 0, u, 0)
    return jnp.clip(u, 0, 254).astype(jnp.uint8)


def exponent_modelopt(amax: jax.Array, elem_max: float) -> jax.Array:
    """ModelOpt: e = clamp(ceil(log2(amax / elem_max)), -127, 127); returns u = e + 127.

    ceil(log2(v)) is taken from v's binary exponent (frexp) rather than a log2 call: XLA's log2
    is not exact at powers of two, where torch's is, and an off-by-one exponent doubles a scale.
    The division is exact.div (correctly rounded on every backend; fuses).
    """
    a = amax.astype(jnp.float32)
    v = div(a, elem_max)
    mant, exp = jnp.frexp(v)  # v = mant * 2**exp, mant in [0.5, 1)
    e = jnp.where(mant == 0.5, exp - 1, exp)
    e = jnp.clip(jnp.where(amax > 0, e, -127), -127, 127)
    return (e + 127).astype(jnp.uint8)
