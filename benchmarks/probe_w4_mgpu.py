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

import jax
import jax.numpy as jnp

from jqlin import bench
from pallas_kernels.fp8_block_a16_mgpu import _launch, _scale_operand, launch_params


STREAMS = ("int4", "fp8", "int8", "bf16")
# the weight format each stream's bytes come from (None: the bf16 baseline's matrix)
STREAM_FORMATS = {"int4": "nvfp4_a16", "fp8": "fp8_block_a16", "int8": "fp8_block_a16",
                  "bf16": None}


def stream_op(weights: str = "int4", a_in_registers: bool = True,
              stages: int | None = None, blocks: int = 1, wgs: int = 2,
              a_load: str = "wgmma") -> bench.Op:
    """The Mosaic W8A16 kernel with its decode settings on: the NVFP4 weight's bytes as int4
    codes with unit scales (weights="int4", see the docstring); fp8_block_a16 weights ("fp8");
    the same bytes read as int8 ("int8": Mosaic's prmt-based int8 -> bf16 conversion instead of
    e4m3 -> f32 -> bf16 -- same bytes, cheaper conversion; wrong products, time only); or the
    bf16 baseline's weights ("bf16": twice the bytes, no conversion -- the structure's own
    ceiling next to XLA's dot). The converted codes are wgmma's A operand from registers or
    (a_in_registers=False, what the interpreter runs) from shared memory; stages: pipeline
    depth (None: the kernel's, as many as fit up to 8 -- one CTA per SM at decode; bf16: 4);
    blocks: K-blocks per pipeline step; wgs: compute warpgroups per CTA (2 or 4: 64 weight
    rows each; the K ranges follow from the resulting tile count as in the dispatcher); a_load:
    how the weight tile is read into registers (fp8_block_a16_matmul_mgpu's a_load; 8-bit
    streams)."""
    interpret = jax.default_backend() == "cpu"
    a_in_registers = a_in_registers and not interpret

    def fn(x, qw):
        n, k = qw.shape if weights == "bf16" else qw.storage_shape
        rows, scales = jnp.ones((k // 128, n), jnp.float32), "rows"
        if weights == "int4":
            codes = jax.lax.bitcast_convert_type(qw.data, jnp.int4).reshape(n, k)
        elif weights == "int8":
            codes = jax.lax.bitcast_convert_type(qw.data, jnp.int8)
        elif weights == "bf16":  # the kernel sizes its stages for 1-byte weights
            codes = qw
        else:
            # the scales as the dispatcher's kernel reads them (as stored, since session 9)
            codes, (rows, scales) = qw.data, _scale_operand(qw.scale, "block", n, k)
        params = {"group_m": 8, "block_m": 128, "k_splits": 1, "k_parts": 1,
                  **launch_params(x.shape[0], n, k, interpret, compute_wgs=wgs),
                  "a_in_registers": a_in_registers,
                  "stages": stages or (max(2, 4 // blocks) if weights == "bf16" else None),
                  "blocks_per_step": blocks, "a_load": a_load, "scales": scales}
        return _launch(x, codes, rows, out_dtype=jnp.dtype(x.dtype), interpret=interpret,
                       **params)
    name = (f"mgpu_{weights}_stream" + ("" if a_in_registers else "_smem")
            + ("" if stages is None else f"_stages{stages}")
            + ("" if blocks == 1 else f"_blocks{blocks}") + ("" if wgs == 2 else f"_wg{wgs}")
            + ("" if a_load == "wgmma" else f"_{a_load}"))
    return bench.Op(name, STREAM_FORMATS[weights], "default", fn)


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
                   help="2: also time the streams with two K-blocks per pipeline step")
    p.add_argument("--wgs", default="2",
                   help="comma list of compute warpgroups per CTA (2, 4) for the streams; 4 "
                        "skips bf16 (its 64 KB weight tiles)")
    p.add_argument("--a-loads", default="wgmma",
                   help="comma list of fp8_block_a16_matmul_mgpu a_load values for the 8-bit "
                        "streams (fp8, int8), e.g. wgmma,relabel_4x")
    p.add_argument("--streams", default="int4,fp8",
                   help=f"comma list of {STREAMS}: the streams timed (int4 also from shared "
                        "memory)")
    p.add_argument("--smoke", action="store_true",
                   help="one product per call, one call per sample (CPU smoke test: the "
                        "interpreter's time; the timings mean nothing)")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    ops = [bench.bf16_op(), bench.kernel_op("pallas_nvfp4", "nvfp4_a16"),
           bench.kernel_op("pallas_fp8_w8a16", "fp8_block_a16")]
    streams = [w for w in args.streams.split(",") if w]
    if unknown := set(streams) - set(STREAMS):
        p.error(f"--streams: unknown {sorted(unknown)}; choose from {STREAMS}")
    wgs = [int(v) for v in args.wgs.split(",")]
    if "int4" in streams and not cpu:
        ops.append(stream_op(a_in_registers=False))
    blocks = [1] + ([args.blocks] if args.blocks > 1 else [])
    # the interpreter runs only shared-memory A operands
    loads = [v for v in args.a_loads.split(",") if v]
    ops += [stream_op(w, a_in_registers=not cpu, blocks=b, wgs=g, a_load=a)
            for g in wgs for b in blocks for w in streams for a in loads
            if not (g == 4 and w == "bf16") and (a == "wgmma" or w in ("fp8", "int8"))]
    ops += [stream_op(weights, stages=int(s)) for s in args.stages.split(",") if s
            for weights in streams]
    bench.run_and_report(bench.parse_shapes(args.shapes), [int(v) for v in args.m.split(",")],
                         ops, reps=args.reps, out=args.out, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
