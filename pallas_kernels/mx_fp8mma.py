"""MXFP8 x MXFP8 with fp8 tensor-core MMAs: one MMA per 32-wide K chunk, scaled in float32.

    y[m, n] = sum_c  sx[m, c] * sw[n, c] * sum_{k in chunk c} xq[m, k] * wq[n, k]

Both operands carry a power-of-two scale per 32 elements of K, which an fp8 MMA cannot apply,
so each chunk's fp8 x fp8 product (K = 32, one wgmma k-step, exact products) is multiplied by
the outer product of its two scales and added to the float32 accumulator. That puts
2 * block_m * block_n CUDA-core operations beside every 32-deep MMA: the price this variant
pays for fp8 MMA throughput, measured against the bf16-dequantization variant (mx_core).

x arrives quantized (codes + float32 scales 2**(u-127)); the caller used its producer's rule.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from .common import MatmulConfig, cdiv
from .launch import launch_split_k
from .tiles import load2, mask2, store_tile, tile_coords
from .fp8_dot import fp8_dot
from .mx_decode import e8m0_to_f32

__all__ = ["mxfp8_fp8mma_matmul", "CHUNK"]

F32 = jnp.float32
E4M3 = jnp.float8_e4m3fn
CHUNK = 32


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    n: int
    k: int
    cfg: MatmulConfig
    steps_per_split: int


def _col(ref, r0, nr, col, lim, rows):
    view = ref.at[pl.ds(r0, nr), col]
    if lim is None:
        return view[...]
    return pltriton.load(view, mask=rows < lim, other=jnp.zeros((), view.dtype))


def _body(x_ref, xs_ref, w_ref, ws_ref, o_ref, *, p: _Static):
    cfg = p.cfg
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    t = tile_coords(p.m, p.n, bm, bn, cfg.group_m, cfg.split_k, p.steps_per_split)
    m0, n0, rm, rn, m_lim, n_lim, step0 = t
    def step(i, acc):
        k0 = (step0 + i) * bk
        for c in range(bk // CHUNK):  # chunks in K order
            kc = k0 + c * CHUNK
            # Loaded as e4m3 directly: Triton feeds wgmma only from plain loads (a bitcast of
            # bytes in between demotes the dot to mma.sync).
            x = load2(x_ref, m0, bm, kc, CHUNK, mask2(rm, m_lim, None, None))
            w = load2(w_ref, n0, bn, kc, CHUNK, mask2(rn, n_lim, None, None))
            # K = 32 is one fp8 MMA k-step: promoting every 32 adds nothing to the f32 adds
            # done below anyway (Pallas' default attribute, 0, picks a slower lowering).
            part = fp8_dot(x, w, promote_k=CHUNK)
            g = lax.div(kc, CHUNK)
            sx = _col(xs_ref, m0, bm, g, m_lim, rm)
            sw = _col(ws_ref, n0, bn, g, n_lim, rn)
            acc = acc + part * (sx[:, None] * sw[None, :])
        return acc

    acc = lax.fori_loop(0, p.steps_per_split, step, jnp.zeros((bm, bn), F32))
    store_tile(o_ref, t, acc, p.m, cfg.split_k)


def _check(name, arr, shape, dtypes):
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if arr.dtype not in [jnp.dtype(d) for d in dtypes]:
        raise ValueError(f"{name} has dtype {arr.dtype}, expected one of {list(dtypes)}")


def mxfp8_fp8mma_matmul(xq: jax.Array, x_scale: jax.Array, w: jax.Array, w_scale: jax.Array, *,
                        config: MatmulConfig, out_dtype, interpret: bool = False,
                        poison: bool = False, name: str = "mxfp8_fp8mma") -> jax.Array:
    """y (M, N) = (xq * x_scale) @ (w * 2**(w_scale-127))^T, float32 accumulation.

    xq: e4m3 (M, K) codes; x_scale: float32 (M, K/32); w: e4m3 (N, K); w_scale: uint8 (N, K/32).
    """
    m, k = xq.shape
    n = w.shape[0]
    if k % CHUNK:
        raise ValueError(f"K={k} must be a multiple of {CHUNK}")
    _check("xq", xq, (m, k), [E4M3, jnp.uint8])
    _check("x_scale", x_scale, (m, k // CHUNK), [F32])
    _check("w", w, (n, k), [E4M3, jnp.uint8])
    _check("w_scale", w_scale, (n, k // CHUNK), [jnp.uint8])
    cfg = config
    if cfg.variant != "mma":
        raise ValueError(f"the fp8-MMA MXFP8 kernel runs the 'mma' variant, got {cfg.variant!r}")
    if cfg.block_k % CHUNK or k % cfg.block_k:
        raise ValueError(f"block_k={cfg.block_k} must be a multiple of {CHUNK} dividing K={k}")
    steps = k // cfg.block_k
    if steps % cfg.split_k:
        raise ValueError(f"split_k={cfg.split_k} must divide the {steps} K-steps")
    if cfg.k_parts != 1:
        raise ValueError(f"k_parts={cfg.k_parts}: this kernel runs K parts as split_k")
    p = _Static(m, n, k, cfg, steps // cfg.split_k)
    # Weight exponents decoded once here (N*K/32 values, an XLA pass of a few us): decoded in
    # the kernel, Triton repeats the decode for every accumulator element it broadcasts to.
    w_scale = e8m0_to_f32(w_scale)
    xq = lax.bitcast_convert_type(xq, E4M3)  # same width: no data movement
    w = lax.bitcast_convert_type(w, E4M3)
    return launch_split_k(functools.partial(_body, p=p), [xq, x_scale, w, w_scale], m=m, n=n,
                          tiles=cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n), split_k=cfg.split_k,
                          num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                          out_dtype=jnp.dtype(out_dtype), poison=poison, interpret=interpret,
                          name=name)
