"""Tile-config sweep of the Pallas FP8 kernels on the device (explicit configs, one process).

Decides the heuristics of pallas_kernels/fp8_heuristics.py: for memory-bound decode (M = 1, 16)
which variant (mma / swap-AB / gemv), tile and split fills the bandwidth; for M = 4096 which
tiles and fp8 promotion interval (promote_k) give the most TFLOP/s; and which single
M-independent config serves deterministic mode at both ends. bf16 and XLA fp8 are timed in the
same run for ratios.
Usage (device): PYTHONPATH=. python benchmarks/sweep_fp8.py --out $OUT/sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

from jqlin import bench, formats
from jqlin.kernels.pallas_fp8 import w8a16_apply
from pallas_kernels import MatmulConfig
from pallas_kernels.fp8_heuristics import num_sms, split_for
from pallas_kernels.common import cdiv

C = MatmulConfig


@dataclasses.dataclass(frozen=True)
class Auto:
    """A config whose split_k is filled per shape: the power of two reaching `target` programs."""
    # (kept as a plain record: MatmulConfig itself validates split_k >= 1)

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    variant: str = "mma"
    k_unroll: int = 1
    fp8_mma: bool = True
    fast_convert: bool = False
    per_sm: int | None = None  # programs per SM to fill to (None: the sweep's target)

    def resolve(self, m: int, n: int, k: int, target: int) -> C:
        tiles = (1 if self.variant == "gemv" else cdiv(m, self.block_m)) * cdiv(n, self.block_n)
        bk = self.block_k * self.k_unroll
        if self.per_sm is not None:
            target = self.per_sm * num_sms()
        return C(self.block_m, self.block_n, self.block_k, self.num_warps, self.num_stages,
                 split_for(tiles, k, bk, target=target), variant=self.variant,
                 k_unroll=self.k_unroll, fp8_mma=self.fp8_mma, fast_convert=self.fast_convert)


def _fill(cfg, m: int, n: int, k: int, target: int) -> C:
    return cfg.resolve(m, n, k, target) if isinstance(cfg, Auto) else cfg


A = Auto
# v2 (run 2). Run 1 found every mma/swap/gemv decode config at 38-54 us (M=1, 8192^2): here
# more warps, hoisted multi-step loads (k_unroll) and shallower pipelines, to find the limiter.
DECODE = [  # W8A16 per-channel at M = 1 and 16 (gemv: M = 1 only)
    A(16, 64, 256, 4, 4), A(16, 64, 256, 8, 4), A(16, 64, 256, 4, 3, k_unroll=2),
    A(16, 64, 128, 4, 3, k_unroll=4), A(16, 32, 256, 4, 3, k_unroll=2),
    A(16, 128, 128, 8, 3, k_unroll=2), A(16, 64, 256, 4, 1, k_unroll=4),
    A(16, 64, 512, 8, 2), A(1, 32, 256, 4, 1, "gemv", k_unroll=2),
    A(1, 64, 128, 8, 1, "gemv", k_unroll=4),
    C(64, 64, 128, 4, 4, 1), C(64, 128, 64, 4, 4, 2),  # deterministic candidates (N=8192)
]
DECODE_W8A8 = [A(16, 64, 256, 4, 4), A(16, 64, 256, 4, 4, fp8_mma=False),
               A(16, 64, 256, 4, 3, k_unroll=2, fp8_mma=False),
               C(64, 128, 128, 4, 4, 1, promote_k=128), C(64, 128, 128, 4, 4, 2, promote_k=128)]
LARGE_W8A16 = [C(128, 128, 64, 4, 4), C(128, 128, 64, 4, 4, variant="swap"),
               C(128, 128, 64, 8, 4, variant="swap"), C(256, 128, 64, 8, 3, variant="swap"),
               C(128, 256, 64, 8, 3, variant="swap"), C(64, 128, 64, 4, 4, variant="swap"),
               C(64, 64, 128, 4, 4, 1), C(64, 128, 64, 4, 4, 2)]
LARGE_W8A8 = [C(64, 128, 128, 4, 4, promote_k=128), C(64, 128, 128, 4, 3, promote_k=128),
              C(64, 128, 128, 4, 5, promote_k=128), C(64, 256, 128, 8, 3, promote_k=128),
              C(128, 128, 128, 8, 3, promote_k=128), C(64, 128, 128, 4, 4, promote_k=256),
              C(64, 128, 128, 4, 4, group_m=16, promote_k=128),
              C(64, 128, 128, 4, 4, 2, promote_k=128)]
LARGE_BLOCK = [C(64, 128, 128, 4, 4, promote_k=128), C(64, 128, 128, 4, 3, promote_k=128),
               C(64, 128, 128, 4, 5, promote_k=128), C(128, 128, 128, 8, 3, promote_k=128),
               C(64, 128, 128, 4, 4, group_m=16, promote_k=128),
               C(64, 64, 128, 4, 4, promote_k=128), C(64, 128, 128, 4, 4, 2, promote_k=128)]
# v3 (session 2). The grid of session 2 put the W8A16 MMA tiles at 0.84 of copy bandwidth at
# M <= 16 (fast_convert no better) while XLA's own fused multiply-reduce of the dequantized
# weight reached 1.02 at M=1: the gemv body now keeps 2-D accumulators (one K reduction at the
# end). And M=64 / 256 ran at 0.56x / 0.26x bf16: swap-AB and wider tiles there.
GEMV_V3 = [A(1, bn, bk, w, st, "gemv", per_sm=ps, fast_convert=fc)
           for bn, bk, w, st, ps, fc in [
               (16, 256, 4, 3, 4, False), (16, 256, 4, 3, 4, True), (8, 512, 4, 3, 4, False),
               (32, 256, 4, 3, 4, False), (16, 512, 8, 3, 4, False), (16, 256, 4, 4, 8, False),
               (32, 128, 4, 4, 8, False), (64, 128, 4, 3, 2, False), (16, 256, 4, 2, 2, False),
               (8, 256, 2, 3, 8, False)]]
MID_V3 = [A(64, 64, 256, 4, 4), A(64, 64, 256, 4, 4, fast_convert=True),
          A(64, 128, 128, 4, 3), A(64, 64, 128, 4, 4, k_unroll=2),
          A(64, 128, 128, 4, 3, "swap"), A(64, 128, 128, 8, 3, "swap"),
          A(64, 128, 128, 4, 3, "swap", fast_convert=True), A(64, 64, 256, 4, 3, "swap"),
          A(128, 128, 64, 8, 4, "swap"), A(128, 128, 128, 8, 3, "swap"),
          A(64, 256, 64, 8, 3, "swap"), A(32, 64, 256, 4, 4)]
SMALL_V3 = [A(16, 64, 128, 4, 3, k_unroll=4), A(16, 64, 128, 4, 3, k_unroll=4, fast_convert=True),
            A(16, 128, 128, 4, 3, k_unroll=2), A(16, 64, 256, 4, 3, k_unroll=2, per_sm=4),
            A(16, 128, 128, 4, 3, "swap", k_unroll=2), A(16, 64, 128, 4, 3, "swap", k_unroll=4),
            A(16, 64, 128, 4, 4, k_unroll=2, per_sm=4)]
# Block-scaled W8A16 at M=4096 ran at 0.23x bf16 with the per-channel tile (256x128x64: a scale
# multiply per 64-wide K-step on a 256x128 accumulator): 128-wide K-steps and smaller tiles.
LARGE_BLOCK_A16 = [C(256, 128, 64, 8, 3, variant="swap", fast_convert=True),
                   C(256, 128, 128, 8, 2, variant="swap", fast_convert=True),
                   C(128, 128, 128, 8, 3, variant="swap", fast_convert=True),
                   C(128, 128, 128, 4, 3, variant="swap", fast_convert=True),
                   C(64, 128, 128, 4, 3, variant="swap", fast_convert=True),
                   C(128, 128, 128, 8, 3, fast_convert=True), C(128, 64, 128, 4, 3)]
# v4 (prepared in session 2, not run). SASS of the gemv body (Triton 3.6, sm_90, 4 warps, no
# cp.async: its loads are not software-pipelined) shows bytes in flight set by registers:
# 1x16x256 k_unroll=1 uses 56 regs at M=1 (9 programs/SM x 4 KB = 36 KB: measured ~1.0 BW),
# 103 at M=2 (4 x 4 KB = 16 KB: measured ~0.5), 173 at M=4 (2 x 4 KB: ~0.25). k_unroll hoists
# the next tiles' loads: M=2 u2 105 regs (4 x 8 KB = 32 KB), M=2 8x256 u4 80 regs (6 x 8 KB),
# M=1 u2 72 regs (7 x 8 KB), M=1 u4 92 (5 x 16 KB), M=4 8x256 u4 128 regs (4 x 8 KB).
# Prediction: M=2 ~0.9-1.0 BW (~1.4x bf16), M=4 ~0.8 (FFMA-bound near 4/weight), M=1 small-N
# shapes +10-20% from the extra bytes in flight.
GEMV_V4 = [A(1, 16, 256, 4, 1, "gemv", k_unroll=u, per_sm=ps) for u, ps in
           [(1, 8), (2, 8), (4, 8), (2, 16)]] + \
          [A(1, 8, 256, 4, 1, "gemv", k_unroll=4, per_sm=8),
           A(1, 8, 256, 4, 1, "gemv", k_unroll=2, per_sm=16)]
# v5 (prepared in session 4, not run). ncu (h200_s4_ncu_decode.txt): the M=2 gemv 1x16x256 u2
# runs at 128 registers -> 25% theoretical occupancy, DRAM 39%; the M=1 gemv 1x8x256 u4 at 64
# registers -> 50%, achieved 39%, issue-bound (8.7 cycles per issued instruction). The gemv
# keeps a (block_n, block_k) float32 accumulator per row: 16x256 over 128 threads is 32
# registers a row. Smaller tiles or more warps per program cut it; more programs per SM keep
# the bytes in flight. Prediction: M=2 at <= 64 registers and ~16 programs/SM >= 0.85 of copy
# bandwidth (1.3-1.5x bf16; today 0.94-1.19x); M=1 with 8 warps / 16 programs per SM +5-10%.
GEMV_V5 = [A(1, 8, 256, 4, 1, "gemv", k_unroll=1, per_sm=16),
           A(1, 8, 256, 4, 1, "gemv", k_unroll=2, per_sm=16),
           A(1, 8, 128, 2, 1, "gemv", k_unroll=2, per_sm=32),
           A(1, 16, 256, 8, 1, "gemv", k_unroll=1, per_sm=8),
           A(1, 16, 256, 8, 1, "gemv", k_unroll=2, per_sm=8),
           A(1, 8, 256, 8, 1, "gemv", k_unroll=4, per_sm=16)]
DECODE_BLOCK = [A(16, 64, 256, 4, 4), A(16, 64, 256, 4, 4, fp8_mma=False)]


def _tag(cfg: C) -> str:
    t = f"{cfg.variant}:{cfg.block_m}x{cfg.block_n}x{cfg.block_k}/w{cfg.num_warps}s{cfg.num_stages}"
    t += f"/sk{cfg.split_k}" if cfg.split_k != 1 else ""
    t += f"/u{cfg.k_unroll}" if cfg.k_unroll != 1 else ""
    t += "" if cfg.fp8_mma else "/bf16mma"
    t += f"/g{cfg.group_m}" if cfg.group_m != 8 else ""
    t += "/fc" if cfg.fast_convert else ""
    return t + (f"/p{cfg.promote_k}" if cfg.promote_k else "")


def _op(fmt: str, cfg: C, m: int) -> bench.Op:
    return bench.fp8_op(fmt, f"cfg[{_tag(cfg)}]", config=cfg, min_m=m, max_m=m)


def _mgpu_block_op(blocks: int, group_m: int = 1, programs: int | None = None) -> bench.Op:
    """fp8_block through the Mosaic GPU kernel (pallas_kernels.fp8_block_mgpu) with `blocks`
    K-blocks per pipeline step, `group_m` tile rows per launch group and, with `programs`, a
    persistent grid; activations quantized as the dispatcher's glue does."""
    from jqlin.kernels.pallas_fp8 import quantize_x
    from pallas_kernels.fp8_block_mgpu import fp8_block_matmul_mgpu
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        xq, xs, _ = quantize_x(x, qw, qw.spec)
        y = fp8_block_matmul_mgpu(xq, xs, qw.data, qw.scale, out_dtype=x.dtype,
                                  blocks_per_step=blocks, group_m=group_m, programs=programs,
                                  interpret=interpret)
        return qw.trim_rows(y)
    tag = f"_p{programs}" if programs else ""
    return bench.Op(f"mgpu_block{blocks}_g{group_m}{tag}", "fp8_block", "default", fn)


