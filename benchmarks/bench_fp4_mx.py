"""NVFP4 / MXFP4 / MXFP8 kernels on the device: auto kernels, variants and baselines, one run.

Built on jqlin.bench (same timing, same copy-bandwidth and bf16 `jnp.dot` baselines measured in
the same process), adding what the group-scaled kernels need to be judged:
  * decode variants of the e2m1 decoder ("asm" PTX vs portable "jnp") and tile configs;
  * MXFP8 W8A8 with fp8 MMAs per 32-chunk vs bf16 dequantization;
  * `jax.nn.scaled_dot_general` with the mxfp8 config (bf16 inputs quantized inside the call,
    decomposed on Hopper) -- the MXFP8 baseline of the issue.

    PYTHONPATH=. python benchmarks/bench_fp4_mx.py --out $OUT --parts decode,large
    PYTHONPATH=. python benchmarks/bench_fp4_mx.py --out $OUT --parts grid --shapes all \
        --m 1,16,64,256,1024,4096,16384       # the issue's grid: auto kernels and baselines
    parts: decode (M=1,16 variants), large (M=4096), mid (M=64/256 tiles), det (det-mode K
    schedules at M=1..4096), mgpu (NVFP4's Mosaic kernel vs its Triton one, M=1..256), mgpu_mx (the same for MX), mgpu4
    (the Mosaic kernel with 4 K-blocks a step), mgpuw (its e2m1 codes read 8 a load,
    a_load="words", beside byte loads), det4 / detw (deterministic launches: 4 vs 2 K-blocks
    a step, words vs bytes; M=1,16 / 256,4096), dets (deterministic steps straddling K parts'
    ends, K = 7168, beside one block a step), detstream (deterministic streamed parts where
    det_params keeps in-CTA parts), dethalves (a det order of two halves of K at M = 64 / 256),
    dethalvesdec (the group decode's wgmma_halves in deterministic launches, M = 256 / 4096),
    detpredecode (deterministic launches on codes decoded to bf16 first, M = 1024 / 4096),
    detpredecodex64 (the same on 64-row x tiles, M = 4096), detgroupsstore (the same with a
    CTA's two groups' sums stored to slabs, M = 4096), detgroupsreload (deterministic mode
    with the first group's sum read back in its CTA, M = 4096),
    detranges (deterministic K ranges with stored parts at
    M = 64 / 256), dequant (group_dequant's pass beside XLA's dequantization, M = 1024 / 4096),
    rowfinish (NVFP4's finish in the CTAs beside XLA's, and on predecoded codes reloaded,
    M = 1024 / 4096), detpredecodemid (deterministic launches predecoded below
    PREDECODE_MIN_M, M = 1024 / 2048), detother2048 (deterministic mode's other decode than
    the dispatcher's at M = 2048, 11 shapes), smallmdense (weight-only at M = 1-16: the
    Mosaic kernel beside the dense path with XLA's dequantization and with the Pallas pass),
    kparts (default mode's K ranges as in-CTA parts at M = 128 / 256), mxmma (MXFP8 W8A8 on
    Mosaic GPU fp8 MMAs beside the dispatcher's bf16 route, M = 1024 / 4096), grid.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp

from jqlin import bench
from jqlin.kernels.pallas_fp4 import apply
from pallas_kernels.common import MatmulConfig as C, cdiv
from pallas_kernels.fp8_heuristics import num_sms, split_for
from pallas_kernels.mx_heuristics import with_det_block_m

DECODE_SHAPES = [("llama3-8b", 4096, 28672), ("llama3-8b", 14336, 4096),
                 ("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 6144), ("llama3-8b", 4096, 4096),
                 ("llama3-70b", 8192, 10240), ("llama3-70b", 8192, 57344),
                 ("llama3-70b", 28672, 8192), ("deepseek-v3", 7168, 24576),
                 ("deepseek-v3", 7168, 36864), ("deepseek-v3", 18432, 7168)]
LARGE_SHAPES = [("llama3-70b", 8192, 8192), ("deepseek-v3", 7168, 24576)]
DETRANGES_SHAPES = [("llama3-8b", 14336, 4096), ("llama3-8b", 4096, 4096),
                    ("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 8192),
                    ("deepseek-v3", 18432, 7168)]
# det_halves_ops: the shapes of few weight tiles (N <= 10240) and one wide one (control)
DETHALVES_SHAPES = DETRANGES_SHAPES + [("llama3-70b", 8192, 10240), ("llama3-70b", 28672, 8192),
                                       ("deepseek-v3", 7168, 24576)]
# det_park_ops / det_group_halves_ops: in-CTA parts at 128-row tiles (M = 256 / 4096)
PARK_SHAPES = DETRANGES_SHAPES[:1] + DETRANGES_SHAPES[3:] + [("llama3-70b", 28672, 8192)]
# a square weight, K = 14336 (deterministic mode's stored groups), e2m1 words (MXFP4's predecode
# keeps their K permutation: an XLA pass after the dequantization)
DEQUANT_SHAPES = [("llama3-70b", 8192, 8192), ("llama3-8b", 14336, 4096),
                  ("deepseek-v3", 7168, 24576)]
MIDM_SHAPES = [("llama3-8b", 4096, 4096), ("llama3-70b", 8192, 8192), ("llama3-8b", 14336, 4096)]
DETSTREAM_SHAPES = [("llama3-8b", 4096, 28672), ("llama3-70b", 8192, 57344)]
DETS_SHAPES = [("deepseek-v3", 7168, 24576), ("deepseek-v3", 7168, 36864),
               ("llama3-70b", 8192, 8192)]


def _sdg_mxfp8(x, w):
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    return jax.nn.scaled_dot_general(x, w, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.bfloat16, configs=[cfg] * 3)


def _sdg_op(**kw) -> bench.Op:
    return bench.Op("scaled_dot_general_mxfp8", None, "default", _sdg_mxfp8, xla_gemm_min_m=0,
                    **kw)


def _variant(fmt: str, tag: str, m: int | None = None, **kw) -> bench.Op:
    """The format's kernel with overrides (config / decode / mxfp8_variant), recorded as is."""
    interpret = jax.default_backend() == "cpu"  # CPU: a smoke run of the script itself

    def fn(x, qw):
        return apply(x, qw, qw.spec, interpret=interpret, **kw)
    rec = {k: (v.to_json() if isinstance(v, C) else v) for k, v in kw.items()}
    return bench.Op(f"var[{tag}]", fmt, "default", fn, min_m=m, max_m=m, config=rec)


