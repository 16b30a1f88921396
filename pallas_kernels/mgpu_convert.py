"""e4m3 weights -> bf16 / f16 in registers for wgmma's A operand (Mosaic GPU, sm_90), without
the float32 detour.

Mosaic GPU converts e4m3 only to f16 (`cvt.rn.f16x2.e4m3x2`); to reach bf16 its `astype` goes
f16 -> f32 -> bf16: per pair of weights one e4m3x2 conversion, two f16 -> f32 and one f32 pair
-> bf16 pair. On the H200 those conversions bound the W8A16 decode kernel: a 128 x 128 weight
block per pipeline step costs ~1190 cycles per SM whatever the number of compute warpgroups
(benchmarks/NOTES.md, session 8), where the bytes alone allow ~1050.

Here each pair takes the one e4m3x2 -> f16x2 conversion, then integer work on both halves at
once: an e4m3 value is a normal f16 (or zero) whose low 7 mantissa bits are zero, so clearing
the sign, shifting right by 3 and putting the sign back gives the bf16 bit pattern of the
value times 2^-112 -- exact, as is the bf16 multiply by 2^112 that follows. The result is
bit for bit what astype gives for every finite e4m3 value (tests: the interpreter's reference
path on all 254 of them; on the GPU, the kernel's outputs bitwise against astype's). NaN
codes (0x7f / 0xff, which no checkpoint format here stores) do not stay NaN.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import llvm

__all__ = ["e4m3_to_16bit", "E4M3_TO_BF16_PTX"]

# $0: bf16x2 out; $1: two e4m3 bytes. 0x7780 is 2^112 in bf16.
E4M3_TO_BF16_PTX = """{
.reg .b32 h, t, s;
cvt.rn.f16x2.e4m3x2 h, $1;
and.b32 t, h, 0x7FFF7FFF;
shr.b32 t, t, 3;
lop3.b32 t, t, h, 0x80008000, 0xF8;
mov.b32 s, 0x77807780;
mul.rn.bf16x2 $0, t, s;
}"""
_E4M3_TO_F16_PTX = "cvt.rn.f16x2.e4m3x2 $0, $1;"


def _convert_fragments(arr: mgpu.FragmentedArray, dtype) -> mgpu.FragmentedArray:
    """The registers of arr (e4m3, vectors of an even length) converted pair by pair."""
    target = mgpu_utils.dtype_to_ir_type(jnp.dtype(dtype))
    i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
    ptx = E4M3_TO_BF16_PTX if jnp.dtype(dtype) == jnp.bfloat16 else _E4M3_TO_F16_PTX
    pair_ty = ir.VectorType.get((2,), target)
    new = arr.registers.copy()
    for idx, reg in enumerate(arr.registers.flat):
        [length] = ir.VectorType(reg.type).shape
        if length % 2:
            raise NotImplementedError(f"e4m3 registers of {length} values (need pairs)")
        pairs = [mgpu_utils.vector_slice(reg, slice(j, j + 2)) if length > 2 else reg
                 for j in range(0, length, 2)]
        out = [mgpu_utils.bitcast(
            llvm.inline_asm(i32, [mgpu_utils.bitcast(p, i16)], ptx, "=r,h"), pair_ty)
            for p in pairs]
        new.flat[idx] = mgpu_utils.vector_concat(out) if len(out) > 1 else out[0]
    return mgpu.FragmentedArray(_registers=new, _layout=arr.layout, _is_signed=None)


def e4m3_to_16bit(w, dtype):
    """w: an e4m3 (rows, cols) array in wgmma's register layout (Layout.WGMMA) inside a Mosaic
    GPU kernel -> the same values as dtype (bf16 or f16), same layout. GPU only: the
    interpreter cannot run inline PTX (the kernels use astype there: the same values)."""
    out = plgpu.ShapeDtypeStruct(w.shape, jnp.dtype(dtype), layout=plgpu.Layout.WGMMA)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA,), return_type=out)
    def convert(ctx, arr):
        del ctx
        return _convert_fragments(arr, dtype)

    return convert(w)