def _with_halves(params: dict) -> dict:
    """wgmma_halves where the launch runs one K-block a step (session 16)."""
    return {**params, "wgmma_halves": True} if params.get("blocks_per_step", 1) == 1 else params


def _predecoded(params: dict) -> dict:
    """The weights decoded to bf16 first, wgmma reading them from shared memory (session 17);
    the launch's halves (a register conversion) dropped."""
    return {**{key: v for key, v in params.items() if key != "wgmma_halves"}, "predecode": True}


def _x_tile_64(params: dict) -> dict:
    """The same launch on 64-row x tiles (session 17: predecoded parked launches, 4 stages)."""
    return {**params, "block_m": 64}


def _groups_stored(params: dict) -> dict:
    """The same launch with a CTA's two groups' sums stored to slabs of their own
    (groups_sum="store", session 17) where it holds both."""
    return {**params, "groups_sum": "store"}


def _groups_reloaded(params: dict) -> dict:
    """The same launch with the first group's sum read back by its CTA and added there
    (groups_sum="reload", session 18) where it holds both -- on predecoded weights (the only
    ones it takes: check_predecode)."""
    return {**params, "groups_sum": "reload"} if params.get("predecode") else params


# suffixes of _mgpu_a16_op's string launches: the same launch with these weight reads or tiles
READ_OPTIONS = {"_h": _with_halves, "_pd": _predecoded, "_x64": _x_tile_64,
                "_gs": _groups_stored, "_gr": _groups_reloaded}


