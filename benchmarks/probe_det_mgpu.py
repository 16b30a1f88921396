"""Are the Mosaic GPU kernels bitwise the Triton kernels' deterministic schedules? (GPU probe,
session 6; its answer decides whether deterministic mode may run them, NOTES.md.)

W8A16 block: the Triton deterministic config sums K as contiguous parts (k_parts, or split_k
programs at small M), each part from zero with per-128-K `acc + part * scale`, parts added left to
right; fp8_block_a16_mgpu with k_splits = that part count has the same order, so the bits match
iff both compilers' MMAs and multiply-adds round alike. W8A8 block: the Mosaic kernel keeps one
running total, so it is compared with the Triton deterministic tile forced to k_parts=1 (same
order apart from the parts) as well as with the real deterministic config.

    PYTHONPATH=. python3 benchmarks/probe_det_mgpu.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
from pallas_kernels.fp8_block_mgpu import fp8_block_matmul_mgpu
from pallas_kernels.fp8_core import fp8_matmul
from pallas_kernels.fp8_w8a16 import w8a16_config
from pallas_kernels.fp8_w8a8 import w8a8_config

F32, E4M3 = jnp.float32, jnp.float8_e4m3fn
SHAPES = ((8192, 8192), (4096, 4096), (7168, 2048), (14336, 1024))  # (K, N)


def _compare(a, b) -> dict:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    same = a.view(np.uint32) == b.view(np.uint32)
    return dict(bitwise=bool(same.all()), equal_frac=float(same.mean()),
                max_abs_diff=float(np.abs(a - b).max()), max_abs=float(np.abs(a).max()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="probe_det_mgpu.json")
    p.add_argument("--m", default="1,16,256")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    interp = jax.default_backend() == "cpu"  # CPU: Mosaic GPU's interpreter (a smoke run)
    rows = []
    for k, n in SHAPES:
        w = jnp.asarray(rng.standard_normal((n, k)) * 4, E4M3)
        ws = jnp.asarray(rng.uniform(0.01, 2, (n // 128, k // 128)), F32)
        for m in (int(v) for v in args.m.split(",")):
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
            cfg = w8a16_config(m, n, k, scale_kind="block", x_dtype=x.dtype, deterministic=True)
            triton = jax.jit(lambda x, w, ws, cfg=cfg: fp8_matmul(
                x, None, w, ws, x_scale_kind="none", w_scale_kind="block", config=cfg,
                out_dtype=F32, interpret=interp))(x, w, ws)
            parts = cfg.k_parts * cfg.split_k
            for block_m in sorted({128, 8 if m < 8 else 16 if m <= 16 else 128}):
                mosaic = jax.jit(lambda x, w, ws, bm=block_m: fp8_block_a16_matmul_mgpu(
                    x, w, ws, out_dtype=F32, k_splits=parts, block_m=bm, a_in_registers=not interp,
                    interpret=interp))(x, w, ws)
                rows.append(dict(kind="w8a16_block", k=k, n=n, m=m, block_m=block_m,
                                 triton_config=cfg.to_json(), k_splits=parts,
                                 **_compare(triton, mosaic)))
                print(rows[-1], flush=True)
            if m < 128:
                continue
            xq = jnp.asarray(rng.standard_normal((m, k)) * 8, E4M3)
            xs = jnp.asarray(rng.uniform(0.01, 2, (m, k // 128)), F32)
            _, dcfg = w8a8_config(m, n, k, x_scale_kind="group", w_scale_kind="block",
                                  deterministic=True)
            mosaic = jax.jit(lambda *a: fp8_block_matmul_mgpu(*a, out_dtype=F32,
                                                                 interpret=interp))(xq, xs, w, ws)
            for tag, c in (("det", dcfg), ("det_one_part",
                                          dataclasses.replace(dcfg, k_parts=1, split_k=1))):
                triton = jax.jit(lambda *a, c=c: fp8_matmul(
                    *a, x_scale_kind="group", w_scale_kind="block", config=c,
                    out_dtype=F32, interpret=interp))(xq, xs, w, ws)
                rows.append(dict(kind=f"w8a8_block_{tag}", k=k, n=n, m=m,
                                 triton_config=c.to_json(), **_compare(triton, mosaic)))
                print(rows[-1], flush=True)
            with open(args.out, "w") as f:
                json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows),
                          f, indent=1)
    with open(args.out, "w") as f:
        json.dump(dict(device=str(jax.devices()[0]), jax=jax.__version__, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
