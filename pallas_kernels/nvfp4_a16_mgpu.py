"""NVFP4 weights (packed e2m1, e4m3 scale per 16 along K, float32 global) times bf16 activations
on Mosaic GPU: the W8A16 kernel of fp8_block_a16_mgpu (swap-AB, a TMA warpgroup streaming the
tiles, two compute warpgroups, weights converted in registers as wgmma's A operand, the same
decode launches: K ranges, stream-K, deterministic K parts) fed 4-bit codes and their group
scales (scales="groups"), decoded by mgpu_e2m1 -- half the bytes of its e4m3 stream.

Numerics per output (m, n): the decoded weight e2m1 * s * 2**-8 is exact in bf16; each 128-K
block's wgmma chain sums bf16 products in float32 from zero, the blocks are added in K order
(the ranges' or parts' sums in K order, as for fp8); the float32 total is multiplied by 2**8
(exact) and then divided ("div", compressed-tensors' weight_global_scale) or multiplied ("mul",
ModelOpt's weight_scale_2) by the row's global scale, rounded once to the output dtype. The
same products as the XLA reference (exact dequantization, float32 dot); the float32 sums run
in another order.

Layout: w uint8 (N, K/2) packed as stored (low nibble first) -- viewed as int4 (N, K), which
keeps the nibble order; w_scale e4m3 (N, K/16) as stored, read as bytes in tiles of two
K-blocks' groups; N a multiple of 128, K of 256 (the scale rows' TMA boxes are >= 16 bytes).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from .fp8_block_a16_mgpu import (BLOCK, COMPUTE_WGS, WG_ROWS, X_TILES, _launch, launch_params,
                                 stream_programs)
from .fp8_heuristics import num_sms
from .mgpu_e2m1 import GROUP, POST_FACTOR

__all__ = ["nvfp4_a16_matmul_mgpu", "nvfp4_launch_params", "K_MULTIPLE", "supports",
           "FOUR_BLOCK_MIN_TILES"]

K_MULTIPLE = 2 * BLOCK  # a scale tile's two K-blocks
N_MULTIPLE = 2 * WG_ROWS  # two compute warpgroups' rows
# launch settings that describe how K and the tiles are cut (overriding any replaces them all)
PARTITION = {"block_m", "k_splits", "k_parts", "programs", "blocks_per_step", "parts_sum"}


def supports(m: int, n: int, k: int, x_dtype) -> str | None:
    """None, or why this kernel cannot take these operands (the dispatcher's explanation)."""
    if jnp.dtype(x_dtype) != jnp.dtype(jnp.bfloat16):
        return f"the Mosaic NVFP4 kernel takes one bf16 activation, got {jnp.dtype(x_dtype)}"
    if n % N_MULTIPLE or k % K_MULTIPLE:
        return (f"the Mosaic NVFP4 kernel needs N % {N_MULTIPLE} == 0 and K % {K_MULTIPLE} == 0 "
                f"(stored), got N={n}, K={k}")
    return None


# Four K-blocks a pipeline step (default mode, x tiles <= 16 rows) from this many weight
# tiles of 128 rows. H200, session 12 (benchmarks/bench_fp4_mx.py --parts mgpu4, 11 shapes,
# same run): +5-10% at M=1 and +2-7% at M=16 from N = 8192 (64 tiles) on; 2-7% slower on
# 4096x4096 / 4096x6144 (32-48 tiles), even on 14336x4096; at M=64 24-31% slower (two stages).
FOUR_BLOCK_MIN_TILES = 64


def nvfp4_launch_params(m: int, n: int, k: int, interpret: bool,
                        deterministic: bool = False) -> dict:
    """fp8_block_a16_mgpu.launch_params, with four K-blocks a step where FOUR_BLOCK_MIN_TILES
    says (a stream re-shared for the longer steps: >= 8 K-blocks a CTA; K ranges only where
    each holds whole steps). Deterministic mode keeps launch_params' (its sums are the same
    either way, and its launch is the fp8 kernel's)."""
    p = launch_params(m, n, k, interpret, deterministic=deterministic)
    kb = k // BLOCK
    per_part = kb // p.get("k_splits", 1) // p.get("k_parts", 1)
    if (deterministic or p.get("block_m", BLOCK) > 16 or n // N_MULTIPLE < FOUR_BLOCK_MIN_TILES
            or per_part % 4):
        return p
    if "programs" in p:
        p["programs"] = stream_programs(n // N_MULTIPLE, kb // 4, num_sms(), 2)
    return {**p, "blocks_per_step": 4}


def _check_launch(p: dict, n: int, k: int) -> None:
    """The K partition and stream a launch asks for must cut K at whole steps."""
    kb, blocks = k // BLOCK, p.get("blocks_per_step", 1)
    splits, parts = p["k_splits"], p["k_parts"]
    if not all(isinstance(v, int) and v >= 1 for v in (splits, parts)) or kb % (splits * parts):
        raise ValueError(f"k_splits * k_parts must divide K/{BLOCK}={kb}, got {splits} * {parts}")
    if blocks not in (1, 2, 4) or (kb // splits // parts) % blocks:
        raise ValueError(f"blocks_per_step must be 1, 2 or 4, dividing the {kb // splits // parts}"
                         f" K-blocks of a K part, got {blocks!r}")
    if (programs := p.get("programs")) is not None:
        tiles = n // (p.get("compute_wgs", 2) * WG_ROWS)
        total = tiles * (kb // blocks if parts == 1 else parts)
        if not (isinstance(programs, int) and programs >= 1 and total % programs == 0
                and splits == 1):
            raise ValueError(f"programs must divide the {total} stream items (k_splits=1), got "
                             f"{programs!r}")


def nvfp4_a16_matmul_mgpu(x: jax.Array, w: jax.Array, w_scale: jax.Array,
                          col_scale: jax.Array, *, post: str, out_dtype=None,
                          deterministic: bool = False, interpret: bool = False,
                          **overrides) -> jax.Array:
    """y (M, N) = x (M, K) bf16 @ (e2m1(w) * e4m3(w_scale))^T, then `post` ("div" | "mul") by
    col_scale (float32 (N,)) per output column, in out_dtype (default x's).
    deterministic: det_params' launch, whose K order is a function of K alone (as for fp8).
    overrides: launch settings of fp8_block_a16_matmul_mgpu (block_m, k_splits, k_parts,
    programs, blocks_per_step -- here also 4 --, stages, parts_sum, group_m, a_in_registers)
    on top of launch_params' for (M, N, K); any of the partition settings (PARTITION) given
    replaces launch_params' partition (unset ones: one x tile of 128 rows, one K range, one
    part, one K-block a step)."""
    m, k = x.shape
    n = w.shape[0]
    if post not in ("div", "mul"):
        raise ValueError(f"post must be 'div' (CT global) or 'mul' (ModelOpt), got {post!r}")
    if x.ndim != 2 or (why := supports(m, n, k, x.dtype)):
        raise ValueError(why or f"x must be (M, K), got shape {tuple(x.shape)}")
    if w.dtype != jnp.dtype(jnp.uint8) or w.shape != (n, k // 2):
        raise ValueError(f"w must be uint8 (N, K/2) packed e2m1 for x {tuple(x.shape)}, got "
                         f"{w.dtype} {tuple(w.shape)}")
    if w_scale.dtype != jnp.dtype(jnp.float8_e4m3fn) or w_scale.shape != (n, k // GROUP):
        raise ValueError(f"w_scale must be float8_e4m3fn (N, K/{GROUP}) = {(n, k // GROUP)}, "
                         f"got {w_scale.dtype} {tuple(w_scale.shape)}")
    if col_scale.shape != (n,):
        raise ValueError(f"col_scale must be (N,) = ({n},), got {tuple(col_scale.shape)}")
    params = {**dict(group_m=8, block_m=BLOCK, k_splits=1, k_parts=1, stages=None),
              **nvfp4_launch_params(m, n, k, interpret, deterministic=deterministic)}
    if set(overrides) & PARTITION:  # a launch of its own, not launch_params' partition
        params = {key: v for key, v in params.items() if key not in PARTITION}
        params.update(block_m=BLOCK, k_splits=1, k_parts=1)
    if unknown := set(overrides) - {"block_m", "k_splits", "k_parts", "programs",
                                    "blocks_per_step", "stages", "parts_sum", "group_m",
                                    "a_in_registers", "compute_wgs"}:
        raise ValueError(f"unknown launch settings {sorted(unknown)}")
    params.update(overrides)
    if params["block_m"] not in X_TILES or params.get("compute_wgs", 2) not in COMPUTE_WGS:
        raise ValueError(f"block_m must be one of {X_TILES}, compute_wgs one of {COMPUTE_WGS}")
    _check_launch(params, n, k)
    if params["a_in_registers"] == bool(interpret):
        raise ValueError("the e2m1 decode runs in registers on the GPU (inline PTX) and from "
                         "shared memory in the interpreter; a_in_registers must be "
                         f"{not interpret} here")
    codes = lax.bitcast_convert_type(w, jnp.int4).reshape(n, k)
    scales = lax.bitcast_convert_type(w_scale, jnp.uint8)
    col = col_scale.astype(jnp.float32)[:, None]

    def finish(yt):  # (N, M) float32 sums -> times 2**8, then the global scale
        yt = yt * POST_FACTOR
        return yt / col if post == "div" else yt * col
    return _launch(x, codes, scales, out_dtype=jnp.dtype(out_dtype or x.dtype),
                   interpret=interpret, scales="groups", finish=finish, **params)
