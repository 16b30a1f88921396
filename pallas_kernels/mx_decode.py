"""In-kernel decoders for microscaled weights (NVFP4, MXFP4, MXFP8): bytes -> exact floats.

Everything here is plain jnp on small tiles, so it lowers through the Triton backend and runs
unchanged in interpret mode. Hopper has no FP4 MMA, so the kernels turn a weight tile into
bf16 MMA operands; every value produced here is exact in bf16 (see each function), which makes
in-kernel dequantization lossless.

e2m1 codes are decoded through float16 bit patterns rather than a table: placing the 3
magnitude bits of an e2m1 code at bits 9..11 of a float16 (sign at bit 15) yields exactly
value * 2**-14 -- the e2m1 subnormal 0.5 lands on the float16 subnormal 2**-15, and the
float16 -> float32 conversion is exact for subnormals (a conversion, not arithmetic, so no
flush-to-zero applies). The 2**14 is given back once, on the float32 accumulator.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as pltriton

__all__ = ["E2M1_DECODE_SHIFT", "ASM_NVFP4_SCALE_SHIFT", "e2m1_bytes_to_f32",
           "e2m1_nibbles_to_f32", "e2m1_nibbles_bf16_asm", "e2m1_words_bf16_asm",
           "e8m0_to_f32", "expand_groups"]

F32 = jnp.float32
E2M1_DECODE_SHIFT = 2.0 ** 14  # e2m1_bytes_to_f32 returns value * 2**-14
# The asm decoder yields value * 2**-126 (bf16 bit patterns); NVFP4 scales are pre-multiplied by
# 2**100 (e4m3 * 2**100 < 2**109 fits bf16 exactly) and the remaining 2**26 goes to the
# accumulator, so one bf16 multiply per pair gives code * scale * 2**-26, a normal bf16.
ASM_NVFP4_SCALE_SHIFT = 2.0 ** 100
ASM_NVFP4_ACC_SHIFT = 2.0 ** 26


def e2m1_bytes_to_f32(packed: jax.Array) -> jax.Array:
    """(rows, cols) uint8 packed e2m1 -> (rows, 2*cols) float32 equal to value * 2**-14.

    On-disk order: element 2j is the low nibble of byte j, element 2j+1 the high nibble.
    """
    rows, cols = packed.shape
    b = packed.astype(jnp.uint16)
    lo = ((b & 0x08) << 12) | ((b & 0x07) << 9)
    hi = ((b & 0x80) << 8) | ((b & 0x70) << 5)
    bits = jnp.stack([lo, hi], axis=-1).reshape(rows, 2 * cols)  # [low, high] interleave
    return lax.bitcast_convert_type(bits, jnp.float16).astype(F32)


def e2m1_nibbles_to_f32(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(rows, cols) uint8 packed e2m1 -> (low, high) nibbles, each (rows, cols) float32 * 2**-14.

    low holds elements 0, 2, 4, ... of the row and high elements 1, 3, 5, ...: the caller pairs
    them with the even and odd columns of the activation instead of interleaving the weight.
    """
    b = packed.astype(jnp.uint16)
    lo = ((b & 0x08) << 12) | ((b & 0x07) << 9)
    hi = ((b & 0x80) << 8) | ((b & 0x70) << 5)
    return (lax.bitcast_convert_type(lo, jnp.float16).astype(F32),
            lax.bitcast_convert_type(hi, jnp.float16).astype(F32))


