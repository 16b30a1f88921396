"""E8M0 (UE8M0) scales, stored as their biased exponent byte u: value = 2**(u - 127).

Exponents are computed with explicit integer/log2 arithmetic: a float -> float8_e8m0fnu cast
rounds and maps 0 to NaN, which is neither producer's rule. A block whose amax is NaN (it holds
a NaN) gets the NaN scale u = 255 under both rules, as torchao's MX reference sets it: its
values dequantize to NaN. The producers' own torch code leaves that case undefined (a NaN
exponent cast to uint8); left to the arithmetic, it became u = 0 here and the block's values
finite -- a NaN activation turned silently into numbers.
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


def divide_by_e8m0(x: jax.Array, u: jax.Array) -> jax.Array:
    """x / 2**(u - 127) for u broadcast like x, exactly: x times 2**(127 - u).

    A multiplication (identical for powers of two): XLA flushes subnormals, so the scale
    2**-127 of an all-zero block would read as 0 and turn 0 / scale into NaN, while its
    reciprocal 2**127 is a normal number. The one subnormal reciprocal, 2**-127 for u = 254
    (ModelOpt's scale of a block holding inf), is applied as 2**-126 then 1/2: flushed, it
    would make inf * 0 = NaN where the producer's torch code scales inf to inf. u = 255 (NaN
    scale): any values (the scale makes them NaN).
    """
    r = e8m0_to_f32((254 - jnp.minimum(u.astype(jnp.int32), 253)).astype(jnp.uint8))
    y = x * r
    return jnp.where(u == 254, y * 0.5, y)


def exponent_ct(amax: jax.Array, elem_emax: int) -> jax.Array:
    """compressed-tensors: u = 127 + floor(log2(p2(amax))) - emax, clipped to [0, 254]; 255
    for a NaN amax.

    p2 rounds amax's float32 mantissa to a power of two (add 1<<21 to the bits, keep sign and
    exponent), so floor(log2(p2)) is the biased exponent field minus 127.
    """
    bits = jax.lax.bitcast_convert_type(amax.astype(jnp.float32), jnp.uint32)
    exp_field = ((bits + jnp.uint32(1 << 21)) >> 23) & jnp.uint32(0xFF)
    # amax == 0: log2(0) = -inf, clipped to u = 0 by the producer.
    u = exp_field.astype(jnp.int32) - elem_emax
    u = jnp.clip(jnp.where(amax > 0, u, 0), 0, 254)
    return jnp.where(jnp.isnan(amax), 255, u).astype(jnp.uint8)


def exponent_modelopt(amax: jax.Array, elem_max: float) -> jax.Array:
    """ModelOpt: e = clamp(ceil(log2(amax / elem_max)), -127, 127); returns u = e + 127 (255
    for a NaN amax). The ceiling is exact (_ceil_log2; torch's log2 is exact at powers of
    two); the division is exact.div (correctly rounded on every backend; fuses)."""
    a = amax.astype(jnp.float32)
    v = div(a, elem_max)
    e = jnp.where(jnp.isinf(v), 127, _ceil_log2(v))  # ceil(log2(inf)) clamps to 127
    e = jnp.clip(jnp.where(amax > 0, e, -127), -127, 127)
    return jnp.where(jnp.isnan(amax), 255, e + 127).astype(jnp.uint8)


DEEPSEEK_AMAX_FLOOR = 1e-4


def exponent_deepseek(amax: jax.Array) -> jax.Array:
    """DeepSeek's ue8m0 activation scales (its inference kernels' act_quant with
    `scale_fmt: "ue8m0"`, fast_round_scale): s = 2**ceil(log2(max(amax, 1e-4) * f32(1/448))),
    the exact ceiling (DeepSeek reads it off the float32 bits: the same integer); returns
    u = 127 + log2(s), 255 (the NaN scale) for a NaN amax and for an inf one (DeepSeek's scale
    is inf there: the row's outputs are NaN either way)."""
    a = jnp.maximum(amax.astype(jnp.float32), jnp.float32(DEEPSEEK_AMAX_FLOOR))
    t = a * jnp.float32(1.0 / 448.0)  # (a normal float32 from the floor on, or inf / NaN)
    return jnp.where(jnp.isfinite(t), _ceil_log2(t) + 127, 255).astype(jnp.uint8)


def _ceil_log2(v: jax.Array) -> jax.Array:
    """ceil(log2(v)) of positive finite float32 v, exactly: from v's binary exponent (frexp),
    not a log2 call -- XLA's log2 is not exact at powers of two, and an off-by-one exponent
    doubles a scale."""
    mant, exp = jnp.frexp(v)  # v = mant * 2**exp, mant in [0.5, 1)
    return jnp.where(mant == 0.5, exp - 1, exp)
