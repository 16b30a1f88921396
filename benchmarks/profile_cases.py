"""Launch a few W8A16 / W8A8 decode kernels once each, for a profiler to look at (no timing).

    ncu --target-processes all -k regex:fp8_w8a -c 8 --csv --page details \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section LaunchStats --section WarpStateStats \
        python3 benchmarks/profile_cases.py > ncu.csv    # on the GPU machine
    python3 benchmarks/ncu_summary.py ncu.csv --kernels fp8_w8a

The Triton functions are named fp8_w8a16 / fp8_w8a8. Without `-k`, ncu replays every kernel
JAX launches (start-up included) and did not reach these cases in 170 s (session 3).

Cases (8192x8192 weights, fresh random data): W8A16 per-channel at M=1 (default gemv), at M=2
(gemv 1x16x256, k_unroll 2: bytes in flight like M=1's, yet ~0.6 of copy bandwidth), at M=16
(the 16-row MMA tile, <= 0.82); W8A8 per-tensor at M=16 (the same tile with fp8 MMAs and no
e4m3 -> bf16 conversion: ~1.1). Each runs twice: a warm-up (compiles) and the profiled launch.
On CPU the kernels run in interpret mode (a smoke run of this script).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jqlin
from jqlin.kernels.pallas_fp8 import w8a16_apply
from pallas_kernels import MatmulConfig


def cases(k: int, n: int):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((n, k)), jnp.float32)
    x16 = jnp.asarray(rng.standard_normal((16, k)), jnp.bfloat16)
    a16 = jqlin.quantize(w, "fp8_per_channel_a16")
    a8 = jqlin.quantize(w, "fp8_per_tensor", calibration=x16)
    gemv2 = MatmulConfig(1, 16, 256, num_warps=4, num_stages=1, variant="gemv", k_unroll=2,
                         split_k=2)
    interpret = jax.default_backend() == "cpu"
    yield "w8a16 M=1 default", lambda: jqlin.matmul(x16[:1], a16)
    yield "w8a16 M=2 gemv u2", jax.jit(lambda x: w8a16_apply(x, a16, a16.spec, config=gemv2,
                                                             interpret=interpret)), x16[:2]
    yield "w8a16 M=16 default", lambda: jqlin.matmul(x16, a16)
    yield "w8a8 per-tensor M=16 default", lambda: jqlin.matmul(x16, a8)


def main() -> int:
    small = jax.default_backend() == "cpu"
    for name, fn, *args in cases(*((1024, 128) if small else (8192, 8192))):
        for _ in range(2):
            y = jax.block_until_ready(fn(*args))
        print(f"{name}: out {y.shape} {y.dtype}, finite {bool(jnp.isfinite(y).all())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
