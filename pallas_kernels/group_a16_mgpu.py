"""Group-scaled weights times bf16 activations on Mosaic GPU -- NVFP4 (packed e2m1, e4m3 scale
per 16 along K, float32 global), MXFP4 (packed e2m1, e8m0 per 32) and MXFP8 (e4m3, e8m0 per
32): the W8A16 kernel of fp8_block_a16_mgpu (swap-AB, a TMA warpgroup streaming the tiles, two
compute warpgroups, weights converted in registers as wgmma's A operand, the same decode
launches: K ranges, stream-K, deterministic K parts) fed the codes and their group scales as
stored (scales="groups"), decoded by mgpu_group_decode -- 4-bit codes are half the bytes of its
e4m3 stream.

Numerics per output (m, n): the decoded weight (code * group scale, divided by the format's
post factor: 2**8 for NVFP4, 1 for MX) is exact in bf16 (MX: wherever the product is a bf16
number, as in the Triton kernels); each 128-K block's wgmma chain sums bf16 products in float32
from zero, the blocks are added in K order (the ranges' or parts' sums in K order, as for fp8);
the float32 total is multiplied by the post factor (exact) and, for NVFP4, divided ("div",
compressed-tensors' weight_global_scale) or multiplied ("mul", ModelOpt's weight_scale_2) by the
row's global scale, then rounded once to the output dtype -- by the CTAs where they write the
rounded output themselves (since session 22; RowFinish), else by XLA on the float32 sums they
write (the same operations, the same bits). The same products as the XLA reference (exact
dequantization, float32 dot); the float32 sums run in another order.

e2m1 codes are read from shared memory one byte a register (a_load="wgmma") or, from
WORDS_MIN_WEIGHTS weights on, as 32-bit words of 8 codes (a_load="words": fewer loads and scale
conversions; the MMA sees K permuted inside each 32 columns, x is permuted alike -- the same
products, another float32 summation order inside a K-block, fixed by (N, K)).

Layout: e2m1 weights uint8 (N, K/2) packed as stored (low nibble first) -- viewed as int4 (N,
K), which keeps the nibble order; e4m3 weights (N, K); scales (N, K/group) as stored, read as
bytes in tiles of whole K-blocks' groups of at least 16 bytes a row (TMA): N a multiple of 128,
K of 256 (NVFP4) or 512 (MX).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .fp8_block_a16_mgpu import (BLOCK, GROUP_A_LOADS, PREDECODE_MIN_M, WG_ROWS, _launch,
                                 check_launch, check_predecode, group_tile_blocks,
                                 launch_params, step_unit, stream_programs)
from .fp8_heuristics import num_sms
from .mgpu_common import RowFinish
from .mgpu_group_decode import FORMATS, Format, predecode_weights
from .mgpu_relabel import permute_k

__all__ = ["nvfp4_a16_matmul_mgpu", "mxfp4_a16_matmul_mgpu", "mxfp8_a16_matmul_mgpu",
           "group_a16_matmul_mgpu", "group_launch_params", "with_blocks_per_step", "k_multiple",
           "supports", "check_operands",
           "FOUR_BLOCK_MIN_TILES", "WORDS_MIN_WEIGHTS", "PREDECODE_FORMATS", "reads_words",
           "det_predecode_min_m",
           "DET_PREDECODE_MIN_M"]

N_MULTIPLE = 2 * WG_ROWS  # two compute warpgroups' rows
# launch settings that describe how K and the tiles are cut (overriding any replaces them all)
PARTITION = {"block_m", "k_splits", "k_parts", "programs", "blocks_per_step", "parts_sum",
             "k_groups", "groups_sum"}
_SETTINGS = PARTITION | {"stages", "group_m", "a_in_registers", "compute_wgs", "a_load",
                         "wgmma_halves", "predecode"}


def k_multiple(fmt: str) -> int:
    """K must be a multiple of this: one scale tile's K-blocks at one K-block a step."""
    return BLOCK * group_tile_blocks(1, FORMATS[fmt].scale_bytes)


