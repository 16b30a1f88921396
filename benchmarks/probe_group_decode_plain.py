"""NVFP4 / MXFP4 / MXFP8 weight-only decode on the plain-pipeline kernel
(pallas_kernels.group_a16_decode_mgpu) at explicit launches, beside bf16, the dispatcher's choice
and the warp-specialized kernel it replaced at M <= 16 (group_a16_mgpu, path='mgpu'), in one run.

Sessions 27-28 ran it to find the launch rule (group_decode_params; NOTES.md):
    PYTHONPATH=. python3 benchmarks/probe_group_decode_plain.py --shapes all --m 1 \
        --grid 1,2,4,8,16:2 --loads rule --out $OUT/group_rule_m1.json
--loads: bytes, words (e2m1 codes 8 a 32-bit load) or rule (group_decode_params' choice).
W4A4 formats (nvfp4, mxfp4) get the dispatcher and group_a16_mgpu only. --det adds deterministic
mode: the dispatcher's (the decode kernel's since session 29) and group_a16_mgpu's det_params
launch, e.g.:
    PYTHONPATH=. python3 benchmarks/probe_group_decode_plain.py --shapes all --m 1,16 \
        --grid none --det --out $OUT/group_det.json On CPU it runs a tiny
interpreted smoke of the same ops.
"""

from __future__ import annotations

import argparse

import jax

from jqlin import bench
from jqlin.kernels.pallas_fp4 import apply, nvfp4_post_scale
from pallas_kernels.group_a16_decode_mgpu import group_a16_decode_mgpu, group_decode_params

KERNEL_OF = {"nvfp4_a16": "pallas_nvfp4", "mxfp4_a16": "pallas_mxfp4",
             "mxfp8_a16": "pallas_mxfp8", "nvfp4": "pallas_nvfp4", "mxfp4": "pallas_mxfp4"}


def _operands(qw):
    """(fmt, w, w_scale, col_scale, post) of a weight-only group QuantizedWeight, as the
    dispatcher reads them (jqlin.kernels.pallas_fp4.apply)."""
    wk = qw.spec.weight
    fmt = "nvfp4" if wk.scale_dtype == "float8_e4m3fn" else "mxfp4" if wk.is_fp4 else "mxfp8"
    col, post = nvfp4_post_scale(qw, qw.spec) if fmt == "nvfp4" else (None, "none")
    return fmt, qw.data, qw.scale, col, post


def plain_op(spec_name: str, splits: int | None, stages: int | None,
             load: str = "bytes") -> bench.Op:
    """The decode kernel at that launch (None, None: group_decode_params')."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        fmt, w, s, col, post = _operands(qw)
        how = group_decode_params(fmt, *qw.storage_shape).load if load == "rule" else load
        return qw.trim_rows(group_a16_decode_mgpu(fmt, x, w, s, col, post=post, splits=splits,
                                                  stages=stages, load=how,
                                                  interpret=interpret))
    tag = "" if load == "bytes" or splits is None else f"_{load}"
    launch = "rule" if splits is None else f"k{splits}_st{stages}"
    return bench.Op(f"plain_{launch}{tag}", spec_name, "default", fn)


def det_op(spec_name: str, range_parts: int | None) -> bench.Op:
    """The decode kernel in deterministic mode's order (group_a16_decode_mgpu(deterministic=
    True): the dispatcher's since session 29) with range_parts of the K parts a CTA (None: the
    least). (Session 30's plain_det_overlap rows: an option removed since, commit 06b3456.)"""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        fmt, w, s, col, post = _operands(qw)
        return qw.trim_rows(group_a16_decode_mgpu(fmt, x, w, s, col, post=post,
                                                  deterministic=True, range_parts=range_parts,
                                                  interpret=interpret))
    name = "plain_det" + (f"_rp{range_parts}" if range_parts else "")
    return bench.Op(name, spec_name, "det", fn)


def warp_specialized_op(spec_name: str, deterministic: bool = False) -> bench.Op:
    """group_a16_mgpu (path='mgpu'), which default mode ran at M <= 16 before session 28 (and
    deterministic mode before session 29)."""
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        return apply(x, qw, qw.spec, path="mgpu", deterministic=deterministic,
                     interpret=interpret)
    return bench.Op("group_a16_mgpu", spec_name, "det" if deterministic else "default", fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="")
    p.add_argument("--shapes", default="4096x4096,8192x8192,4096x28672,14336x4096")
    p.add_argument("--m", default="1,16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--formats", default="nvfp4_a16,mxfp4_a16")
    p.add_argument("--grid", default="1,2,4,8:2",
                   help="SPLITS:STAGES lists of explicit launches (weight-only formats), or none")
    p.add_argument("--det", action="store_true",
                   help="also deterministic mode: the dispatcher's and the decode kernel's")
    p.add_argument("--no-ws", action="store_true",
                   help="leave out group_a16_mgpu in default mode")
    p.add_argument("--det-range-parts", default="",
                   help="with --det: the decode kernel's deterministic launches, K parts a CTA "
                        "(a multiple of det_range_parts')")
    p.add_argument("--rule", action="store_true",
                   help="also the decode kernel at its own launch rule (group_decode_params)")
    p.add_argument("--loads", default="rule",
                   help="bytes,words: how e2m1 codes are read (rule: group_decode_params')")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    shapes = [("tiny", 1024, 128)] if cpu else bench.parse_shapes(args.shapes)
    grid = bench.parse_launch_grid(args.grid)
    ops = [bench.bf16_op()]
    for spec_name in args.formats.split(","):
        ops.append(bench.kernel_op(KERNEL_OF[spec_name], spec_name))
        if not args.no_ws:
            ops.append(warp_specialized_op(spec_name))
        if args.det:
            ops += [bench.kernel_op(KERNEL_OF[spec_name], spec_name, deterministic=True),
                    warp_specialized_op(spec_name, deterministic=True)]
        if not spec_name.endswith("_a16"):  # (W4A4: the dispatcher quantizes x first)
            continue
        if args.det and args.det_range_parts:
            ops += [det_op(spec_name, int(r)) for r in args.det_range_parts.split(",")]
        loads = [ld for ld in args.loads.split(",")
                 if ld != "words" or not spec_name.startswith("mxfp8")]
        ops += [plain_op(spec_name, sp, st, ld) for ld in loads for sp, st in grid]
        if args.rule:
            ops.append(plain_op(spec_name, None, None, "rule"))
    bench.run_and_report(shapes, tuple(int(v) for v in args.m.split(",")), ops, reps=args.reps,
                         out=args.out, smoke=cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