def _auto(fmt: str, det: bool = False) -> bench.Op:
    return bench.kernel_op(bench._auto_kernel(bench.formats.get(fmt)), fmt, det)


def _decode_cfg(cfg: C, m: int, n: int, k: int, per_sm: int) -> C:
    """split_k filled per shape like the heuristic: about `per_sm` programs per SM."""
    split = split_for(cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n), k, cfg.block_k,
                      target=per_sm * num_sms())
    return dataclasses.replace(cfg, split_k=split)


def decode_ops(k: int, n: int) -> list[bench.Op]:
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt), _auto(fmt, det=True)]
    ops += [_auto("nvfp4"), _auto("mxfp4"), _auto("mxfp8")]
    ops.append(_variant("nvfp4_a16", "jnp-decode", decode="jnp"))
    for m in (1, 16):  # run 1's heuristic (2 programs per SM, 4 stages), for the A/B
        cfg = _decode_cfg(C(16, 64, 256, num_warps=4, num_stages=4, variant="swap"), m, n, k, 2)
        ops.append(_variant("nvfp4_a16", "run1-cfg", m=m, config=cfg))
        cfg = _decode_cfg(C(16, 64, 256, num_warps=4, num_stages=3, variant="swap"), m, n, k, 8)
        ops.append(_variant("nvfp4_a16", "8-per-SM", m=m, config=cfg))
    # No-MMA gemv at M=1 (session 2, not yet timed). SASS (sm_90): 1x8x512 55 regs, 7.5
    # instructions per NVFP4 weight; 1x16x256 72 regs, 9.3. Prediction: 2.0-2.5x bf16 on the
    # large shapes (issue-bound near 4.4 T weights/s), vs 1.26x geomean for the MMA tile.
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"):
        for bn, bk in ((8, 512), (16, 256)):
            cfg = _decode_cfg(C(1, bn, bk, num_warps=4, num_stages=1, variant="gemv"), 1, n, k, 8)
            ops.append(_variant(fmt, f"gemv{bn}x{bk}", m=1, config=cfg))
    return ops


def large_ops(k: int, n: int) -> list[bench.Op]:
    del k, n
    ops = [bench.bf16_op(), _sdg_op()]
    for fmt in ("nvfp4_a16", "nvfp4", "mxfp4_a16", "mxfp4", "mxfp8", "mxfp8_a16"):
        ops += [_auto(fmt), _auto(fmt, det=True)]
    for fmt in ("nvfp4_a16", "mxfp8"):  # the Triton kernel at the same M (default config)
        ops.append(_variant(fmt, "pallas-path", path="pallas"))
    ops.append(_variant("nvfp4_a16", "pallas-swap256x128x64w8", path="pallas",
                        config=C(256, 128, 64, num_warps=8, num_stages=3, variant="swap")))
    ops.append(_variant("mxfp8", "fp8mma64x128x128w4", mxfp8_variant="fp8mma",
                        config=C(64, 128, 128, num_warps=4, num_stages=4)))
    return ops


# mxmma_ops (session 52): MXFP8 W8A8's fp8-MMA route at prefill M, on four of the shapes
MXMMA_SHAPES = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 28672),
                ("deepseek-v3", 7168, 24576), ("llama3-8b", 4096, 4096)]


def mxmma_ops(k: int, n: int) -> list[bench.Op]:
    """MXFP8 W8A8 with fp8 wgmma on Mosaic GPU (pallas_kernels.mx_fp8_mgpu: each 32-wide chunk
    scaled by its two scales in float32, two or four chunks' wgmmas in flight) beside the
    dispatcher's route (exact bf16 operands, one XLA dot), bf16 `jnp.dot` and
    scaled_dot_general. Prediction (docs/targets.md: the scaling's >= 2 FP32 instructions per
    element and chunk cap it near half the fp8 peak, ~990 TFLOP/s, with perfect overlap):
    450-650 TFLOP/s at M = 4096 -- 0.6-0.9x bf16, behind the bf16 route's ~0.98x. Measured
    (H100, session 53): 354-444 TFLOP/s, 0.47-0.66x; the bf16 route 0.88-1.14x."""
    del k, n
    return [bench.bf16_op(), _sdg_op(), _auto("mxfp8")] + [
        _variant("mxfp8", v, mxfp8_variant=v) for v in ("fp8mma_mgpu", "fp8mma_mgpu_f4")]


MID_SHAPES = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 28672), ("llama3-8b", 14336, 4096)]


def mid_m_ops(k: int, n: int) -> list[bench.Op]:
    """M = 256-1023 (session 19): default mode's kernel beside each path it could take there
    -- the Mosaic kernel, the Triton kernel and the dense path (exact bf16 dequantization +
    XLA's GEMM). Before session 19's rule (fp4_matmul.mgpu_path) the dispatcher ran the Mosaic
    kernel up to MGPU_MAX_M = 256, Triton from 257, dense from DENSE_MIN_M = 1024; M=257-1023
    had not been timed. Prediction: dense ahead of Triton there (session 12: Triton 0.51-0.56x
    bf16 at M=256, dense ~0.9x at 4096), and of the Mosaic kernel at 256 on most shapes."""
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16", "nvfp4"):
        ops += [_auto(fmt)] + [_variant(fmt, path, path=path)
                               for path in ("dense", "mgpu", "pallas")]
    return ops


