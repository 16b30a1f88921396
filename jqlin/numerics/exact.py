"""IEEE division as the producers compute it, on every backend.

Producers (torch) divide with correctly rounded float32 division, and their stored scales and
codes are what jqlin must reproduce bit for bit. XLA does not divide that way everywhere: on
GPU it emits `div.full.f32`, which is up to 2 ulp off (openxla/xla#37181: 23% of random
quotients are 1 ulp off; `a / a != 1`), and its simplifier turns `a / c` (c a constant or a
broadcast) into `a * (1/c)`. One ulp moves a code wherever the quotient sits near a rounding
boundary of the element format (session 31: the oracle tests' ties fail on the H200 with
plain division). So off the CPU `div` takes the hardware's quotient only as a first guess and
corrects it with exact integer arithmetic on the significands: the correction fuses with its
neighbours (no barrier), and its answer does not depend on how the guess was computed. The
CPU's division is IEEE: there only the reciprocal rewrite is stopped (a barrier).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

F32 = jnp.float32
I32 = jnp.int32
U32 = jnp.uint32
_MANT = 0x7FFFFF
_HIDDEN = 0x800000
_CORRECTIONS = 4  # the guess may be this many ulps off (div.full: 2; a reciprocal multiply: 3)


def div(a, b) -> jax.Array:
    """a / b, correctly rounded (round to nearest even), for float32; elementwise.

    Where both operands and the quotient are normal floats the result is exact on every
    backend; elsewhere (zero, inf, NaN, subnormal operands or quotients) it is the backend's
    own division (XLA flushes subnormals to zero). float16 / bfloat16 operands (compressed-
    tensors' weight-dtype rule): the float32 quotient rounded once more (_round_to_16bit),
    which is their correctly rounded quotient. Other dtypes: plain division.
    On the CPU, whose division is IEEE, the divisor goes behind a barrier instead (the
    simplifier's reciprocal rewrite): the correction's ~50 integer ops made XLA's CPU
    compiles of the quantization rules ~7x longer (CI). Elsewhere: fuses, no barrier.
    """
    a = jnp.asarray(a)
    b = jnp.asarray(b, a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else jnp.asarray(b)
    if a.dtype in _16BIT:
        return _round_to_16bit(div(a.astype(F32), b.astype(F32)), a.dtype).astype(a.dtype)
    if a.dtype != F32:
        return a / b
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a, b = jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)
    return jax.lax.platform_dependent(a, b, cpu=_div_barrier, default=div_corrected)


# float16 / bfloat16: (exponent bits, mantissa bits, smallest normal: float16's subnormals
# are normal float32s; bfloat16's are float32's own, which reduce_precision keeps)
_16BIT = {jnp.dtype(jnp.float16): (5, 10, 2.0 ** -14), jnp.dtype(jnp.bfloat16): (8, 7, None)}


def _round_to_16bit(q: jax.Array, dtype) -> jax.Array:
    """float32 q rounded to the nearest `dtype` value (ties to even), still as float32.

    Why not a plain 16-bit division, or q.astype(dtype): under jit XLA may keep the float32
    value where a 16-bit result is widened again (excess precision), and may rewrite
    a / broadcast(b) as a reciprocal multiply; on the CPU jitted float16 codes differed from
    eager ones (session 41).
    reduce_precision is kept; below the smallest normal it flushes, so subnormals are whole
    steps of the subnormal spacing (power-of-two products: exact). Rounding the correctly
    rounded float32 quotient again gives the correctly rounded 16-bit one: float32's 24 bits
    are at least 2p + 2 for p = 11 or 8, so the double rounding is innocuous."""
    exp_bits, mant_bits, tiny = _16BIT[jnp.dtype(dtype)]
    normal = jax.lax.reduce_precision(q, exponent_bits=exp_bits, mantissa_bits=mant_bits)
    if tiny is None:
        return normal
    step = tiny * 2.0 ** -mant_bits
    sub = jnp.round(q * (1.0 / step)) * step
    return jnp.where(jnp.abs(q) < tiny, sub, normal)


def _div_barrier(a, b):
    # b must reach the barrier with every axis a has: under vmap a batch axis of a alone would
    # otherwise be added to b after the barrier, as a broadcast the reciprocal rewrite sees
    # (quotients 1 ulp off); a value-dependent select carries a's batch axis to b, and
    # full_like / broadcast_to would not.
    return a / jax.lax.optimization_barrier(jnp.where(a == a, b, b))


def div_corrected(a: jax.Array, b: jax.Array) -> jax.Array:
    """div's path off the CPU (tested on the CPU too, directly): float32 a / b of one shape,
    the hardware's quotient corrected by integer arithmetic."""
    ua = jax.lax.bitcast_convert_type(a, U32)
    ub = jax.lax.bitcast_convert_type(b, U32)
    ea, eb = ((ua >> 23) & 0xFF).astype(I32), ((ub >> 23) & 0xFF).astype(I32)
    sa, sb = (ua & _MANT) | _HIDDEN, (ub & _MANT) | _HIDDEN  # significands, 2**23 <= s < 2**24
    ge = sa >= sb
    # the quotient's significand is sa * 2**k / sb, in [2**23, 2**24]: k = 23 if sa >= sb else 24
    k = jnp.where(ge, 23, 24).astype(U32)
    guess = (sa.astype(F32) / sb.astype(F32)) * jnp.where(ge, 2.0 ** 23, 2.0 ** 24)
    q = _round_significand_quotient(sa, sb, k, guess.astype(I32))
    e = ea - eb + 127 - jnp.where(ge, 0, 1)  # the biased exponent of the quotient
    bits = (e << 23) + (q - _HIDDEN)  # (q = 2**24 carries into the exponent, as it should)
    sign = (ua ^ ub) & jnp.uint32(0x80000000)
    exact = jax.lax.bitcast_convert_type(bits.astype(U32) | sign, F32)
    normal = ((ea >= 1) & (ea <= 254) & (eb >= 1) & (eb <= 254) & (e >= 1) & (e <= 254))
    return jnp.where(normal, exact, a / b)


def _round_significand_quotient(sa, sb, k, q):
    """round(sa * 2**k / sb) to nearest from a guess q at most _CORRECTIONS off: the remainder
    r = sa * 2**k - q * sb is small (|r| < 5 * 2**24), so uint32 arithmetic that wraps modulo
    2**32 computes it exactly; each step moves q one toward the quotient while |r| > sb / 2.
    (A quotient of two floats never lies exactly halfway between two floats, so no tie rule.)
    sa, sb: uint32 significands; k: uint32 shift (23 or 24); q: int32. Returns int32."""
    r = jax.lax.bitcast_convert_type((sa << k) - q.astype(U32) * sb, I32)
    sb = sb.astype(I32)
    for _ in range(_CORRECTIONS):
        up, down = 2 * r > sb, 2 * r < -sb
        q = q + up.astype(I32) - down.astype(I32)
        r = r - jnp.where(up, sb, 0) + jnp.where(down, sb, 0)
    return q
