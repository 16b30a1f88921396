"""Float32 outputs and wider activations, side by side in one process against bf16
`jnp.dot`: the kernel's bf16 output (`matmul(x)`), its float32 output (`matmul(x,
out_dtype=float32)`, what row-parallel layers and float32-promoting QuantDense layers run since
session 36) and the float32 x they ran before (`matmul(x.astype(float32))`: since session 38
weight-only kernels run its three exact bf16 parts stacked as rows; before, the Triton kernels'
float32 dot or in-kernel parts). `f16_x`: a float16 x (the 4-bit / MX weight-only kernels:
two bf16 parts as rows; FP8 W8A16 takes it as it is).

    PYTHONPATH=. python benchmarks/bench_out_dtype.py --out $OUT/out_dtype.json
    python benchmarks/bench_out_dtype.py --smoke      # CPU: 256x256, the interpreter
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from jqlin import bench, dispatch

FORMATS = "nvfp4_a16,mxfp4_a16,mxfp8_a16,fp8_per_channel_a16,fp8_block_a16,nvfp4,fp8_ptpc"
VARIANTS = {
    "bf16_out": lambda x: (x, None),
    "f32_out": lambda x: (x, jnp.float32),
    "f32_x": lambda x: (x.astype(jnp.float32), None),
    "f16_x": lambda x: (x.astype(jnp.float16), None),
}


def ops(fmts: list[str], deterministic: bool, interpret: bool,
        variants: list[str] | None = None) -> list[bench.Op]:
    out = [bench.bf16_op()]
    kernel = "auto"
    for fmt in fmts:
        for variant in variants or list(VARIANTS):
            prep = VARIANTS[variant]
            def fn(x, qw, prep=prep, fmt=fmt):
                xx, out_dtype = prep(x)
                name = kernel
                if interpret:  # (the interpreter: the format's Pallas kernel forced)
                    name = dispatch.kernels_for(qw.spec)[0]
                y = dispatch.matmul(xx, qw, kernel=name, deterministic=deterministic,
                                    out_dtype=out_dtype)
                return y.astype(jnp.float32)  # (every variant ends in float32)
            out.append(bench.Op(f"{variant}", fmt, "det" if deterministic else "default", fn,
                                config={"variant": variant}))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="")
    p.add_argument("--formats", default=FORMATS)
    p.add_argument("--m", default="1,16,256,4096")
    p.add_argument("--shapes", default="8192x8192,14336x4096", help="KxN list")
    p.add_argument("--det", action="store_true", help="deterministic mode")
    p.add_argument("--variants", default=",".join(VARIANTS), help="of " + ",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="CPU: one tiny shape, the interpreter")
    args = p.parse_args(argv)
    fmts = args.formats.split(",")
    variants = args.variants.split(",")
    if unknown := sorted(set(variants) - set(VARIANTS)):
        p.error(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    smoke = args.smoke or jax.default_backend() == "cpu"
    shapes = [("smoke", 256, 256)] if smoke else [
        ("probe", *(int(v) for v in s.split("x"))) for s in args.shapes.split(",")]
    ms = [2] if smoke else [int(v) for v in args.m.split(",")]
    bench.run_and_report(shapes, ms, ops(fmts, args.det, smoke, variants),
                         reps=1 if smoke else args.reps, out=args.out, smoke=smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
