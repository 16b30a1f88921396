"""Time the fp8 dense path (pallas_kernels.fp8_dense) against the Triton kernel and bf16 at
prefill M, side by side in one process (wall clock of back-to-back jitted calls; at these sizes
the kernels run ~0.1-2 ms, far above dispatch). A quick check, not the grid (bench_matmul.py).

    PYTHONPATH=. python3 benchmarks/check_dense.py [--shape 8192x8192] [--m 1024,4096]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jqlin
from jqlin import bench


def _time(f, *args, calls: int = 20) -> float:
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready([f(*args) for _ in range(calls)])
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="8192x8192", help="KxN")
    p.add_argument("--m", default="1024,4096")
    args = p.parse_args(argv)
    k, n = (int(v) for v in args.shape.split("x"))
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    wb = w.astype(jnp.bfloat16)
    print(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}; K={k} N={n}")
    for m in (int(v) for v in args.m.split(",")):
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        t_bf16 = _time(jax.jit(lambda a, b: jnp.dot(a, b.T, preferred_element_type=jnp.float32
                                                    ).astype(a.dtype)), x, wb)
        for fmt in ("fp8_per_channel_a16", "fp8_ptpc", "fp8_per_tensor"):
            qw = jqlin.quantize(w, fmt, calibration=x if fmt == "fp8_per_tensor" else None)
            times = {}
            for path in ("pallas", "dense"):  # pallas: the Triton kernel's config for this M
                f = jax.jit(bench.fp8_op(fmt, path, path=path).fn)
                times[path] = _time(f, x, qw)
            print(f"M={m:5d} {fmt:20s} bf16 {t_bf16 * 1e6:8.1f} us | pallas "
                  f"{times['pallas'] * 1e6:8.1f} us ({t_bf16 / times['pallas']:.2f}x) | dense "
                  f"{times['dense'] * 1e6:8.1f} us ({t_bf16 / times['dense']:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