def mid_ops(k: int, n: int) -> list[bench.Op]:
    """M = 64 and 256 (session 3). The grid measured 0.28-0.34x bf16 at M=256 for every format
    (64x128x64 swap tiles, ~1 program per SM) and 0.68-0.79x at M=64; M >= 1024 runs the dense
    path at 0.56-0.72x. Each weight tile is decoded once per block_m activation rows, so decode
    work at M=256 is 4x that of one 64-row tile. Candidates: larger block_m (fewer decodes per
    weight), 128-wide K-steps, and the dense path (dequantize once, then XLA's bf16 GEMM;
    ~4.5 bytes moved per weight vs 2 for bf16: predicted ~0.45-0.5x at M=256, worse at 64)."""
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt), _variant(fmt, "dense", path="dense")]
        for m in (64, 256):
            for tag, cfg, per_sm in (
                    ("swap64x128x128w4", C(64, 128, 128, num_warps=4, num_stages=3,
                                          variant="swap"), 2),
                    ("swap128x64x128w4", C(128, 64, 128, num_warps=4, num_stages=3,
                                          variant="swap"), 2),
                    ("swap128x128x64w8", C(128, 128, 64, num_warps=8, num_stages=3,
                                          variant="swap"), 1),
                    ("swap128x128x128w8", C(128, 128, 128, num_warps=8, num_stages=3,
                                           variant="swap"), 1),
                    ("swap256x128x64w8", C(256, 128, 64, num_warps=8, num_stages=3,
                                          variant="swap"), 1)):
                if cfg.block_m > max(64, m):
                    continue
                ops.append(_variant(fmt, tag, m=m, config=_decode_cfg(cfg, m, n, k, per_sm)))
    return ops


def det_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic-mode K schedules (prepared in session 3, not yet timed). Today's det config
    (block_k 256 for e2m1, K split to ~2 programs/SM by N alone) ran at 0.35-0.47x bf16 at
    M=256 and M >= 1024 against 0.45-0.96x for default mode: at large M its split writes
    split x M x N float32 partials, at M=256 its 256-wide K-steps cost pipeline stages. Each
    candidate is one K schedule (M-independent, as det mode needs) run at every M with
    det mode's block_m for that M; the det target is within 1.15x of default at every M."""
    ops = [bench.bf16_op()]
    for fmt, bits, group in (("nvfp4_a16", 4, 16), ("mxfp8_a16", 8, 32)):
        ops += [_auto(fmt), _auto(fmt, det=True)]
        for tag, bk, per_sm in (("bk128-2perSM", 128, 2), ("bk128-1perSM", 128, 1),
                                ("bk256-1perSM", 256, 1)):
            base = C(16, 64, bk, num_warps=4, num_stages=3, variant="swap")
            split = split_for(cdiv(n, 64), k, bk, target=per_sm * num_sms())
            for m in (1, 16, 256, 4096):
                cfg = with_det_block_m(dataclasses.replace(base, split_k=split), m,
                                       elem_bits=bits, group=group)
                ops.append(_variant(fmt, f"det-{tag}", m=m, config=cfg))
    return ops


