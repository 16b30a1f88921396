"""Per-kernel device times (CUPTI) of the group-scaled formats' dense path (default mode,
M >= 1024) with group_dequant's Pallas pass and with XLA's dequantization, side by side in one
process: which kernels XLA runs for each (a separate dequantization pass, or one fused into
its GEMM), and what each costs.

    PYTHONPATH=. python benchmarks/probe_dense_kernels.py --out $OUT/probe_dense.json
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jqlin import bench, qweight
from jqlin.kernels.pallas_fp4 import apply
from pallas_kernels.mx_dense import xla_dequantization

SHAPES = ((8192, 8192), (14336, 4096), (7168, 24576))  # (K, N)


def _fn(xla_dequant: bool, interpret: bool):
    def fn(x, qw):
        if not xla_dequant:
            return apply(x, qw, qw.spec, interpret=interpret)
        with xla_dequantization():
            return apply(x, qw, qw.spec, interpret=interpret)
    return jax.jit(fn)


def run(formats, ms, shapes, calls: int) -> list[dict]:
    gpu = jax.default_backend() == "gpu"
    rng = np.random.default_rng(0)
    records = []
    for k, n in shapes:
        w = jnp.asarray(rng.standard_normal((n, k)) * 0.05, jnp.float32)
        for fmt in formats:
            qw = qweight.quantize(w, fmt)
            for m in ms:
                x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
                for tag, xla in (("pass", False), ("xla_dequant", True)):
                    fn = _fn(xla, not gpu)
                    jax.block_until_ready(fn(x, qw))
                    kernels = bench.kernel_medians_us(fn, (x, qw), calls, name_chars=90)
                    rec = dict(fmt=fmt, k=k, n=n, m=m, variant=tag, kernels_us=kernels,
                               total_us=sum(kernels.values()))
                    print(f"{fmt} K={k} N={n} M={m} {tag}: {rec['total_us']:.1f} us "
                          f"{ {kn: round(v, 1) for kn, v in kernels.items()} }", flush=True)
                    records.append(rec)
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out")
    p.add_argument("--formats", default="nvfp4_a16,mxfp4_a16,mxfp8_a16")
    p.add_argument("--m", default="1024,4096")
    p.add_argument("--calls", type=int, default=10)
    args = p.parse_args(argv)
    small = jax.default_backend() == "cpu"
    shapes = ((256, 128),) if small else SHAPES
    ms = (32,) if small else tuple(int(v) for v in args.m.split(","))
    records = run(args.formats.split(","), ms, shapes, 2 if small else args.calls)
    if args.out:
        bench.write_records(args.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
