"""Group-scaled weight tiles decoded in registers for the Mosaic GPU weight-only kernel: NVFP4
(e2m1 codes, e4m3 scale per 16 along K), MXFP4 (e2m1, e8m0 per 32) and MXFP8 (e4m3, e8m0 per
32), each weight times its group scale, exact in bf16 (within bf16's range), as wgmma's A
operand.

Hopper's Mosaic GPU converts e2m1 only on sm_100, so the decode is bit arithmetic (inline PTX,
GPU only; the interpreter computes the same values with jnp, `decode_jnp`):
  * an e2m1 nibble n = s e1 e0 m becomes the bf16 pattern s << 15 | (e1 e0 m) << 6: the
    exponent field holds e, the mantissa's top bit m -- the value e2m1(n) * 2**-126, exactly,
    for normal and subnormal codes alike (bf16 subnormals have the same 2**-126 step as its
    smallest normal binade). Two nibbles of a byte b are two such halves of one 32-bit
    register: b * 0x40040 puts both magnitudes, b * 0x1001000 both signs in place (the copies
    do not overlap), and one lop3 keeps the right bits: 4 instructions per 2 weights.
  * NVFP4: the group scale s (e4m3, converted exactly by the hardware) times 2**118 is a bf16
    number (<= 448 * 2**118 < 2**127), so one bf16x2 multiply gives e2m1 * s * 2**-8 -- exact:
    the product has at most 6 significant bits and lies in [2**-18, 2**12]. The 2**8 returns in
    float32 after the MMA (Format.post_factor, with the global scale).
  * MX: the scale 2**(u - 127) is a bf16 number for every byte u (u = 0: the subnormal
    2**-127; 255: NaN, as jqlin.numerics.e8m0_to_f32), so e2m1 patterns are first multiplied by
    2**126 (-> e2m1 exactly) and then by the scale -- two bf16x2 multiplies, no factor to undo;
    e4m3 weights (converted as the fp8 kernel does) take the one scale multiply. Exact wherever
    the product is a bf16 number, as in the Triton kernels' bf16 decode.
Register layout: the tile (64 rows, 128 K) in Layout.WGMMA, two consecutive K values per
register; thread t holds rows (t // 32) * 16 + (t % 32) // 4 and that + 8, register i at row
offset 8 * (i % 2) and column 8 * (i // 2) + 2 * (t % 4) (`register_map`, checked by tests).

`decode_words` reads the codes as Layout.WGMMA_UPCAST_4X instead: 8 consecutive codes of a row
per 32-bit load (8 loads a thread and K-block instead of 32 byte loads). Codes j and j + 4 of a
word sit at the same place of its two 16-bit halves, so one shift and mask turn both into
their bf16 patterns (shift, shift, and, lop3 per pair, as the byte decode, without the byte's
extraction); the pairs are handed to wgmma as its registers with the K columns permuted
(mgpu_relabel, pairing "halves"), x permuted alike by the caller. A thread's 8 codes lie in one
group, and a thread meets 4 of a K-block's groups per row instead of all: half NVFP4's scale
conversions.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

from .mgpu_relabel import TILE, _positions
from .mx_decode import BF16X2_2_POW_126, e8m0_to_f32, expand_groups
from .mx_dense import dequantized

__all__ = ["Format", "FORMATS", "E2M1_VALUES", "register_map", "word_register_map",
           "nibble_patterns", "word_patterns", "decode_jnp", "decode", "decode_words",
           "predecode_weights", "scale_splat_values"]


class Format(NamedTuple):
    """A group-scaled weight format as the kernel reads it."""
    name: str
    elem: str  # "e2m1" (packed codes, viewed int4) | "e4m3"
    scale: str  # "e4m3" | "e8m0" (one byte per group, as stored)
    group: int  # K values per scale
    post_factor: float  # the decoded weights are the true ones / post_factor

    @property
    def scale_bytes(self) -> int:  # per 128-wide K-block and weight row
        return 128 // self.group

    @property
    def bits(self) -> float:  # stored bits per weight, its scale's share included
        return (4 if self.elem == "e2m1" else 8) + 8 / self.group


FORMATS = {f.name: f for f in (Format("nvfp4", "e2m1", "e4m3", 16, 2.0 ** 8),
                               Format("mxfp4", "e2m1", "e8m0", 32, 1.0),
                               Format("mxfp8", "e4m3", "e8m0", 32, 1.0))}
E2M1_VALUES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       np.float32)
_NVFP4_SCALE_FACTOR = 0x7A800000  # float32 2**118


@functools.cache
def register_map(group: int, width: int = TILE[1]) -> tuple[np.ndarray, np.ndarray]:
    """(row offset, K group) of each register of a thread's (64, width) tile in Layout.WGMMA
    (width 128: a K-block; 64: half of one, wgmma_halves), the same for every thread; raises if
    the layout is not what the decode assumes (two consecutive K values per register, rows
    base(t) and base(t) + 8)."""
    pos = _positions(fa.WGMMA_LAYOUT, (TILE[0], width))  # (threads, elements): row * width + col
    rows, cols = pos // width, pos % width
    t = np.arange(pos.shape[0])
    base = (t // 32) * 16 + (t % 32) // 4
    if not (np.array_equal(rows[:, 0], base) and np.array_equal(pos[:, 1::2], pos[:, ::2] + 1)):
        raise AssertionError("Layout.WGMMA is not the row / pair layout the decode assumes")
    offset, grp = rows[:, ::2] - base[:, None], cols[:, ::2] // group
    if not (np.all(offset == offset[0]) and np.all(grp == grp[0])
            and set(np.unique(offset)) == {0, 8}):
        raise AssertionError("Layout.WGMMA's registers differ between threads")
    return offset[0], grp[0]


@functools.cache
def word_register_map(width: int = TILE[1]) -> np.ndarray:
    """Column of the first code of each register of a thread's (64, width) tile in
    Layout.WGMMA_UPCAST_4X, less 8 * (t % 4) (the same for every thread); raises if the
    layout is not what decode_words assumes (rows base(t) + 8 * (i % 2), 8 consecutive codes
    from column 32 * (i // 2) + 8 * (t % 4))."""
    layout = fa.WGMMA_LAYOUT_UPCAST_4X
    vec = layout.vector_length
    # (threads, registers, codes)
    pos = _positions(layout, (TILE[0], width)).reshape(128, -1, vec)
    rows, cols = pos // width, pos % width
    t = np.arange(128)[:, None]
    i = np.arange(pos.shape[1])[None, :]
    base = (t // 32) * 16 + (t % 32) // 4
    first = 32 * (i // 2) + 8 * (t % 4)
    if not (vec == 8 and np.array_equal(rows, np.broadcast_to((base + 8 * (i % 2))[..., None],
                                                               rows.shape))
            and np.array_equal(cols, first[..., None] + np.arange(vec))):
        raise AssertionError("Layout.WGMMA_UPCAST_4X is not the layout decode_words assumes")
    return first[0]


def word_patterns(q: np.ndarray) -> np.ndarray:
    """decode_words' integer step on 32-bit words q of 8 codes (code j in bits 4j..4j+3):
    (..., 4) bf16x2 patterns, pair j = codes j (low half) and j + 4 (high half)."""
    q = q.astype(np.uint32)[..., None]
    j = np.arange(4, dtype=np.int64)
    mag_shift, sign_shift = 6 - 4 * j, 12 - 4 * j

    def shift(v, by):
        return np.where(by >= 0, v << np.maximum(by, 0).astype(np.uint32),
                        v >> np.maximum(-by, 0).astype(np.uint32)).astype(np.uint32)
    return ((shift(q, mag_shift) & np.uint32(0x01C001C0))
            | (shift(q, sign_shift) & np.uint32(0x80008000)))


def nibble_patterns(b: np.ndarray) -> np.ndarray:
    """The decode's integer step on bytes b (uint32 array): the bf16x2 patterns (low half: the
    low nibble) of both codes, as the PTX computes them."""
    b = b.astype(np.uint32)
    u = (b * np.uint32(0x40040)) & np.uint32(0x01C001C0)
    return u | ((b * np.uint32(0x1001000)) & np.uint32(0x80008000))


def scale_splat_values(scale_bytes: np.ndarray, fmt: Format) -> np.ndarray:
    """float32 of the bf16 factor the PTX splats for scale bytes (NVFP4: s * 2**118 rounded to
    bf16; MX: the e8m0 scale as a bf16 bit pattern)."""
    b = scale_bytes.astype(np.uint8)
    if fmt.scale == "e4m3":
        s = b.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        return (s * np.float32(2.0 ** 118)).astype(ml_dtypes.bfloat16).astype(np.float32)
    return np.asarray(e8m0_to_f32(jnp.asarray(b)))  # (bf16 numbers, the subnormal included)


def _e2m1_jnp(codes: jax.Array) -> jax.Array:
    nib = codes.astype(jnp.int32) & 0xF  # (no table: a kernel may not close over arrays)
    e, half = (nib >> 1) & 3, (nib & 1).astype(jnp.float32) * 0.5
    mag = jnp.where(e == 0, half, jnp.ldexp(1.0 + half, e - 1))
    return jnp.where(nib >= 8, -mag, mag)


def decode_jnp(w: jax.Array, scales: jax.Array, fmt: Format) -> jax.Array:
    """w: int4 codes (e2m1 formats) or e4m3 values, (rows, 128) -- a K-block; scales uint8
    (rows, fmt.scale_bytes) -> bf16 weight * scale / fmt.post_factor: the values `decode` gives,
    for the interpreter."""
    v = _e2m1_jnp(w) if fmt.elem == "e2m1" else w.astype(jnp.float32)
    s = (lax.bitcast_convert_type(scales, jnp.float8_e4m3fn).astype(jnp.float32)
         if fmt.scale == "e4m3" else e8m0_to_f32(scales))
    s = expand_groups(s, fmt.group)
    return (v * s * (1.0 / fmt.post_factor)).astype(jnp.bfloat16)


def predecode_weights(w: jax.Array, scales: jax.Array, fmt: Format,
                      interpret: bool = False) -> jax.Array:
    """The whole weight as decode_jnp decodes a K-block -- bf16 (N, K) = code * scale /
    fmt.post_factor -- by the dense path's dequantization (group_a16_mgpu's predecode;
    mx_dense.dequantized: group_dequant's Pallas pass where it fits, else XLA's float4
    conversion, 3x faster than decode_jnp's arithmetic; the same bits): e2m1 codes packed as
    stored (uint8 (N, K/2), low nibble first) or e4m3 (N, K); scales uint8 (N, K/group).
    interpret: the Pallas pass in the interpreter."""
    return dequantized(w, scales, elem=fmt.elem, scale=fmt.scale, group=fmt.group,
                       factor=1.0 / fmt.post_factor, interpret=interpret)


_NVFP4_SCALES_PTX = """{
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
}""" % ((_NVFP4_SCALE_FACTOR,) * 4)

# e8m0 bytes -> bf16 patterns u << 7, 0 -> the subnormal 2**-127, 255 -> NaN, each splat
_E8M0_SCALES_PTX = "{\n.reg .b32 t, p;\n.reg .pred z;\n" + "".join(f"""bfe.u32 t, $4, {8 * i}, 8;
shl.b32 p, t, 7;
setp.eq.u32 z, t, 0;
selp.b32 p, 0x40, p, z;
setp.eq.u32 z, t, 255;
selp.b32 p, 0x7FC0, p, z;
prmt.b32 ${i}, p, p, 0x1010;
""" for i in range(4)) + "}"

_E2M1_PTX = """{
.reg .b32 u, v;
mul.lo.u32 u, $1, 0x40040;
mul.lo.u32 v, $1, 0x1001000;
and.b32 v, v, 0x80008000;
lop3.b32 u, u, 0x01C001C0, v, 0xEA;
%s
}"""


def _times_scale(scale: str, pattern: str, scratch: str, out: str, splat: str) -> str:
    """PTX: out = the bf16x2 `pattern` register times the `splat` (MX: first times 2**126,
    through `scratch`) -- one rendering for both decodes."""
    if scale == "e4m3":
        return f"mul.rn.bf16x2 {out}, {pattern}, {splat};"
    return (f"mov.b32 {scratch}, 0x{BF16X2_2_POW_126:08X};\n"
            f"mul.rn.bf16x2 {pattern}, {pattern}, {scratch};\n"
            f"mul.rn.bf16x2 {out}, {pattern}, {splat};")


def _byte_ptx(scale: str) -> str:  # byte $1 -> its two codes times the splat $2, in $0
    return _E2M1_PTX % _times_scale(scale, "u", "v", "$0", "$2")


# codes j and j + 4 of word $4 -> pair j ($j) times the splat $5 (MX: first times 2**126)
_WORD_PTX = "{\n.reg .b32 a, b, c;\n" + "".join(f"""{"shl" if 6 - 4 * j > 0 else "shr"}.b32 a, $4, {abs(6 - 4 * j)};
{f"shl.b32 b, $4, {12 - 4 * j};" if j < 3 else "mov.b32 b, $4;"}
and.b32 b, b, 0x80008000;
lop3.b32 a, a, 0x01C001C0, b, 0xEA;
%(times{j})s
""" for j in range(4)) + "}"


def _word_ptx(scale: str) -> str:
    return _WORD_PTX % {f"times{j}": _times_scale(scale, "a", "c", f"${j}", "$5")
                        for j in range(4)}


_SCALES_PTX = {"e4m3": _NVFP4_SCALES_PTX, "e8m0": _E8M0_SCALES_PTX}  # 4 scale bytes -> splats


def _row_scale_words(ref, fmt: Format):
    """Inside an inline Mosaic GPU body: (thread index in the warpgroup, {row offset (0, 8):
    the thread's row's scale bytes as 32-bit words}) from the (64, scale_bytes) ref."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import arith, vector
    i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    c = mgpu_utils.c
    t = arith.remui(mgpu_utils.thread_idx(), c(128, i32))
    base = arith.addi(arith.muli(arith.divui(t, c(32, i32)), c(16, i32)),
                      arith.divui(arith.remui(t, c(32, i32)), c(4, i32)))
    words = fmt.scale_bytes // 4
    rows = {}
    for off in (0, 8):
        row = arith.index_cast(index, arith.addi(base, c(off, i32)))
        raw = vector.load(ir.VectorType.get((fmt.scale_bytes,), i8), ref,
                          [row, arith.constant(index, 0)])
        packed = mgpu_utils.bitcast(raw, ir.VectorType.get((words,), i32))
        rows[off] = [vector.extract(packed, dynamic_position=[],
                                    static_position=ir.DenseI64ArrayAttr.get([wi]))
                     for wi in range(words)]
    return t, rows


def _tile(half: int | None) -> tuple[int, int]:
    """The (rows, K) tile a decode takes: a K-block, or half of one (half 0 or 1)."""
    return TILE if half is None else (TILE[0], TILE[1] // 2)


def decode(w: jax.Array, scales, fmt: Format, half: int | None = None) -> jax.Array:
    """w: int4 codes (e2m1 formats) or bf16 values (e4m3, converted exactly), (64, 128) in
    Layout.WGMMA (a warpgroup's K-block) -- or with `half` (0 / 1) that K-block's first or
    second 64 columns (64, 64); scales: a shared-memory ref (64, fmt.scale_bytes) uint8 (the
    K-block's group scales) -> bf16 weight * scale / fmt.post_factor in Layout.WGMMA, wgmma's
    A operand. GPU only (inline Mosaic GPU)."""
    tile = _tile(half)
    offset, group = register_map(fmt.group, tile[1])
    first = 0 if half is None else half * tile[1] // fmt.group  # the tile's first group
    wanted = range(first, first + tile[1] // fmt.group)
    out = plgpu.ShapeDtypeStruct(tile, jnp.bfloat16, layout=plgpu.Layout.WGMMA)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()), return_type=out)
    def body(ctx, arr, ref):
        del ctx
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import arith
        i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
        ptx = _SCALES_PTX[fmt.scale]
        splats = {}  # (row offset, group) -> bf16x2 of the group's factor twice
        for off, words in _row_scale_words(ref, fmt)[1].items():
            for wi, word in enumerate(words):
                if not any(4 * wi + g in wanted for g in range(4)):
                    continue  # (a half's decode: the other half's groups)
                for g, val in enumerate(mgpu_utils.inline_ptx(ptx, word,
                                                              result_types=[i32] * 4)):
                    splats[off, 4 * wi + g] = val
        bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
        regs = np.empty(arr.registers.shape, dtype=object)
        for i, reg in enumerate(arr.registers.flat):
            splat = splats[int(offset[i]), first + int(group[i])]
            if fmt.elem == "e2m1":
                byte = arith.extui(i32, mgpu_utils.bitcast(reg, i8))
                val = mgpu_utils.inline_ptx(_byte_ptx(fmt.scale), byte, splat,
                                            result_types=i32)
            else:  # bf16 pairs of e4m3 values: times the scale
                val = mgpu_utils.inline_ptx("mul.rn.bf16x2 $0, $1, $2;",
                                            mgpu_utils.bitcast(reg, i32), splat,
                                            result_types=i32)
            regs.flat[i] = mgpu_utils.bitcast(val, bf16x2)
        return fa.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

    return body(w, scales)


def decode_words(w: jax.Array, scales, fmt: Format, half: int | None = None) -> jax.Array:
    """w: int4 codes (64, 128) in Layout.WGMMA_UPCAST_4X (a warpgroup's K-block; with `half`,
    its first or second 64 columns); scales: a shared-memory ref (64, fmt.scale_bytes) uint8
    (the K-block's) -> bf16 weight * scale / fmt.post_factor in Layout.WGMMA with the K columns
    permuted as mgpu_relabel.permute_k(..., "halves") shows them (x must be permuted alike:
    the permutation stays inside each 32 columns, so a half's columns are its own). e2m1
    formats; GPU only (inline Mosaic GPU)."""
    from .mgpu_relabel import pair_slots
    if fmt.elem != "e2m1":
        raise ValueError(f"decode_words decodes e2m1 codes, not {fmt.elem} ({fmt.name})")
    tile = _tile(half)
    word_register_map(tile[1])  # the layout it assumes, or an error at trace time
    slots = pair_slots("halves", tile[1])
    chunk0 = 0 if half is None else half * tile[1] // 32  # the tile's first 32-column chunk
    out = plgpu.ShapeDtypeStruct(tile, jnp.bfloat16, layout=plgpu.Layout.WGMMA)
    per_group = fmt.group // 8  # 8-code chunks per group: NVFP4 2 (a thread's parity), MX 4
    ptx = _word_ptx(fmt.scale)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA_UPCAST_4X, plgpu.RefType()),
                       return_type=out)
    def body(ctx, arr, ref):
        del ctx
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import arith
        i32 = ir.IntegerType.get_signless(32)
        c = mgpu_utils.c
        t, rows = _row_scale_words(ref, fmt)
        splats = {}  # (row offset, j) -> the splat of register pair j's group (i // 2 == j)
        for off, word in rows.items():
            if per_group == 2:  # NVFP4: this thread's groups are 2j + (t % 4) // 2
                odd = arith.divui(arith.remui(t, c(4, i32)), c(2, i32))
                sel = arith.addi(c(0x6420, i32), arith.muli(odd, c(0x1111, i32)))
                mine = mgpu_utils.inline_ptx("prmt.b32 $0, $1, $2, $3;", word[0], word[1], sel,
                                             result_types=i32)
            else:  # MX: group j of the row for every thread
                mine = word[0]
            for j, val in enumerate(mgpu_utils.inline_ptx(_SCALES_PTX[fmt.scale], mine,
                                                          result_types=[i32] * 4)):
                splats[off, j] = val
        bf16x2 = ir.VectorType.get((2,), ir.BF16Type.get())
        regs = np.empty(fa.WGMMA_LAYOUT.registers_shape(tile), dtype=object)
        for i, reg in enumerate(arr.registers.flat):
            q = mgpu_utils.bitcast(reg, i32)
            pairs = mgpu_utils.inline_ptx(ptx, q, splats[8 * (i % 2), chunk0 + i // 2],
                                          result_types=[i32] * 4)
            for j, val in enumerate(pairs):
                regs.flat[slots[4 * i + j]] = mgpu_utils.bitcast(val, bf16x2)
        return fa.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

    return body(w, scales)
