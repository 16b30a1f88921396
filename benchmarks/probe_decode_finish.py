"""The decode kernels' in-kernel finish (session 42) against XLA's finish of their slabs, side
by side with bf16 and the dispatcher, for the FP8 weight-only decode kernel
(pallas_kernels.fp8_a16_decode_mgpu) and the 4-bit / MX one (group_a16_decode_mgpu), each at
its launch rule's K ranges.

    PYTHONPATH=. python3 benchmarks/probe_decode_finish.py --formats fp8_per_channel_a16,nvfp4_a16 \
        --shapes all --m 1,16 --out $OUT/finish.json

Ops per format: `<fmt>:pallas_*` (the dispatcher: the in-kernel finish where
takes_kernel_finish's rule says), `decode_slabs` (in_kernel_finish=False: float32 slabs of
y^T, XLA's sum / scale / transpose / rounding pass after) and `decode_fin`
(in_kernel_finish=True where the launch allows it, else an error row). Both direct ops read
the scales as the dispatcher does.

Prediction (H200; session 30's breakdown put XLA's finish pass at 1.2-1.7 us): decode_fin
~1.2 us under decode_slabs at 4096x4096 M=1 (7.8 -> ~6.6 us: 1.63x -> ~1.9x bf16), 1-1.7 us
under it elsewhere; NVFP4 W4A16 the same microseconds off a smaller time.
Measured (H100, session 43, h100_decode_finish_s43.json): FP8 1.0-2.2 us under at N >= 8192,
0.3-0.5 us over at N = 4096; NVFP4 0.9-6.6 us over everywhere -- hence FINISH_IN_KERNEL_MIN_N.
--det (session 45) adds deterministic mode: `<kernel>[det]` (the dispatcher), and the decode
kernels' det launch (det_order's 8 parts as K ranges) with `decode_slabs[det]` /
`decode_fin[det]` (where each range is one part; else an error row). Prediction: decode_fin[det]
~1-2 us under decode_slabs[det] from N = 8192 (the default launch's gain there), over it at
N = 4096 (8 ranges finished in the kernel were 1.7-3.1 us over 8 as slabs there, H100 s45).
Measured (H100, session 46, h100_detfin{,_wide}_s46.json): decode_fin[det] under
decode_slabs[det] only at 4096x28672 M = 1 (45.2 / 47.6 us) and M = 8 (46.3 / 49.3); over it
everywhere else (M = 16 there 60.9 / 54.4; N = 4096 +1.5-3.7 us). Default mode there:
41.2-42.2 us -- the det launch's 8 float32 slabs are the gap, not their adder. Session 46 then
folds the parts in the CTA at default's K ranges (det_fold_parts): `<kernel>[det]` (the
dispatcher) takes it at 4096x28672, 7168x24576 (one range) and 8192x8192 (two, one group
each). Prediction: that row within 1.03x of default's at M = 1 / 8 / 16 there (4096x28672
M = 16: ~43 us against 54.4).
Session 47 ran --pad-rows (PAD_Y_ROWS, M = 9-15 finished as 16 rows): no faster than the
dispatcher's launch (h100_padrows_s47.json); the option and PAD_Y_ROWS were removed.
"""

from __future__ import annotations

import argparse

import jax

from jqlin import bench
from jqlin.kernels.pallas_fp4 import nvfp4_post_scale
from jqlin.kernels.pallas_fp8 import _weight_scale
from pallas_kernels.fp8_a16_decode_mgpu import fp8_a16_decode_mgpu
from pallas_kernels.group_a16_decode_mgpu import group_a16_decode_mgpu

GROUP_FMT = {"nvfp4_a16": "nvfp4", "mxfp4_a16": "mxfp4", "mxfp8_a16": "mxfp8"}
KERNEL = {"nvfp4_a16": "pallas_nvfp4", "mxfp4_a16": "pallas_mxfp4", "mxfp8_a16": "pallas_mxfp8"}


def finish_op(fmt: str, finish: bool | None, splits: int | None = None,
              deterministic: bool = False) -> bench.Op:
    """The format's decode kernel at its launch rule's K ranges (or `splits` of them), its finish
    in the kernel or by XLA (None: the kernel's own choice -- in deterministic mode
    det_fold_parts' folded launch where it runs); deterministic: deterministic mode's launch
    (det_order's parts)."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        if fmt in GROUP_FMT:
            g = GROUP_FMT[fmt]
            col, post = nvfp4_post_scale(qw, qw.spec) if g == "nvfp4" else (None, "none")
            return group_a16_decode_mgpu(g, x, qw.data, qw.scale, col, post=post, splits=splits,
                                         in_kernel_finish=finish, interpret=interpret,
                                         deterministic=deterministic)
        scale, kind = _weight_scale(qw, qw.spec)  # (the dispatcher's reading of the scales)
        return fp8_a16_decode_mgpu(x, qw.data, scale, scale_kind=kind, splits=splits,
                                   in_kernel_finish=finish, interpret=interpret,
                                   deterministic=deterministic)
    name = ({None: "decode_auto", True: "decode_fin", False: "decode_slabs"}[finish]
            + ("" if splits is None else f"@{splits}"))
    return bench.Op(name, fmt, "det" if deterministic else "default", fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_decode_probe_args(p, m="1,16", reps=3)
    p.add_argument("--formats", default="fp8_per_channel_a16,fp8_block_a16,nvfp4_a16")
    p.add_argument("--splits", default="",
                   help="K-range counts to time besides the launch rule's (e.g. 1,2,4); a "
                        "count a shape's K cannot take gives an error row")
    p.add_argument("--det", action="store_true",
                   help="also deterministic mode: the dispatcher's det launch and the decode "
                        "kernels' det launch finished by XLA and (session 45) in the kernel")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    shapes = [("tiny", 512, 256)] if cpu else bench.parse_shapes(args.shapes)
    ops = [bench.bf16_op()]
    for fmt in args.formats.split(","):
        ops.append(bench.kernel_op(KERNEL.get(fmt, "pallas_fp8_w8a16"), fmt))
        # (the interpreter has no clusters: XLA's finish only)
        for splits in [None] + [int(v) for v in args.splits.split(",") if v]:
            ops += [finish_op(fmt, False, splits)] + ([] if cpu else [finish_op(fmt, True, splits)])
        if args.det:
            ops += [bench.kernel_op(KERNEL.get(fmt, "pallas_fp8_w8a16"), fmt, deterministic=True),
                    finish_op(fmt, False, deterministic=True)] + (
                [] if cpu else [finish_op(fmt, True, deterministic=True),
                                finish_op(fmt, None, deterministic=True)])
    bench.run_and_report(shapes, tuple(int(v) for v in args.m.split(",")), ops, reps=args.reps,
                         out=args.out, smoke=cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
