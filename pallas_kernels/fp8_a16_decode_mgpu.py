"""FP8 weight-only decode (W8A16 at M <= 16, whole-K scales) on Mosaic GPU's plain pipeline:
the default-mode 'decode' path of `pallas_fp8_w8a16` on sm_90 (pallas_kernels.fp8_paths).

Why a second W8A16 kernel: fp8_block_a16_mgpu's warp-specialized pipeline uses setmaxnreg, so
ptxas launches it at the register cap -- one CTA an SM by construction -- and each SM's ramp and
tail are the decode's fixed cost (H200, session 25: 1.5 us over XLA's split-K GEMM on the same
bytes, which runs ~4 small CTAs an SM). Here a CTA is one warpgroup of 64 weight rows on
plgpu.emit_pipeline (no setmaxnreg: ptxas allocates what the kernel uses, 85-91 registers, so
RESIDENT_CTAS of them share an SM and their ramps overlap), K cut into `splits` ranges.
H200, session 26 (benchmarks/probe_decode_plain.py, 11 shapes, same run): at M=1 1.58-1.98x
bf16 with decode_params' choice where fp8_block_a16_mgpu ran 1.34-1.97x; at M=16 1.43-1.91x
where it ran 1.21-1.75x (4 shapes).

Swap-AB, as fp8_block_a16_mgpu: the weight tile (64 rows, 128 K) is wgmma's A operand,
converted e4m3 -> x's dtype in registers (exact: every e4m3 value is a bf16 and an f16), x^T
its B operand (8 or 16 rows). Numerics per output (m, n): one float32 wgmma chain over a K
range from zero, written as a float32 slab of y^T; XLA adds the ranges' slabs in K order,
multiplies by the weight's scale (per channel or per tensor) and rounds once to x's dtype.

Block scales (128x128, session 28; the dispatcher's up to K = 14336 since session 29): each
K-block's wgmma chain runs from zero and is added, times its block's scale, to the range's
float32 total in K order (the Mosaic kernel's per-block arithmetic), the CTA's row of scales
copied to shared memory once; XLA adds the ranges' totals in K order and rounds. H200, session
29 (h200_decode_block_plain_s29.json, 11 shapes): the Mosaic kernel's time / this one's at
decode_params' launch 0.93-1.11 at M=1, 0.95-1.09 at M=16 (18432x7168 0.93 / 0.95;
8192x57344 and 28672x8192 0.99-1.01; the rest 1.02-1.11).

deterministic=True: fp8_block_a16_mgpu's deterministic sums (det_order), the same bits on the
H200; the dispatcher's where fp8_paths.det_decode_wins (session 29). Since session 46 at
default mode's K ranges where those are one or one a det_groups group (det_fold_parts): each
CTA adds its parts as they close and y is written in the kernel -- no slabs, default's time.

Not done in the CTA: with one range, applying the scale and writing y through a transposed
staging slot (as fp8_block_a16_mgpu's out_t) measured the same on its own but faulted the
device (CUDA_ERROR_LAUNCH_FAILED) on 4096 x 28672 at M=1 when run beside the other W8A16
kernels in one benchmark process, twice in three runs, never with the slab (H200, session 26,
NOTES.md); compute-sanitizer found nothing in a run of its own.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .common import current_k_shards, device_ranges
from .fp8_block_a16_mgpu import det_groups
from .fp8_heuristics import det_k_parts, num_sms
from .launch import fold_parts, sum_device_splits
from .mgpu_common import (BLOCK, TMA_ROW_F32, WG_ROWS, RowFinish, div_full, finish_rows,
                          interpret_params, store_piece, swizzled, zero_total)

__all__ = ["fp8_a16_decode_mgpu", "decode_params", "DecodeParams", "DECODE_MAX_M",
           "decode_fits", "plain_slabs", "det_order", "det_launch", "least_range_parts",
           "SCALE_KINDS", "KernelFinish", "finishes_in_kernel", "takes_kernel_finish",
           "finish_note", "MAX_CLUSTER", "FINISH_IN_KERNEL_MIN_N", "folds_parts",
           "det_fold_parts", "det_decode_launch", "DET_FOLD_KERNELS", "writes_y_rows",
           "FP8_X_MAX_M", "x_tile_rows", "plain_stages"]

F32 = jnp.float32
DECODE_MAX_M = 16  # x tiles of 8 or 16 rows (wgmma's N)
SCALE_KINDS = ("channel", "tensor", "block")
# CTAs an SM holds at once: 85-91 registers x 128 threads (ptxas, H200, session 26) leave five
# by registers; four stages of (64 x 128 e4m3 + 16 x 128 bf16) stay under a fifth of its
# shared memory
RESIDENT_CTAS = 5
# decode_params: the fewest K ranges whose launch has more CTAs than SMs and fills FILL_MIN
# of its last round (an SM's, or past RESIDENT_CTAS an SM, the resident slots'); four
# pipeline stages where fewer than FEW_CTAS CTAs share an SM, else two (bytes in flight an SM).
# H200, session 26, M=1 (probe_decode_plain.py --grid 1,2,4,8,16:2,4, 11 shapes): the rule's
# choice was within 0.97 of the best measured (splits, stages) on every shape.
FILL_MIN = 0.8
FEW_CTAS = 3
MAX_STAGES = 4
# The in-kernel finish groups a weight tile's K ranges into one cluster: Hopper's portable
# cluster size bounds the ranges it takes
MAX_CLUSTER = 8
# Where in_kernel_finish=None takes the in-kernel finish: a kernel's least N (absent: never).
# H100, session 43 (probe_decode_finish.py, M = 1 / 16, bitwise XLA's finish in the GPU tests):
# the FP8 kernel's cluster finish took 1.0-2.2 us off the slabs + XLA's pass at N >= 8192
# (8192x8192, 8192x10240, 4096x28672) and added 0.3-0.5 us at N = 4096 (4096x4096,
# 14336x4096), where a cluster's ranges wait on its slowest; the 4-bit / MX kernel's added
# 0.9-6.6 us on all five shapes, so it finishes in the kernel only when asked.
FINISH_IN_KERNEL_MIN_N = {"fp8_a16_decode_mgpu": 8192}
# Kernels whose deterministic mode takes det_fold_parts' launch (in_kernel_finish and
# range_parts unset): default mode's K ranges, each CTA folding its parts, y written in the
# kernel. Its 8 parts as 8 ranges wrote 8 float32 slabs that XLA then read: at 4096x28672
# M = 16, 53.6 us against default's 42.2 (H100, session 46).
DET_FOLD_KERNELS = ("fp8_a16_decode_mgpu",)


# e4m3 x (fp8_block_det's swap-AB launch) takes x tiles of up to this many rows: one tile for
# all of M, wgmma's N (a multiple of 16 past 16 rows)
FP8_X_MAX_M = 128


def x_tile_rows(m: int) -> int:
    """plain_slabs' x tile for M rows: 8, 16, or M rounded up to a multiple of 16."""
    return 8 if m <= 8 else -(-m // 16) * 16


class DecodeParams(NamedTuple):
    splits: int  # K ranges (one CTA each per 64 weight rows)
    stages: int  # pipeline stages (TMA copies in flight per CTA)


class KernelFinish(NamedTuple):
    """plain_slabs' in-kernel finish: the launch writes y (rows, N) in out_dtype itself instead
    of float32 slabs of y^T. A weight tile's K ranges form one cluster; the other ranges send
    their float32 totals to range 0's shared memory (st.async), which adds them in K order,
    applies `row` and rounds -- the operations XLA's finish runs on the slabs (sum_splits'
    left fold, then row.xla), so the same bits, without the slabs' round trip and XLA's pass
    (H200, session 30: 1.2-1.7 us of a 6-24 us decode)."""
    out_dtype: jnp.dtype  # 16-bit: the transposed store is stmatrix .trans
    rows: int  # M
    row: RowFinish
    # deterministic mode's det_groups: the ranges form this many equal groups of consecutive
    # ones, each added in K order, then the groups' sums in order (sum_device_splits' fold)
    groups: int = 1


def writes_y_rows(m: int) -> bool:
    """Whether the in-kernel finish can write an M-row y: TMA stores y's rows in tiles of 8, so
    M <= 8 or a multiple of 8. (Session 46's PAD_Y_ROWS wrote 16 rows for M = 9-15 and XLA kept
    M: bitwise, but no faster than the dispatcher's launch on an H100, session 47 -- removed.)"""
    return m <= 8 or m % 8 == 0


def folds_parts(splits: int, range_parts: int, groups: int) -> bool:
    """Whether a launch whose `splits` K ranges hold range_parts K parts each can add them in
    the kernel as fold_parts(all parts, groups) does: one part a range (range 0 folds the
    cluster's by groups), one range (its CTA folds its parts by groups), or one range a group
    (each CTA folds its group's run, range 0 the runs in order)."""
    return range_parts == 1 or splits == 1 and range_parts % groups == 0 or splits == groups


def finishes_in_kernel(m: int, splits: int, out_dtype, *, deterministic: bool,
                       interpret: bool, range_parts: int = 1, groups: int = 1) -> bool:
    """Whether a launch of `splits` K ranges can finish in the kernel (KernelFinish): on a GPU
    (the interpreter has no clusters), outside k_shards (the slabs of every device are summed),
    with a 16-bit output, at most MAX_CLUSTER ranges and M <= 8 or 16 (TMA's store tiles y's
    rows by 8: it drops rows past a shorter y, but a longer one must be whole tiles:
    writes_y_rows).
    Deterministic mode's parts (range_parts of them a range, added by det_groups' `groups`)
    where folds_parts says the kernel can add them as XLA adds their slabs."""
    return (not interpret and current_k_shards() is None
            and folds_parts(splits, range_parts, groups)
            and jnp.dtype(out_dtype).itemsize == 2 and splits <= MAX_CLUSTER
            and writes_y_rows(m))


def takes_kernel_finish(kernel: str, m: int, n: int, splits: int, out_dtype, *,
                        deterministic: bool, interpret: bool, asked: bool | None,
                        range_parts: int = 1, groups: int = 1) -> bool:
    """Whether `kernel`'s launch (y (M, N)) finishes in the kernel: `asked` (its
    in_kernel_finish) True requires it (an error naming `kernel` where finishes_in_kernel
    refuses), False refuses it, None takes it where it can run, in default mode, and N
    reaches the kernel's FINISH_IN_KERNEL_MIN_N. (Deterministic mode: the kernel asks for it
    itself where it takes det_fold_parts' launch.)"""
    can = finishes_in_kernel(m, splits, out_dtype, deterministic=deterministic,
                             interpret=interpret, range_parts=range_parts, groups=groups)
    if asked and not can:
        raise ValueError(f"{kernel}: in_kernel_finish=True needs a GPU launch outside "
                         f"k_shards, a 16-bit output, at most {MAX_CLUSTER} K ranges -- of "
                         f"one K part each, or one range, or one range a group of parts -- "
                         f"and M <= 8 or a multiple of 8; got M={m}, splits={splits}, "
                         f"range_parts={range_parts}, groups={groups}, "
                         f"out_dtype={jnp.dtype(out_dtype)}, deterministic={deterministic}, "
                         f"interpret={interpret}")
    if asked is None:
        return (can and not deterministic
                and n >= FINISH_IN_KERNEL_MIN_N.get(kernel, math.inf))
    return can and asked


def finish_note(kernel: str, m: int, n: int, splits: int, out_dtype, *, deterministic: bool,
                interpret: bool, range_parts: int = 1, groups: int = 1,
                asked: bool | None = None) -> str:
    """explain()'s words for who adds `kernel`'s launch's K ranges (deterministic mode: their
    range_parts K parts each, by `groups`) and rounds its output."""
    if takes_kernel_finish(kernel, m, n, splits, out_dtype, deterministic=deterministic,
                           interpret=interpret, asked=asked, range_parts=range_parts,
                           groups=groups):
        ranges = (f"its {splits} K ranges one cluster, range 0 adding the others' totals"
                  if splits > 1 else "one K range")
        if range_parts > 1:
            ranges = f"each CTA folding its {range_parts} K parts, " + ranges
        return f", finished in the kernel ({ranges}, y written by the CTAs)"
    return ", ranges added by XLA" if splits * range_parts > 1 else ""


def decode_fits(m: int, n: int, k: int) -> bool:
    """Whether this kernel takes the problem: M <= DECODE_MAX_M, N a multiple of 64, K of 128."""
    return 1 <= m <= DECODE_MAX_M and n % WG_ROWS == 0 and k % BLOCK == 0 and k > 0


def _fill(ctas: int, sms: int) -> float:
    """The fraction of the launch's last round its CTAs fill (an SM's up to RESIDENT_CTAS each,
    then the resident slots')."""
    unit = sms if ctas <= sms * RESIDENT_CTAS else sms * RESIDENT_CTAS
    return ctas / (unit * math.ceil(ctas / unit))


def decode_params(n: int, k: int, sms: int | None = None) -> DecodeParams:
    """The K ranges and stages of a launch for an (N, K) weight (M-free: the x tile alone
    follows M)."""
    sms = sms or num_sms()
    tiles, blocks = n // WG_ROWS, k // BLOCK
    if n % WG_ROWS or k % BLOCK or not blocks:
        raise ValueError(f"decode_params: N={n} must be a multiple of {WG_ROWS} and K={k} a "
                         f"positive one of {BLOCK}")
    candidates = [1]  # then K ranges (powers of two) of at least two whole blocks
    while blocks % (candidates[-1] * 2) == 0 and blocks // (candidates[-1] * 2) >= 2:
        candidates.append(candidates[-1] * 2)
    splits = next((s for s in candidates
                   if tiles * s > sms and _fill(tiles * s, sms) >= FILL_MIN),
                  max(candidates, key=lambda s: (_fill(tiles * s, sms), -s)))
    return DecodeParams(splits, plain_stages(tiles * splits, sms))


def plain_stages(ctas: int, sms: int) -> int:
    """Pipeline stages of a plain launch of `ctas` CTAs: MAX_STAGES where fewer than FEW_CTAS
    share an SM, else two (the bytes in flight an SM)."""
    return MAX_STAGES if min(ctas / sms, RESIDENT_CTAS) < FEW_CTAS else 2


def det_order(n: int, k: int) -> tuple[int, int, int]:
    """Deterministic mode's K order for an (N, K) weight (fp8_block_a16_mgpu.det_params':
    det_k_parts(K) parts of the unsharded K, each from zero, added in K order by det_groups'
    groups) as the plain kernel runs it: (K parts, groups, parts on this device -- its K
    ranges; inside common.k_shards a share of them)."""
    shards = current_k_shards()
    count = 1 if shards is None else shards.count
    parts = det_k_parts(k * count, BLOCK)
    return parts, det_groups(n, parts), device_ranges(parts, k * count, count)


def least_range_parts(n: int, k: int, step_blocks: int) -> int:
    """The fewest of det_order's parts (this device's) a K range must hold for its K-blocks to
    make whole steps of step_blocks; at most all of them (whole steps only if K is)."""
    _, _, local = det_order(n, k)
    per_part, held = k // BLOCK // local, 1
    while (held * per_part) % step_blocks and held < local:
        held *= 2
    return held


def det_launch(kernel: str, n: int, k: int, least: int,
               range_parts: int | None) -> tuple[int, int, int]:
    """Deterministic mode's launch: (det_groups' groups, K ranges, parts a range) -- range_parts
    (None: least) of this device's det_order parts a range, a multiple of least."""
    _, groups, local = det_order(n, k)
    range_parts = range_parts or least
    if local % range_parts or range_parts % least:
        raise ValueError(f"{kernel}: range_parts must divide this device's {local} K parts "
                         f"and be a multiple of {least}, got {range_parts}")
    return groups, local // range_parts, range_parts


def det_fold_parts(kernel: str, m: int, n: int, k: int, out_dtype, *,
                   interpret: bool) -> int | None:
    """Deterministic mode's folded launch, where `kernel` takes it (DET_FOLD_KERNELS): default
    mode's K ranges (decode_params) where they are one or one a det_groups group, each CTA adding
    its K parts as XLA adds their slabs and the launch finishing y in the kernel -- the parts a
    range then holds; None where it cannot run (an M or output the in-kernel finish refuses,
    k_shards, the interpreter) or default's ranges split a group."""
    if kernel not in DET_FOLD_KERNELS:
        return None
    parts, groups, local = det_order(n, k)
    ranges = decode_params(n, k).splits
    if ranges not in (1, groups) or local != parts or local % ranges:
        return None
    held = local // ranges
    if held == 1 or not finishes_in_kernel(m, ranges, out_dtype, deterministic=True,
                                           interpret=interpret, range_parts=held,
                                           groups=groups):
        return None
    return held


def det_decode_launch(m: int, n: int, k: int, out_dtype, *, interpret: bool,
                      range_parts: int | None = None,
                      in_kernel_finish: bool | None = None) -> tuple[int, int, int, bool | None]:
    """This kernel's deterministic launch: (det_groups' groups, K ranges, parts a range,
    in_kernel_finish) -- det_fold_parts' folded launch, finished in the kernel, where
    range_parts and in_kernel_finish are both unset and it runs; else det_launch's at
    range_parts (None: one part a range). The kernel and explain() both read it."""
    if range_parts is None and in_kernel_finish is None:
        range_parts = det_fold_parts("fp8_a16_decode_mgpu", m, n, k, out_dtype,
                                     interpret=interpret)
        in_kernel_finish = True if range_parts else None
    groups, splits, range_parts = det_launch("fp8_a16_decode_mgpu", n, k, 1, range_parts)
    return groups, splits, range_parts, in_kernel_finish


def fp8_a16_decode_mgpu(x: jax.Array, w: jax.Array, w_scale: jax.Array, *, scale_kind: str,
                        splits: int | None = None, stages: int | None = None,
                        out_dtype=None, deterministic: bool = False,
                        range_parts: int | None = None, in_kernel_finish: bool | None = None,
                        interpret: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) @ (w * w_scale)^T, rounded to out_dtype (x's by default).

    x: bf16 or f16, M <= DECODE_MAX_M. w: (N, K) e4m3, N a multiple of 64, K of 128 * splits.
    w_scale: float32, (N, 1) (scale_kind "channel"), (1, 1) ("tensor") or (ceil(N/128), K/128)
    ("block": 128x128 weight blocks -- each K-block's float32 chain from zero, times its
    block's scale, added in K order; the dispatcher's choice up to K = 14336 since session 29,
    at M = 2-8 too since session 30: fp8_paths.DECODE_BLOCK_MAX_K).
    splits, stages: the launch (None: decode_params'). interpret: Mosaic GPU's interpreter.
    deterministic: fp8_block_a16_mgpu's deterministic sums instead (det_order: each K-block's
    chain from zero times its scale -- block, channel or tensor -- added in K order within
    det_k_parts' parts, a K range each, the slabs added by det_groups); M-free, splits unset.
    Bitwise that kernel's (the interpreter at M >= 9; the GPU at M = 1-16, session 29), so
    deterministic mode takes it where fp8_paths.det_decode_wins. range_parts (deterministic
    mode): how many of the parts a K range (a CTA) holds, each part's total its own slab
    (None: one; the same bits whatever it is).
    in_kernel_finish: the ranges' sum, the scale and the rounding in the kernel (KernelFinish;
    the same bits as XLA's finish of the slabs) -- None: takes_kernel_finish's default, False:
    never (the slabs and XLA's pass), True: required (an error where it cannot run; in
    deterministic mode where folds_parts says the kernel can add the parts by det_groups).
    Deterministic mode with both unset takes det_fold_parts' launch where it runs (default's
    K ranges, each CTA folding its parts, y written in the kernel: the same bits)."""
    m, k = x.shape
    n = w.shape[0]
    if scale_kind not in SCALE_KINDS:
        raise ValueError(f"fp8_a16_decode_mgpu: scale_kind must be one of {SCALE_KINDS}, got "
                         f"{scale_kind!r}")
    if x.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"fp8_a16_decode_mgpu: x must be bf16 or f16, got {x.dtype}")
    if w.dtype != jnp.dtype(jnp.float8_e4m3fn) or w.shape != (n, k):
        raise ValueError(f"fp8_a16_decode_mgpu: w must be ({n}, {k}) float8_e4m3fn, got "
                         f"{w.dtype}{tuple(w.shape)}")
    want = {"channel": (n, 1), "tensor": (1, 1),
            "block": (-(-n // BLOCK), k // BLOCK)}[scale_kind]
    if w_scale.shape != want or w_scale.dtype != jnp.dtype(F32):
        raise ValueError(f"fp8_a16_decode_mgpu: w_scale must be float32 {want} for scale_kind "
                         f"{scale_kind!r}, got {w_scale.dtype}{tuple(w_scale.shape)}")
    if not decode_fits(m, n, k):
        raise ValueError(f"fp8_a16_decode_mgpu: needs 1 <= M <= {DECODE_MAX_M}, N a multiple of "
                         f"{WG_ROWS} and K of {BLOCK}; got M={m}, N={n}, K={k}")
    auto = decode_params(n, k)
    groups = 1
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    if deterministic:
        if splits is not None:
            raise ValueError("fp8_a16_decode_mgpu: deterministic mode's launch is fixed by "
                             "(N, K): leave splits unset")
        groups, splits, range_parts, in_kernel_finish = det_decode_launch(
            m, n, k, out_dtype, interpret=interpret, range_parts=range_parts,
            in_kernel_finish=in_kernel_finish)
    elif range_parts is not None:
        raise ValueError("fp8_a16_decode_mgpu: range_parts is deterministic mode's")
    splits, stages = splits or auto.splits, stages or auto.stages
    if k % (BLOCK * splits):
        raise ValueError(f"fp8_a16_decode_mgpu: K={k} is not {splits} ranges of whole "
                         f"{BLOCK}-wide blocks")
    per_block = None  # scales the CTAs apply to each K-block's chain
    if scale_kind == "block":  # (the columns padded for TMA's 16-byte rows)
        per_block = jnp.pad(w_scale, ((0, 0), (0, -(k // BLOCK) % 4)))
    elif deterministic:  # whole-K scales, applied per K-block as the Mosaic kernel does
        per_block = jnp.broadcast_to(w_scale.reshape(-1), (n,))
    finish = None
    if takes_kernel_finish("fp8_a16_decode_mgpu", m, n, splits, out_dtype,
                           deterministic=deterministic, interpret=interpret,
                           asked=in_kernel_finish, range_parts=range_parts or 1,
                           groups=groups):
        finish = KernelFinish(out_dtype, m, RowFinish(
            None if per_block is not None else w_scale.reshape(-1), 1.0, "mul"), groups)
    y = plain_slabs(x, w, splits=splits, stages=stages, interpret=interpret,
                    a_tile=lambda w_ref, _: w_ref[...].astype(F32).astype(x.dtype),
                    chains="range" if per_block is None else "block", chain_scales=per_block,
                    range_parts=range_parts or 1, finish=finish)
    if finish is not None:
        return y
    # parts (inside k_shards every device's) in K order, by groups
    total = sum_device_splits(y, y.shape[0], n, y.shape[2], groups=groups)
    if per_block is not None:
        return total[:, :m].T.astype(out_dtype)
    return (total[:, :m].T * w_scale.reshape(1, -1)).astype(out_dtype)


def plain_slabs(x: jax.Array, w: jax.Array, scales: jax.Array | None = None, *, splits: int,
                stages: int, a_tile: Callable | None, blocks: int = 1, interpret: bool = False,
                chains: str = "range", chain_scales: jax.Array | None = None,
                range_parts: int = 1, finish: KernelFinish | None = None,
                x_scales: jax.Array | None = None) -> jax.Array:
    """The launch: (splits, N, x_tile_rows(M)) float32 slabs of y^T (splits * range_parts with
    range_parts), range s holding its K range's sums (x rows past M zero). x (M <= 16, K)
    16-bit (or e4m3, M <= FP8_X_MAX_M: x_scales); w (N, K) codes of any dtype a_tile reads
    (int4 for e2m1); scales None or (N, K / (128 * blocks) * c) uint8, a (64, c) tile a step.
    A step is `blocks` K-blocks of 128; a_tile(w_ref, s_ref) -> one K-block's (64, 128) A
    operand in x's dtype (s_ref: its `c / blocks` scale columns; None without scales).
    chains: "range" (one wgmma chain over the range) or "block" (each K-block's chain from zero,
    added to the range's float32 total in K order: the Mosaic kernel's per-block sums), then
    times chain_scales if given -- its shape says what it is: float32 (N/128, >= K/128) 128x128
    blocks' scales, the columns padded to a multiple of 4 (TMA rows of 16 bytes), one value a
    K-block; or (N,) one value a weight row for every K-block (whole-K scales in deterministic
    mode's per-block order). A CTA's share is copied to shared memory once.
    range_parts ("block" chains): each K range is this many equal parts of whole K-blocks (not
    necessarily of whole steps), each part's total kept apart and stored as its own slab --
    (splits * range_parts, N, 8 or 16) in K order -- so deterministic mode's parts need not
    be one CTA each (nor hold whole steps).
    finish: the launch returns y (finish.rows = M, N) itself (KernelFinish); with range_parts > 1
    (folds_parts: one range, or one range a group) each CTA adds its parts' totals as they
    close, by finish.groups' runs, instead of storing them -- fold_parts' additions.
    x_scales: fp8 activations (W8A8, fp8_block_det): x e4m3 with float32 (M, K/128) scales,
    a_tile None (the weight tile is wgmma's A operand as stored, from shared memory: fp8 wgmma
    takes both operands K-major), "block" chains; each K-block's chain is multiplied by its x
    rows' scales, then by chain_scales -- fp8_block_mgpu's (part * x scale) * w scale.
    (group_a16_decode_mgpu runs the group formats' decode through it.)"""
    m, k = x.shape
    n = w.shape[0]
    if chains not in ("range", "block") or (chain_scales is not None and chains != "block"):
        raise ValueError(f"plain_slabs: chains must be 'range' or 'block' (chain_scales: "
                         f"'block' only), got {chains!r}")
    cs = chain_scales
    if cs is not None and not (cs.shape == (n,) or cs.ndim == 2 and cs.shape[0] * BLOCK >= n
                               and cs.shape[1] % 4 == 0 and cs.shape[1] * BLOCK >= k):
        raise ValueError(f"plain_slabs: chain_scales must be (N,) or (N/128, >= K/128 in a "
                         f"multiple of 4), got {tuple(cs.shape)} for N={n}, K={k}")
    if range_parts < 1 or range_parts > 1 and chains != "block" or (
            k // BLOCK // splits) % range_parts:
        raise ValueError(f"plain_slabs: range_parts must split each of the {splits} K ranges "
                         f"into equal parts of whole K-blocks ('block' chains), got "
                         f"{range_parts} for K={k}")
    if finish is not None and (
            not folds_parts(splits, range_parts, finish.groups) or splits > MAX_CLUSTER
            or finish.rows != m or not writes_y_rows(m) or finish.row.op not in ("mul", "div")
            or jnp.dtype(finish.out_dtype).itemsize != 2 or finish.groups < 1
            or (splits * range_parts) % finish.groups):
        raise ValueError(f"plain_slabs: the in-kernel finish takes one part a range, one "
                         f"range or one range a group, at most {MAX_CLUSTER} ranges, a 16-bit "
                         f"output, rows = M with M <= 8 or a multiple of 8 (x's rows), groups "
                         f"dividing the parts; got "
                         f"range_parts={range_parts}, splits={splits}, "
                         f"{jnp.dtype(finish.out_dtype)}, rows={finish.rows}, M={m}, "
                         f"groups={finish.groups}")
    fp8_x = x.dtype == jnp.dtype(jnp.float8_e4m3fn)
    if fp8_x != (x_scales is not None) or fp8_x != (a_tile is None) or (
            fp8_x and (chains != "block" or scales is not None
                       or x_scales.shape != (m, k // BLOCK))):
        raise ValueError(f"plain_slabs: e4m3 x goes with x_scales (M, K/128) = {(m, k // BLOCK)}, "
                         f"a_tile None and 'block' chains (16-bit x with neither); got x "
                         f"{x.dtype}, x_scales "
                         f"{None if x_scales is None else tuple(x_scales.shape)}, chains "
                         f"{chains!r}, a_tile {'None' if a_tile is None else 'given'}")
    if m > (FP8_X_MAX_M if fp8_x else DECODE_MAX_M):
        raise ValueError(f"plain_slabs: x takes at most {DECODE_MAX_M} rows ({FP8_X_MAX_M} in "
                         f"e4m3), got {m}")
    block_m = x_tile_rows(m)
    xs_rows = None
    # one row of x scales a K-block, streamed beside its tiles, at least 128 bytes wide (TMA's
    # shared-memory alignment; session 49: rows of 8 / 16 values faulted); rows past M: ones
    # -- x's rows there are TMA's zeros
    xs_cols = max(block_m, TMA_ROW_F32)
    if fp8_x:
        xs_rows = jnp.pad(x_scales.astype(F32).T, ((0, 0), (0, xs_cols - m)),
                          constant_values=1.0)
    # TMA reads x's rows past its end as zeros (their outputs are dropped); its row tiling takes
    # counts of at most 8 or multiples of 8 (as fp8_block_a16_mgpu._launch)
    if m > 8 and m % 8:
        x = jnp.pad(x, ((0, 8 - m % 8), (0, 0)))
    step_k = blocks * BLOCK
    steps, tiles = k // step_k // splits, n // WG_ROWS
    scale_cols = 0 if scales is None else scales.shape[1] // (k // step_k)

    piped = 2 + (scales is not None) + fp8_x  # operands the pipeline streams
    inputs = [a for a in (w, x, scales, xs_rows, cs) if a is not None]
    col = None if finish is None else finish.row.col
    if col is not None:
        inputs.append(col)
        if col.dtype != jnp.dtype(F32) or col.shape not in ((n,), (1,)):
            raise ValueError(f"plain_slabs: finish.row.col must be float32 ({n},) or (1,), got "
                             f"{col.dtype}{tuple(col.shape)}")

    def body(*refs):
        w_gmem, x_gmem = refs[:2]
        out_gmem, finish_scratch = refs[len(inputs)], refs[len(inputs) + 1:]
        if finish is None:
            t = lax.axis_index("tile")
            tile, split = t % tiles, t // tiles
        else:  # (a tile's ranges are one cluster)
            tile = lax.axis_index("tile")
            split = lax.axis_index("range") if splits > 1 else 0

        def write_y(total):  # KernelFinish: times col, rounded, y's rows written transposed
            y_smem = finish_scratch[-1]
            c = None
            if col is not None:
                col_gmem = refs[len(inputs) - 1]
                if col.shape[0] == 1:
                    c = col_gmem[0]
                else:
                    c = lax.broadcast_in_dim(
                        plgpu.load(col_gmem.at[pl.ds(tile * WG_ROWS, WG_ROWS)],
                                   layout=plgpu.Layout.WGMMA.reduce(1), optimized=False),
                        total.shape, [0])
            total = finish_rows(total, c, finish.row.factor, finish.row.op,
                                divide=functools.partial(div_full, interpret=False))
            # (TMA drops the rows past y's M: x's zero rows)
            store_piece(total, y_smem,
                        out_gmem.at[pl.ds(0, block_m), pl.ds(tile * WG_ROWS, WG_ROWS)],
                        transposed=True)
            plgpu.wait_smem_to_gmem(0)

        def finish_total(total):  # KernelFinish: range 0 adds the cluster's totals in K order
            if splits == 1:
                return write_y(total)
            recv, recv_bar = finish_scratch[:2]

            @pl.when(split > 0)
            def _send():
                plgpu.async_store_smem(total, recv.at[split - 1], recv_bar, cluster_idx=0,
                                       cluster_dim="range")

            @pl.when(split == 0)
            def _add():  # XLA's fold of the slabs (groups: deterministic mode's det_groups;
                # ranges that folded a group each send its run: added in order)
                plgpu.barrier_wait(recv_bar)
                write_y(fold_parts(
                    lambda r: total if r == 0 else plgpu.load(recv.at[r - 1],
                                                              layout=plgpu.Layout.WGMMA),
                    splits, finish.groups if range_parts == 1 else 1))

        def specs(first):  # the pipeline's tiles from K-step `first` on
            return [plgpu.BlockSpec((WG_ROWS, step_k), lambda i: (tile, first + i),
                                    transforms=swizzled(w.dtype)),
                    plgpu.BlockSpec((block_m, step_k), lambda i: (0, first + i),
                                    transforms=swizzled(x.dtype))] + (
                [plgpu.BlockSpec((WG_ROWS, scale_cols), lambda i: (tile, first + i))]
                if scales is not None else []) + (
                [plgpu.BlockSpec((blocks, xs_cols), lambda i: (first + i, 0))] if fp8_x else [])

        def a_operand(w_smem, s_smem, j, a_smem):  # K-block j of the step, as wgmma's A
            cols = pl.ds(j * BLOCK, BLOCK)
            if a_tile is None:  # (fp8 x: the stored tile)
                return w_smem if blocks == 1 else w_smem.at[:, cols]
            s_ref = (s_smem[0].at[:, pl.ds(j * scale_cols // blocks, scale_cols // blocks)]
                     if s_smem else None)
            a = a_tile(w_smem if blocks == 1 else w_smem.at[:, cols], s_ref)
            if interpret:  # the interpreter's wgmma reads A from shared memory
                a_smem[...] = a
                plgpu.commit_smem()
                a = a_smem
            return a

        def store(total, out_smem, slab=None):
            if finish is not None:
                return finish_total(total)
            out_smem[...] = total
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(out_smem, out_gmem.at[split if slab is None else slab,
                                                          pl.ds(tile * WG_ROWS, WG_ROWS)])
            plgpu.wait_smem_to_gmem(0)

        def by_blocks(out_smem, a_smem, cs_smem=None, cs_bar=None):
            # the CTA's share of chain_scales (if any), once: its 128-row block's row of block
            # scales, or its 64 rows' scales; then per K-block a chain from zero
            row = None
            if cs_smem is not None:
                share = (pl.ds(tile * WG_ROWS, WG_ROWS) if cs.ndim == 1 else
                         pl.ds(tile * WG_ROWS // BLOCK, 1))
                plgpu.copy_gmem_to_smem(refs[piped].at[share], cs_smem, cs_bar)
                plgpu.barrier_wait(cs_bar)
                if cs.ndim == 1:
                    row = plgpu.load(cs_smem, layout=plgpu.Layout.WGMMA.reduce(1))

            part_blocks = steps * blocks // range_parts
            folds = finish is not None and range_parts > 1
            # (folding: this CTA's groups of parts -- all of finish.groups with one range, else
            # its one group -- and the parts a run)
            runs = (finish.groups if splits == 1 else 1) if folds else 1
            per_run = range_parts // runs

            def fold_block(carry, part, b):  # K-block b (of the range) joins its part; a
                # closing part joins its run, a closing run the total (fold_parts' additions)
                cur, run, *total = carry
                cur = cur + part
                q = lax.div(b, part_blocks)

                def where(c, a, o):
                    return lax.select(lax.broadcast_in_dim(c, a.shape, ()), a, o)
                closes = lax.rem(b + 1, part_blocks) == 0
                new_run = where(lax.rem(q, per_run) == 0, cur, run + cur)
                if total:  # (several runs: the closed ones' sum apart)
                    ends = jnp.logical_and(closes, lax.rem(q, per_run) == per_run - 1)
                    total = [where(ends, where(q < per_run, new_run, total[0] + new_run),
                                   total[0])]
                return (where(closes, zero_total(part.shape), cur),
                        where(closes, new_run, run), *total)

            def block_xt(x_smem, j):
                return (x_smem if blocks == 1 else
                        x_smem.at[:, pl.ds(j * BLOCK, BLOCK)]).transpose((1, 0))

            def step_chains(w_smem, x_smem, s_smem):  # the step's K-blocks' chains, each from 0
                def chain(j, acc):
                    plgpu.wgmma(acc, a_operand(w_smem, s_smem, j, a_smem), block_xt(x_smem, j))
                    plgpu.wgmma_wait(0)
                    return acc[...]
                # (lazily: each chain traced just before its addition)
                return (pl.run_scoped(functools.partial(chain, j),
                                      plgpu.ACC((WG_ROWS, block_m), F32))
                        for j in range(blocks))

            def step(idx, w_smem, x_smem, *rest):
                *s_smem, totals = rest
                xs_smem = s_smem.pop() if fp8_x else None
                for j, part in enumerate(step_chains(w_smem, x_smem, s_smem)):
                    if xs_smem is not None:  # the x rows' scales first (fp8_block_mgpu's order)
                        xr = plgpu.load(xs_smem.at[j, pl.ds(0, block_m)],
                                        layout=plgpu.Layout.WGMMA.reduce(0))
                        part = part * lax.broadcast_in_dim(xr, part.shape, [1])
                    if row is not None:
                        part = part * lax.broadcast_in_dim(row, part.shape, [0])
                    elif cs_smem is not None:
                        kb = (split * steps + idx[0]) * blocks + j
                        part = part * lax.broadcast_in_dim(cs_smem[0, kb], part.shape, ())
                    if range_parts == 1:  # (one total: the carry as before range_parts)
                        totals = totals + part
                    elif folds:
                        totals = fold_block(totals, part, idx[0] * blocks + j)
                    else:  # (the K-block's part of the range: its total alone takes it)
                        q = lax.div(idx[0] * blocks + j, part_blocks)
                        totals = tuple(
                            lax.select(lax.broadcast_in_dim(q == p, part.shape, ()), t + part, t)
                            for p, t in enumerate(totals))
                return totals

            carried = 1 if range_parts == 1 else (2 + (runs > 1)) if folds else range_parts
            totals = plgpu.emit_pipeline(
                step, grid=(steps,), max_concurrent_steps=stages, in_specs=specs(split * steps),
                init_carry=zero_total((WG_ROWS, block_m)) if carried == 1 else tuple(
                    zero_total((WG_ROWS, block_m)) for _ in range(carried)))(*refs[:piped])
            if folds:  # (one run: it is the total)
                return store(totals[-1], out_smem)
            for p, total in enumerate((totals,) if range_parts == 1 else totals):
                store(total, out_smem, None if range_parts == 1 else split * range_parts + p)

        def accumulate(acc, out_smem, a_smem):  # one chain over the range
            def step(_, w_smem, x_smem, *s_smem):
                for j in range(blocks):
                    xt = (x_smem if blocks == 1 else
                          x_smem.at[:, pl.ds(j * BLOCK, BLOCK)]).transpose((1, 0))
                    plgpu.wgmma(acc, a_operand(w_smem, s_smem, j, a_smem), xt)
                    plgpu.wgmma_wait(0)

            first = split * steps
            plgpu.emit_pipeline(step, grid=(steps,), max_concurrent_steps=stages,
                                in_specs=specs(first))(*refs[:piped])
            store(acc[...], out_smem)

        scratch = ([plgpu.SMEM((WG_ROWS, BLOCK), x.dtype, transforms=swizzled(x.dtype))]
                   if interpret and not fp8_x else [])
        if chains == "block":
            held = [] if cs is None else [
                plgpu.SMEM((WG_ROWS,) if cs.ndim == 1 else (1, cs.shape[1]), F32),
                plgpu.Barrier(num_arrivals=1)]
            pl.run_scoped(
                lambda out_smem, *rest: by_blocks(
                    out_smem, rest[len(held)] if scratch else None, *rest[:len(held)]),
                plgpu.SMEM((WG_ROWS, block_m), F32), *held, *scratch)
            return
        pl.run_scoped(
            lambda out_smem, *a: pl.run_scoped(
                lambda acc: accumulate(acc, out_smem, a[0] if a else None),
                plgpu.ACC((WG_ROWS, block_m), F32)),
            plgpu.SMEM((WG_ROWS, block_m), F32), *scratch)

    params = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup)
    if finish is None:
        call = plgpu.kernel(
            body, out_type=jax.ShapeDtypeStruct((splits * range_parts, n, block_m), F32),
            grid=(tiles * splits,), grid_names=("tile",), compiler_params=params,
            interpret=interpret_params(interpret))
        return call(*inputs)
    out_dtype = jnp.dtype(finish.out_dtype)
    # kernel-level scratch: its barrier is initialized before the cluster's first sync. Its
    # arrivals count warpgroups (warpgroup semantics: Mosaic's init multiplies by 128 threads,
    # each sending thread's expect_tx arriving once): one per sending range. (Session 42 asked
    # 128 per range; 128 x 128 never came and the launch hung on the H200, session 43.)
    received = [plgpu.SMEM((splits - 1, WG_ROWS, block_m), F32,
                           transforms=swizzled(F32, block_m)),
                plgpu.Barrier(num_arrivals=splits - 1)] if splits > 1 else []
    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((finish.rows, n), out_dtype),
        grid=(tiles,), grid_names=("tile",),
        cluster=(splits,) if splits > 1 else (), cluster_names=("range",) if splits > 1 else (),
        scratch_types=received + [plgpu.SMEM((block_m, WG_ROWS), out_dtype,
                                             transforms=swizzled(out_dtype, WG_ROWS))],
        compiler_params=params, interpret=interpret_params(interpret))
    return call(*inputs)
