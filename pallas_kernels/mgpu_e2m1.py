"""NVFP4 weight tiles decoded in registers for the Mosaic GPU W4A16 kernel: e2m1 codes times
their e4m3 group scale (one per 16 along K), exact in bf16, as wgmma's A operand.

Hopper's Mosaic GPU converts e2m1 only on sm_100, so the decode is bit arithmetic (inline PTX,
GPU only; the interpreter computes the same values with jnp):
  * a nibble n = s e1 e0 m becomes the bf16 pattern s << 15 | (e1 e0 m) << 6: the exponent
    field holds e, the mantissa's top bit m -- the value e2m1(n) * 2**-126, exactly, for normal
    and subnormal codes alike (bf16 subnormals have the same 2**-126 step as its smallest
    normal binade). Two nibbles of a byte b are two such halves of one 32-bit register: b *
    0x40040 puts both magnitudes, b * 0x1001000 both signs in place (the copies do not
    overlap), and one lop3 keeps the right bits: 4 instructions per 2 weights.
  * the group scale s (e4m3, converted exactly by the hardware) times 2**118 is a bf16 number
    (<= 448 * 2**118 < 2**127), so one bf16x2 multiply gives e2m1 * s * 2**-8 -- exact: the
    product has at most 6 significant bits and lies in [2**-18, 2**12]. The 2**8 returns in
    float32 after the MMA (POST_FACTOR, with the global scale).
Register layout: the tile (64 rows, 128 K) in Layout.WGMMA, two consecutive K values (one
byte of codes) per register; thread t holds rows (t // 32) * 16 + (t % 32) // 4 and that + 8,
register i at row offset 8 * (i % 2) and K group i // 4 (derived from the layout by
`register_map` and checked by tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from .mgpu_relabel import TILE, _positions

__all__ = ["GROUP", "POST_FACTOR", "E2M1_VALUES", "register_map", "nibble_patterns",
           "decode_jnp", "decode"]

GROUP = 16  # K values per e4m3 scale
POST_FACTOR = 2.0 ** 8  # the decoded weights are e2m1 * s * 2**-8 (see the module docstring)
SCALE_FACTOR_BITS = 0x7A800000  # float32 2**118
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       np.float32)


@functools.cache
def register_map() -> tuple[np.ndarray, np.ndarray]:
    """(row offset, K group) of each register of a thread's (64, 128) tile in Layout.WGMMA,
    the same for every thread; raises if the layout is not what the decode assumes (two
    consecutive K values per register, rows base(t) and base(t) + 8)."""
    pos = _positions(fa.WGMMA_LAYOUT)  # (threads, elements): row * 128 + col
    rows, cols = pos // TILE[1], pos % TILE[1]
    t = np.arange(pos.shape[0])
    base = (t // 32) * 16 + (t % 32) // 4
    if not (np.array_equal(rows[:, 0], base) and np.array_equal(pos[:, 1::2], pos[:, ::2] + 1)):
        raise AssertionError("Layout.WGMMA is not the row / pair layout the decode assumes")
    offset, group = rows[:, ::2] - base[:, None], cols[:, ::2] // GROUP
    if not (np.all(offset == offset[0]) and np.all(group == group[0])
            and set(np.unique(offset)) == {0, 8}):
        raise AssertionError("Layout.WGMMA's registers differ between threads")
    return offset[0], group[0]


def nibble_patterns(b: np.ndarray) -> np.ndarray:
    """The decode's integer step on bytes b (uint32 array): the bf16x2 patterns (low half: the
    low nibble) of both codes, as the PTX computes them."""
    b = b.astype(np.uint32)
    u = (b * np.uint32(0x40040)) & np.uint32(0x01C001C0)
    return u | ((b * np.uint32(0x1001000)) & np.uint32(0x80008000))


def decode_jnp(codes: jax.Array, scales: jax.Array) -> jax.Array:
    """codes int4 (rows, 128) (a K-block), scales uint8 (rows, 8) (its e4m3 group scales) ->
    bf16 e2m1 * s * 2**-8: the values `decode` gives, for the interpreter."""
    nib = codes.astype(jnp.int32) & 0xF  # (no table: a kernel may not close over arrays)
    e, half = (nib >> 1) & 3, (nib & 1).astype(jnp.float32) * 0.5
    mag = jnp.where(e == 0, half, jnp.ldexp(1.0 + half, e - 1))
    v = jnp.where(nib >= 8, -mag, mag)
    s = lax.bitcast_convert_type(scales, jnp.float8_e4m3fn).astype(jnp.float32)
    return (v * jnp.repeat(s, GROUP, axis=1) * (1.0 / POST_FACTOR)).astype(jnp.bfloat16)


_SCALES_PTX = """{
.reg .b16 l, h, a<4>;
.reg .b32 p, q;
.reg .f32 f<4>;
mov.b32 {l, h}, $4;
cvt.rn.f16x2.e4m3x2 p, l;
cvt.rn.f16x2.e4m3x2 q, h;
mov.b32 {a0, a1}, p;
mov.b32 {a2, a3}, q;
cvt.f32.f16 f0, a0;
cvt.f32.f16 f1, a1;
cvt.f32.f16 f2, a2;
cvt.f32.f16 f3, a3;
mul.rn.f32 f0, f0, 0f%08X;
mul.rn.f32 f1, f1, 0f%08X;
mul.rn.f32 f2, f2, 0f%08X;
mul.rn.f32 f3, f3, 0f%08X;
cvt.rn.bf16x2.f32 $0, f0, f0;
cvt.rn.bf16x2.f32 $1, f1, f1;
cvt.rn.bf16x2.f32 $2, f2, f2;
cvt.rn.bf16x2.f32 $3, f3, f3;
}""" % ((SCALE_FACTOR_BITS,) * 4)

_CODES_PTX = """{
.reg .b32 u, v;
mul.lo.u32 u, $1, 0x40040;
mul.lo.u32 v, $1, 0x1001000;
and.b32 v, v, 0x80008000;
lop3.b32 u, u, 0x01C001C0, v, 0xEA;
mul.rn.bf16x2 $0, u, $2;
}"""


def decode(codes: jax.Array, scales) -> jax.Array:
    """codes: int4 (64, 128) in Layout.WGMMA (a warpgroup's K-block of codes); scales: a
    shared-memory ref (64, 8) uint8 (its e4m3 group scales) -> bf16 e2m1 * s * 2**-8 in
    Layout.WGMMA, wgmma's A operand. GPU only (inline Mosaic GPU)."""
    offset, group = register_map()
    out = plgpu.ShapeDtypeStruct(TILE, jnp.bfloat16, layout=plgpu.Layout.WGMMA)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()), return_type=out)
    def body(ctx, arr, ref):
        del ctx
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import arith, vector
        i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
        index = ir.IndexType.get()
        t = arith.remui(mgpu_utils.thread_idx(), mgpu_utils.c(128, i32))
        base = arith.addi(arith.muli(arith.divui(t, mgpu_utils.c(32, i32)),
                                     mgpu_utils.c(16, i32)),
                          arith.divui(arith.remui(t, mgpu_utils.c(32, i32)),
                                      mgpu_utils.c(4, i32)))
        splats = {}  # (row offset, group) -> bf16x2 of s * 2**118 twice
        for off in (0, 8):
            row = arith.index_cast(index, arith.addi(base, mgpu_utils.c(off, i32)))
            raw = vector.load(ir.VectorType.get((8,), i8), ref,
                              [row, arith.constant(index, 0)])
            words = mgpu_utils.bitcast(raw, ir.VectorType.get((2,), i32))
            for w in range(2):
                word = vector.extract(words, dynamic_position=[],
                                      static_position=ir.DenseI64ArrayAttr.get([w]))
                vals = mgpu_utils.inline_ptx(_SCALES_PTX, word, result_types=[i32] * 4)
                for g, val in enumerate(vals):
                    splats[off, 4 * w + g] = val
        bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
        regs = np.empty(arr.registers.shape, dtype=object)
        for i, reg in enumerate(arr.registers.flat):
            byte = arith.extui(i32, mgpu_utils.bitcast(reg, i8))
            val = mgpu_utils.inline_ptx(_CODES_PTX, byte, splats[int(offset[i]), int(group[i])],
                                        result_types=i32)
            regs.flat[i] = mgpu_utils.bitcast(val, bf16x2)
        return fa.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

    return body(codes, scales)


def scale_pattern_values(scale_bytes: np.ndarray) -> np.ndarray:
    """float32 of what _SCALES_PTX gives for e4m3 bytes (s * 2**118 rounded to bf16)."""
    s = scale_bytes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (s * np.float32(2.0 ** 118)).astype(ml_dtypes.bfloat16).astype(np.float32)
