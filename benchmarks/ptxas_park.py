"""ptxas's register and spill report for deterministic in-CTA parts at 128-row x tiles, one
left fold vs the two-group order's parked first-half sum (session 15; run on the GPU machine
with MOSAIC_GPU_DUMP_PTXAS=1, which prints ptxas -v for every Mosaic GPU kernel compiled).

    MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=. python3 benchmarks/ptxas_park.py
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu


def main() -> int:
    m, n, k = 4096, 8192, 8192
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jnp.ones((n, k), jnp.float8_e4m3fn)
    ws = jnp.ones((n // 128, k // 128), jnp.float32)
    for name, p in (("one_fold", dict(k_parts=8)), ("parked", dict(k_parts=8, k_groups=2))):
        print(f"== {name}", flush=True)
        f = jax.jit(lambda *a, p=p: fp8_block_a16_matmul_mgpu(*a, block_m=128, **p))
        jax.block_until_ready(f(x, w, ws))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
