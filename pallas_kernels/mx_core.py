"""One Triton-backend Pallas kernel body for group-scaled weights dequantized to bf16 MMAs.

    y[m, n] = post[n] * sum_k  x[m, k] * (q[n, k] * s[n, k // group])

serves NVFP4 (e2m1 elements, e4m3 scales per 16, a global scale), MXFP4 (e2m1, e8m0 per 32)
and MXFP8 (e4m3, e8m0 per 32). Hopper has no FP4 MMA, and FP8 MMAs cannot take a scale that
changes every 16/32 elements of K, so each weight tile is decoded inside the kernel and
multiplied by its group scales in float32: e2m1 * e4m3, e2m1 * 2**k and e4m3 * 2**k all need at
most 6 significant bits, so the product is exact in bf16 (within bf16's exponent range) and
the bf16 MMA with float32 accumulation sees exactly the stored weight. The NVFP4 global scale
(a divisor or a multiplier, a scalar or one value per stored row after a fuse) multiplies or
divides the float32 accumulator per output column, once.

Activations arrive as one or more bf16 "parts" whose sum is the activation: one part for bf16
inputs and for quantized activations (exact in bf16); float16 inputs are split into a hi and a
lo bf16 part (exact), float32 inputs into three (exact to float32 rounding), so a bf16 MMA
never silently rounds a wider activation.

The weight is stored (N, K) row-major (packed (N, K/2) bytes for e2m1). The "swap" variant
makes the decoded weight tile the MMA's A operand (it stays in registers) and x^T the B
operand; "mma" puts x first; "gemv" (M <= 4) runs no MMA (see _gemv_body). Every operand read is masked where a tile can run off the edge
of M or N (the Triton backend does not mask block reads); K is never masked: K is a multiple
of block_k by construction (storage is padded to whole groups and block_k divides K).

Reduction order: the K-steps of a program run in order, each is one MMA chain over block_k
(parts in a fixed order); with split_k > 1 each split covers a contiguous K range and the
float32 partials are summed afterwards left to right. The order is a function of
(block_k, split_k, variant) alone; the tile sizes over M and N do not enter it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .common import MatmulConfig, cdiv, finish_rows
from .launch import launch_split_k, writes_partials
from .tiles import load2, mask2, row_tile_coords, store_tile, tile_coords
from .mx_dense import dense_dequant_matmul
from .mx_decode import (ASM_NVFP4_ACC_SHIFT, ASM_NVFP4_SCALE_SHIFT, E2M1_DECODE_SHIFT,
                        e2m1_bytes_to_f32, e2m1_nibbles_bf16_asm, e2m1_nibbles_to_f32,
                        e8m0_to_f32, expand_groups)

__all__ = ["mx_dequant_matmul", "split_activation", "activation_parts", "ELEMS", "SCALES",
           "FP4_LAYOUTS", "DECODES"]

F32, BF16 = jnp.float32, jnp.bfloat16
ELEMS = ("e2m1", "e4m3")  # e2m1: packed uint8 (N, K/2); e4m3: (N, K) as e4m3 or its bytes
SCALES = ("e4m3", "e8m0")  # group scales: e4m3 (NVFP4) or e8m0 exponent bytes (MX)
# How packed e2m1 pairs meet the activation: "interleave" decodes a byte into its two K-adjacent
# weights (one MMA over the tile); "split" keeps low and high nibbles as two half-width tiles
# and multiplies them with the even and odd activation columns (two MMAs, no register shuffle).
FP4_LAYOUTS = ("interleave", "split")
# How e2m1 codes become bf16 (split layout): "jnp" (float16 bit patterns, portable, runs in
# interpret mode) or "asm" (PTX on 4 packed bytes at a time, GPU only; see mx_decode).
DECODES = ("jnp", "asm")


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    n: int
    k: int
    cfg: MatmulConfig
    elem: str
    scale: str
    group: int
    n_parts: int
    post: str  # "none" | "mul" | "div": how the per-column post scale enters
    fp4_layout: str
    decode: str
    steps_per_split: int
    out_dtype: object


def _truncate_bf16(x: jax.Array) -> jax.Array:
    """float32 x with its low 16 bits cleared: exactly a bf16 number (bit ops, not a convert)."""
    bits = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFF0000)
    return lax.bitcast_convert_type(bits, F32)


_PARTS = {jnp.dtype(BF16): 1, jnp.dtype(jnp.float16): 2, jnp.dtype(F32): 3}


def activation_parts(dtype) -> int:
    """How many bf16 parts split_activation cuts an activation of this dtype into."""
    if jnp.dtype(dtype) not in _PARTS:
        raise ValueError(f"x must be bf16, f16 or f32, got {jnp.dtype(dtype)}")
    return _PARTS[jnp.dtype(dtype)]


def split_activation(x: jax.Array) -> list[jax.Array]:
    """bf16 parts whose float32 sum is x exactly: 1 for bf16, 2 for f16, 3 for f32.

    Each part is x's next 8 significant bits, cut by clearing low bits. (Rounding through a
    bf16 convert and subtracting is not safe: with xla_allow_excess_precision, on by default on
    GPU, XLA deletes the f32 -> bf16 -> f32 pair and the remainder becomes 0.) An infinite x is
    (inf, 0, 0): inf - inf would make the later parts NaN, and an inf activation's row NaN
    where x @ W gives +-inf.
    """
    count = activation_parts(x.dtype)
    if count == 1:
        return [x]
    rest = x.astype(F32)
    parts = []
    for _ in range(count):
        head = _truncate_bf16(rest)
        parts.append(head.astype(BF16))  # exact
        rest = jnp.where(jnp.isinf(rest), 0.0, rest - head)  # exact: head holds the leading bits
    return parts


def _decode_tile(p: _Static, w_ref, s_ref, n0, rn, k0):
    """The (bn, bk) bf16 weight tile at K offset k0: elements times group scales, exactly."""
    cfg = p.cfg
    bn, bk = cfg.block_n, cfg.block_k
    n_lim = p.n if p.n % bn else None
    rows = mask2(rn, n_lim, None, None)
    if p.elem == "e2m1":
        q = load2(w_ref, n0, bn, lax.div(k0, 2), bk // 2, rows)
        wf = e2m1_bytes_to_f32(q)  # value * 2**-14; given back on the accumulator
    else:
        q = load2(w_ref, n0, bn, k0, bk, rows)
        wf = lax.bitcast_convert_type(q, jnp.float8_e4m3fn).astype(F32)
    s = load2(s_ref, n0, bn, lax.div(k0, p.group), bk // p.group, rows)
    if p.scale == "e8m0":
        sf = e8m0_to_f32(s)
    else:
        sf = lax.bitcast_convert_type(s, jnp.float8_e4m3fn).astype(F32)
    return (wf * expand_groups(sf, p.group)).astype(BF16)


def _decode_split(p: _Static, w_ref, s_ref, n0, rn, k0):
    """(low, high) (bn, bk/2) bf16 tiles: elements k0, k0+2, ... and k0+1, k0+3, ..."""
    cfg = p.cfg
    bn, bk = cfg.block_n, cfg.block_k
    n_lim = p.n if p.n % bn else None
    rows = mask2(rn, n_lim, None, None)
    q = load2(w_ref, n0, bn, lax.div(k0, 2), bk // 2, rows)
    s = load2(s_ref, n0, bn, lax.div(k0, p.group), bk // p.group, rows)
    sf = e8m0_to_f32(s) if p.scale == "e8m0" else lax.bitcast_convert_type(
        s, jnp.float8_e4m3fn).astype(F32)
    if p.decode == "asm":
        if p.scale == "e4m3":
            sf = sf * ASM_NVFP4_SCALE_SHIFT
        se = expand_groups(sf.astype(BF16), p.group // 2)  # exact: e4m3 * 2**100, 2**k
        return e2m1_nibbles_bf16_asm(q, se, unbias=p.scale == "e8m0")
    se = expand_groups(sf, p.group // 2)
    lo, hi = e2m1_nibbles_to_f32(q)
    return (lo * se).astype(BF16), (hi * se).astype(BF16)


def _body(*refs, p: _Static):
    x_refs = refs[: p.n_parts]
    w_ref, s_ref = refs[p.n_parts], refs[p.n_parts + 1]
    c_ref = refs[p.n_parts + 2] if p.post != "none" else None
    o_ref = refs[-1]
    cfg = p.cfg
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    swap = cfg.variant == "swap"
    t = tile_coords(p.m, p.n, bm, bn, cfg.group_m, cfg.split_k, p.steps_per_split)
    m0, n0, rm, rn, m_lim, n_lim, step0 = t
    dims = (((1,), (1,)), ((), ()))
    split = p.elem == "e2m1" and p.fp4_layout == "split"

    def mma(acc, w, x):
        if swap:
            return acc + lax.dot_general(w, x, dims, preferred_element_type=F32)
        return acc + lax.dot_general(x, w, dims, preferred_element_type=F32)

    xmask = mask2(rm, m_lim, None, None)

    def step(i, acc):
        k0 = (step0 + i) * bk
        if split:
            lo, hi = _decode_split(p, w_ref, s_ref, n0, rn, k0)
            kh = lax.div(k0, 2)
            for j in range(0, len(x_refs), 2):  # fixed part order: (even, odd) per part
                acc = mma(acc, lo, load2(x_refs[j], m0, bm, kh, bk // 2, xmask))
                acc = mma(acc, hi, load2(x_refs[j + 1], m0, bm, kh, bk // 2, xmask))
            return acc
        w = _decode_tile(p, w_ref, s_ref, n0, rn, k0)
        for x_ref in x_refs:  # fixed part order
            acc = mma(acc, w, load2(x_ref, m0, bm, k0, bk, xmask))
        return acc

    acc = lax.fori_loop(0, p.steps_per_split, step,
                        jnp.zeros((bn, bm) if swap else (bm, bn), F32))
    if swap:
        acc = acc.T
    if not writes_partials(cfg.split_k):
        acc = _post(p, acc, c_ref, n0, rn, n_lim)
    store_tile(o_ref, t, acc, p.m, cfg.split_k)


def _gemv_body(*refs, p: _Static):
    """No MMA, for M <= 4 rows (variant "gemv"): each row keeps a float32 accumulator of the
    decoded tile's shape and adds the elementwise products of every K-step; the reduction
    across the tile runs once at the end (as fp8_core's gemv). The decoded weight tile is the
    same exact bf16 tile the MMA variants use. Order: per tile lane the K-steps in order, then
    Triton's fixed lane tree, then split-K partials left to right -- a function of the config,
    different from the MMA variants' (so never a deterministic-mode config)."""
    x_refs = refs[: p.n_parts]
    w_ref, s_ref = refs[p.n_parts], refs[p.n_parts + 1]
    c_ref = refs[p.n_parts + 2] if p.post != "none" else None
    o_ref = refs[-1]
    cfg = p.cfg
    bn, bk = cfg.block_n, cfg.block_k
    t = row_tile_coords(p.n, bn, cfg.split_k, p.steps_per_split)
    n0, rn, n_lim, step0 = t.n0, t.rn, t.n_lim, t.step0
    split = p.elem == "e2m1" and p.fp4_layout == "split"
    width = bk // 2 if split else bk

    def step(i, accs):
        k0 = (step0 + i) * bk
        if split:  # (low, high) nibble tiles meet the (even, odd) activation columns
            tiles = [t.astype(F32) for t in _decode_split(p, w_ref, s_ref, n0, rn, k0)]
            kx = lax.div(k0, 2)
        else:
            tiles = [_decode_tile(p, w_ref, s_ref, n0, rn, k0).astype(F32)]
            kx = k0
        new = []
        for r in range(p.m):
            acc = accs[r]
            for j, x_ref in enumerate(x_refs):  # fixed part order, as in _body
                xr = load2(x_ref, r, 1, kx, width, None).astype(F32)
                acc = acc + tiles[j % len(tiles)] * xr
            new.append(acc)
        return tuple(new)

    zero = jnp.zeros((bn, width), F32)
    accs = lax.fori_loop(0, p.steps_per_split, step, tuple(zero for _ in range(p.m)))
    for r in range(p.m):
        acc = jnp.sum(accs[r], axis=1)[None, :]
        if not writes_partials(cfg.split_k):
            acc = _post(p, acc, c_ref, n0, rn, n_lim)
        store_tile(o_ref, t._replace(m0=r), acc, p.m, cfg.split_k)


def _acc_shift(p: _Static) -> float:
    """Power of two the decoded weights were scaled by (given back on the accumulator)."""
    if p.elem != "e2m1":
        return 1.0
    if p.fp4_layout == "split" and p.decode == "asm":
        return ASM_NVFP4_ACC_SHIFT if p.scale == "e4m3" else 1.0
    return E2M1_DECODE_SHIFT


def _post(p: _Static, acc, c_ref, n0, rn, n_lim):
    """The decode shift, then the per-column post scale, on the float32 accumulator."""
    if _acc_shift(p) != 1.0:
        acc = acc * _acc_shift(p)
    if p.post == "none":
        return acc
    view = c_ref.at[pl.ds(n0, p.cfg.block_n)]
    c = view[...] if n_lim is None else pltriton.load(view, mask=rn < n_lim, other=1.0)
    return acc / c[None, :] if p.post == "div" else acc * c[None, :]


def _post_xla(p: _Static, y, col_scale):
    """_post for split-K: applied once to the summed partials (same operations, same order)."""
    return finish_rows(y, None if p.post == "none" else col_scale[None, :], _acc_shift(p),
                       p.post)


def _check(name, arr, shape, dtypes):
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if arr.dtype not in [jnp.dtype(d) for d in dtypes]:
        raise ValueError(f"{name} has dtype {arr.dtype}, expected one of {list(dtypes)}")


def validate_config(cfg: MatmulConfig, *, k: int, group: int, split_nibbles: bool = False,
                    m: int | None = None) -> int:
    """Checks a config against the problem; returns the K-steps per split."""
    if split_nibbles and cfg.block_k < 32:
        raise ValueError(f"the split e2m1 layout needs block_k >= 32 (two MMAs of K/2 >= 16), "
                         f"got {cfg.block_k}")
    if cfg.variant == "gemv" and m is not None and m > 4:
        raise ValueError(f"the gemv variant serves M <= 4 rows, got M={m}")
    if cfg.k_parts != 1:
        raise ValueError(f"k_parts={cfg.k_parts}: the dequantizing kernels run K parts as "
                         f"split_k (k_parts is an fp8 x fp8 option)")
    if cfg.block_k % group or cfg.block_k < group:
        raise ValueError(f"block_k={cfg.block_k} must be a multiple of the scale group {group}")
    if k % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must divide K={k} (K is never masked)")
    steps = k // cfg.block_k
    if steps % cfg.split_k:
        raise ValueError(f"split_k={cfg.split_k} must divide the {steps} K-steps "
                         f"(K={k}, block_k={cfg.block_k})")
    return steps // cfg.split_k


def mx_dequant_matmul(x_parts: Sequence[jax.Array], w: jax.Array, w_scale: jax.Array,
                      col_scale: jax.Array | None, *, elem: str, scale: str, group: int,
                      post: str, config: MatmulConfig, out_dtype, fp4_layout: str = "split",
                      decode: str | None = None, path: str = "pallas",
                      interpret: bool = False, poison: bool = False,
                      name: str = "mx_dequant_matmul") -> jax.Array:
    """y (M, N) = sum(x_parts) (M, K) @ dequant(w)^T, then per-column `post` with col_scale.

    x_parts: bf16 (M, K) arrays (see split_activation). w: packed uint8 (N, K/2) for e2m1,
    e4m3 or uint8 bytes (N, K) for e4m3. w_scale: (N, K/group), e4m3 or uint8 for scale
    "e4m3", uint8 exponents for "e8m0". col_scale: float32 (N,) for post "mul"/"div", else
    None. fp4_layout: see FP4_LAYOUTS (e2m1 only). decode: see DECODES; None = "asm" on the
    GPU with the split layout, "jnp" otherwise (interpret mode has no PTX). path: "pallas" (this
    kernel) or "dense" (mx_dense: exact bf16 dequantization + an XLA dot; not batch-invariant).
    poison: start from a NaN-filled output so unwritten elements stay visible (tests).
    """
    if elem not in ELEMS:
        raise ValueError(f"elem must be one of {ELEMS}, got {elem!r}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if fp4_layout not in FP4_LAYOUTS:
        raise ValueError(f"fp4_layout must be one of {FP4_LAYOUTS}, got {fp4_layout!r}")
    if decode is None:
        decode = "asm" if elem == "e2m1" and fp4_layout == "split" and not interpret else "jnp"
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
    if decode == "asm" and interpret:
        raise ValueError("decode='asm' is PTX and cannot run in interpret mode; use 'jnp'")
    if post not in ("none", "mul", "div"):
        raise ValueError(f"post must be 'none', 'mul' or 'div', got {post!r}")
    x_parts = list(x_parts)
    if not x_parts:
        raise ValueError("x_parts must hold at least one bf16 array")
    m, k = x_parts[0].shape
    for i, xp in enumerate(x_parts):
        _check(f"x_parts[{i}]", xp, (m, k), [BF16])
    if k % group:
        raise ValueError(f"K={k} must be a multiple of the scale group {group}")
    n = w.shape[0]
    if elem == "e2m1":
        _check("w", w, (n, k // 2), [jnp.uint8])
    else:
        _check("w", w, (n, k), [jnp.float8_e4m3fn, jnp.uint8])
        w = lax.bitcast_convert_type(w, jnp.uint8)  # same width: no data movement
    sdt = [jnp.uint8] + ([jnp.float8_e4m3fn] if scale == "e4m3" else [])
    _check("w_scale", w_scale, (n, k // group), sdt)
    w_scale = lax.bitcast_convert_type(w_scale, jnp.uint8)
    if (post == "none") != (col_scale is None):
        raise ValueError(f"post={post!r} needs col_scale exactly when it is not 'none'")
    if col_scale is not None:
        _check("col_scale", col_scale, (n,), [F32])
    if path == "dense":
        return dense_dequant_matmul(x_parts, w, w_scale, col_scale, elem=elem, scale=scale,
                                    group=group, post=post, out_dtype=out_dtype,
                                    interpret=interpret)
    if path != "pallas":
        raise ValueError(f"path must be 'pallas' or 'dense', got {path!r}")
    split_nibbles = elem == "e2m1" and fp4_layout == "split"
    sps = validate_config(config, k=k, group=group, split_nibbles=split_nibbles, m=m)
    out_dtype = jnp.dtype(out_dtype)
    if split_nibbles:  # even / odd activation columns meet the low / high nibbles
        x_parts = [h for xp in x_parts for h in (xp[:, 0::2], xp[:, 1::2])]
    p = _Static(m, n, k, config, elem, scale, group, len(x_parts), post, fp4_layout, decode, sps,
                out_dtype)

    cfg = config
    operands = x_parts + [w, w_scale] + ([col_scale] if col_scale is not None else [])
    gemv = cfg.variant == "gemv"
    tiles = cdiv(n, cfg.block_n) * (1 if gemv else cdiv(m, cfg.block_m))
    return launch_split_k(functools.partial(_gemv_body if gemv else _body, p=p), operands, m=m,
                          n=n, tiles=tiles, split_k=cfg.split_k,
                          num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                          out_dtype=out_dtype, poison=poison, interpret=interpret, name=name,
                          finish=lambda total: _post_xla(p, total, col_scale))