def supports(fmt: str, m: int, n: int, k: int, x_dtype) -> str | None:
    """None, or why this kernel cannot take these operands (the dispatcher's explanation)."""
    if jnp.dtype(x_dtype) != jnp.dtype(jnp.bfloat16):
        return f"the Mosaic {fmt} kernel takes one bf16 activation, got {jnp.dtype(x_dtype)}"
    if n % N_MULTIPLE or k % k_multiple(fmt):
        return (f"the Mosaic {fmt} kernel needs N % {N_MULTIPLE} == 0 and K % {k_multiple(fmt)}"
                f" == 0 (stored), got N={n}, K={k}")
    return None


# Four K-blocks a pipeline step (default mode, x tiles <= 16 rows) from this many weight
# tiles of 128 rows. H200, session 12 (benchmarks/bench_fp4_mx.py --parts mgpu4, 11 shapes,
# same run): +5-10% at M=1 and +2-7% at M=16 from N = 8192 (64 tiles) on; 2-7% slower on
# 4096x4096 / 4096x6144 (32-48 tiles), even on 14336x4096; at M=64 24-31% slower (two stages).
# Measured on NVFP4; MXFP4 takes it too (its session-12 grid ran with it; no A/B).
FOUR_BLOCK_MIN_TILES = 64


# e2m1 codes read as 32-bit words (a_load="words": mgpu_group_decode.decode_words, x permuted
# by one small XLA pass) from this many weights N * K, in both modes and at every M (a function
# of (N, K): deterministic mode's K order stays independent of M). H200, session 13
# (bench_fp4_mx.py --parts mgpuw, 11 shapes, M = 1 / 16 / 64, same run, over byte loads):
# NVFP4 +2-20% from 8192x8192 on (8192x57344 +14-20%, 28672x8192 +8-16%), 2-12% slower below
# (4096x4096: the x pass, ~0.8 us, against a ~9 us product); MXFP4 (no scale conversions
# saved: a thread meets 4 of its groups either way) +2-10% from 7168x24576 on, -5..+5% below.
WORDS_MIN_WEIGHTS = {"nvfp4": 8192 * 8192, "mxfp4": 7168 * 24576}


# wgmma_halves (fp8_block_a16_mgpu.halves_pay's launches) for MXFP8's e4m3 codes only. H200,
# session 16 (bench_fp4_mx.py --parts dethalvesdec, 4 shapes, same run; in-CTA parts at 128-row
# tiles spill 16 bytes for NVFP4, 44 for MXFP8, none with the halves): MXFP8 det/default at
# M=4096 1.63-1.70x -> 1.49-1.56x, at M=256 1.12-1.17x -> 1.03-1.11x; NVFP4 slower with them
# (M=4096 1.38-1.48x -> 1.44-1.54x, M=256 +3-11%): its e2m1 decode is the bound, and a half
# converts its groups' scales again.
# Deterministic mode's predecode (fp8_block_a16_mgpu.PREDECODE_MIN_M: codes decoded to bf16
# by XLA, predecode_weights, then wgmma from shared memory) for these formats. H200, session 17
# (bench_fp4_mx.py --parts detpredecode, 4 shapes, same run), time with / without at M=4096:
# MXFP4 0.90-1.02, MXFP8 0.97-1.00, NVFP4 0.98-1.09 (its in-register decode of 4.5 bits a
# weight costs less than streaming 16); at M=1024 all three 1.14-1.48. Default mode runs the
# dense path from mx_dense.DENSE_MIN_M rows, so it never meets the rule. NVFP4 joined in
# session 22, once its finish ran in the CTAs (RowFinish) and so its predecoded launches could
# reload their first group's sum as MX's do: 0.82-0.96x the time of its register decode at
# M=4096 (bench_fp4_mx.py --parts rowfinish, 3 shapes, h200_fp4_rowfinish_s22.json).
# The rows from which deterministic mode predecodes: DET_PREDECODE_MIN_M, except e2m1 codes the
# register decode reads as words (WORDS_MIN_WEIGHTS), which keep PREDECODE_MIN_M. The Pallas
# pass (sessions 21-22) and reloaded groups made predecoding pay below PREDECODE_MIN_M where the
# register decode is dear. H200, session 24 (bench_fp4_mx.py --parts detother2048 twice in one
# process, 11 shapes, h200_fp4_det_other_decode_m2048_s24.json), time predecoded / register
# decode at M=2048: MXFP8 0.81-0.91 on every shape; e2m1 codes read as bytes NVFP4 0.78-0.88
# (its 3 such shapes), MXFP4 0.76-0.84 (7); read as words NVFP4 1.02-1.17 (8), MXFP4 1.00-1.06
# (4) -- the words decode is cheap enough that streaming 16 bits a weight loses. (Sessions
# 22-23's 3-shape A/Bs mixed the two kinds of shape.) At M=1024 predecoding does not pay
# (0.91-1.37, session 22). Predecoded sums are the register decode's bits, so M may choose.
DET_PREDECODE_MIN_M = 2048
PREDECODE_FORMATS = ("nvfp4", "mxfp4", "mxfp8")


