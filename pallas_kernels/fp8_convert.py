"""e4m3 -> bf16 tile conversion with integer ops (inline PTX), for bf16 MMAs on fp8 weights.

Hopper has no e4m3 -> bf16 instruction: the compiler's chain (e4m3x2 -> f16x2 -> f32 -> bf16)
runs on the conversion units, which at decode bandwidth become the limiter. Here two codes per
32-bit register are placed by bits: prmt moves each byte to the high byte of a 16-bit lane,
then (x & 0x80008000) | ((x >> 4) & 0x07F007F0) puts the sign at bit 15 and the 4 exponent +
3 mantissa bits at bits 10..4 -- the bf16 pattern of value * 2**-120 (e4m3's bias 7 vs bf16's
127). One bf16 multiply by 2**120 (0x7B80) restores the value exactly: normals map to normals,
e4m3 subnormals (m * 2**-9) land on bf16 subnormals (bf16 multiplies keep subnormals) and come
back exact. Zero and -0 map to themselves; the NaN code (0x7F/0xFF) becomes +-480, so inputs
must be finite (quantized weights are: quantization saturates).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import triton as pltriton

__all__ = ["e4m3_to_bf16"]

# $0: 2 bf16 results (one 32-bit register); $1: 2 e4m3 bytes packed in one 32-bit register.
_ASM = """
{
.reg .b32 x, s, e, big;
prmt.b32 x, $1, 0, 0x1404;
and.b32 s, x, 0x80008000;
shr.u32 e, x, 4;
and.b32 e, e, 0x07F007F0;
or.b32 x, s, e;
mov.b32 big, 0x7B807B80;
mul.rn.bf16x2 $0, x, big;
}
"""


def e4m3_to_bf16(tile: jax.Array, *, interpret: bool) -> jax.Array:
    """bf16 tile equal to the e4m3 tile (finite codes). Interpret mode: plain astype."""
    if interpret:
        return tile.astype(jnp.bfloat16)
    codes = lax.bitcast_convert_type(tile, jnp.uint8)
    [out] = pltriton.elementwise_inline_asm(
        _ASM, args=[codes], constraints="=r,r", pack=2,
        result_shape_dtypes=[jax.ShapeDtypeStruct(tile.shape, jnp.bfloat16)])
    return out
