"""NVFP4 and MXFP4 matmuls: packed e2m1 weights dequantized in-kernel to bf16 MMA operands.

  * NVFP4: e4m3 scale per 16 along K; the global scale (scalar or per stored row) enters the
    float32 accumulator per output column, as a divisor (compressed-tensors'
    weight_global_scale) or a multiplier (ModelOpt's weight_scale_2) -- `post`.
  * MXFP4: e8m0 exponent byte per 32 along K; no global scale.

dequant_matmul runs a Mosaic GPU kernel (group_a16_mgpu, or at decode sizes
group_a16_decode_mgpu) instead where mgpu_path says so.

W4A16 passes the activation itself (split into exact bf16 parts); W4A4 passes its quantized
activation, which the caller builds so that it is exact in bf16 (NVFP4: e2m1 code times its e4m3
block scale, the activation global folded into `col_scale`; MX: e2m1/e4m3 code times 2**k).
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from .common import MatmulConfig, resolve_config
from .mx_core import mx_dequant_matmul
from .mx_dense import DENSE_MIN_M
from .mx_heuristics import dequant_heuristic, fit_smem, with_det_block_m

__all__ = ["nvfp4_matmul", "mxfp4_matmul", "dequant_matmul", "resolve_dequant_config",
           "fp4_layout_for", "path_for", "mgpu_path", "NVFP4_KERNEL", "MXFP4_KERNEL",
           "MGPU_MAX_M", "GROUP_FORMAT", "DECODE_FORMATS", "decode_refusal"]

NVFP4_KERNEL = "nvfp4_dequant"
MXFP4_KERNEL = "mxfp4_dequant"


def resolve_dequant_config(kernel: str, *, m: int, n: int, k: int, elem_bits: int, group: int,
                           deterministic: bool, config: MatmulConfig | None,
                           extra: str = "") -> MatmulConfig:
    """explicit -> cached -> heuristic; deterministic configs then get block_m from M.

    extra: the number of bf16 activation parts (as a string; also part of the cache key), which
    sets how much shared memory a pipeline stage needs.
    """
    cfg = resolve_config(kernel, m=m, n=n, k=k, deterministic=deterministic, explicit=config,
                         extra=extra, heuristic=functools.partial(
                             dequant_heuristic, elem_bits=elem_bits, group=group))
    if config is not None:
        return cfg
    parts = int(extra or 1)
    if deterministic:
        return with_det_block_m(cfg, m, parts=parts, elem_bits=elem_bits, group=group)
    # Float32 activations come as 3 bf16 parts: the 128-row tile of M=65..256 would need ~206 KB
    # of stages, past the budget, so it runs with 64 rows (bf16 inputs keep 128).
    return fit_smem(cfg, parts=parts, elem_bits=elem_bits, group=group, shrink_m=True)


def path_for(m: int, deterministic: bool, config: MatmulConfig | None, path: str | None) -> str:
    """'dense' (exact bf16 dequantization + XLA dot) at large M in default mode, else 'pallas'."""
    if path is not None:
        return path
    return "dense" if not deterministic and config is None and m >= DENSE_MIN_M else "pallas"


# Default mode runs these formats with one bf16 activation up to this M on the Mosaic GPU
# kernel (group_a16_mgpu) where wgmma exists; deterministic mode on it at every M (the
# formats listed here). H200, session 12, NVFP4 (bench_fp4_mx.py --parts mgpu, 11 shapes, same
# run), over the Triton kernel: W4A16 M=1 1.30x -> 1.76x bf16 (geomean), M=16 1.23x -> 1.67x,
# M=64 0.80x -> 1.14x, M=256 0.56x -> 0.70x (equal on 4096x6144); W4A4 M=1 1.14x -> 1.38x,
# M=256 0.49x -> 0.56x. MX (--parts mgpu_mx, 11 shapes, same run; faster on every shape and
# M): MXFP4 W4A16 M=1 1.34x -> 1.73x, M=16 1.29x -> 1.61x, M=64 0.80x -> 1.20x, M=256 0.55x
# -> 0.72x; MXFP4 W4A4 M=1 1.29x -> 1.50x; MXFP8 W8A16 M=1 1.19x -> 1.64x, M=16 1.03x ->
# 1.57x, M=64 0.77x -> 1.24x, M=256 0.51x -> 0.71x (MXFP8 W8A8's bf16 variant runs the same
# kernel on its exact bf16 activation; not measured apart). From 257 to DENSE_MIN_M the Triton
# kernel ran 0.26-0.45x bf16 (session 19, bench_fp4_mx.py --parts midm, 3 shapes at M=512 /
# 768, same run), this kernel 0.48-0.77x where its launch fills its waves, dense 0.37-0.67x:
# this kernel there, dense where it would leave a wave part-empty (mgpu_path).
MGPU_MAX_M = {"nvfp4": 256, "mxfp4": 256, "mxfp8": 256}
# ... except up to DECODE_MAX_M (16) for these formats, which default mode runs on the
# plain-pipeline decode kernel (group_a16_decode_mgpu: several CTAs an SM) where it takes the
# weight. H200, session 28 (probe_group_decode_plain.py through the dispatcher, 11 shapes, same
# run, h200_fp4_grid_decode_s28.json), speed over group_a16_mgpu: M=1 NVFP4 1.01-1.17x (geomean
# 1.09), MXFP4 1.00-1.16x (1.08); M=16 NVFP4 1.02-1.12x (1.08), MXFP4 0.97-1.10x (1.06).
# MXFP8 on it ran 0.81-0.97x group_a16_mgpu's speed (session 29, 2 shapes,
# h200_mxfp8_decode_s29.log): it keeps group_a16_mgpu.
# Deterministic mode takes it too, in group_a16_mgpu's deterministic order (the same bits:
# test_gpu_deterministic_order_is_group_a16_mgpus_bitwise). H200, session 29
# (probe_group_decode_plain.py --grid none --det, h200_fp4_decode_det_s29{a,b,c}.json, both
# kernels in one run per shape, 11 shapes; K=7168 and MX K=14336 / 18432 two K parts a CTA),
# group_a16_mgpu's det time / this kernel's: M=1 NVFP4 1.01-1.25 (geomean 1.12), MXFP4
# 1.04-1.26 (1.11); M=16 NVFP4 0.98-1.17 (1.06), MXFP4 0.98-1.09 (1.03).
DECODE_FORMATS = ("nvfp4", "mxfp4")
GROUP_FORMAT = {("e2m1", "e4m3"): "nvfp4", ("e2m1", "e8m0"): "mxfp4", ("e4m3", "e8m0"): "mxfp8"}


def decode_refusal(fmt: str, m: int, n: int, k: int, parts: int, x_dtype) -> str | None:
    """None, or why the plain-pipeline decode kernel (group_a16_decode_mgpu) cannot take this."""
    from .group_a16_decode_mgpu import fit_refusal
    if parts != 1 or jnp.dtype(x_dtype) != jnp.dtype(jnp.bfloat16):
        return "it takes one bf16 activation part"
    return fit_refusal(fmt, m, n, k)


def mgpu_path(fmt: str, m: int, n: int, k: int, parts: int, x_dtype, *, deterministic: bool,
              config: MatmulConfig | None, path: str | None, interpret: bool) -> str:
    """path_for's choice, 'decode' or 'mgpu' (the Mosaic GPU kernels): explicitly, or on sm_90
    for one bf16 activation part -- in default mode 'decode' (group_a16_decode_mgpu) for
    DECODE_FORMATS at the M, N, K it takes; else 'mgpu' (group_a16_mgpu) where N, K suit it,
    for the formats of MGPU_MAX_M, in default mode up to its M, and on to DENSE_MIN_M where its
    launch fills its waves (fp8_block_a16_mgpu.mid_m_fills; else 'dense' there), in
    deterministic mode at every M (det_params' K order, a function of K alone; never the Triton
    kernel for some M and this one for others: their bits differ) -- but 'decode' up to 16
    rows, where the decode kernel runs that order, to the same bits. The
    interpreter (CI) keeps the Triton kernel unless asked."""
    from .fp8_block_a16_mgpu import mid_m_fills
    from .fp8_paths import mosaic_wgmma_ok
    from .group_a16_mgpu import supports
    why = supports(fmt, m, n, k, x_dtype) if parts == 1 else "it takes one bf16 activation part"
    if path == "mgpu":
        if why:
            raise ValueError(f"path='mgpu' cannot run this {fmt} matmul: {why}")
        return path
    if path == "decode":
        why_not = decode_refusal(fmt, m, n, k, parts, x_dtype)
        if why_not:
            raise ValueError(f"path='decode' cannot run this {fmt} matmul: {why_not}")
        return path
    auto = path is None and config is None and not interpret
    if (auto and fmt in DECODE_FORMATS and mosaic_wgmma_ok(False)
            and decode_refusal(fmt, m, n, k, parts, x_dtype) is None):
        return "decode"  # (deterministic: group_a16_mgpu's order, to the bit)
    if auto and why is None and fmt in MGPU_MAX_M and mosaic_wgmma_ok(False):
        if deterministic or m <= MGPU_MAX_M[fmt]:
            return "mgpu"
        if m < DENSE_MIN_M:  # (MID_M_MIN_FILL)
            return "mgpu" if mid_m_fills(m, n) else "dense"
    return path_for(m, deterministic, config, path)


def fp4_layout_for(cfg: MatmulConfig, layout: str | None) -> str:
    """'split' (two half-width MMAs, no register interleave) when block_k allows it."""
    if layout is not None:
        return layout
    return "split" if cfg.block_k >= 32 else "interleave"


def dequant_matmul(kernel: str, x_parts: Sequence[jax.Array], w: jax.Array,
                   w_scale: jax.Array, col_scale: jax.Array | None, *, elem: str, scale: str,
                   group: int, post: str, out_dtype, deterministic: bool,
                   config: MatmulConfig | None, path: str | None, interpret: bool, poison: bool,
                   fp4_layout: str | None = None, decode: str | None = None) -> jax.Array:
    """One format's entry (NVFP4 / MXFP4 / MXFP8): resolve the tile config and the path, then
    run the shared dequantizing kernel (mx_core)."""
    m, k = x_parts[0].shape
    fmt = GROUP_FORMAT[elem, scale]
    path = mgpu_path(fmt, m, w.shape[0], k, len(x_parts), x_parts[0].dtype,
                     deterministic=deterministic, config=config, path=path,
                     interpret=interpret)
    if path == "decode":
        from .group_a16_decode_mgpu import group_a16_decode_mgpu
        return group_a16_decode_mgpu(fmt, x_parts[0], w, w_scale, col_scale, post=post,
                                     out_dtype=out_dtype, deterministic=deterministic,
                                     interpret=interpret)
    if path == "mgpu":
        from .group_a16_mgpu import group_a16_matmul_mgpu
        return group_a16_matmul_mgpu(fmt, x_parts[0], w, w_scale, col_scale, post=post,
                                     out_dtype=out_dtype, deterministic=deterministic,
                                     interpret=interpret)
    e2m1 = elem == "e2m1"
    cfg = resolve_dequant_config(kernel, m=m, n=w.shape[0], k=k, elem_bits=4 if e2m1 else 8,
                                 group=group, deterministic=deterministic, config=config,
                                 extra=f"{len(x_parts)}")
    return mx_dequant_matmul(x_parts, w, w_scale, col_scale, elem=elem, scale=scale,
                             group=group, post=post, config=cfg, out_dtype=out_dtype,
                             fp4_layout=fp4_layout_for(cfg, fp4_layout) if e2m1 else "split",
                             decode=decode, path=path,
                             interpret=interpret, poison=poison, name=kernel)


def nvfp4_matmul(x_parts: Sequence[jax.Array], w: jax.Array, w_scale: jax.Array,
                 col_scale: jax.Array, *, post: str, out_dtype, deterministic: bool = False,
                 config: MatmulConfig | None = None, fp4_layout: str | None = None,
                 decode: str | None = None, path: str | None = None, interpret: bool = False,
                 poison: bool = False) -> jax.Array:
    """y (M, N) = sum(x_parts) @ (e2m1(w) * e4m3(w_scale))^T, then `post` ("div"|"mul") col_scale.

    w: uint8 (N, K/2) packed, low nibble first. w_scale: e4m3 (N, K/16). col_scale: float32 (N,).
    """
    if post not in ("div", "mul"):
        raise ValueError(f"NVFP4 needs post 'div' (CT global) or 'mul' (ModelOpt), got {post!r}")
    return dequant_matmul(NVFP4_KERNEL, x_parts, w, w_scale, col_scale, elem="e2m1",
                          scale="e4m3", group=16, post=post, out_dtype=out_dtype,
                          deterministic=deterministic, config=config, path=path,
                          interpret=interpret, poison=poison, fp4_layout=fp4_layout,
                          decode=decode)


def mxfp4_matmul(x_parts: Sequence[jax.Array], w: jax.Array, w_scale: jax.Array, *, out_dtype,
                 deterministic: bool = False, config: MatmulConfig | None = None,
                 fp4_layout: str | None = None, decode: str | None = None,
                 path: str | None = None, interpret: bool = False,
                 poison: bool = False) -> jax.Array:
    """y (M, N) = sum(x_parts) @ (e2m1(w) * 2**(w_scale - 127))^T. w_scale: uint8 (N, K/32)."""
    return dequant_matmul(MXFP4_KERNEL, x_parts, w, w_scale, None, elem="e2m1", scale="e8m0",
                          group=32, post="none", out_dtype=out_dtype,
                          deterministic=deterministic, config=config, path=path,
                          interpret=interpret, poison=poison, fp4_layout=fp4_layout,
                          decode=decode)