def e2m1_nibbles_to_f32_bits(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Like e2m1_nibbles_to_f32 but value * 2**-126, built directly as float32 bit patterns.

    The 3 magnitude bits go to bits 22..24 (exponent low bits + top mantissa bit): e2m1's
    subnormal 0.5 becomes the float32 subnormal 2**-127. Callers must multiply by a factor
    >= 2**24 before any flush-to-zero arithmetic sees it (Triton's mul.f32 keeps subnormals).
    """
    b = packed.astype(jnp.uint32)
    lo = ((b & 0x08) << 28) | ((b & 0x07) << 22)
    hi = ((b & 0x80) << 24) | ((b & 0x70) << 18)
    return lax.bitcast_convert_type(lo, F32), lax.bitcast_convert_type(hi, F32)


# One asm instance: 2 packed bytes (one 32-bit register) -> the bf16 values of their 2 low (or 2
# high) nibbles, times 2 bf16 scales. prmt spreads the bytes to the two 16-bit lanes; a shift
# brings the wanted nibble to bits 12..15 of each lane, where one mask, one shift and one or
# ((x & 0x80008000) | (x >> 6 & 0x01C001C0)) give the bf16 pattern of code * 2**-126. Code 1
# (0.5) lands on the bf16 subnormal 2**-127, which bf16 multiplies keep (they have no .ftz form).
# $0: the 2 results; $1: the 2 bytes; $2: the 2 scales. (Low and high nibbles are two
# single-result asm ops: Pallas lowers a multi-result asm op as one value.)
_E2M1_ASM = """
{
.reg .b32 x, t, m, r;
prmt.b32 x, $1, 0, 0x4140;
shl.b32 x, x, %SHIFT%;
and.b32 m, x, 0x80008000; shr.u32 t, x, 6; and.b32 t, t, 0x01C001C0; or.b32 r, m, t;
%PRE%
mul.rn.bf16x2 $0, r, $2;
}
"""
# MX scales span 2**-127..2**127: first restore code * 2**-126 to the code itself (x 2**126,
# bf16 0x7E80), then multiply by the power of two; both products are exact.
BF16X2_2_POW_126 = 0x7E807E80  # two bf16 2**126 (also mgpu_group_decode's MX decode)
_PRE_UNBIAS = f"""
.reg .b32 big;
mov.b32 big, 0x{BF16X2_2_POW_126:08X};
mul.rn.bf16x2 r, r, big;
"""


def e2m1_nibbles_bf16_asm(packed: jax.Array, scale: jax.Array, *, unbias: bool):
    """GPU-only: (rows, cols) uint8 + (rows, cols) bf16 scales -> (low, high) bf16 tiles.

    unbias=False: returns code * scale * 2**-126 (NVFP4 passes scale * 2**100).
    unbias=True: returns code * scale exactly (MX powers of two).
    Elementwise per byte, so it does not matter which 2 bytes Triton packs per instance.
    """
    pre = _PRE_UNBIAS if unbias else ""
    out = jax.ShapeDtypeStruct(packed.shape, jnp.bfloat16)
    res = []
    for shift in (12, 8):  # low nibble: bits 0..3 -> 12..15; high: 4..7 -> 12..15
        asm = _E2M1_ASM.replace("%SHIFT%", str(shift)).replace("%PRE%", pre)
        [r] = pltriton.elementwise_inline_asm(
            asm, args=[packed, scale], constraints="=r,r,r", pack=2,
            result_shape_dtypes=[out])
        res.append(r)
    return tuple(res)


# One asm instance: 4 packed bytes (one 32-bit register) -> 4 words, each the bf16 values of a
# byte's low nibble (low half) and high nibble (high half) -- on-disk element order -- times
# their scale pair. b * 0x40040 puts the low nibble's magnitude at bits 6..8 and the high one's
# at 22..24, b * 0x1001000 the signs at bits 15 and 31 (the shifted copies do not overlap, so
# the products are the ORs), two ands and an or (one lop3) keep those bits: the bf16 pair of
# code * 2**-126 (as _E2M1_ASM). Then x 2**126 (exact: the codes themselves), x the scale pair
# and, where given, x the factor pair. $0-$3: the words; $4: the bytes; $5-$8: scale pairs.
def _e2m1_word_asm(i: int, factor: bool) -> str:
    last = "r" if factor else f"${i}"
    lines = [f"prmt.b32 b, $4, 0, 0x444{i};", "mul.lo.u32 m, b, 0x40040;",
             "mul.lo.u32 g, b, 0x1001000;", "and.b32 g, g, 0x80008000;",
             "and.b32 m, m, 0x01C001C0;", "or.b32 r, m, g;", "mul.rn.bf16x2 r, r, big;",
             f"mul.rn.bf16x2 {last}, r, ${5 + i};"]
    if factor:  # (code * scale) * factor: the reference's order
        lines.append(f"mul.rn.bf16x2 ${i}, r, f;")
    return "\n".join(lines)


def e2m1_words_bf16_asm(packed: jax.Array, scale_pairs: jax.Array,
                        factor_pair: int | None = None) -> jax.Array:
    """GPU-only: (rows, cols) uint8 packed e2m1 + (rows, cols) uint32 bf16 scale pairs (the
    byte's scale in both halves) -> (rows, cols) uint32 words: the byte's two codes times the
    scale (then times factor_pair, bf16 bits in both halves, where given), each product
    rounded to bf16 -- exact wherever the products are bf16 numbers. Elementwise per byte."""
    head = [".reg .b32 b, m, g, r, f, big;", f"mov.b32 big, 0x{BF16X2_2_POW_126:08X};"]
    if factor_pair is not None:
        head.append(f"mov.b32 f, 0x{factor_pair:08X};")
    body = [_e2m1_word_asm(i, factor_pair is not None) for i in range(4)]
    asm = "{\n" + "\n".join(head + body) + "\n}"
    # int32: the lowering gives the result the aval's MLIR type and Triton's integers are
    # signless (a uint32 result is refused)
    out = jax.ShapeDtypeStruct(packed.shape, jnp.int32)
    [w] = pltriton.elementwise_inline_asm(
        asm, args=[packed, scale_pairs], constraints="=r,=r,=r,=r,r,r,r,r,r", pack=4,
        result_shape_dtypes=[out])
    return lax.bitcast_convert_type(w, jnp.uint32)


def e8m0_to_f32(u: jax.Array) -> jax.Array:
    """Biased exponent bytes -> 2**(u - 127) in float32; u = 0 -> 2**-127, u = 255 -> NaN.

    Same bit patterns as jqlin.numerics.e8m0_to_f32 (this package does not import jqlin).
    """
    u32 = u.astype(jnp.uint32)
    bits = jnp.where(u32 == 0, jnp.uint32(0x00400000), u32 << 23)
    bits = jnp.where(u32 == 255, jnp.uint32(0x7FC00000), bits)
    return lax.bitcast_convert_type(bits, F32)


def expand_groups(s: jax.Array, group: int) -> jax.Array:
    """(rows, g) per-group values -> (rows, g*group), each repeated over its group along K."""
    rows, g = s.shape
    if group == 1:
        return s
    return jnp.broadcast_to(s[:, :, None], (rows, g, group)).reshape(rows, g * group)
