"""The W8A16 decode kernel (pallas_kernels.fp8_a16_decode_mgpu) on the GPU, over and over:
decode_params' launch on each shape, `--iters` times on fresh x, each result checked against
the float64 bound; a device fault is reported and ends the run. Session 26 ran it (then with
an --rows option for the in-CTA finish, since dropped) plain and under
`compute-sanitizer --tool memcheck`, chasing the CUDA_ERROR_LAUNCH_FAILED that the in-CTA
finish gave in the benchmark on 4096 x 28672 at M=1 (NOTES.md): no fault, no error there.

    PYTHONPATH=. python3 benchmarks/probe_decode_fault.py --shapes 4096x28672 --m 1,9,16
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from jqlin import bench
from pallas_kernels import fp8_a16_decode_mgpu as decode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4096x28672")
    p.add_argument("--m", default="1")
    p.add_argument("--kinds", default="channel,tensor")
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    interpret = jax.default_backend() == "cpu"
    rng = np.random.default_rng(0)
    bad = 0
    for _, k, n in bench.parse_shapes(args.shapes):
        w = jnp.asarray(rng.standard_normal((n, k)) * 4, jnp.float8_e4m3fn)
        wd = np.asarray(w.astype(jnp.float32), np.float64)
        for kind in args.kinds.split(","):
            ws = jnp.asarray(rng.uniform(0.01, 2, (n, 1) if kind == "channel" else (1, 1)),
                             jnp.float32)
            f = jax.jit(lambda x, w, ws, kind=kind: decode.fp8_a16_decode_mgpu(
                x, w, ws, scale_kind=kind, interpret=interpret))
            wsd = wd * np.broadcast_to(np.asarray(ws, np.float64), (n, 1))
            wsd_t, abs_t = np.ascontiguousarray(wsd.T), np.ascontiguousarray(np.abs(wsd).T)
            for m in (int(v) for v in args.m.split(",")):
                worst = 0.0
                try:
                    for _ in range(args.iters):
                        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
                        y = np.asarray(f(x, w, ws).astype(jnp.float32), np.float64)
                        xd = np.asarray(x.astype(jnp.float32), np.float64)
                        ref = xd @ wsd_t
                        tol = 1e-5 * (np.abs(xd) @ abs_t) + 2.0 ** -7 * np.abs(ref)
                        worst = max(worst, float(np.max(np.abs(y - ref) / tol))
                                    if np.isfinite(y).all() else float("inf"))
                    status = "ok" if worst <= 1 else "WRONG"
                except Exception as e:  # the fault: reported, the probe stops (the context
                    # is lost after a launch failure)
                    print(f"K={k} N={n} M={m} {kind}: FAULT "
                          f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
                    return 2
                bad += status != "ok"
                print(f"K={k} N={n} M={m} {kind} "
                      f"{decode.decode_params(n, k)}: {status} (worst |y-ref|/tol {worst:.3g})",
                      flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
