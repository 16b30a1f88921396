"""Device probes behind benchmarks/NOTES.md (not the benchmark itself).

  decode    M=1 K=N=8192: W8A16 configs timed one call per dispatch (host loop, no inner
            batching) next to a Pallas pure-read kernel over the same fp8 bytes and XLA's
            own read (row sums), to separate kernel, harness and Pallas-codegen limits.
  accuracy  fp8_ptpc / fp8_block at real K: kernel vs XLA reference vs float64 from the very
            codes the kernel consumed, per config (promotion interval, MMA tile).
Usage: PYTHONPATH=. python benchmarks/probe_fp8.py decode|accuracy
"""

from __future__ import annotations

import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jqlin import dispatch, qweight
from jqlin.kernels.pallas_fp8 import quantize_x, w8a16_apply, w8a8_apply
from pallas_kernels import MatmulConfig as C

F32 = jnp.float32


def _loop_time(f, args_list, iters=60):
    jax.block_until_ready(f(*args_list[0]))
    jax.block_until_ready(f(*args_list[1 % len(args_list)]))
    t0 = time.perf_counter()
    out = None
    for i in range(iters):
        out = f(*args_list[i % len(args_list)])
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def _read_kernel(w_ref, o_ref, *, bn, bk, steps):
    """Sum |w| over each row tile: reads every weight byte once (a bandwidth ceiling)."""
    n0 = pl.program_id(0) * bn
    k_base = pl.program_id(1) * steps * bk

    def step(i, acc):
        return acc + w_ref[pl.ds(n0, bn), pl.ds(k_base + i * bk, bk)].astype(F32)

    acc = jax.lax.fori_loop(0, steps, step, jnp.zeros((bn, bk), F32))
    o_ref[pl.ds(pl.program_id(1), 1), pl.ds(n0, bn)] = jnp.sum(acc, axis=1)[None, :]


def pallas_read(w, *, bn, bk, split, warps, stages):
    n, k = w.shape
    steps = k // bk // split
    return pl.pallas_call(
        functools.partial(_read_kernel, bn=bn, bk=bk, steps=steps),
        out_shape=jax.ShapeDtypeStruct((split, n), F32), grid=(n // bn, split),
        in_specs=[pl.no_block_spec], out_specs=pl.no_block_spec,
        compiler_params=pltriton.CompilerParams(num_warps=warps, num_stages=stages))(w)


def decode():
    k = n = 8192
    key = jax.random.key(0)
    ws = [qweight.quantize(jax.random.normal(jax.random.fold_in(key, i), (n, k), F32),
                           "fp8_per_channel_a16") for i in range(3)]
    wb = [jax.random.normal(jax.random.fold_in(key, 10 + i), (n, k), jnp.bfloat16)
          for i in range(2)]
    xs = [jax.random.normal(jax.random.fold_in(key, 20 + i), (1, k), jnp.bfloat16)
          for i in range(3)]
    mb = n * k / 1e6
    print(f"K=N={k} M=1, fp8 weight {mb:.1f} MB; per-call times (host loop, one product per "
          "dispatch)")
    bf16 = jax.jit(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))))
    t = _loop_time(bf16, [(xs[i % 3], wb[i % 2]) for i in range(6)])
    print(f"  bf16 dot                      {t * 1e6:7.1f} us  {2 * mb / t / 1e6:5.2f} TB/s")
    xla_read = jax.jit(lambda w: jnp.sum(w.data.astype(F32), axis=1))
    t = _loop_time(xla_read, [(w,) for w in ws])
    print(f"  XLA row-sum read of fp8       {t * 1e6:7.1f} us  {mb / t / 1e6:5.2f} TB/s")
    for bn, bk, split, warps, stages in [(64, 256, 2, 4, 3), (32, 512, 2, 4, 3),
                                         (64, 256, 4, 8, 3), (16, 1024, 1, 4, 2),
                                         (128, 128, 2, 4, 4)]:
        f = jax.jit(functools.partial(pallas_read, bn=bn, bk=bk, split=split, warps=warps,
                                      stages=stages))
        try:
            t = _loop_time(f, [(w.data,) for w in ws])
            print(f"  pallas read {bn}x{bk} sk{split} w{warps}s{stages}   {t * 1e6:7.1f} us  "
                  f"{mb / t / 1e6:5.2f} TB/s")
        except Exception as e:
            print(f"  pallas read {bn}x{bk}: {type(e).__name__}: {str(e)[:200]}")
    cfgs = [C(16, 64, 256, 4, 4, 2), C(16, 64, 256, 8, 4, 4), C(16, 32, 512, 4, 3, 2),
            C(16, 128, 128, 8, 5, 4), C(16, 64, 512, 8, 3, 4), C(16, 64, 256, 4, 2, 4),
            C(16, 64, 256, 4, 4, 8), C(1, 64, 256, 8, 3, 4, variant="gemv")]
    for cfg in cfgs:
        f = jax.jit(lambda x, w, cfg=cfg: w8a16_apply(x, w, w.spec, config=cfg))
        try:
            t = _loop_time(f, [(xs[i], ws[i]) for i in range(3)])
            print(f"  w8a16 {cfg.variant} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} "
                  f"w{cfg.num_warps}s{cfg.num_stages} sk{cfg.split_k}  {t * 1e6:7.1f} us  "
                  f"{mb / t / 1e6:5.2f} TB/s")
        except Exception as e:
            print(f"  w8a16 {cfg}: {type(e).__name__}: {str(e)[:200]}")