def _mgpu_a16_op(fmt: str, a_in_registers: bool, small: str | dict | None = None) -> bench.Op:
    """fmt (fp8_block_a16 / fp8_per_channel_a16) through the Mosaic GPU W8A16 kernel
    (pallas_kernels.fp8_block_a16_mgpu), weights converted into registers or shared memory.
    small: None (128-row x tiles, one K range), "auto" (the dispatcher's launch_params for the
    M), "ranges" (K ranges: range_params), "stream" (stream-K: stream_params), "det"
    (deterministic mode's launch_params), "det_s13" (the same with session 13's one
    K-block a step where K parts hold no whole steps), "det_cta" (det_params without its
    stream of whole K parts: in-CTA parts or ranges), "det_fold" (the same with streamed parts folded
    by each tile's first CTA, parts_sum="cond"), "det_wide" (the same without narrowed x tiles for
    in-CTA parts), "det_x16" (the same with 16-row x tiles at least, as in the interpreter,
    not narrowed), "det_ranges" (det_params without its stream of whole K parts, 16
    rows: session 10's deterministic launch) or a dict of block_m / k_splits / stages
    overrides on top of "auto"."""
    from jqlin.kernels.pallas_fp8 import _W_KIND
    from jqlin.kernels.xla import pad_k
    from pallas_kernels.fp8_block_a16_mgpu import (DET_GPU_MIN_X_TILE, DET_MIN_X_TILE,
                                                   det_params, fp8_block_a16_matmul_mgpu,
                                                   launch_params, range_params, stream_params,
                                                   with_two_block_steps)
    interpret = jax.default_backend() == "cpu"
    kind = _W_KIND[formats.get(fmt).weight.granularity]

    # "<small><suffix>": the same launch with a weight-reading option (READ_OPTIONS)
    option = next((o for o in READ_OPTIONS if isinstance(small, str) and small.endswith(o)),
                  None)
    base = small[:-len(option)] if option else small

    def fn(x, qw):
        (n, k), m = qw.storage_shape, x.shape[0]
        params = dict(a_in_registers=a_in_registers)
        small = base
        if small == "ranges":  # session 9's decode launch: K ranges
            params.update(with_two_block_steps(range_params(m, n, k, num_sms()), n, k))
        elif small == "stream":
            params.update(stream_params(m, n, k, num_sms()))
        elif small in ("det", "det_fold", "det_s13"):
            params = {**launch_params(m, n, k, interpret, deterministic=True), **params}
            if small == "det_fold" and "programs" in params:
                params["parts_sum"] = "cond"
            per_part = k // 128 // params.get("k_splits", 1) // params.get("k_parts", 1)
            if small == "det_s13" and per_part % params.get("blocks_per_step", 1):
                params["blocks_per_step"] = 1  # (session 13: no step across a part's end)
        elif small == "det_halves":  # K parts folded within halves of K, the halves' sums
            # added after: 2 K ranges of P / 2 in-CTA parts each (session 15's probe of a
            # det order whose big-M launch is default mode's two ranges)
            from pallas_kernels.fp8_block_a16_mgpu import _x_tile
            from pallas_kernels.fp8_heuristics import det_k_parts
            p = det_k_parts(k, 128)
            params.update(with_two_block_steps(dict(
                block_m=max(DET_GPU_MIN_X_TILE if not interpret else DET_MIN_X_TILE,
                            _x_tile(m)), k_splits=2, k_parts=p // 2, compute_wgs=2), n, k))
        elif small in ("det_g1", "det_g1_f32"):  # det mode's launch for one left fold of the parts
            # (session 14's order, for comparison)
            from pallas_kernels.fp8_block_a16_mgpu import one_left_fold
            with one_left_fold():
                params = {**launch_params(m, n, k, interpret, deterministic=True), **params}
        elif small == "det_cta":  # deterministic mode without the stream of K parts
            params.update(with_two_block_steps(det_params(
                m, n, k, num_sms(), streamed=False, min_x_tile=DET_GPU_MIN_X_TILE,
                narrow=True), n, k))
        elif small in ("det_ranges", "det_x16", "det_wide"):
            params.update(with_two_block_steps(det_params(
                m, n, k, num_sms(), streamed=small != "det_ranges",
                min_x_tile=DET_GPU_MIN_X_TILE if small == "det_wide" else DET_MIN_X_TILE), n, k))
        elif small is not None:
            params = {**launch_params(m, n, k, interpret), **params,
                      **(small if isinstance(small, dict) else {})}
        if small == "det_g1_f32":  # the same with a float32 kernel output, as the two-group
            # order's parked launch writes, rounded by XLA after -- which of its costs is which
            from pallas_kernels.fp8_block_a16_mgpu import _launch, _scale_operand
            ws, scales = _scale_operand(qw.scale, kind, n, k)
            y = _launch(pad_k(x, k), qw.data, ws, out_dtype=jnp.dtype(jnp.float32),
                        stages=None, group_m=8, interpret=interpret, scales=scales,
                        **{"k_splits": 1, "k_parts": 1, **params})
            return qw.trim_rows(y.astype(x.dtype))
        if option:
            params = READ_OPTIONS[option](params)
        y = fp8_block_a16_matmul_mgpu(pad_k(x, k), qw.data, qw.scale, scale_kind=kind,
                                      interpret=interpret, **params)
        return qw.trim_rows(y)
    tag = "" if small is None else "_" + (small if isinstance(small, str) else "_".join(
        f"{key}{v}" for key, v in small.items()))
    mode = ("det" if base in ("det", "det_fold", "det_s13", "det_cta", "det_wide", "det_x16",
                            "det_ranges", "det_halves", "det_g1", "det_g1_f32")
            else "default")
    return bench.Op(f"mgpu_a16_{'regs' if a_in_registers else 'smem'}{tag}", fmt, mode, fn)


def _path_op(fmt: str, path: str) -> bench.Op:
    """fmt through the dispatcher's kernel for it with fp8_path's choice replaced by `path`
    ('pallas': the Triton kernels, 'dense': one XLA GEMM of the stored codes, 'mgpu': the
    Mosaic GPU kernels) -- where a rule's threshold M sits (session 19's mid-M probe)."""
    return bench.fp8_op(fmt, f"path_{path}", path=path,
                        xla_gemm_min_m=0 if path == "dense" else None)


def _reduce_op(fmt: str, dtype) -> bench.Op:
    """W8A16 with whole-K scales as one XLA dot of the codes converted to `dtype` (no widening
    pass: XLA fuses the convert into its M=1 multiply-reduce), the scale on the float32 sum --
    the dense path's formula as the XLA reference runs it at M=1."""
    def fn(x, qw):
        y = jax.lax.dot_general(x.astype(dtype), qw.data.astype(dtype), (((1,), (1,)), ((), ())),
                                precision=jax.lax.Precision.HIGHEST,
                                preferred_element_type=jnp.float32)
        s = qw.scale.reshape(1, -1) if qw.scale.size > 1 else qw.scale.reshape(())
        return (y * s).astype(x.dtype)
    return bench.Op(f"reduce_{jnp.dtype(dtype).name}", fmt, "default", fn)


def _padded_dense_op(fmt: str, how: str) -> bench.Op:
    """W8A16 whole-K scales at M=1 as the dense path on x made two rows (bench.two_rows: 'zeros'
    or 'broadcast'). Why: at M=1 XLA's product is a reduction, from M=2 its GEMM with the convert
    fused (session 24), which ran faster at M=2 than the Mosaic kernel at M=1 on all 11 shapes
    (h200_fp8_sweep_a16_small_m_s24.json) -- if the extra row is free."""
    interpret = jax.default_backend() == "cpu"
    fn = lambda x, qw: w8a16_apply(x, qw, qw.spec, path="dense", interpret=interpret)  # noqa: E731
    return bench.Op(f"pad2_{how}", fmt, "default", bench.two_rows(fn, how), max_m=1,
                    xla_gemm_min_m=0)


# the paths each fp8 format can take at mid M (fp8_paths.fp8_path)
MID_M_PATHS = {"fp8_per_tensor_a16": ("mgpu", "dense"), "fp8_per_channel_a16": ("mgpu", "dense"),
               "fp8_block_a16": ("mgpu",), "fp8_per_tensor": ("pallas", "dense"),
               "fp8_ptpc": ("pallas", "dense"), "fp8_block": ("pallas", "mgpu")}


def _triton_block_op() -> bench.Op:
    """fp8_block through the Triton kernel at every M (the dispatcher leaves it at M >= 256)."""
    return bench.fp8_op("fp8_block", "triton_block", path="pallas")


def _ops_for(fmt: str, cfgs, ms, n: int, k: int, target: int, baselines: bool):
    ops = [bench.bf16_op()] if baselines else []
    if baselines and fmt == "fp8_per_tensor":
        ops.append(bench.xla_fp8_op())
    for m in ms:
        for cfg in cfgs:
            if (cfg.variant == "gemv" and m > 4) or (m <= 16) != (cfg.block_m <= 16):
                continue  # gemv at M <= 4 only; 16-row tiles exactly at M <= 16
            ops.append(_op(fmt, _fill(cfg, m, n, k, target), m))
    return ops


def summary(path: str) -> None:
    """One line per record: time, TFLOP/s, BW fraction, ratio to bf16."""
    d = json.load(open(path))
    print(f"copy BW {d.get('copy_bandwidth_Bps', 0) / 1e12:.2f} TB/s, elementwise "
          f"{d.get('elementwise_bandwidth_Bps', 0) / 1e12:.2f} TB/s")
    for r in d["records"]:
        head = f"{r['K']}x{r['N']} M={r['M']} {r['label'][:58]}"
        if "error" in r:
            print(head, "ERR", r["error"][:120])
        else:
            print(head, f"{r['median_us']:.1f}us {r['tflops']:.0f}TF bw{r['frac_copy_bw']:.2f} "
                        f"x{r.get('speedup_vs_bf16', 0):.2f}")


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--summary":
        summary(sys.argv[2])
        return 0
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--parts", default="decode,large")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny shapes and M")
    p.add_argument("--smoke", action="store_true",
                   help="one product per call, one call per sample (CPU smoke test: the "
                        "interpreter's time; the timings mean nothing)")
    args = p.parse_args(argv)
    target = 2 * num_sms()
    records, meta = [], {}
    parts = args.parts.split(",")

    def save():
        with open(args.out, "w") as f:
            json.dump({**meta, "records": records}, f, indent=1)

    def run_saved(shape, ms, ops):  # one shape's ops side by side; the JSON after each shape
        res = bench.run([shape], ms, ops, reps=args.reps, log=print, on_record=records.append,
                        smoke=args.smoke)
        meta.update({kk: v for kk, v in res.items() if kk != "records"})
        save()
        print(bench.format_table(res["records"]), flush=True)

    def a16_launches(smalls, ms, tiny_smalls, shapes=None):  # fp8_block_a16's launches
        shapes = shapes or [(model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns]
        if args.tiny:  # (the interpreter: CI's time)
            shapes, ms, smalls = [("tiny", 512, 256)], (3,), tiny_smalls
        for model, k, n in shapes:
            run_saved((model, k, n), ms, [bench.bf16_op()] + [
                _mgpu_a16_op("fp8_block_a16", not args.tiny, small) for small in smalls])

    def go(shapes, fmt, cfgs, ms, baselines=True, extra_fmts=()):
        if args.tiny:
            shapes, ms = [("tiny", 1024, 256)], tuple(min(m, 64) for m in ms)
        for model, k, n in shapes:
            ops = _ops_for(fmt, cfgs, ms, n, k, target, baselines)
            for ef in extra_fmts:
                ops.append(bench.xla_fp8_op(ef))
            run_saved((model, k, n), ms, ops)

    if "decode" in parts:
        go([("llama3-70b", 8192, 8192)], "fp8_per_channel_a16", DECODE, (1, 16))
        go([("llama3-70b", 8192, 8192)], "fp8_ptpc", DECODE_W8A8, (1, 16), baselines=False,
           extra_fmts=("fp8_per_tensor",))
        go([("deepseek-v3", 7168, 24576)], "fp8_block", DECODE_BLOCK, (1, 16))
    if "v3" in parts:
        v3_shapes = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 4096),
                     ("llama3-8b", 4096, 28672)]
        go(v3_shapes, "fp8_per_channel_a16", GEMV_V3 + SMALL_V3 + MID_V3, (1, 2, 4, 16, 64, 256))
    if "v4" in parts:
        v4_shapes = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 4096),
                     ("llama3-8b", 4096, 28672), ("deepseek-v3", 18432, 7168)]
        go(v4_shapes, "fp8_per_channel_a16", GEMV_V4 + SMALL_V3[:1], (1, 2, 4))
        go([("deepseek-v3", 7168, 24576)], "fp8_block_a16", GEMV_V4 + SMALL_V3[:1], (1, 2))
    if "v5" in parts:
        v5_shapes = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 4096),
                     ("llama3-8b", 4096, 28672), ("deepseek-v3", 18432, 7168)]
        go(v5_shapes, "fp8_per_channel_a16", GEMV_V5 + GEMV_V4[4:5] + SMALL_V3[:1], (1, 2, 4))
    if "mgpu" in parts:  # the Mosaic GPU block kernel vs the Triton one, the dispatcher, bf16
        # v2 (session 5): grouped launch order (group_m) and the M where it starts to pay.
        # v3 (session 5, untimed): a persistent grid of one CTA per SM (`_p<SMs>`); prediction
        # in NOTES.md: +3-8% where tiles run several waves (N=4096-6144), ~0 elsewhere
        sms = 1 if args.tiny else num_sms()  # tiny: a persistent CTA runs several tiles
        ms = (256, 512, 1024, 4096, 16384)
        shapes = [("llama3-70b", 8192, 8192), ("deepseek-v3", 7168, 24576),
                  ("llama3-70b", 28672, 8192), ("llama3-8b", 4096, 6144)]
        if args.tiny:  # (two tiles: the interpreter's time grows with them)
            shapes, ms = [("tiny", 512, 256)], (100,)
        for model, k, n in shapes:
            ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_block", "fp8_block"),
                   _triton_block_op(), _mgpu_block_op(2, 16), _mgpu_block_op(2, 16, programs=sms)]
            if not args.tiny:  # (the interpreter takes ~30 s per variant)
                ops += [_mgpu_block_op(2, 8), _mgpu_block_op(2, 8, programs=sms)]
            run_saved((model, k, n), ms, ops)
    if "mgpu_a16" in parts:  # the Mosaic GPU W8A16 kernel vs the Triton / dense paths and bf16
        # (session 6 call 1: 0.71-0.86x bf16 with registers as wgmma's A operand, as session 5
        # predicted; Triton block 0.37-0.52x)
        ms, shapes = (16, 256, 1024, 4096), [("llama3-70b", 8192, 8192),
                                         ("deepseek-v3", 7168, 24576), ("llama3-8b", 4096, 6144)]
        if args.tiny:
            shapes, ms = [("tiny", 512, 256)], (100,)
        for model, k, n in shapes:
            ops = [bench.bf16_op()]
            for fmt in ("fp8_block_a16", "fp8_per_channel_a16"):  # vs the Triton / dense path
                ops += [bench.kernel_op("pallas_fp8_w8a16", fmt), _mgpu_a16_op(fmt, False)]
                ops += [] if args.tiny else [_mgpu_a16_op(fmt, True)]
            run_saved((model, k, n), ms, ops)
    if "mgpu_dec" in parts:  # the Mosaic GPU W8A16 kernel at decode sizes (session 6)
        # prediction (NOTES.md): TMA-pipelined weight tiles at >= 70% of copy bandwidth, so
        # >= 1.6x bf16 at M <= 16 where the Triton kernels reach 1.1-1.7x
        regs = not args.tiny  # (the interpreter runs only shared-memory A operands)
        ms = (1, 16, 64)
        shapes = [("llama3-70b", 8192, 8192), ("llama3-8b", 4096, 4096),
                  ("llama3-8b", 4096, 28672), ("llama3-8b", 14336, 4096),
                  ("deepseek-v3", 7168, 24576), ("deepseek-v3", 18432, 7168)]
        if args.tiny:
            shapes, ms = [("tiny", 512, 256)], (3,)
        for model, k, n in shapes:
            ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_w8a16", "fp8_block_a16"),
                   _mgpu_a16_op("fp8_block_a16", regs, "auto")]
            if not args.tiny:
                ops += [_mgpu_a16_op("fp8_block_a16", regs, dict(k_splits=s))
                        for s in (1, 2, 4, 8)]
                ops += [_mgpu_a16_op("fp8_block_a16", regs, dict(stages=4)),
                        bench.kernel_op("pallas_fp8_w8a16", "fp8_per_channel_a16"),
                        _mgpu_a16_op("fp8_per_channel_a16", regs, "auto")]
            run_saved((model, k, n), ms, ops)
    if "mgpu_split" in parts:  # K ranges where the session-6 grid found the rule weak
        # (4096x6144 / 8192x10240 got 8 ranges and 0.84-1.15x; M=256 at one CTA per tile
        # leaves SMs idle on 14336x4096: 0.46x)
        regs = not args.tiny
        shapes = [("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 10240),
                  ("llama3-8b", 4096, 4096), ("llama3-8b", 14336, 4096)]
        ms = (1, 16, 256)
        if args.tiny:
            shapes, ms = [("tiny", 512, 256)], (3,)
        for model, k, n in shapes:
            ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_w8a16", "fp8_block_a16"),
                   bench.kernel_op("pallas_fp8_w8a16", "fp8_per_channel_a16")]
            ops += [_mgpu_a16_op("fp8_block_a16", regs, dict(k_splits=s))
                    for s in ((1, 2) if args.tiny else (1, 2, 4, 8))]
            run_saved((model, k, n), ms, ops)
    if "mgpu_stream" in parts:  # W8A16 decode: stream-K against K ranges (session 10)
        # prediction (NOTES.md session 10): where the ranges fill 0.73-0.87 of the SMs'
        # slots (4096x6144, 8192x10240, 4096x28672, 8192x57344, 7168x36864, 18432x7168)
        # 10-25% faster; where they fill 0.97 in one wave, the same; in 3 waves (7168x24576)
        # a few % faster. Calls 1-2: right at M <= 16 (but 0-4% slower where the ranges run
        # one full wave); at M=64 the cond closing a piece costs ~15% a step (a select
        # instead, call 1, more): faster only where ranges run short CTAs in >= 3 waves
        a16_launches(("ranges", "stream"), (1, 16, 64), ("ranges", "stream"))
    if "det_stream" in parts:  # deterministic W8A16 decode: whole K parts streamed (s11)
        # prediction (NOTES.md session 11): det/default from 1.06-1.37x (session 10) to
        # within ~1.05x at M <= 16 where the old launch ran 1.5 waves (K=7168, N >= 24576)
        # or 0.6-0.8 of one (ranges x stored parts); at M=64 the per-part cond close of
        # 64-row x tiles (~15% a step, session 10) against the old stored parts' select
        a16_launches(("auto", "det_ranges", "det_x16", "det"), (1, 16, 64), ("det",))
    if "det_narrow" in parts and not args.tiny:  # in-CTA parts on narrower x tiles (s11)
        # prediction (NOTES.md session 11): where 128-row tiles leave SMs idle (M=256 on
        # 4096x4096 / 14336x4096: det/default 1.68x / 1.88x) ~1.2-1.3x; at M=64 32-row tiles
        # against streamed parts' slabs on 8192x8192, 18432x7168, 28672x8192 (1.17-1.29x) ~1.1x.
        # Call 4: right at M=256 (1.19x / 1.37x) and M=128 (4096x6144 1.57 -> 1.12x), wrong
        # against the stream (32-row in-CTA parts 1.2-1.6x slower): narrowed only where in-CTA
        # parts are det_params' choice anyway
        a16_launches(("auto", "det_wide", "det"), (64, 128, 256), ())
    if "det_model" in parts:  # streamed parts by folded slabs (session 14)
        # prediction: where the model now streams (4096x28672 M=1/16, 8192x57344 M=16) the
        # stream 4-10% faster than in-CTA parts, as for MXFP8's 8-bit codes in session 14
        a16_launches(("auto", "det", "det_cta"), (1, 16), ("det", "det_cta"),
                     [("llama3-8b", 4096, 28672), ("llama3-70b", 8192, 57344)])
    if "det_halves" in parts:  # a det order of two halves, each a left fold (session 15)
        # prediction (NOTES.md session 15): 2 ranges x P/2 in-CTA parts against default mode
        # and today's det launch: at M=256 ~1.1x default where default runs 2 ranges
        # (4096x4096, 14336x4096, 8192x10240: det today 1.34-1.88x), 1.1-1.3x where it runs
        # one (two f32 slabs, 2x CTAs); at M=64 ~1.1-1.2x (64-row parts' cond)
        a16_launches(("auto", "det", "det_halves"), (16, 64, 256), ("det", "det_halves"))
    if "det_groups" in parts:  # the two-group order through det_params (session 15)
        # prediction (NOTES.md session 15): det/default <= 1.15x at M=64/256 on the shapes of
        # N <= 10240 (call 1's two ranges where they fill the SMs, the first half's sum parked
        # in shared memory elsewhere), M <= 16 within 1.10x, M=4096 as before (+0-3%)
        a16_launches(("auto", "det", "det_g1"), (1, 16, 64, 256, 4096), ("det",),
                     None if args.tiny else [s for s in (
                         (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns)
                         if s[2] <= 16384])
    if "det_park" in parts:  # the two-group order's parked launch (session 15, call 5)
        # prediction: with the park as a pl.when and a select (no nested cond carrying the
        # sums) its cost against one fold's in-CTA parts from 8-16% to ~3% (the float32
        # output's extra bytes). Call 5: no change (8-16%). Call 6 adds det_g1_f32, one
        # fold's launch writing float32 as the parked one does
        a16_launches(("auto", "det", "det_g1", "det_g1_f32"), (256, 4096), ("det",),
                     None if args.tiny else [("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 8192),
                                             ("llama3-70b", 8192, 10240),
                                             ("llama3-8b", 14336, 4096),
                                             ("deepseek-v3", 18432, 7168),
                                             ("llama3-70b", 28672, 8192)])
    if "parts_cost" in parts:  # in-CTA parts at 128-row x tiles against one K range (s16)
        # prediction (NOTES.md session 16): if the cost of deterministic mode's in-CTA parts is
        # the part ends (the cond closing a part), it grows with their count (k_parts 2 < 8);
        # if it is the third live accumulator (spills), k_parts=2 costs about what 8 do
        a16_launches(("auto", dict(k_parts=2), dict(k_parts=8), "det", "det_g1"), (1024, 4096),
                     (dict(k_parts=2), "det"),
                     None if args.tiny else [("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 8192),
                                             ("llama3-8b", 14336, 4096),
                                             ("llama3-70b", 28672, 8192)])
    if "halves" in parts:  # wgmma_halves: in-CTA parts without spills (session 16)
        # prediction (NOTES.md session 16): the halves free the 16 registers in-CTA parts at
        # 128-row x tiles spill for (SASS: 3 STL + 6 LDL a step), so k_parts=8 and det's
        # launches at M >= 256 come to within ~3% of one K range (today +4-24%); one K range
        # itself unchanged or slightly slower (a wait more per step)
        a16_launches(("auto", dict(wgmma_halves=True), dict(k_parts=8),
                      dict(k_parts=8, wgmma_halves=True), "det", "det_h", "det_g1", "det_g1_h"),
                     (256, 4096), ("det", "det_h"),
                     None if args.tiny else [("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 8192),
                                             ("llama3-8b", 14336, 4096),
                                             ("deepseek-v3", 18432, 7168),
                                             ("llama3-70b", 28672, 8192)])
    if "predecode" in parts:  # the weights decoded to bf16 first, wgmma's A from smem (s17)
        # prediction (NOTES.md session 17): at M >= 1024 a weight tile is converted once per
        # x tile (32 times at M=4096); decoded once by XLA (~3 bytes a weight moved: ~60 us on
        # 8192x8192, 6% of the product) the kernel runs bf16 MMAs from shared memory with no
        # weight registers -- no halves, no spills: det 1.11-1.22x -> ~1.0x of today's
        # default, and default's one range itself 10-20% faster
        a16_launches(("auto", "auto_pd", "det", "det_pd"), (1024, 4096), ("det", "det_pd"))
    if "predecode_x64" in parts:  # the parked launches, predecoded, on 64-row x tiles (s17)
        # prediction (NOTES.md session 17): predecoded 128-row parked launches hold two stages
        # of 64 KB (bf16 weight and x tiles) beside the 64 KB float32 park; 64-row x tiles
        # hold four (48 KB a stage, 32 KB park) -- det/default at M=4096 on N <= 16384 from
        # 1.14-1.32 to ~1.1 unless wgmma's 64-wide N (more shared-memory bytes per MMA, each
        # weight tile read by twice the CTAs) costs what the stages gain
        a16_launches(("auto", "det", "det_x64"), (4096, 16384), ("det", "det_x64"),
                     None if args.tiny else [s for s in (
                         (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns)
                         if s[2] <= 16384])
    if "groups_store" in parts:  # the parked launches' groups stored instead (s17)
        # prediction (NOTES.md session 17): predecoded parked launches hold 2 stages; stored
        # groups (two float32 slabs, the stores in halves of the x tile) hold 3: det/default
        # at M=4096 on N <= 16384 from 1.14-1.32 to ~1.05-1.1 (the slabs' extra ~8 bytes an
        # output against the third stage)
        a16_launches(("auto", "det", "det_gs"), (4096, 16384), ("det", "det_gs"),
                     None if args.tiny else [s for s in (
                         (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns)
                         if s[2] <= 16384])
    if "groups_reload" in parts:  # the first group's sum read back in its CTA (s18)
        # prediction (NOTES.md session 18): stored groups write two float32 slabs (8 bytes an
        # output) that an XLA pass reads back with the transpose; reloading the first in the
        # CTA (from L2, mostly) and writing the 16-bit output saves ~96 of 160 MB that pass
        # moves on 4096x4096 at M=4096: det/default there 1.20 -> ~1.10, 2-5% elsewhere.
        # (Session 18 call 1 also ran M=1024's register-decode park beside reload, and reload
        # on 4 stages: 1.00-1.02 / 0.99-1.09 -- since refused, check_predecode.) det_gs /
        # det_gr: stored / reloaded whatever RELOAD_MAX_K says
        a16_launches(("auto", "det_gs", "det_gr"), (4096,), ("det_gs", "det_gr"),
                     None if args.tiny else [s for s in (
                         (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns)
                         if s[2] <= 16384])
    def mid_m(fmts, ms, shapes):  # the dispatcher's kernel beside each path it could take
        if args.tiny:
            shapes, ms, fmts = [("tiny", 512, 256)], (100,), ["fp8_per_channel_a16"]
        for model, k, n in shapes:
            ops = [bench.bf16_op()]
            for fmt in fmts:
                kname = ("pallas_fp8_block" if fmt == "fp8_block" else "pallas_fp8_w8a16"
                         if formats.get(fmt).activation is None else "pallas_fp8_w8a8")
                ops += [bench.kernel_op(kname, fmt)] + [
                    _path_op(fmt, p) for p in MID_M_PATHS[fmt]
                    if not (args.tiny and p == "mgpu")]  # (the interpreter's mgpu: too slow)
            run_saved((model, k, n), ms, ops)

    mid_shapes = [("llama3-8b", 4096, 4096), ("llama3-70b", 8192, 8192),
                  ("llama3-8b", 14336, 4096), ("deepseek-v3", 7168, 24576)]
    if "mid_m" in parts:  # M between the figures' 256 and 1024 (session 19 call 1)
        # why: no figure of record covered M=257-1023, where fp8_paths switched paths (whole-K
        # scales, before session 19's rules: Triton / Mosaic below DENSE_MIN_M = 1024, the
        # dense XLA GEMM from it).
        # Prediction: W8A8 per-tensor / ptpc's Triton kernel at M=512 is at or below the dense
        # path (at 1024 dense ran 1.16-1.36x bf16 vs Triton's 1.01-1.11x, session 4); W8A16
        # whole-K scales: mgpu and dense within ~10% at 512 (0.76x at 256 on mgpu, 0.72-0.81x
        # at 1024 dense)
        mid_m(list(MID_M_PATHS), (256, 512, 768, 1024), mid_shapes)
    if "mid_m_w8a8" in parts:  # where W8A8's dense path starts (session 19 call 2)
        # call 1: dense 1.09-1.26x the Triton kernel at M=256-768 on 8192x8192, 1.03-1.26x on
        # 4096x4096. Prediction: Triton keeps M <= 64 (weight-streaming, its split-K decode
        # configs), dense from 128 or 256
        mid_m(["fp8_per_tensor", "fp8_ptpc"], (16, 64, 128, 256, 512), mid_shapes)
    if "w8a8_decode" in parts:  # W8A8 whole-K scales: Triton or dense at M <= 64 (session 23)
        # why: session 23's decode grid ran XLA's fp8 x fp8 dot 1.61x bf16 at M=16 against the
        # Triton kernel's 1.53x (Triton / cuBLAS 0.93-1.19; K=4096 shapes 1.15-1.19).
        # Prediction (M = 8-64, 11 shapes): dense ahead at M=16-64 on the K=4096 shapes,
        # within ~5% elsewhere; Triton ahead at M=8
        # (the dispatcher is the Triton kernel there: no path_pallas row)
        for model, k, n in ([("tiny", 512, 256)] if args.tiny else [
                (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns]):
            run_saved((model, k, n), (4,) if args.tiny else (8, 16, 32, 64), [bench.bf16_op()] + [
                op for fmt in ("fp8_per_tensor", "fp8_ptpc")
                for op in (bench.kernel_op("pallas_fp8_w8a8", fmt), _path_op(fmt, "dense"))])
    if "a16_m1" in parts:  # W8A16 whole-K scales at M = 1-8: the kernel or an XLA reduction (s24)
        # why: every decode grid since session 7 ran the XLA reference (float32 dequantization,
        # one dot) faster than the Mosaic kernel at M=1 on 4096x4096 (0.86-0.91 of its time)
        # and 4096x6144 (0.93-0.98), not at M=16 (6-8x slower) nor on larger weights.
        # Prediction: XLA's fused multiply-reduce ahead at M=1 on weights <= 4096x6144 only;
        # at M >= 2 XLA leaves the reduction for a GEMM and loses
        for model, k, n in ([("tiny", 512, 256)] if args.tiny else [
                ("llama3-8b", 4096, 4096), ("llama3-8b", 4096, 6144), ("llama3-8b", 14336, 4096),
                ("llama3-70b", 8192, 8192)]):
            run_saved((model, k, n), (1, 2) if args.tiny else (1, 2, 4, 8), [bench.bf16_op()] + [
                op for fmt in ("fp8_per_tensor_a16", "fp8_per_channel_a16")
                for op in (bench.kernel_op("pallas_fp8_w8a16", fmt), bench.kernel_op("xla", fmt),
                           _reduce_op(fmt, jnp.float32), _reduce_op(fmt, jnp.bfloat16))])
    if "a16_small_m" in parts:  # the same over 11 shapes and M = 1-512 (session 24, call 3)
        # why: call 2 (a16_m1) ran XLA's bf16 dot of the converted codes (reduce_bfloat16: the
        # dense path's formula without the widening pass, XLA fusing the convert into its
        # GEMM) at 0.78-0.97 of the Mosaic kernel's time at M = 2-8 on all 4 shapes, at M=1
        # 0.93-1.00 on the two smallest only. Prediction: it stays ahead to M ~ 64 where its
        # GEMM tiles are still one weight pass, and on the larger weights by less
        for model, k, n in ([("tiny", 512, 256)] if args.tiny else [
                (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns]):
            run_saved((model, k, n), (1, 2) if args.tiny else (1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                               512), [bench.bf16_op()] + [
                op for fmt in ("fp8_per_tensor_a16", "fp8_per_channel_a16")
                for op in (bench.kernel_op("pallas_fp8_w8a16", fmt),
                           _reduce_op(fmt, jnp.bfloat16))])
    if "a16_m1pad" in parts:  # W8A16 whole-K scales at M=1: kernel vs dense on 2 rows (s25)
        # call 1 (dispatcher = the Mosaic kernel then; zeros, repeat): prediction -- the padded
        # dense path at M=2's dense time plus < 1 us, 0.85-0.97 of the kernel's time. Measured
        # 0.94-1.04 (geomean 0.99-1.00): the pad is a kernel of its own. Call 4: x broadcast
        # to two rows, which XLA keeps inside its GEMM (a16_xla_like: 0.91-0.99 on 4 shapes),
        # then tried as the dispatcher's M=1 rule (recorded under the dispatcher's label):
        # 0.93-1.05, geomean 0.99-1.01 -- even, reverted
        for model, k, n in ([("tiny", 512, 256)] if args.tiny else [
                (model, k, n) for model, kns in bench.SHAPES.items() for k, n in kns]):
            run_saved((model, k, n), (1,), [bench.bf16_op()] + [
                op for fmt in ("fp8_per_tensor_a16", "fp8_per_channel_a16")
                for op in (_path_op(fmt, "mgpu"), _padded_dense_op(fmt, "broadcast"),
                           _padded_dense_op(fmt, "zeros"))])
    if "a16_xla_like" in parts:  # W8A16 at M=1-2: Triton tiles like XLA's fused GEMM's (s25)
        # why: session 25's breakdown (8 chained products) ran XLA's M=2 GEMM of the converted
        # codes 6.1 / 18.5 / 22.4 us on 4096x4096 / 8192x8192 / 8192x10240 against the Mosaic
        # kernel's 7.8 / 20.0 / 23.9 at M=1: a fixed ~1.5 us. XLA's tiles (xla_gemm_config.py):
        # 8 x rows x 64 weight rows, 4 warps, 3 stages, split-K to ~4 CTAs an SM -- many small
        # CTAs an SM, whose ramps overlap, where the Mosaic kernel runs one large CTA an SM.
        # Prediction: this kernel's 16 x 64 tiles at ~4 CTAs an SM come within 5% of XLA's M=2
        # time at M=1 if the conversion is not its limiter (sessions 2-5: 38-54 us on 8192x8192
        # with other tiles -- then it is); broadcast x (if XLA keeps it in its GEMM) is XLA's
        # own kernel at M=1
        cfgs = [A(16, 64, 128, 4, 3, per_sm=4), A(16, 64, 256, 4, 3, per_sm=4),
                A(16, 64, 128, 4, 4, per_sm=4), A(16, 64, 128, 4, 3, per_sm=2),
                A(16, 64, 128, 4, 3, per_sm=4, fast_convert=True),
                A(16, 64, 128, 4, 3, variant="swap", per_sm=4)]
        for model, k, n in ([("tiny", 512, 256)] if args.tiny else [
                ("llama3-8b", 4096, 4096), ("llama3-70b", 8192, 8192),
                ("llama3-70b", 8192, 10240), ("llama3-8b", 4096, 28672)]):
            fmt = "fp8_per_channel_a16"
            run_saved((model, k, n), (1, 2), [bench.bf16_op(), bench.kernel_op(
                "pallas_fp8_w8a16", fmt), _padded_dense_op(fmt, "broadcast"),
                _path_op(fmt, "mgpu")] + [_op(fmt, _fill(c, m, n, k, target), m)
                                          for m in ((1, 2)) for c in cfgs])
    if "mid_m_a16" in parts:  # W8A16 whole-K scales: mgpu or dense at 512-1024 (session 19)
        # call 1: equal on 8192x8192 (within its ~5% run-to-run), dense 1.2-1.4x at M=768 on
        # 4096x4096 (mgpu's 6 x tiles x 32 weight tiles = 1.45 waves of 132 SMs); mgpu ahead
        # at 512 (1.2-1.3x) and 1024 on 4096x4096. Prediction: the waves decide -- a rule by
        # mgpu's wave fill, not by M alone
        # (call 1 ran 4096x4096 and 8192x8192 at 256-1024: the other two shapes here)
        mid_m(["fp8_per_tensor_a16", "fp8_per_channel_a16"], (512, 768, 1024), mid_shapes[2:])
    if "default_parts" in parts:  # default mode's predecoded prefill launch as in-CTA parts (s19)
        # why: session 18's figures of record ran fp8_block_a16's deterministic launch (8
        # in-CTA parts, one fold, predecoded) 3-9% faster than default mode's one K range on
        # the shapes of N > 16384 (8192x57344 6430 vs 7016 us at M=4096), with more work a
        # step. Prediction: if the in-CTA parts' per-step cond is what helps (a schedule
        # effect), k_parts=2 gains what 8 do; if it is neither, the gap is run-to-run and
        # all three launches land within 2%. group_m 4 / 16: the weight tiles launched
        # together (L2 reuse of x tiles) as the other knob that differs by shape
        # call 1: k_parts=2 0.90-0.98 of auto on 8 of 10 cases, 14336x4096 1.00 / 1.06, k_parts=8
        # in between; group_m no gain. Call 2 repeats it with k_parts=4 beside. (Since then
        # "auto" is k_parts=2, PREFILL_K_PARTS: k_parts=1 is the one range)
        a16_launches(("auto", dict(k_parts=1), dict(k_parts=2), dict(k_parts=4), dict(k_parts=8),
                      dict(group_m=4), dict(group_m=16), "det"), (4096, 16384),
                     (dict(k_parts=1), "det"),
                     None if args.tiny else [("llama3-70b", 8192, 57344),
                                             ("deepseek-v3", 7168, 24576),
                                             ("llama3-8b", 4096, 28672),
                                             ("llama3-70b", 8192, 8192),
                                             ("llama3-8b", 14336, 4096)])
    if "predecode_m" in parts:  # the same at M = 2048 / 16384, 6 shapes (where it starts)
        a16_launches(("auto", "auto_pd", "det", "det_pd"), (2048, 16384), ("det", "det_pd"),
                     None if args.tiny else [("llama3-8b", 4096, 6144), ("llama3-70b", 8192, 8192),
                                             ("llama3-8b", 14336, 4096),
                                             ("llama3-70b", 8192, 57344),
                                             ("deepseek-v3", 7168, 24576),
                                             ("llama3-70b", 28672, 8192)])
    if "det_straddle" in parts:  # steps across K parts' ends (session 14)
        # prediction: K=7168 det at M=1/16 from one K-block a step (parts of 7) to two: det/default
        # 1.12-1.17x -> ~1.08-1.12x (session 7: two blocks a step -1..+4% for fp8 weights at
        # default mode); 8192x8192 (parts of 8) the control, unchanged
        a16_launches(("auto", "det", "det_s13"), (1, 16), ("det", "det_s13"),
                     [("deepseek-v3", 7168, 24576), ("deepseek-v3", 7168, 36864),
                      ("llama3-70b", 8192, 8192)])
    if "det_fold" in parts and not args.tiny:  # streamed parts folded by a tile's first CTA
        # prepared in session 11 after its device time, not measured. Prediction: the slabs
        # (8 * P * rows bytes per weight row, written and read) drop to ~3/8 written and ~5/8
        # read where CTAs run 12 parts (K=7168, N >= 24576) and to 5/8 where they run 4
        # (8192x8192, 18432x7168): det/default at M=16 K=7168 wide 1.17 -> ~1.10, at M=64
        # 8192x8192 / 18432x7168 1.29 -> ~1.15 -- unless the second live accumulator and the
        # nested cond cost more per step than the bytes save
        a16_launches(("auto", "det", "det_fold"), (1, 16, 64), ())
    if "mgpu_parts" in parts:  # deterministic W8A16's in-CTA parts (session 7 call 3)
        # k_parts=8 cost 8-17% against k_parts=1 at M >= 1024 (the grid: ~15%); a variant that
        # kept the parts' sum in shared memory instead of a second register accumulator
        # (commit "experiment: in-CTA parts summed in shared memory") was no better: -5% to +10%
        regs = not args.tiny
        shapes = [("llama3-70b", 8192, 8192), ("deepseek-v3", 7168, 24576),
                  ("llama3-8b", 4096, 6144)]
        ms = (1024, 4096)
        if args.tiny:  # (one 128-row x tile: the interpreter's time grows with the tiles)
            shapes, ms = [("tiny", 512, 256)], (100,)
        for model, k, n in shapes:
            p = 4 if args.tiny else 8
            # (session 8's parts closed by selects ran 12-18% slower than the cond in session 9,
            # h200_sweep_mgpu_parts_s9.json; removed)
            ops = [bench.bf16_op(), _mgpu_a16_op("fp8_block_a16", regs, "auto"),
                   _mgpu_a16_op("fp8_block_a16", regs, dict(k_parts=p))]
            run_saved((model, k, n), ms, ops)
        # decode: deterministic mode's 16-row x tiles vs 8 (bitwise the same on the H200):
        # 8 rows 2-4% faster at M=1, 1.5x slower at M=16 (two tiles)
        for model, k, n in ([] if args.tiny else [("llama3-8b", 4096, 6144),
                                                  ("llama3-70b", 8192, 10240)]):
            ops = [bench.bf16_op()] + [_mgpu_a16_op("fp8_block_a16", regs, dict(
                block_m=b, k_splits=8)) for b in (8, 16)]
            run_saved((model, k, n), (1, 16), ops)
    if "block_a16" in parts:
        go([("llama3-70b", 8192, 8192)], "fp8_block_a16", LARGE_BLOCK_A16, (4096,))
    if "large" in parts:
        go([("llama3-70b", 8192, 8192)], "fp8_per_channel_a16", LARGE_W8A16, (4096,))
        go([("llama3-70b", 8192, 8192)], "fp8_ptpc", LARGE_W8A8, (4096,), baselines=False,
           extra_fmts=("fp8_per_tensor",))
        go([("deepseek-v3", 7168, 24576)], "fp8_block", LARGE_BLOCK, (4096,))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
