"""What XLA compiles W8A16's dense formula into at decode sizes: the optimized HLO's GEMM
fusions and custom calls, with their backend configs (emitter, tiles, split-K), per shape and M.

Why (NOTES session 24, item 1): at M = 2-8 XLA's GEMM of bf16 x with the e4m3 codes converted
inside it ran 0.80-1.00 of the Mosaic W8A16 kernel's time on the same bytes; at M=1 XLA emits
a reduction instead. This prints which kernels and tile / split-K choices those are, no timing.

    PYTHONPATH=. python3 benchmarks/xla_gemm_config.py [--shapes 4096x4096,8192x8192] [--m 1,2,8]
"""

from __future__ import annotations

import argparse
import re

import jax
import jax.numpy as jnp

from jqlin import bench
from pallas_kernels.fp8_dense import fp8_dense_matmul

# the lines of the optimized HLO that say which kernel runs: fusions of the dot and GEMM calls
_KERNEL_LINE = re.compile(r"(kind=k\w+|custom_call_target=|triton_gemm_config|block_m|split_k"
                          r"|__cublas|__triton|reduce\()")
_CONFIG = re.compile(r'"(?:triton_gemm_config|block_level_fusion_config|gemm_backend_config|'
                     r'custom_fusion_config)":\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')


def dense_a16(x: jax.Array, w: jax.Array) -> jax.Array:
    """The dispatcher's dense path for W8A16 (fp8_dense), one per-tensor scale of 1."""
    return fp8_dense_matmul(x, None, w, jnp.ones((1, 1), jnp.float32), x_scale_kind="none",
                            w_scale_kind="tensor", out_dtype=x.dtype)


FORMULATIONS = {"dense": dense_a16, "two_rows": bench.two_rows(dense_a16, "zeros"),
                "broadcast_rows": bench.two_rows(dense_a16, "broadcast")}


def kernel_lines(fn, m: int, k: int, n: int) -> list[str]:
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    w = jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn)
    text = jax.jit(fn).lower(x, w).compile().as_text()
    out = []
    for ln in text.splitlines():
        if not _KERNEL_LINE.search(ln):
            continue
        head, _, config = ln.strip().partition("backend_config=")
        out.append(head.split(", metadata=")[0][:300])
        # the emitter's choices (tiles, split-K, stages, warps) sit in the backend config
        out += ["    " + c for c in _CONFIG.findall(config)]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    cpu = jax.default_backend() == "cpu"
    p.add_argument("--shapes", default="512x256" if cpu else "4096x4096,8192x8192,14336x4096",
                   help="KxN,...")
    p.add_argument("--m", default="1,2,8")
    args = p.parse_args(argv)
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        for m in map(int, args.m.split(",")):
            for name, fn in FORMULATIONS.items():
                if m > 1 and name != "dense":
                    continue
                print(f"== {name} K={k} N={n} M={m}")
                for ln in kernel_lines(fn, m, k, n):
                    print("  " + ln)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