def mgpu_ops(k: int, n: int, formats=("nvfp4_a16", "nvfp4")) -> list[bench.Op]:
    """The Mosaic GPU kernel (session 12: group_a16_mgpu, codes decoded in registers) beside
    the Triton kernel it replaces at decode and bf16. NVFP4 prediction: the fp8 Mosaic
    kernel's step cost with half the bytes -- 1.6-2.0x bf16 at M <= 16 (the session-7 int4
    stream probe: 1.55x, up to 2.2x with two K-blocks a step), against the Triton kernel's
    1.2-1.5x. MX (mgpu_mx): MXFP4 as NVFP4 (one more multiply a pair: ~1.7x), MXFP8 W8A16
    as fp8_block_a16 (~1.7x, against the Triton gemv's 1.17x)."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in formats:
        ops += [_auto(fmt), _variant(fmt, "triton", path="pallas"),
                _variant(fmt, "mgpu", path="mgpu")]
    return ops


def mgpu_blocks_ops(k: int, n: int) -> list[bench.Op]:
    """The Mosaic NVFP4 kernel with 4 K-blocks a step beside the dispatcher's (<= 2) at M <= 64.
    Why: session 12's first grid ran it at 0.3-0.65 of the copy bandwidth at M=1 -- the step
    cost, not the bytes (half of fp8's per step); prediction +10-25% on the large shapes."""
    del k, n
    return [bench.bf16_op(), _auto("nvfp4_a16"), _mgpu_blocks_op(4)]


def _mgpu_blocks_op(blocks: int) -> bench.Op:
    """nvfp4_a16 on the Mosaic kernel with `blocks` K-blocks a pipeline step and byte loads
    (session 12's variant), its launch otherwise the dispatcher's: a stream re-shared for the
    longer steps (>= 8 K-blocks a CTA), K ranges only where a range holds whole steps."""
    from pallas_kernels.group_a16_mgpu import with_blocks_per_step

    def adjust(p, n, k, m):
        return with_blocks_per_step({**p, "a_load": "wgmma"}, n, k, blocks)
    return _mgpu_group_op("nvfp4_a16", f"{blocks}blocks", adjust=adjust, max_m=64)


def mgpu_words_ops(k: int, n: int) -> list[bench.Op]:
    """The Mosaic kernel reading its e2m1 codes as 32-bit words (a_load="words":
    mgpu_group_decode.decode_words) beside the dispatcher's byte loads, same launch.
    Why: the 4-bit decode is bound by instructions per weight, not bytes (session 9: int4
    stream DRAM 53%, ALU 56%; session 12: BW 0.3-0.65 at M=1). Words cut a thread's shared
    loads from 32 to 8 a K-block, drop the byte extraction, and halve NVFP4's scale
    conversions (a thread meets 4 groups of a row, not 8): ~25% fewer instructions a weight.
    Prediction: +10-20% at M=1 and 16 on the large shapes, less at M=64; the x permutation
    it needs is one more small XLA pass (~1-2 us at M=1, visible on the small shapes)."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16"):  # (auto: words where WORDS_MIN_WEIGHTS says)
        ops += [_auto(fmt), _mgpu_group_op(fmt, "words", a_load="words"),
                _mgpu_group_op(fmt, "bytes", a_load="wgmma")]
    return ops


def det_blocks_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode's launch with 4 K-blocks a step where its K parts hold a multiple
    of 4 (session 13) beside the same partition at 2 a step (session 12's), and with byte
    loads instead of words. Why: det/default reached 1.2-1.4x at M <= 16 on the large shapes
    once default mode took words and 4 blocks a step (session 13 call 2); prediction: the
    shapes whose parts hold 8 K-blocks (K = 8192, 28672; 4096 with >= 64 tiles) drop to
    ~1.1x; K = 7168 (parts of 7: one block a step) stays."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16"):
        ops += [_auto(fmt), _auto(fmt, det=True),
                _mgpu_group_op(fmt, "det-2blocks", deterministic=True,
                               adjust=lambda p, n, k, m: {**p, "blocks_per_step": min(
                                   2, p.get("blocks_per_step", 1))}),
                _mgpu_group_op(fmt, "det-bytes", deterministic=True,
                               adjust=lambda p, n, k, m: {**p, "a_load": "wgmma"})]
    return ops


def _whole_part_steps(p: dict, n: int, k: int, m: int) -> dict:
    """Launch p with session 13's rule for streamed K parts: steps of 2 or 4 K-blocks only
    where every part holds whole steps (else one a step)."""
    per_part = k // 128 // p.get("k_splits", 1) // p.get("k_parts", 1)
    return p if per_part % p.get("blocks_per_step", 1) == 0 else {**p, "blocks_per_step": 1}


def _four_block_stream(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic streamed parts re-shared so that every CTA's run holds 4-block steps (the
    most CTAs, at most one per SM, whose runs of whole parts are multiples of 4 K-blocks)."""
    if p.get("k_parts", 1) == 1 or "programs" not in p:
        return p
    tiles, kb, sms = n // 128, k // 128, num_sms()
    total = tiles * p["k_parts"]
    programs = next((c for c in range(min(sms, total), 0, -1) if total % c == 0
                     and tiles * kb // c % 4 == 0), None)
    return p if programs is None or kb % 4 else {**p, "programs": programs, "blocks_per_step": 4}


def det_straddle_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode's streamed K parts with steps of 2 or 4 K-blocks that may straddle a
    part's end (session 14) beside session 13's launch (one block a step where parts of 7
    K-blocks, K = 7168, hold no whole steps), and (NVFP4) a stream re-shared for 4-block steps
    on fewer CTAs. Why: K = 7168 det/default ran 1.33-1.41x at M <= 16 (session 13), all other
    shapes 1.03-1.17x with 2-4 blocks a step. Prediction: K = 7168 to ~1.10-1.15x for the
    4-bit formats (7168x24576 takes 4 blocks; 7168x36864's CTA run of 126 K-blocks only 2),
    W8A16-like gains for MXFP8 (~5%)."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt), _auto(fmt, det=True),
                _mgpu_group_op(fmt, "det-s13", deterministic=True, adjust=_whole_part_steps)]
    ops.append(_mgpu_group_op("nvfp4_a16", "det-4blocks-reshared", deterministic=True,
                              adjust=_four_block_stream))
    return ops


def _det_streamed(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic launch p replaced by det_stream_params' streamed K parts where det_params'
    model kept in-CTA parts: its steps (2 K-blocks where they fit), or 4 where p took 4 (the
    dispatcher's rule for e2m1 codes) and the stream's steps hold them."""
    from pallas_kernels.fp8_block_a16_mgpu import (DET_GPU_MIN_X_TILE, det_stream_params,
                                                   step_unit)
    from pallas_kernels.fp8_heuristics import det_k_parts
    if "programs" in p:
        return p
    q = det_stream_params(p["block_m"], n, k, num_sms(), det_k_parts(k, 128),
                          min_x_tile=DET_GPU_MIN_X_TILE)
    if q is None:
        return p
    q = {**q, "a_load": p.get("a_load", "wgmma")}
    if p.get("blocks_per_step", 1) == 4 and step_unit(q, n, k) % 4 == 0:
        q["blocks_per_step"] = 4
    return q


def det_stream_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode's streamed K parts where det_params' bytes-over-slots model keeps
    in-CTA parts (4096x28672, 8192x57344 at M=16: det/default 1.11-1.17x, session 13).
    Why: the model (session 11) counts every part's slab, but since session 12 a tile's first
    CTA folds its parts and stores one prefix; prediction: the stream within ~1.05x of default
    mode there, as at M=1 where the model already picks it."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt), _auto(fmt, det=True),
                _mgpu_group_op(fmt, "det-streamed", deterministic=True, adjust=_det_streamed)]
    return ops


def _beside_det(tag: str, adjust, formats=("nvfp4_a16", "mxfp8_a16")) -> list[bench.Op]:
    """bf16, then for each weight-only format (NVFP4 and MXFP8 unless told): the dispatcher in
    both modes and a deterministic launch variant (adjust(params, n, k, m), named tag)."""
    ops = [bench.bf16_op()]
    for fmt in formats:
        ops += [_auto(fmt), _auto(fmt, det=True),
                _mgpu_group_op(fmt, tag, deterministic=True, adjust=adjust)]
    return ops


def _det_stored_ranges(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's partition as det_params' "ranges" launch whatever its bytes model
    says: default mode's K ranges (range_params, at most P), each storing its P / R parts to
    slabs of their own (parts_sum="store") on the x tile holding M's rows (128 from 128 rows)."""
    from pallas_kernels.fp8_block_a16_mgpu import range_params
    from pallas_kernels.fp8_heuristics import det_k_parts
    from pallas_kernels.group_a16_mgpu import PARTITION
    if m > 256:
        return p
    parts, ranges = det_k_parts(k, 128), range_params(m, n, k, num_sms())
    r = min(parts, ranges["k_splits"])
    q = {key: v for key, v in p.items() if key not in PARTITION}
    q.update(block_m=ranges["block_m"], k_splits=r, k_parts=parts // r, blocks_per_step=1)
    if r < parts:
        q["parts_sum"] = "store"
    return q


def det_ranges_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode at M = 64 / 256 as default mode's K ranges with stored parts beside
    det_params' choice (streamed parts with 64-row x tiles, or in-CTA parts narrowed to 64).
    Why: at M=256 NVFP4 det/default reached 1.67x on 14336x4096 (session 13), fp8 1.37x, at
    M=64 fp8 1.30x on 8192x8192 / 18432x7168 (session 12); the bytes model rejected ranges
    there by a few percent (16384 vs 15224 bytes a row on 14336x4096). Prediction: ranges with
    stored parts ~1.3x of default at M=256 on the small-N shapes (8 slabs: +50 MB of float32
    round trip against default's 2), no better at M=64 where the stream is already default
    mode's partition size."""
    del k, n
    return _beside_det("det-stored-ranges", _det_stored_ranges)


def _det_halves(p: dict, n: int, k: int, m: int) -> dict:
    """A deterministic order of two halves of K, each the left fold of its P / 2 parts, the
    halves' sums added after: 2 K ranges of P / 2 in-CTA parts (parts_sum="cond") on the x
    tile holding M's rows -- at 128-row tiles default mode's two-range launch."""
    from pallas_kernels.fp8_block_a16_mgpu import DET_GPU_MIN_X_TILE, _x_tile
    from pallas_kernels.fp8_heuristics import det_k_parts
    from pallas_kernels.group_a16_mgpu import PARTITION
    parts = det_k_parts(k, 128)
    q = {key: v for key, v in p.items() if key not in PARTITION}
    block_m = max(DET_GPU_MIN_X_TILE, _x_tile(m))
    per_part = k // 128 // parts
    q.update(block_m=block_m, k_splits=2, k_parts=parts // 2, parts_sum="cond",
             blocks_per_step=2 if block_m <= 16 and per_part % 2 == 0 else 1)
    return q


def det_halves_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode's launch against a det order of two halves of K (_det_halves).
    Why: at M = 64 / 256 det/default reaches 1.3-1.7x on the shapes with few weight tiles,
    where default mode runs two K ranges and deterministic mode, bound to one left fold of
    P parts, runs streamed slabs or narrowed in-CTA parts. Prediction (NOTES session 15):
    ~1.1x default at M=256 where default runs two ranges, 1.1-1.3x where it runs one."""
    del k, n
    return _beside_det("det-halves", _det_halves)


def _det_one_fold(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch for one left fold of the K parts (session 14's order:
    one_left_fold), for comparison with the two-group order."""
    from pallas_kernels.fp8_block_a16_mgpu import one_left_fold
    from pallas_kernels.group_a16_mgpu import PARTITION, group_launch_params
    with one_left_fold():
        fold = group_launch_params(m, n, k, jax.default_backend() == "cpu",
                                   deterministic=True, fmt=p["_fmt"])
    q = {key: v for key, v in p.items() if key not in PARTITION and key != "_fmt"}
    q.update({key: v for key, v in fold.items() if key in PARTITION or key == "a_load"})
    return q


def det_park_ops(k: int, n: int) -> list[bench.Op]:
    """The two-group deterministic order (N <= 16384) beside one left fold's launch, at M =
    256 / 4096 where the two-group order parks the first half's sum (session 15). Prediction:
    parked in-CTA parts within ~3% of one fold's (the float32 output's bytes)."""
    del k, n
    return _beside_det("det-one-fold", _det_one_fold)


def _det_halves_decode(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch with wgmma_halves where fp8's rule takes them (halves_pay:
    in-CTA parts folded in registers at 128-row x tiles, one K-block a step)."""
    from pallas_kernels.fp8_block_a16_mgpu import halves_pay
    return {**p, "wgmma_halves": True} if halves_pay(p) else p


def _det_predecoded(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch on codes decoded to bf16 first (predecode, session 17; the
    launch's halves, a register conversion, dropped)."""
    return {**{key: v for key, v in p.items() if key != "wgmma_halves"}, "predecode": True}


def det_predecode_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode on predecoded codes beside its decoding launch, at prefill sizes where
    default mode runs the dense path. Prediction (NOTES session 17): det/default at M=4096
    from 1.40-1.65x to ~1.1x (the same decode pass as dense, then bf16 MMAs from shared
    memory in det's K order instead of cuBLAS's)."""
    del k, n
    return _beside_det("det-predecode", _det_predecoded, ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _det_predecoded_x64(p: dict, n: int, k: int, m: int) -> dict:
    """_det_predecoded on 64-row x tiles (four pipeline stages beside the park)."""
    return {**_det_predecoded(p, n, k, m), "block_m": 64}


def det_predecode_x64_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode (the dispatcher's, MX predecoded) beside predecoded codes on 64-row
    x tiles at M = 4096 (session 17; prediction as sweep_fp8.py's predecode_x64)."""
    del k, n
    return _beside_det("det-predecode-x64", _det_predecoded_x64,
                       ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _det_predecoded_stored(p: dict, n: int, k: int, m: int) -> dict:
    """_det_predecoded with a CTA's two groups' sums stored to slabs (groups_sum="store")."""
    return {**_det_predecoded(p, n, k, m), "groups_sum": "store"}


def det_groups_store_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode beside predecoded codes with stored groups at M = 4096 (session 17;
    prediction as sweep_fp8.py's groups_store)."""
    del k, n
    return _beside_det("det-predecode-gs", _det_predecoded_stored,
                       ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _det_reloaded(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch with the first group's sum read back by its CTA and added
    there (groups_sum="reload", session 18) where a CTA holds both groups, on predecoded codes
    (the only ones it takes since call 1, which ran NVFP4's register decode so too: 1.10-1.14x
    slower)."""
    return {**p, "groups_sum": "reload"} if p.get("predecode") else p


def det_groups_reload_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode beside reloaded groups at M = 4096 (session 18; prediction as
    sweep_fp8.py's groups_reload)."""
    del k, n
    return _beside_det("det-reload", _det_reloaded, ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _xla_dequant_op(fmt: str, det: bool) -> bench.Op:
    """The format's auto kernel with its dequantization pass (dense path, predecode) forced to
    XLA's, as before session 21 -- the same values (group_dequant)."""
    from pallas_kernels.mx_dense import xla_dequantization
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):  # (traced within: the jitted op keeps XLA's pass; thread-local, as
        # jqlin.bench traces ops concurrently -- a module patch leaked into the others)
        with xla_dequantization():
            return apply(x, qw, qw.spec, deterministic=det, interpret=interpret)
    return bench.Op("var[xla-dequant]", fmt, "det" if det else "default", fn)


def dequant_ops(k: int, n: int) -> list[bench.Op]:
    """group_dequant's Pallas pass (session 21) beside XLA's dequantization, in the dense path
    (default mode, M >= 1024) and deterministic mode's predecode (MX, M >= 4096), and NVFP4's
    deterministic launch on predecoded codes (det-predecode) now that the pass is cheaper.
    Prediction (NOTES session 21): 8192x8192 passes 100.9 -> ~45 us (MXFP4), 80.8 -> ~53 us
    (MXFP8); so the dense path -5..-10% at M=4096, -15..-25% at M=1024."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16", "nvfp4"):
        ops += [_auto(fmt), _xla_dequant_op(fmt, False)]
    for fmt in ("mxfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt, det=True), _xla_dequant_op(fmt, True)]
    ops += [_auto("nvfp4_a16", det=True),
            _mgpu_group_op("nvfp4_a16", "det-predecode", deterministic=True,
                           adjust=_det_predecoded)]
    return ops


def _det_xla_finish_op(fmt: str) -> bench.Op:
    """NVFP4's deterministic launch with its finish left to XLA, as before session 22: the
    kernel writes float32 y^T (out_dtype float32), XLA multiplies, transposes and rounds."""
    op = _mgpu_group_op(fmt, "det-xla-finish", deterministic=True, out_dtype=jnp.float32)
    return dataclasses.replace(op, fn=lambda x, qw: op.fn(x, qw).astype(x.dtype))


def _det_predecoded_as_mx(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch as MX formats take it at prefill sizes (predecoded codes,
    the first group's sum reloaded up to RELOAD_MAX_K, else stored)."""
    from pallas_kernels.group_a16_mgpu import group_launch_params
    return {key: v for key, v in group_launch_params(m, n, k, False, deterministic=True,
                                                     fmt=p["_fmt"], predecode=True).items()
            if key != "a_in_registers"}


def row_finish_ops(k: int, n: int) -> list[bench.Op]:
    """NVFP4's finish (post factor, global scale) in the CTAs that round their own output
    (session 22) beside XLA's finish of float32 sums (det-xla-finish, before), and NVFP4's
    deterministic mode on predecoded codes with reloaded groups (det-predecode-reload: what MX
    takes; session 21 measured it parked, with XLA's finish: 0.86-1.10x at M=4096). Prediction:
    in-CTA finish -5..-10% where the launch writes y itself (no slabs, no parked group);
    det-predecode-reload -10% against session 21's predecoded figure."""
    del k, n
    return [bench.bf16_op(), _auto("nvfp4_a16"), _auto("nvfp4_a16", det=True),
            _det_xla_finish_op("nvfp4_a16"),
            _mgpu_group_op("nvfp4_a16", "det-predecode-reload", deterministic=True,
                           adjust=_det_predecoded_as_mx)]


def _det_predecoded_any_m(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch predecoded whatever M (launch_params' rule from
    PREDECODE_MIN_M rows applied below it: the halves dropped, a CTA holding both groups
    reloading the first's sum up to RELOAD_MAX_K, else storing it)."""
    from pallas_kernels.fp8_block_a16_mgpu import RELOAD_MAX_K, holds_both_groups
    q = {key: v for key, v in p.items() if key != "wgmma_halves"}
    q["predecode"] = True
    if holds_both_groups(q.get("k_groups", 1), q.get("k_splits", 1), q.get("k_parts", 1),
                         q.get("parts_sum", "cond"), "programs" in q):
        q["groups_sum"] = "reload" if k <= RELOAD_MAX_K else "store"
    return q


def det_predecode_mid_ops(k: int, n: int) -> list[bench.Op]:
    """Deterministic mode predecoded below PREDECODE_MIN_M (M = 1024 / 2048) beside its
    register decode, now that the pass is Pallas (sessions 21-22) and groups reload (session
    17 measured 1.14-1.48x slower at M=1024 with XLA's pass, parked groups). Prediction: at
    M=1024 the pass (~50 us on 8192x8192) against ~280 us of kernel: break-even or a loss;
    at 2048 a win where the register decode's per-x-tile cost dominates."""
    del k, n
    return _beside_det("det-predecode-any-m", _det_predecoded_any_m,
                       ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _det_other_decode(p: dict, n: int, k: int, m: int) -> dict:
    """Deterministic mode's launch with the other decode than the dispatcher's at this M: the
    register decode where the dispatcher predecodes (det_predecode_min_m), else predecoded (the
    same sums either way: test_gpu_predecoded_codes_give_the_same_bits)."""
    from pallas_kernels.group_a16_mgpu import det_predecode_min_m, group_launch_params
    fmt = p["_fmt"]
    if m < det_predecode_min_m(fmt, n, k):
        return _det_predecoded_any_m(p, n, k, m)
    q = group_launch_params(m, n, k, False, deterministic=True, fmt=fmt, predecode=False)
    return {key: v for key, v in q.items() if key != "a_in_registers"}


def det_other_decode_ops(k: int, n: int) -> list[bench.Op]:
    """The dispatcher's deterministic decode at M=2048 beside the other one, every format, all
    11 shapes in one process (session 23: the MX rule rested on 3-shape A/Bs, NVFP4's 3-shape
    A/Bs said predecode wins and an 11-shape grid in another run said it loses from N >= 7168).
    Prediction: MX predecoded / register 0.8-0.95 on every shape; NVFP4 predecoded / register
    ~0.85 at N <= 6144 and 1.05-1.15 from N >= 7168, if session 23's cross-run split holds."""
    del k, n
    return _beside_det("det-other-decode", _det_other_decode,
                       ("nvfp4_a16", "mxfp4_a16", "mxfp8_a16"))


def _dense_xla_dequant_op(fmt: str) -> bench.Op:
    """The format's dense path (exact bf16 dequantization, one XLA dot) with XLA's
    dequantization instead of group_dequant's pass, at any M: XLA may fuse it into its GEMM."""
    from pallas_kernels.mx_dense import xla_dequantization
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):  # (thread-local override, traced within: see _xla_dequant_op)
        with xla_dequantization():
            return apply(x, qw, qw.spec, interpret=interpret, path="dense")
    return bench.Op("var[dense-xla-dequant]", fmt, "default", fn)


def small_m_dense_ops(k: int, n: int) -> list[bench.Op]:
    """The weight-only formats at M = 1-16: the dispatcher (the Mosaic kernel) beside the dense
    path with XLA's dequantization and with the Pallas pass. Why: session 24 found XLA fusing
    e4m3 -> bf16 into its own GEMM at M = 2-8, 0.80-1.05x the Mosaic W8A16 kernel's time on 11
    shapes (fp8_paths.DENSE_A16_DECODE_M). Prediction: MXFP8 (a convert and a power-of-two
    multiply) fuses the same way and wins at M = 2-8; the e2m1 formats' unpacking may not fuse
    (then 3-6x slower); the Pallas pass loses at every small M (a 2-byte write a weight)."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("mxfp8_a16", "mxfp4_a16", "nvfp4_a16"):
        ops += [_auto(fmt), _dense_xla_dequant_op(fmt), _variant(fmt, "dense", path="dense"),
                _two_rows(_dense_xla_dequant_op(fmt))]
    return ops


def _two_rows(op: bench.Op) -> bench.Op:
    """op at M=1 on x with a zero row appended (bench.two_rows; sweep_fp8.py --parts
    a16_m1pad for e4m3)."""
    return dataclasses.replace(op, name=op.name[:-1] + "-2rows]", fn=bench.two_rows(op.fn),
                               max_m=1)


def det_group_halves_ops(k: int, n: int) -> list[bench.Op]:
    """The group decode's wgmma_halves (session 16, prepared; run the GPU test
    test_gpu_group_wgmma_halves_give_the_same_bits first) beside deterministic mode's launch.
    Prediction (NOTES session 16): if the group kernels' in-CTA parts spill at 128-row tiles
    as fp8's did (benchmarks/sass_parts.py --only nvfp4_p1,nvfp4_det,mxfp8_det), det/default
    at M=4096 from 1.33-1.77x to ~1.2-1.4x; at M=256 -5..-10%."""
    del k, n
    return _beside_det("det-halves-decode", _det_halves_decode)


def _with_k_parts(parts: int):
    """Default mode's launch with each K range summed as `parts` in-CTA parts (cond), where
    its ranges hold a multiple of them and no stream runs (the sums differ from one part's
    only in float32 rounding order)."""
    def adjust(p, n, k, m):
        ranges = k // 128 // p.get("k_splits", 1)
        if "programs" in p or ranges % parts:
            return p
        return {**p, "k_parts": parts, "parts_sum": "cond"}
    return adjust


def kparts_ops(k: int, n: int) -> list[bench.Op]:
    """Default mode at M = 128 / 256 (128-row x tiles) with its K ranges summed as 2 or 8
    in-CTA parts beside one. Why: deterministic mode (8 in-CTA parts, otherwise default mode's
    tile) ran 5-16% faster than default mode at M=256 on 8192x8192 / 18432x7168 / 4096x6144
    for NVFP4 (sessions 13 and 14, h200_fp4_det_ranges_s14.json). Prediction: k_parts=8 5-15%
    faster than 1 at 128-row tiles for the 4-bit codes if the part's cond is what helps (it
    resets the running sum's dependence every part); no change for MXFP8 (its det/default
    there was 1.12-1.13x)."""
    del k, n
    ops = [bench.bf16_op()]
    for fmt in ("nvfp4_a16", "mxfp8_a16"):
        ops += [_auto(fmt)] + [_mgpu_group_op(fmt, f"kparts{q}", adjust=_with_k_parts(q))
                               for q in (2, 8)]
    return ops


def _mgpu_group_op(fmt: str, tag: str, deterministic: bool = False, adjust=None,
                   max_m: int | None = 256, **overrides) -> bench.Op:
    """fmt's weight-only matmul on the Mosaic kernel with the dispatcher's launch
    (group_launch_params, in deterministic mode if asked; adjust(params, n, k, m) -> params) plus
    `overrides`, timed up to max_m (deterministic: every M)."""
    from jqlin.kernels.pallas_fp4 import nvfp4_post_scale
    from pallas_kernels.fp4_matmul import GROUP_FORMAT
    from pallas_kernels.group_a16_mgpu import group_a16_matmul_mgpu, group_launch_params
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        (m, _), (n, k) = x.shape, qw.storage_shape
        wk = qw.spec.weight
        g = GROUP_FORMAT["e2m1" if wk.is_fp4 else "e4m3",
                         "e4m3" if wk.scale_dtype == "float8_e4m3fn" else "e8m0"]
        p = {key: v for key, v in group_launch_params(m, n, k, interpret, fmt=g,
                                                       deterministic=deterministic).items()
             if key != "a_in_registers"}
        if adjust is not None:
            p = adjust({**p, "_fmt": g}, n, k, m)
            p.pop("_fmt", None)
        kw = {}
        if g == "nvfp4":
            col, post = nvfp4_post_scale(qw, qw.spec)
            kw = dict(col_scale=col, post=post)
        return qw.trim_rows(group_a16_matmul_mgpu(g, x, qw.data, qw.scale, interpret=interpret,
                                                  **kw, **{**p, **overrides}))
    return bench.Op(f"var[mgpu-{tag}]", fmt, "det" if deterministic else "default", fn,
                    max_m=None if deterministic else max_m)


FORMATS = ("nvfp4_a16", "nvfp4", "mxfp4_a16", "mxfp4", "mxfp8", "mxfp8_a16")


def grid_ops(formats=FORMATS) -> list[bench.Op]:
    """bf16, scaled_dot_general mxfp8 (M >= 1024), each format's auto kernel in both modes and
    its XLA reference path (M <= 16)."""
    ops = bench.build_ops(formats, None, xla_ref_max_m=16)
    ops.insert(1, _sdg_op(min_m=1024))
    return ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--parts", default="large,decode")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--shapes", default="all", help="grid part: model names, 'all' or KxN list")
    p.add_argument("--m", default=",".join(map(str, bench.M_VALUES)), help="grid part: M values")
    p.add_argument("--formats", default=",".join(FORMATS), help="grid part: formats")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test of the script")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, meta = [], {}
    stream = open(out / "bench_fp4_mx.jsonl", "w")

    def on_record(rec):
        records.append(rec)
        stream.write(json.dumps(bench.json_safe(rec)) + "\n")
        stream.flush()

    plan = []
    for part in args.parts.split(","):
        if part == "decode":
            plan.append((DECODE_SHAPES, (1, 16), decode_ops))
        elif part == "large":
            plan.append((LARGE_SHAPES, (4096,), large_ops))
        elif part == "mgpu":
            plan.append((DECODE_SHAPES, (1, 16, 64, 256), mgpu_ops))
        elif part == "mgpu_mx":
            plan.append((DECODE_SHAPES, (1, 16, 64, 256), lambda k, n: mgpu_ops(
                k, n, ("mxfp4_a16", "mxfp4", "mxfp8_a16"))))
        elif part == "mgpu4":
            plan.append((DECODE_SHAPES, (1, 16, 64), mgpu_blocks_ops))
        elif part == "mgpuw":
            plan.append((DECODE_SHAPES, (1, 16, 64), mgpu_words_ops))
        elif part == "det4":
            plan.append((DECODE_SHAPES, (1, 16), det_blocks_ops))
        elif part == "dets":  # parts ending inside steps (K = 7168), control 8192x8192
            plan.append((DETS_SHAPES, (1, 16), det_straddle_ops))
        elif part == "detstream":  # streamed parts where the model keeps in-CTA parts
            plan.append((DETSTREAM_SHAPES, (1, 16), det_stream_ops))
        elif part == "detranges":  # M=64/256: ranges with stored parts vs det_params' choice
            plan.append((DETRANGES_SHAPES, (64, 256), det_ranges_ops))
        elif part == "dethalves":  # a det order of two halves of K (session 15)
            plan.append((DETHALVES_SHAPES, (64, 256), det_halves_ops))
        elif part == "detpark":  # the two-group order's parked launch vs one fold's
            plan.append((PARK_SHAPES, (256, 4096), det_park_ops))
        elif part == "dethalvesdec":  # the group decode's wgmma_halves (session 16)
            plan.append((PARK_SHAPES, (256, 4096), det_group_halves_ops))
        elif part == "detpredecode":  # deterministic mode on predecoded codes (session 17)
            plan.append((PARK_SHAPES, (1024, 4096), det_predecode_ops))
        elif part == "detpredecodex64":  # the same on 64-row x tiles (session 17)
            plan.append((PARK_SHAPES, (4096,), det_predecode_x64_ops))
        elif part == "detgroupsstore":  # predecoded codes, stored groups (session 17)
            plan.append((PARK_SHAPES, (4096,), det_groups_store_ops))
        elif part == "detgroupsreload":  # the first group's sum read back (session 18)
            plan.append((PARK_SHAPES, (4096,), det_groups_reload_ops))
        elif part == "dequant":  # group_dequant's pass vs XLA's (session 21)
            plan.append((DEQUANT_SHAPES, (1024, 4096), dequant_ops))
        elif part == "rowfinish":  # NVFP4's finish in the CTAs (session 22)
            plan.append((DEQUANT_SHAPES, (1024, 4096), row_finish_ops))
        elif part == "detpredecodemid":  # predecoded below PREDECODE_MIN_M (session 22)
            plan.append((DEQUANT_SHAPES, (1024, 2048), det_predecode_mid_ops))
        elif part == "smallmdense":  # weight-only at M = 1-16: kernel vs dense paths (s24)
            plan.append((DECODE_SHAPES, (1, 2, 4, 8, 16), small_m_dense_ops))
        elif part == "detother2048":  # the other deterministic decode, 11 shapes (s24)
            plan.append((DECODE_SHAPES, (2048,), det_other_decode_ops))
        elif part == "kparts":  # default mode's ranges as in-CTA parts at 128-row tiles
            plan.append((DETRANGES_SHAPES, (128, 256), kparts_ops))
        elif part == "detw":  # words vs bytes in deterministic mode at prefill sizes
            plan.append((MID_SHAPES, (256, 4096), det_blocks_ops))
        elif part == "midm":  # M = 256-1023: which path (session 19)
            plan.append((MIDM_SHAPES, (256, 512, 768), mid_m_ops))
        elif part == "mid":
            plan.append((MID_SHAPES, (64, 256), mid_ops))
        elif part == "mxmma":  # MXFP8 W8A8 on Mosaic GPU fp8 MMAs (session 52)
            plan.append((MXMMA_SHAPES, (1024, 4096), mxmma_ops))
        elif part == "det":
            plan.append((MID_SHAPES, (1, 16, 256, 4096), det_ops))
        elif part == "grid":
            plan.append((bench.parse_shapes(args.shapes),
                         tuple(int(v) for v in args.m.split(",")),
                         lambda k, n: grid_ops(tuple(args.formats.split(",")))))
    for shapes, ms, make_ops in plan:
        if args.tiny:
            # (one M a part, at most 32, each case run once: a smoke of the script -- the
            # kernels' tests check the products; session 53: three Ms in the det part and a
            # warm-up plus 8 interpreter calls a case were most of the smoke test's time)
            shapes, ms = [("tiny", 256, 128)], (min(*ms, 32),)
        for model, k, n in shapes:
            ops = make_ops(k, n)
            if args.tiny:
                ops = [o for o in ops if "scaled_dot_general" not in o.name]
            res = bench.run([(model, k, n)], ms, ops, reps=args.reps, on_record=on_record,
                            smoke=args.tiny)
            meta.update({kk: v for kk, v in res.items() if kk != "records"})
            print(bench.format_table(res["records"]), flush=True)
    stream.close()
    (out / "bench_fp4_mx.json").write_text(
        json.dumps(bench.json_safe({**meta, "records": records}), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
