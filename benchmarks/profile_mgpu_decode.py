"""Launch the Mosaic W8A16 decode kernel's weight streams once each inside a profiler range, for
Nsight Compute to read their pipe and stall counters (session 9; no timing here).

    ncu --clock-control none --set full -k regex:mosaic_gpu -o decode \
        python3 benchmarks/profile_mgpu_decode.py [--shape 28672x8192] [--m 1]
    ncu --import decode.ncu-rep --csv --page raw > decode_raw.csv      # on the GPU machine

Cases, one weight matrix (N, K) and M rows of x: XLA's bf16 dot, and benchmarks/
probe_w4_mgpu.py's streams through the kernel's decode settings -- fp8 with one and two
K-blocks per step, int4 codes (two per step), bf16 weights (the structure's own ceiling).
Every case is compiled and run once first; with --range the second launches run between
cuProfilerStart and cuProfilerStop (for `ncu --profile-from-start off`; session 9: that
segfaulted under JAX, so the default is ncu's kernel-name filter -- Mosaic GPU kernels are
named *_mosaic_gpu_kernel). On CPU the interpreter runs a
small shape with no profiler (a smoke run).
"""

from __future__ import annotations

import argparse
import ctypes

import jax

from jqlin import bench
from probe_w4_mgpu import stream_op


def _profiler(call: str, on: bool) -> None:
    if not on or jax.default_backend() == "cpu":
        return
    rc = getattr(ctypes.CDLL("libcuda.so.1"), call)()
    if rc != 0:
        raise RuntimeError(f"{call} returned CUDA error {rc}")


def cases(cpu: bool):
    yield bench.bf16_op()
    yield stream_op("fp8")
    yield stream_op("fp8", blocks=2)
    if not cpu:  # (the interpreter has no int4 -> bf16 conversion in registers)
        yield stream_op("int4", blocks=2)
    yield stream_op("bf16")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="28672x8192", help="KxN")
    p.add_argument("--m", type=int, default=1)
    p.add_argument("--range", action="store_true",
                   help="launch the profiled cases between cuProfilerStart / cuProfilerStop")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    k, n = (512, 256) if cpu else map(int, args.shape.split("x"))
    key = jax.random.key(0)
    x = jax.random.normal(key, (args.m, k), jax.numpy.bfloat16)
    runs = []
    for op in cases(cpu):
        w = bench._make_weight(jax.random.fold_in(key, 1), op.fmt, n, k)
        fn = jax.jit(op.fn)
        jax.block_until_ready(fn(x, w))  # compile and warm up outside the profiled range
        runs.append((op.name, fn, w))
    _profiler("cuProfilerStart", args.range)
    for name, fn, w in runs:
        y = jax.block_until_ready(fn(x, w))
        print(f"{name}: {args.m}x{k} @ {n}x{k} -> {y.shape}", flush=True)
    _profiler("cuProfilerStop", args.range)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
