"""Group-scaled weights (NVFP4, MXFP4, MXFP8) dequantized to bf16 by one Pallas (Triton) pass:
the dense path's GEMM operand (mx_dense, default mode from DENSE_MIN_M rows) and the Mosaic
kernel's predecoded weights (group_a16_mgpu, deterministic mode at prefill sizes).

The same values as mx_dense.dequantize_bf16 (XLA), bit for bit: each element is decoded to its
exact float32 value, multiplied by its group's scale (float32, exact: e2m1 * e4m3 and
e2m1 / e4m3 * 2**k are float32 numbers), then by `factor` (a power of two) where it is not 1,
then rounded once to bf16 -- the same operations in the same order. (A NaN code times a NaN
scale is NaN in both, its sign either operand's: IEEE 754 leaves that open.) Why a kernel of
our own: XLA's fused dequantization of an 8192 x 8192 weight ran at 1.7 TB/s (MXFP4, 100.9 us) and
2.5 TB/s (MXFP8, 80.8 us) against fp8_widen's 3.9 TB/s (H200, session 20 call 6,
benchmarks/profile_prefill.py).

Packed e2m1 bytes give two bf16 values each; the pass writes them as one 32-bit word (the low
nibble's value in the low half: on-disk element order), so the (N, K/2) uint32 result is the
(N, K) bf16 weight by a bitcast, without interleaving inside the kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .mx_decode import E2M1_DECODE_SHIFT, e2m1_nibbles_to_f32, e8m0_to_f32, expand_groups

__all__ = ["dequantize_groups", "dequant_pass_fits", "DEQUANT_ROWS"]

F32, BF16 = jnp.float32, jnp.bfloat16
DEQUANT_ROWS = 16  # weight rows per program
# stored bytes of a row per program: the widest dividing the row (as fp8_widen's columns)
_COLS = {"e2m1": (512, 256, 128, 64), "e4m3": (1024, 512, 256, 128)}
_WARPS = 4


def _per_scale(elem: str, group: int) -> int:
    """Stored bytes of a row that one scale covers."""
    return group // 2 if elem == "e2m1" else group


def dequant_pass_fits(n: int, k: int, *, elem: str, group: int) -> bool:
    """Whether an (N, K) weight of `elem` codes with one scale per `group` goes through this
    pass (N a multiple of DEQUANT_ROWS, a row's bytes of the narrowest program width) rather
    than XLA's dequantization (the same values)."""
    row_bytes = k // 2 if elem == "e2m1" else k
    return (n % DEQUANT_ROWS == 0 and k % group == 0 and row_bytes % _COLS[elem][-1] == 0
            and _COLS[elem][-1] % _per_scale(elem, group) == 0)


def _bits(v: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(v.astype(BF16), jnp.uint16).astype(jnp.uint32)


def _kernel(w_ref, s_ref, o_ref, *, elem: str, scale: str, per: int, factor: float):
    s = s_ref[...]
    s = expand_groups(e8m0_to_f32(s) if scale == "e8m0" else s.astype(F32), per)

    def value(q):  # the element's exact value times its group scale (and factor), in float32
        v = q * s
        return v if factor == 1.0 else v * factor

    if elem == "e2m1":
        lo, hi = e2m1_nibbles_to_f32(w_ref[...])  # value * 2**-14: back to the value, exactly
        o_ref[...] = (_bits(value(lo * E2M1_DECODE_SHIFT))
                      | (_bits(value(hi * E2M1_DECODE_SHIFT)) << 16))
    else:
        o_ref[...] = value(w_ref[...].astype(F32)).astype(o_ref.dtype)


def dequantize_groups(w: jax.Array, w_scale: jax.Array, *, elem: str, scale: str, group: int,
                      factor: float = 1.0, interpret: bool = False) -> jax.Array:
    """(N, K) bf16 = element * group scale (* factor), exactly (dequant_pass_fits must hold).
    w: packed e2m1 bytes uint8 (N, K/2), low nibble first, or e4m3 (N, K) (or its bytes);
    w_scale: (N, K/group) e4m3 (or its bytes) for scale "e4m3", uint8 e8m0 for "e8m0"."""
    if elem not in _COLS or scale not in ("e4m3", "e8m0"):
        raise ValueError(f"dequantize_groups: elem must be e2m1 or e4m3 and scale e4m3 or "
                         f"e8m0, got {elem!r}, {scale!r}")
    n, row_bytes = w.shape if w.ndim == 2 else (0, 1)
    k = row_bytes * (2 if elem == "e2m1" else 1)
    if w.ndim != 2 or not dequant_pass_fits(n, k, elem=elem, group=group):
        shape = "(N, K/2) packed" if elem == "e2m1" else "(N, K)"
        raise ValueError(f"dequantize_groups: w must be {elem} {shape} with N a multiple of "
                         f"{DEQUANT_ROWS} and a row of a multiple of {_COLS[elem][-1]} bytes, "
                         f"got {tuple(w.shape)}")
    if w_scale.shape != (n, k // group):
        raise ValueError(f"dequantize_groups: w_scale must be (N, K/{group}) = "
                         f"{(n, k // group)}, got {tuple(w_scale.shape)}")
    w_ok = (jnp.uint8,) + ((jnp.float8_e4m3fn,) if elem == "e4m3" else ())
    if w.dtype not in [jnp.dtype(t) for t in w_ok]:
        raise ValueError(f"dequantize_groups: {'packed e2m1' if elem == 'e2m1' else 'e4m3'} "
                         f"codes must be {' or '.join(jnp.dtype(t).name for t in w_ok)}, got "
                         f"{w.dtype}")
    if w_scale.dtype.itemsize != 1:
        raise ValueError(f"dequantize_groups: w_scale must hold one byte a scale ({scale} or "
                         f"its bytes), got {w_scale.dtype}")
    if elem == "e4m3":
        w = lax.bitcast_convert_type(w, jnp.float8_e4m3fn)  # (same width: no data movement)
    w_scale = lax.bitcast_convert_type(
        w_scale, jnp.float8_e4m3fn if scale == "e4m3" else jnp.uint8)
    per = _per_scale(elem, group)
    cols = next(c for c in _COLS[elem] if w.shape[1] % c == 0)
    spec = lambda width: pl.BlockSpec((DEQUANT_ROWS, width), lambda i, j: (i, j))  # noqa: E731
    out = jax.ShapeDtypeStruct(w.shape, jnp.uint32 if elem == "e2m1" else BF16)
    y = pl.pallas_call(
        functools.partial(_kernel, elem=elem, scale=scale, per=per, factor=float(factor)),
        out_shape=out, grid=(n // DEQUANT_ROWS, w.shape[1] // cols),
        in_specs=[spec(cols), spec(cols // per)], out_specs=spec(cols),
        compiler_params=pltriton.CompilerParams(num_warps=_WARPS, num_stages=1),
        interpret=interpret, name=f"dequantize_{elem}_{scale}")(w, w_scale)
    if elem == "e2m1":  # each word: (low nibble's bf16, high nibble's) -> two columns
        y = lax.bitcast_convert_type(y, BF16).reshape(n, k)
    return y
