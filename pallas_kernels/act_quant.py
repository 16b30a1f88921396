"""FP8 activation codes by one Pallas (Triton) pass: q = e4m3(clip(x / s, +-448)) with the
scales s already computed (by the caller's producer rule), elementwise over (M, K) tiles.

Why a kernel of our own (session 31): the quotient must be the correctly rounded one (the
producers divide in IEEE float32), and XLA's GPU division is not (div.full.f32); jqlin's
exact XLA division corrects it with integer arithmetic, which made the codes pass ALU-bound
at prefill sizes (H200, 4096 x 8192 bf16: 173 us, against 86 us for the inexact division).
Here the quotient is the hardware's own IEEE division (`div.rn.f32`), and the cast is the
compiler's round-to-nearest-even e4m3 conversion after the clip -- the same bits as
jqlin.numerics (tests: bitwise on the GPU, every rule).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .mx_decode import expand_groups

__all__ = ["e4m3_codes", "ROWS", "COLS"]

ROWS = 16  # activation rows per program
COLS = 512  # K columns per program (a multiple of every group size used: 128)
_WARPS = 4
_E4M3_MAX = 448.0


def div_rn(a: jax.Array, b: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 a / b correctly rounded: PTX div.rn.f32, spelled out (a plain `/` is not
    promised IEEE on the GPU: XLA's is div.full.f32). Interpret mode: the CPU's IEEE division,
    its divisor behind a barrier (XLA would make a division by a broadcast a reciprocal
    multiply)."""
    if interpret:
        return a / jax.lax.optimization_barrier(jnp.broadcast_to(b, a.shape))
    [q] = pltriton.elementwise_inline_asm(
        "div.rn.f32 $0, $1, $2;", args=[a, b], constraints="=r,r,r", pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)])
    return q


def _kernel(x_ref, s_ref, q_ref, *, m: int, rows: int, per: int | None, interpret: bool):
    # per: K columns a scale covers (a group), 1 a row's, None the tensor's
    # Pallas' Triton lowering masks nothing by itself: the last row block, where M is not a
    # multiple of `rows`, loads and stores under a mask of the live rows (unmasked, its stores
    # overwrote the next buffer on the H200)
    live = pl.program_id(0) * rows + jax.lax.broadcasted_iota(jnp.int32, (rows, 1), 0) < m
    cols = x_ref.shape[1]
    x = pltriton.load(x_ref, mask=jnp.broadcast_to(live, (rows, cols)), other=0)
    x = x.astype(jnp.float32)
    if per is None:
        s = jnp.broadcast_to(s_ref[...], x.shape)
    else:
        s = pltriton.load(s_ref, mask=jnp.broadcast_to(live, s_ref.shape), other=1.0)
        s = expand_groups(s, per) if per > 1 else jnp.broadcast_to(s, x.shape)
    q = jnp.clip(div_rn(x, s, interpret=interpret), -_E4M3_MAX, _E4M3_MAX)
    pltriton.store(q_ref, q.astype(q_ref.dtype), mask=jnp.broadcast_to(live, (rows, cols)))


def e4m3_codes(x: jax.Array, scale: jax.Array, *, interpret: bool = False) -> jax.Array:
    """x (M, K) float (K a multiple of 128), scale float32 (1, 1) per tensor, (M, 1) per row or
    (M, K / g) per group of g (a divisor of COLS) along K -> e4m3 codes (M, K) of
    clip(x / scale, +-448), the quotient correctly rounded, ties to even."""
    if x.ndim != 2 or x.shape[1] % 128:
        raise ValueError(f"e4m3_codes: x must be (M, K) with K a multiple of 128, got {x.shape}")
    m, k = x.shape
    if scale.dtype != jnp.float32 or scale.ndim != 2 or scale.shape[0] not in (1, m):
        raise ValueError(f"e4m3_codes: scale must be float32 (1, 1), ({m}, 1) or ({m}, K/g), "
                         f"got {scale.dtype} {scale.shape}")
    rows, cols = min(ROWS, pl.next_power_of_2(m)), COLS if k % COLS == 0 else 128
    if scale.shape == (1, 1):
        s_spec, per = pl.BlockSpec((1, 1), lambda i, j: (0, 0)), None
    elif scale.shape[1] == 1:
        s_spec, per = pl.BlockSpec((rows, 1), lambda i, j: (i, 0)), 1
    else:
        group = k // scale.shape[1]
        if group * scale.shape[1] != k or cols % group:
            raise ValueError(f"e4m3_codes: a per-group scale {scale.shape} must divide K = {k} "
                             f"into groups dividing {cols}")
        s_spec, per = pl.BlockSpec((rows, cols // group), lambda i, j: (i, j)), group
    block = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
    return pl.pallas_call(
        functools.partial(_kernel, m=m, rows=rows, per=per, interpret=interpret),
        out_shape=jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn),
        grid=(pl.cdiv(m, rows), k // cols), in_specs=[block, s_spec], out_specs=block,
        compiler_params=pltriton.CompilerParams(num_warps=_WARPS, num_stages=1),
        interpret=interpret, name="e4m3_codes")(x, scale)
