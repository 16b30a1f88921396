"""NVFP4 / MXFP4 (and MXFP8) weight-only decode at M <= 16 on Mosaic GPU's plain pipeline: the
default-mode 'decode' path of the group formats' kernels on sm_90 (fp4_matmul.mgpu_path).

Why beside group_a16_mgpu: that kernel's warp-specialized pipeline uses setmaxnreg, so one CTA
an SM; at decode each SM's ramp and tail are fixed cost. Here the FP8 decode kernel's launch
(fp8_a16_decode_mgpu.plain_slabs: a CTA is one warpgroup of 64 weight rows, no setmaxnreg,
62-66 registers with the group decode -- ptxas, H200, session 27 -- so several CTAs share an SM
and their ramps overlap), its A operand the group decode in registers
(mgpu_group_decode.decode, or decode_words for e2m1 codes read as 32-bit words where
group_a16_mgpu.reads_words says), K cut into `splits` ranges. A pipeline step is the K-blocks
whose scale bytes fill a 16-byte TMA row (NVFP4 2, MX 4).

Numerics per output (m, n): each K-block's wgmma sums the exact bf16 products (decoded weight =
code * group scale / post factor, exact in bf16 as in group_a16_mgpu) in float32 into one chain
over its K range from zero; XLA adds the ranges' float32 slabs in K order, applies the post
factor and NVFP4's global scale (RowFinish.xla: the same float32 operations as group_a16_mgpu's
finish) and rounds once. The same products as the XLA reference; the float32 sums run in another
order than group_a16_mgpu's (so default mode's bits differ between M <= 16 and above).

deterministic=True (session 28; the dispatcher's since session 29): group_a16_mgpu's
deterministic sums instead -- each K-block's chain from zero added in K order within
det_k_parts' parts, each part's total its own slab (a K range holds one part, or two where a
part is not whole steps: det_range_parts), the slabs added by det_groups -- bitwise that
kernel's on the H200 (test_gpu_deterministic_order_is_group_a16_mgpus_bitwise). Session 29
(h200_fp4_decode_det_s29{a,b,c}.json, 11 shapes): group_a16_mgpu's det time / this kernel's
M=1 1.01-1.26, M=16 0.98-1.17.

H200, session 28 (benchmarks/probe_group_decode_plain.py, through the dispatcher beside
group_a16_mgpu, 11 shapes, same run, results/h200_fp4_grid_decode_s28.json), speed over
group_a16_mgpu: M=1 NVFP4 1.01-1.17x (geomean 1.09), MXFP4 1.00-1.16x (1.08); M=16 NVFP4
1.02-1.12x (1.08), MXFP4 0.97-1.10x (1.06). x bf16 at M=1: NVFP4 1.60-2.45x, MXFP4 1.48-2.15x.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from .fp8_a16_decode_mgpu import (DECODE_MAX_M, KernelFinish, det_launch, det_order,
                                  least_range_parts, plain_slabs, takes_kernel_finish)
from .fp8_heuristics import num_sms
from .group_a16_mgpu import check_operands, reads_words
from .launch import sum_device_splits
from .mgpu_common import BLOCK, WG_ROWS, RowFinish
from .mgpu_group_decode import FORMATS, decode, decode_jnp, decode_words
from .mgpu_relabel import permute_cols, permute_k

__all__ = ["group_a16_decode_mgpu", "group_decode_params", "GroupDecodeParams",
           "group_decode_fits", "fit_refusal", "det_order", "det_range_parts",
           "det_launch_of", "step_blocks",
           "LOADS", "MIN_CTAS_PER_SM", "MIN_SPLITS", "MAX_SPLITS", "DECODE_MAX_M"]

F32 = jnp.float32
LOADS = ("bytes", "words")
# group_decode_params: the fewest K ranges (at least MIN_SPLITS where K allows) whose launch
# has MIN_CTAS_PER_SM CTAs an SM; two pipeline stages. H200, session 28 (probe_group_decode_plain
# --grid 1,2,4,8,16:2, 11 shapes, M = 1 and 16): the rule's launch within 0.96 of the best
# measured at M=1 on every shape (NVFP4 and MXFP4); at M=16 within 0.92 (MXFP4 8192x8192,
# where two ranges ran best). One range lost on every shape (0.98 at best: 8192x57344), so at
# least two; more than ~4 CTAs an SM gained little where K was long.
# (results/h200_group_decode_rule_m1_s28.json, _m16_s28.json)
MIN_CTAS_PER_SM = 3.75
MIN_SPLITS = 2
MAX_SPLITS = 16
STAGES = 2


class GroupDecodeParams(NamedTuple):
    splits: int  # K ranges (one CTA each per 64 weight rows)
    stages: int  # pipeline stages
    load: str  # "bytes" | "words": how e2m1 codes are read from shared memory


def step_blocks(fmt: str) -> int:
    """K-blocks of 128 a pipeline step: those whose scale bytes fill a 16-byte TMA row."""
    return max(1, 16 // FORMATS[fmt].scale_bytes)


def group_decode_fits(fmt: str, m: int, n: int, k: int) -> bool:
    """Whether this kernel takes the problem: a group format, 1 <= M <= DECODE_MAX_M, N a
    multiple of 64, K of one pipeline step (NVFP4 256, MX 512)."""
    return (fmt in FORMATS and 1 <= m <= DECODE_MAX_M and n > 0 and n % WG_ROWS == 0 and k > 0
            and k % (BLOCK * step_blocks(fmt)) == 0)


def fit_refusal(fmt: str, m: int, n: int, k: int) -> str | None:
    """None where group_decode_fits, else the reason (the one wording for every caller)."""
    if group_decode_fits(fmt, m, n, k):
        return None
    return (f"it needs 1 <= M <= {DECODE_MAX_M}, N a multiple of {WG_ROWS} and K of "
            f"{BLOCK * step_blocks(fmt)} ({fmt}), got M={m}, N={n}, K={k}")


def group_decode_params(fmt: str, n: int, k: int, sms: int | None = None) -> GroupDecodeParams:
    """The launch for an (N, K) weight of fmt (M-free: the x tile alone follows M): K ranges,
    stages, and how the codes are read (group_a16_mgpu.reads_words' rule)."""
    if why := fit_refusal(fmt, 1, n, k):
        raise ValueError(f"group_decode_params: {why}")
    sms = sms or num_sms()
    steps, tiles = k // (BLOCK * step_blocks(fmt)), n // WG_ROWS
    candidates = [s for s in (2 ** i for i in range(int(math.log2(MAX_SPLITS)) + 1))
                  if steps % s == 0 and (s == 1 or steps // s >= 2)]
    splits = next((s for s in candidates
                   if s >= MIN_SPLITS and tiles * s >= MIN_CTAS_PER_SM * sms), candidates[-1])
    load = "words" if FORMATS[fmt].elem == "e2m1" and reads_words(fmt, n, k) else "bytes"
    return GroupDecodeParams(splits, STAGES, load)


def det_range_parts(fmt: str, n: int, k: int) -> int:
    """How many of deterministic mode's K parts a K range (a CTA) holds: the fewest whose
    K-blocks make whole pipeline steps (the 16-byte TMA row of scales: 2 K-blocks NVFP4, 4 MX)
    -- 1 where a part does, 2 at K=7168 (7 K-blocks a part) and for MX at K=14336 / 18432.
    Always some: this device's parts (a power of two) together are its whole K, whole steps
    where the kernel fits."""
    return least_range_parts(n, k, step_blocks(fmt))  # (k: this device's K)


def det_launch_of(fmt: str, n: int, k: int,
                  range_parts: int | None = None) -> tuple[int, int, int]:
    """Deterministic mode's launch for fmt: (groups, K ranges, parts a range) --
    fp8_a16_decode_mgpu.det_launch at det_range_parts' least."""
    return det_launch("group_a16_decode_mgpu", n, k, det_range_parts(fmt, n, k), range_parts)


def group_a16_decode_mgpu(fmt: str, x: jax.Array, w: jax.Array, w_scale: jax.Array,
                          col_scale: jax.Array | None = None, *, post: str = "none",
                          splits: int | None = None, stages: int | None = None,
                          load: str | None = None, out_dtype=None, deterministic: bool = False,
                          range_parts: int | None = None, in_kernel_finish: bool | None = None,
                          interpret: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) bf16 @ (code(w) * scale(w_scale))^T in out_dtype (default x's); for
    NVFP4 then `post` ("div" | "mul") by col_scale (float32 (N,)) per output column.

    fmt, w, w_scale, col_scale, post: as group_a16_mgpu.group_a16_matmul_mgpu takes them (codes
    and scales as stored). M <= DECODE_MAX_M, N a multiple of 64, K of 256 (NVFP4) / 512 (MX).
    splits, stages, load: the launch (None: group_decode_params'); load "words" for e2m1 codes
    only. interpret: Mosaic GPU's interpreter (the decode by jnp: the same values).
    deterministic: group_a16_mgpu's deterministic sums (det_order: each K-block's chain from
    zero added in K order within det_k_parts' parts, a K range holding det_range_parts of
    them, each part's total its own slab, the slabs added by det_groups:
    fp8_a16_decode_mgpu.det_order), codes read as reads_words says -- M-free;
    splits and load must be left unset. Bitwise the Mosaic kernel's (the interpreter at M >= 9,
    whose x tile sets its bits; the GPU at every M: session 29), so deterministic mode's
    dispatcher takes it up to 16 rows (fp4_matmul.mgpu_path). range_parts (deterministic
    mode): how many parts a K range holds (None: det_range_parts'; the same bits whatever it
    is). in_kernel_finish: the ranges' sum, the RowFinish (or MX's factor) and the rounding in
    the kernel (fp8_a16_decode_mgpu.KernelFinish: the same bits as XLA's finish) -- None:
    takes_kernel_finish's default, False: never, True: required."""
    check_operands(fmt, x, w, w_scale, col_scale, post)
    f = FORMATS[fmt]
    m, k = x.shape
    n = w.shape[0]
    if x.dtype != jnp.dtype(jnp.bfloat16):
        raise ValueError(f"group_a16_decode_mgpu: x must be bfloat16, got {x.dtype}")
    if why := fit_refusal(fmt, m, n, k):
        raise ValueError(f"group_a16_decode_mgpu: {why}")
    auto = group_decode_params(fmt, n, k)
    groups = 1
    if deterministic:
        if splits is not None or load is not None:
            raise ValueError("group_a16_decode_mgpu: deterministic mode's launch is fixed by "
                             "(N, K): leave splits and load unset")
        groups, splits, range_parts = det_launch_of(fmt, n, k, range_parts)
    elif range_parts is not None:
        raise ValueError("group_a16_decode_mgpu: range_parts is deterministic mode's")
    splits, stages, load = splits or auto.splits, stages or auto.stages, load or auto.load
    blocks = step_blocks(fmt)
    if k % (BLOCK * blocks * splits):
        raise ValueError(f"group_a16_decode_mgpu: K={k} is not {splits} ranges of whole "
                         f"{BLOCK * blocks}-wide steps ({fmt})")
    if load not in LOADS or (load == "words" and f.elem != "e2m1"):
        raise ValueError(f"group_a16_decode_mgpu: load must be one of {LOADS} ('words': e2m1 "
                         f"codes only), got {load!r} for {fmt}")
    words = load == "words"
    codes = lax.bitcast_convert_type(w, jnp.int4).reshape(n, k) if f.elem == "e2m1" else w
    if words:  # the MMA sees each 32 columns' K permuted as decode_words hands them over
        x = permute_k(x, "halves")

    def a_tile(w_ref, s_ref):  # one K-block's codes and group scales -> bf16 weights
        if interpret:  # the values decode / decode_words give, by jnp
            v = decode_jnp(w_ref[...], s_ref[...], f)
            return permute_cols(v, "halves") if words else v
        if words:
            return decode_words(plgpu.load(w_ref, layout=plgpu.Layout.WGMMA_UPCAST_4X), s_ref,
                                f)
        if f.elem == "e2m1":
            return decode(plgpu.load(w_ref, layout=plgpu.Layout.WGMMA), s_ref, f)
        return decode(w_ref[...].astype(F32).astype(x.dtype), s_ref, f)  # e4m3: exact first

    out_dtype = jnp.dtype(out_dtype or x.dtype)
    finish = (RowFinish(col_scale.astype(F32), f.post_factor, post) if fmt == "nvfp4" else
              RowFinish(None, f.post_factor, "mul"))  # (MX: the factor alone)
    in_kernel = takes_kernel_finish("group_a16_decode_mgpu", m, n, splits, out_dtype,
                                    deterministic=deterministic, interpret=interpret,
                                    asked=in_kernel_finish, range_parts=range_parts or 1,
                                    groups=groups)
    y = plain_slabs(x, codes, lax.bitcast_convert_type(w_scale, jnp.uint8), splits=splits,
                    stages=stages, a_tile=a_tile, blocks=blocks, interpret=interpret,
                    chains="block" if deterministic else "range",
                    range_parts=range_parts or 1,
                    finish=KernelFinish(out_dtype, m, finish, groups) if in_kernel else None)
    if y.ndim == 2:  # (finished in the kernel)
        return y
    # parts (inside k_shards every device's) in K order, by groups
    total = sum_device_splits(y, y.shape[0], n, y.shape[2], groups=groups)
    total = finish.xla(total)
    return total[:, :m].T.astype(out_dtype)
