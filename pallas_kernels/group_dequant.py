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
benchmarks/profile_prefill.py). This pass: MXFP8 56.1 us (3.6 TB/s); e2m1 by the "asm" decode
48.3 us (MXFP4) / 48.6 us (NVFP4), 3.5 TB/s, against 61.4 / 52.9 us by the "jnp" one (session
22 call 2, `profile_prefill.py --only dequant`).

Packed e2m1 bytes give two bf16 values each; the pass writes them as one 32-bit word (the low
nibble's value in the low half: on-disk element order), so the (N, K/2) uint32 result is the
(N, K) bf16 weight by a bitcast, without interleaving inside the kernel.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .mx_decode import (E2M1_DECODE_SHIFT, e2m1_nibbles_to_f32, e2m1_words_bf16_asm,
                        e8m0_to_f32, expand_groups)

__all__ = ["dequantize_groups", "dequant_pass_fits", "DEQUANT_ROWS", "DECODES", "CODES_PER_BYTE"]

F32, BF16 = jnp.float32, jnp.bfloat16
DEQUANT_ROWS = 16  # weight rows per program
# stored bytes of a row per program: the widest dividing the row (as fp8_widen's columns)
_COLS = {"e2m1": (512, 256, 128, 64), "e4m3": (1024, 512, 256, 128)}
_WARPS = 4
# How e2m1 codes become bf16: "jnp" (float16 bit patterns, float32 products, rounded to bf16;
# runs in interpret mode) or "asm" (mx_decode.e2m1_words_bf16_asm: integer ops to bf16 patterns,
# bf16x2 products, GPU only) -- the same bits: every product is exact (e2m1 * e4m3 has at most
# 6 significant bits, e2m1 * 2**k is e2m1 shifted; times a power-of-two factor, still exact) or
# overflows alike. e4m3 codes always take "jnp" (one conversion and multiply per weight).
DECODES = ("jnp", "asm")


CODES_PER_BYTE = {"e2m1": 2, "e4m3": 1}  # a row of K codes is K / this stored bytes


def _per_scale(elem: str, group: int) -> int:
    """Stored bytes of a row that one scale covers."""
    return group // CODES_PER_BYTE[elem]


def dequant_pass_fits(n: int, k: int, *, elem: str, group: int) -> bool:
    """Whether an (N, K) weight of `elem` codes with one scale per `group` goes through this
    pass (N a multiple of DEQUANT_ROWS, a row's bytes of the narrowest program width) rather
    than XLA's dequantization (the same values)."""
    row_bytes = k // CODES_PER_BYTE[elem]
    return (n % DEQUANT_ROWS == 0 and k % group == 0 and row_bytes % _COLS[elem][-1] == 0
            and _COLS[elem][-1] % _per_scale(elem, group) == 0)


def _bits(v: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(v.astype(BF16), jnp.uint16).astype(jnp.uint32)


def _scale_f32(s: jax.Array, scale: str) -> jax.Array:
    """Scale values (e4m3, or e8m0 bytes) -> their exact float32 values."""
    return e8m0_to_f32(s) if scale == "e8m0" else s.astype(F32)


def _bf16_pairs(s: jax.Array, scale: str) -> jax.Array:
    """Scale values -> uint32 words holding the scale's bf16 bits in both halves: the high half
    of its float32 bits, exact because e4m3 and e8m0 numbers are bf16 numbers (the e8m0
    subnormal 2**-127 and NaN of e8m0_to_f32 included) -- no float32 -> bf16 conversion."""
    bits = lax.bitcast_convert_type(_scale_f32(s, scale), jnp.uint32) >> 16
    return bits | (bits << 16)


def _kernel_asm(w_ref, s_ref, o_ref, *, scale: str, per: int, factor: float):
    pairs = expand_groups(_bf16_pairs(s_ref[...], scale), per)
    factor_pair = None
    if factor != 1.0:  # a power of two: its bf16 bits are exact
        f = int(np.array(factor, ml_dtypes.bfloat16).view(np.uint16))
        factor_pair = f | f << 16
    o_ref[...] = e2m1_words_bf16_asm(w_ref[...], pairs, factor_pair)


def _kernel(w_ref, s_ref, o_ref, *, elem: str, scale: str, per: int, factor: float):
    s = expand_groups(_scale_f32(s_ref[...], scale), per)

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
                      factor: float = 1.0, interpret: bool = False,
                      decode: str | None = None) -> jax.Array:
    """(N, K) bf16 = element * group scale (* factor, a power of two), exactly
    (dequant_pass_fits must hold). w: packed e2m1 bytes uint8 (N, K/2), low nibble first, or
    e4m3 (N, K) (or its bytes); w_scale: (N, K/group) e4m3 (or its bytes) for scale "e4m3",
    uint8 e8m0 for "e8m0". decode: see DECODES (e2m1 only); None = "asm" on the GPU."""
    if elem not in _COLS or scale not in ("e4m3", "e8m0"):
        raise ValueError(f"dequantize_groups: elem must be e2m1 or e4m3 and scale e4m3 or "
                         f"e8m0, got {elem!r}, {scale!r}")
    if decode is None:
        decode = "asm" if elem == "e2m1" and not interpret else "jnp"
    if decode not in DECODES or (decode == "asm" and elem != "e2m1"):
        raise ValueError(f"dequantize_groups: decode must be one of {DECODES} ('asm' for e2m1 "
                         f"only), got {decode!r} for {elem}")
    if decode == "asm" and interpret:
        raise ValueError("dequantize_groups: decode='asm' is PTX and cannot run in interpret "
                         "mode; use 'jnp'")
    if not (factor > 0 and math.frexp(factor)[0] == 0.5):
        raise ValueError(f"dequantize_groups: factor must be a power of two (a product that "
                         f"stays exact), got {factor!r}")
    n, row_bytes = w.shape if w.ndim == 2 else (0, 1)
    k = row_bytes * CODES_PER_BYTE[elem]
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
    body = (functools.partial(_kernel_asm, scale=scale, per=per, factor=float(factor))
            if decode == "asm" else
            functools.partial(_kernel, elem=elem, scale=scale, per=per, factor=float(factor)))
    y = pl.pallas_call(
        body,
        out_shape=out, grid=(n // DEQUANT_ROWS, w.shape[1] // cols),
        in_specs=[spec(cols), spec(cols // per)], out_specs=spec(cols),
        compiler_params=pltriton.CompilerParams(num_warps=_WARPS, num_stages=1),
        interpret=interpret, name=f"dequantize_{elem}_{scale}")(w, w_scale)
    if elem == "e2m1":  # each word: (low nibble's bf16, high nibble's) -> two columns
        y = lax.bitcast_convert_type(y, BF16).reshape(n, k)
    return y
