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

_DIMS = (((1,), (1,)), ((), ()))
# the lines of the optimized HLO that say which kernel runs: fusions of the dot and GEMM calls
_KERNEL_LINE = re.compile(r"(kind=k\w+|custom_call_target=|triton_gemm_config|block_m|split_k"
                          r"|__cublas|__triton|reduce\()")
_CONFIG = re.compile(r'"(?:triton_gemm_config|block_level_fusion_config|gemm_backend_config|'
                     r'custom_fusion_config)":\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')


def dense_a16(x: jax.Array, w: jax.Array) -> jax.Array:
    """The dense path's W8A16 formula (fp8_dense at M <= FUSED_CONVERT_MAX_M): XLA's astype."""
    y = jax.lax.dot_general(x, w.astype(x.dtype), _DIMS, precision=jax.lax.Precision.HIGHEST,
                            preferred_element_type=jnp.float32)
    return y.astype(x.dtype)


def two_rows(x: jax.Array, w: jax.Array) -> jax.Array:
    """M=1 as two rows (a zero row appended), row 0 kept."""
    return dense_a16(jnp.pad(x, ((0, 1), (0, 0))), w)[:1]


def broadcast_rows(x: jax.Array, w: jax.Array) -> jax.Array:
    """M=1 as two rows (x broadcast), row 0 kept: does XLA keep the broadcast in its GEMM?"""
    return dense_a16(jnp.broadcast_to(x, (2, x.shape[1])), w)[:1]


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
            cases = [("dense", dense_a16)] + ([("two_rows", two_rows),
                                                ("broadcast_rows", broadcast_rows)] if m == 1 else [])
            for name, fn in cases:
                print(f"== {name} K={k} N={n} M={m}")
                for ln in kernel_lines(fn, m, k, n):
                    print("  " + ln)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