def reads_words(fmt: str, n: int, k: int) -> bool:
    """Whether the register decode reads fmt's codes of an (n, k) weight as 32-bit words."""
    return fmt in WORDS_MIN_WEIGHTS and n * k >= WORDS_MIN_WEIGHTS[fmt]


def det_predecode_min_m(fmt: str, n: int, k: int) -> int:
    """The rows from which deterministic mode decodes fmt's (n, k) codes to bf16 first."""
    return PREDECODE_MIN_M if reads_words(fmt, n, k) else DET_PREDECODE_MIN_M


def group_launch_params(m: int, n: int, k: int, interpret: bool,
                        deterministic: bool = False, fmt: str = "nvfp4",
                        predecode: bool | None = None) -> dict:
    """fp8_block_a16_mgpu.launch_params, with four K-blocks a step for 4-bit codes where
    FOUR_BLOCK_MIN_TILES says (a stream re-shared for the longer steps: >= 8 K-blocks a CTA;
    K ranges only where each holds whole steps), and e2m1 codes read as words where
    WORDS_MIN_WEIGHTS says. Deterministic mode keeps launch_params' partition (the fp8
    kernel's: K parts, ranges, streamed parts) and takes four K-blocks a step by the same rule
    where its steps can hold 4 (step_unit: a part's K-blocks, or streamed parts' tile K and
    CTA run; the sums are the same for 1, 2 or 4 blocks a step). predecode: whether
    launch_params may predecode (None: deterministic mode for PREDECODE_FORMATS), from
    det_predecode_min_m's rows."""
    if predecode is None:
        predecode = deterministic and fmt in PREDECODE_FORMATS
    p = launch_params(m, n, k, interpret, deterministic=deterministic,
                      w_bits=FORMATS[fmt].bits, halves=FORMATS[fmt].elem == "e4m3",
                      predecode_min_m=det_predecode_min_m(fmt, n, k) if predecode else None)
    if reads_words(fmt, n, k):
        p["a_load"] = "words"
    if (FORMATS[fmt].elem != "e2m1" or p.get("block_m", BLOCK) > 16
            or n // N_MULTIPLE < FOUR_BLOCK_MIN_TILES or step_unit(p, n, k) % 4):
        return p
    return with_blocks_per_step(p, n, k, 4)


def with_blocks_per_step(p: dict, n: int, k: int, blocks: int) -> dict:
    """Launch settings p with `blocks` K-blocks a step: a stream re-shared for the longer steps
    (>= 8 K-blocks a CTA); K ranges and parts as they are (they must hold whole steps)."""
    p = {**p, "blocks_per_step": blocks}
    if "programs" in p and p.get("k_parts", 1) == 1:
        p["programs"] = stream_programs(n // N_MULTIPLE, k // BLOCK // blocks, num_sms(),
                                        max(1, 8 // blocks))
    return p


def check_operands(fmt: str, x: jax.Array, w: jax.Array, w_scale: jax.Array,
                   col_scale: jax.Array | None, post: str) -> None:
    """ValueError naming the argument unless fmt is a group format, x is (M, K), w and w_scale
    are fmt's codes and scales as stored for that K, and (post, col_scale) fmt's global scale
    (NVFP4: "div" | "mul" and (N,) float32; MX: "none" and None). Shared by this kernel and
    group_a16_decode_mgpu."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {tuple(FORMATS)}, got {fmt!r}")
    f: Format = FORMATS[fmt]
    if x.ndim != 2:
        raise ValueError(f"x must be (M, K), got shape {tuple(x.shape)}")
    k = x.shape[1]
    n = w.shape[0]
    w_want = ((jnp.uint8, (n, k // 2), "packed e2m1") if f.elem == "e2m1" else
              (jnp.float8_e4m3fn, (n, k), "e4m3"))
    if w.dtype != jnp.dtype(w_want[0]) or w.shape != w_want[1]:
        raise ValueError(f"w must be {jnp.dtype(w_want[0])} {w_want[1]} ({w_want[2]}) for x "
                         f"{tuple(x.shape)}, got {w.dtype} {tuple(w.shape)}")
    s_dtype = jnp.float8_e4m3fn if f.scale == "e4m3" else jnp.uint8
    if w_scale.dtype != jnp.dtype(s_dtype) or w_scale.shape != (n, k // f.group):
        raise ValueError(f"w_scale must be {jnp.dtype(s_dtype)} (N, K/{f.group}) = "
                         f"{(n, k // f.group)}, got {w_scale.dtype} {tuple(w_scale.shape)}")
    if fmt == "nvfp4":
        if post not in ("div", "mul"):
            raise ValueError(f"post must be 'div' (CT global) or 'mul' (ModelOpt), got {post!r}")
        if col_scale is None or col_scale.shape != (n,):
            raise ValueError(f"col_scale must be (N,) = ({n},), got "
                             f"{None if col_scale is None else tuple(col_scale.shape)}")
    elif post != "none" or col_scale is not None:
        raise ValueError(f"{fmt} has no global scale: post must be 'none', col_scale None")


def group_a16_matmul_mgpu(fmt: str, x: jax.Array, w: jax.Array, w_scale: jax.Array,
                          col_scale: jax.Array | None = None, *, post: str = "none",
                          out_dtype=None, deterministic: bool = False, interpret: bool = False,
                          **overrides) -> jax.Array:
    """y (M, N) = x (M, K) bf16 @ (code(w) * scale(w_scale))^T in out_dtype (default x's); for
    NVFP4 then `post` ("div" | "mul") by col_scale (float32 (N,)) per output column.
    fmt: "nvfp4" (w uint8 (N, K/2), w_scale e4m3 (N, K/16)), "mxfp4" (w uint8 (N, K/2),
    w_scale uint8 e8m0 (N, K/32)) or "mxfp8" (w e4m3 (N, K), w_scale uint8 (N, K/32)).
    deterministic: det_params' launch, whose K order is a function of K alone (as for fp8).
    overrides: launch settings of fp8_block_a16_matmul_mgpu (block_m, k_splits, k_parts,
    programs, blocks_per_step -- here also 4 --, stages, parts_sum, k_groups, group_m,
    a_in_registers;
    a_load "wgmma" (byte loads) or "words" (e2m1 codes, 8 a load, K permuted);
    wgmma_halves -- each K-block decoded and multiplied in two halves, the same sums
    (test_gpu_group_wgmma_halves_give_the_same_bits); group_launch_params takes them for
    MXFP8's in-CTA parts at 128-row x tiles; predecode -- the codes decoded to bf16 by one XLA
    pass (predecode_weights, the words' K permutation kept), wgmma reading them from shared
    memory, the same sums (test_gpu_predecoded_codes_give_the_same_bits); groups_sum, as for
    fp8)
    on top of group_launch_params' for (M, N, K); any of the partition settings (PARTITION)
    given replaces its partition (unset ones: one x tile of 128 rows, one K range, one part,
    one K-block a step)."""
    check_operands(fmt, x, w, w_scale, col_scale, post)
    f: Format = FORMATS[fmt]
    m, k = x.shape
    n = w.shape[0]
    if why := supports(fmt, m, n, k, x.dtype):
        raise ValueError(why)
    params = {**dict(group_m=8, block_m=BLOCK, k_splits=1, k_parts=1, stages=None),
              **group_launch_params(m, n, k, interpret, deterministic=deterministic, fmt=fmt)}
    if set(overrides) & PARTITION:  # a launch of its own, not launch_params' partition
        params = {key: v for key, v in params.items() if key not in PARTITION}
        params.update(block_m=BLOCK, k_splits=1, k_parts=1)
    if unknown := set(overrides) - _SETTINGS:
        raise ValueError(f"unknown launch settings {sorted(unknown)}")
    params.update(overrides)
    check_launch(m, n, k, block_m=params["block_m"], k_splits=params["k_splits"],
                 k_parts=params["k_parts"], blocks_per_step=params.get("blocks_per_step", 1),
                 programs=params.get("programs"), compute_wgs=params.get("compute_wgs", 2),
                 group_m=params["group_m"], parts_sum=params.get("parts_sum", "cond"),
                 step_blocks=(1, 2, 4), k_groups=params.get("k_groups", 1),
                 wgmma_halves=params.get("wgmma_halves", False),
                 groups_sum=params.get("groups_sum", "park"))
    a_load = params.get("a_load", "wgmma")
    if a_load not in GROUP_A_LOADS or (a_load == "words" and f.elem != "e2m1"):
        raise ValueError(f"a_load must be one of {GROUP_A_LOADS} ('words': e2m1 codes only), "
                         f"got {a_load!r} for {fmt}")
    predecode = params.pop("predecode", False)
    if predecode and "wgmma_halves" not in overrides:  # (launch_params' choice for the decode)
        params.pop("wgmma_halves", None)
    check_predecode(predecode, a_load, params.get("wgmma_halves", False), GROUP_A_LOADS,
                    params.get("groups_sum", "park"))
    if params["a_in_registers"] == bool(interpret):
        raise ValueError("the group decode runs in registers on the GPU (inline PTX) and from "
                         "shared memory in the interpreter; a_in_registers must be "
                         f"{not interpret} here")
    codes = lax.bitcast_convert_type(w, jnp.int4).reshape(n, k) if f.elem == "e2m1" else w
    scales = lax.bitcast_convert_type(w_scale, jnp.uint8)
    # NVFP4: the float32 sums times the post factor, then the global scale per column -- in
    # the CTAs where they round their own output, else after (RowFinish); MX: nothing to apply
    finish = (RowFinish(col_scale.astype(jnp.float32), f.post_factor, post)
              if col_scale is not None else None)
    if predecode:  # the values decode() gives, K-blocks permuted as decode_words hands them
        w_dec = predecode_weights(w, scales, f, interpret=bool(interpret))
        perm = "halves" if a_load == "words" else None
        params.update(a_load="smem", k_perm=perm)
        return _launch(x, w_dec if perm is None else permute_k(w_dec, perm),
                       jnp.zeros((1, 1), jnp.float32), out_dtype=jnp.dtype(out_dtype or x.dtype),
                       interpret=interpret, scales="none", row_finish=finish, **params)
    return _launch(x, codes, scales, out_dtype=jnp.dtype(out_dtype or x.dtype),
                   interpret=interpret, scales="groups", group_fmt=fmt, row_finish=finish,
                   **params)


def nvfp4_a16_matmul_mgpu(x, w, w_scale, col_scale, *, post: str, **kw) -> jax.Array:
    """group_a16_matmul_mgpu("nvfp4", ...)."""
    return group_a16_matmul_mgpu("nvfp4", x, w, w_scale, col_scale, post=post, **kw)


def mxfp4_a16_matmul_mgpu(x, w, w_scale, **kw) -> jax.Array:
    """group_a16_matmul_mgpu("mxfp4", ...)."""
    return group_a16_matmul_mgpu("mxfp4", x, w, w_scale, **kw)


def mxfp8_a16_matmul_mgpu(x, w, w_scale, **kw) -> jax.Array:
    """group_a16_matmul_mgpu("mxfp8", ...)."""
    return group_a16_matmul_mgpu("mxfp8", x, w, w_scale, **kw)