def accuracy():
    rng = np.random.default_rng(0)
    for fmt, k, n in [("fp8_ptpc", 4096, 6144), ("fp8_block", 7168, 2624)]:
        w = rng.standard_normal((n, k)) * rng.uniform(0.1, 3, (n, 1))
        qw = qweight.quantize(jnp.asarray(w, F32), fmt)
        wd = np.asarray(qw.dequantize_storage(), np.float64)
        for m in (1, 64):
            x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1)),
                            jnp.bfloat16)
            q, s, kind = quantize_x(x, qw, qw.spec)
            sx = np.asarray(s, np.float64)
            xq = np.asarray(q.astype(F32), np.float64) * (
                np.repeat(sx, 128, 1) if kind == "group" else sx)
            y64 = (xq @ wd.T)[:, :n]
            bound = (np.abs(xq) @ np.abs(wd).T)[:, :n]
            ref = np.asarray(dispatch.matmul(x, qw, kernel="xla").astype(F32), np.float64)
            ref32 = np.asarray(jax.jit(lambda x: dispatch.matmul(
                x.astype(F32), qw, kernel="xla"))(x), np.float64)
            line = [f"{fmt} M={m}: xla-ref(bf16 out) {_err(ref, y64, bound)}",
                    f"xla-ref(f32 in/out) {_err(ref32, y64, bound)}"]
            cfgs = {"heuristic": None, "bm16/p-": C(16, 64, 128, 4, 4),
                    "bm16/p128": C(16, 64, 128, 4, 4, promote_k=128),
                    "bm64/p-": C(64, 128, 128, 4, 4), "bm64/p128": C(64, 128, 128, 4, 4,
                                                                     promote_k=128)}
            for name, cfg in cfgs.items():
                y = jax.jit(lambda x, cfg=cfg: w8a8_apply(x.astype(F32), qw, qw.spec,
                                                          config=cfg))(x)
                line.append(f"{name} {_err(np.asarray(y, np.float64), y64, bound)}")
            print("\n    ".join(line))


def _err(y, y64, bound):
    rel = np.linalg.norm(y - y64) / np.linalg.norm(y64)
    return f"rel {rel:.1e} max/bound {np.max(np.abs(y - y64) / bound):.1e}"


def ncu_targets():
    """A few launches for Nsight Compute: the decode kernel (2 configs) and the pure read."""
    k = n = 8192
    w = qweight.quantize(jax.random.normal(jax.random.key(0), (n, k), F32), "fp8_per_channel_a16")
    x = jax.random.normal(jax.random.key(1), (1, k), jnp.bfloat16)
    for cfg in (C(16, 64, 256, 4, 4, 2), C(16, 64, 256, 4, 3, 4, k_unroll=2)):
        f = jax.jit(lambda x, w, cfg=cfg: w8a16_apply(x, w, w.spec, config=cfg))
        for _ in range(2):
            jax.block_until_ready(f(x, w))
    f = jax.jit(functools.partial(pallas_read, bn=64, bk=256, split=2, warps=4, stages=3))
    for _ in range(2):
        jax.block_until_ready(f(w.data))


if __name__ == "__main__":
    {"decode": decode, "accuracy": accuracy, "ncu": ncu_targets}[sys.argv[1]]()
