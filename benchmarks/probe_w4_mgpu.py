"""How fast can a Mosaic GPU kernel stream 4-bit weights at decode? (GPU probe, session 7.)

The NVFP4 / MXFP4 W4A16 target (>= 3x bf16 at M <= 16, issue 4) needs a weight stream at
~80% of the bytes bound (3.56x). The Triton kernels reach 1.0-1.5x, latency-bound (NOTES.md,
session 3). Before building a Mosaic e2m1 kernel, this times its upper bound: the Mosaic W8A16
kernel (fp8_block_a16_mgpu: swap-AB, TMA warpgroup, conversion in registers, decode K ranges)
fed the NVFP4 weight's packed bytes reinterpreted as int4 codes (Mosaic GPU's fast signed
int4 -> bf16 conversion), with unit 128x128 scales. Its results are not NVFP4 products (the
codes are read as integers and the e4m3 group scales are skipped) -- only its time counts, next
to bf16 `jnp.dot`, today's NVFP4 W4A16 path and the fp8 W8A16 Mosaic path, in one process.

    PYTHONPATH=. python3 benchmarks/probe_w4_mgpu.py --out probe_w4.json [--shapes all] [--m 1,16]
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from jqlin import bench
from pallas_kernels.fp8_block_a16_mgpu import _launch, launch_params
from pallas_kernels.mgpu_common import weight_scale_rows


def stream_op(weights: str = "int4", a_in_registers: bool = True,
              stages: int | None = None, blocks: int = 1) -> bench.Op:
    """The Mosaic W8A16 kernel with its decode settings on the NVFP4 weight's bytes as int4 codes
    and unit scales (weights="int4", see the docstring) or on fp8_block_a16 weights ("fp8");
    the converted codes are wgmma's A operand from registers or (a_in_registers=False, what the
    interpreter runs) from shared memory; stages: pipeline depth (None: the kernel's, as many
    as fit up to 8 -- one CTA per SM at decode); blocks: K-blocks per pipeline step."""
    interpret = jax.default_backend() == "cpu"
    a_in_registers = a_in_registers and not interpret

    def fn(x, qw):
        n, k = qw.storage_shape
        if weights == "int4":
            codes = jax.lax.bitcast_convert_type(qw.data, jnp.int4).reshape(n, k)
            rows = jnp.ones((k // 128, n), jnp.float32)
        else:
            codes, rows = qw.data, weight_scale_rows(qw.scale, "block", n, k)
        params = {"group_m": 8, "block_m": 128, "k_splits": 1, "k_parts": 1,
                  **launch_params(x.shape[0], n, k, interpret),
                  "a_in_registers": a_in_registers, "stages": stages,
                  "blocks_per_step": blocks}
        return _launch(x, codes, rows, out_dtype=jnp.dtype(x.dtype), interpret=interpret,
                       **params)
    name = (f"mgpu_{weights}_stream" + ("" if a_in_registers else "_smem")
            + ("" if stages is None else f"_stages{stages}")
            + ("" if blocks == 1 else f"_blocks{blocks}"))
    return bench.Op(name, "nvfp4_a16" if weights == "int4" else "fp8_block_a16", "default", fn)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="probe_w4_mgpu.json")
    p.add_argument("--shapes", default="all")
    p.add_argument("--m", default="1,16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--stages", default="",
                   help="comma list: also time both streams at these pipeline depths")
    p.add_argument("--blocks", type=int, default=1,
                   help="2: also time both streams with two K-blocks per pipeline step")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    ops = [bench.bf16_op(), bench.kernel_op("pallas_nvfp4", "nvfp4_a16"),
           bench.kernel_op("pallas_fp8_w8a16", "fp8_block_a16")]
    if cpu:  # the interpreter runs only shared-memory A operands
        ops.append(stream_op(a_in_registers=False))
    else:
        ops += [stream_op(), stream_op(a_in_registers=False)]
    ops += [stream_op(weights, stages=int(s)) for s in args.stages.split(",") if s
            for weights in ("int4", "fp8")]
    if args.blocks > 1:
        ops += [stream_op(weights, a_in_registers=not cpu, blocks=args.blocks)
                for weights in ("int4", "fp8")]
    result = bench.run(bench.parse_shapes(args.shapes), [int(v) for v in args.m.split(",")],
                       ops, reps=args.reps)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(bench.format_table(result["records"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
