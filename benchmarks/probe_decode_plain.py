"""The W8A16 decode kernel's launch grid: pallas_kernels.fp8_a16_decode_mgpu at explicit K ranges
x pipeline stages, beside bf16 and the dispatcher (whose rule, decode_params, was fitted to this
grid's M=1 run in session 26).

History: session 25 wrote this as a probe holding its own copy of the kernel (one warpgroup of
64 weight rows a CTA on plgpu.emit_pipeline, several CTAs an SM); session 26 ran it and made
the kernel the library's 'decode' path. That version (commit 0a2cc7a) also had per-SM split ops
(plain_s<per_sm>_st<stages>) and `--fused` (one range finished in the CTA, through a transposed
staging slot), which the committed results h200_decode_plain_*_s26.json name; the in-CTA
finish faulted the device beside other W8A16 kernels (NOTES.md session 26) and is gone, and
with it this script's copy of the kernel.

    PYTHONPATH=. python3 benchmarks/probe_decode_plain.py --shapes all --m 1 \
        --grid 1,2,4,8,16:2,4 --out grid.json

Session 28 gave the kernel 128x128 block scales (each K-block's chain from zero, times its
scale, added in K order; not measured, not the dispatcher's choice). First run, beside the
dispatcher (the warp-specialized Mosaic kernel for fp8_block_a16):
    PYTHONPATH=. python3 benchmarks/probe_decode_plain.py --format fp8_block_a16 \
        --shapes all --m 1,16 --grid 1,2,4,8:2,4 --out $OUT/block_plain.json
Also prepared then: deterministic mode's order on this kernel (fp8_a16_decode_mgpu(...,
deterministic=True), bitwise the Mosaic kernel's in the interpreter), beside the dispatcher's
deterministic mode (the Mosaic kernel):
    PYTHONPATH=. python3 benchmarks/probe_decode_plain.py --format fp8_per_channel_a16 \
        --shapes all --m 1,16 --grid none --det --out $OUT/det_plain.json
Prediction: det / default ~1.00-1.08 at M=1 (8 K ranges where default takes 1-8; the slabs'
round trip on the widest N), against 0.98-1.27 with the Mosaic kernel now.
Block-scale prediction: registers ~95-110 (a float32 total beside the accumulator), so four
CTAs an SM; within 0.97 of the whole-K kernel's time on the same shape (a scale multiply-add per K-block
and row is small against the conversion), i.e. +4-5% over the Mosaic kernel at M=1 geomean.
"""

from __future__ import annotations

import argparse

import jax

from jqlin import bench
from jqlin.kernels.pallas_fp8 import _weight_scale
from pallas_kernels import w8a16_matmul
from pallas_kernels.fp8_a16_decode_mgpu import fp8_a16_decode_mgpu


def launch_op(fmt: str, splits: int | None, stages: int | None) -> bench.Op:
    """The kernel at that launch (None, None: decode_params'; a K that `splits` does not
    divide: an error row)."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        scale, kind = _weight_scale(qw, qw.spec)  # (the dispatcher's reading of the scales)
        return fp8_a16_decode_mgpu(x, qw.data, scale, scale_kind=kind, splits=splits,
                                   stages=stages, interpret=interpret)
    name = "plain_rule" if splits is None else f"plain_k{splits}_st{stages}"
    return bench.Op(name, fmt, "default", fn)


def det_op(fmt: str, range_parts: int | None = None) -> bench.Op:
    """The kernel in deterministic mode's order (session 28; the dispatcher's choice where
    fp8_paths.det_decode_wins since session 29), range_parts of the K parts a CTA. (Session
    30's plain_det_overlap rows came from an `overlap` option measured slower and removed
    since: commit 06b3456 has it.)"""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        scale, kind = _weight_scale(qw, qw.spec)
        return fp8_a16_decode_mgpu(x, qw.data, scale, scale_kind=kind, deterministic=True,
                                   range_parts=range_parts, interpret=interpret)
    name = "plain_det" + (f"_rp{range_parts}" if range_parts else "")
    return bench.Op(name, fmt, "det", fn)


def mosaic_det_op(fmt: str) -> bench.Op:
    """fp8_block_a16_mgpu's deterministic launch (path='mgpu'), whatever the dispatcher picks."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        scale, kind = _weight_scale(qw, qw.spec)
        return w8a16_matmul(x, qw.data, scale, scale_kind=kind, deterministic=True,
                            path="mgpu", interpret=interpret)
    return bench.Op("mosaic_det", fmt, "det", fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_decode_probe_args(p, m="1", reps=5)
    p.add_argument("--format", default="fp8_per_channel_a16",
                   choices=["fp8_per_channel_a16", "fp8_per_tensor_a16", "fp8_block_a16"])
    p.add_argument("--grid", default="1,2,4,8:2,4", help="SPLITS:STAGES lists, or none")
    p.add_argument("--det", action="store_true",
                   help="also deterministic mode: the dispatcher's and this kernel's order")
    p.add_argument("--det-range-parts", default="1",
                   help="with --det: the decode kernel's deterministic launches, K parts a CTA")
    p.add_argument("--rule", action="store_true",
                   help="also the kernel at its own launch rule (decode_params)")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    shapes = [("tiny", 512, 256)] if cpu else bench.parse_shapes(args.shapes)
    ops = [bench.bf16_op(), bench.kernel_op("pallas_fp8_w8a16", args.format)] + [
        launch_op(args.format, sp, st) for sp, st in bench.parse_launch_grid(args.grid)]
    if args.rule:
        ops.append(launch_op(args.format, None, None))
    if args.det:
        ops += [bench.kernel_op("pallas_fp8_w8a16", args.format, deterministic=True),
                mosaic_det_op(args.format)]
        ops += [det_op(args.format, int(r)) for r in args.det_range_parts.split(",")]
    bench.run_and_report(shapes, tuple(int(v) for v in args.m.split(",")), ops, reps=args.reps,
                         out=args.out, smoke=cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
