"""What bounds the Mosaic W8A16 kernel at prefill sizes: per-kernel device times of its
predecoded launch (one K range, and PREFILL_K_PARTS in-CTA parts) beside XLA's bf16 dot and
JAX's own Mosaic GPU Hopper matmul (bf16) at several CTA tiles, with and without 2-CTA
clusters sharing an operand tile by TMA multicast -- and, under Nsight Compute, each kernel
once (`--profile`: cuProfilerStart / Stop around one call of each case).

    python3 benchmarks/profile_prefill.py --out prefill.json            # times (CUPTI)
    ncu --profile-from-start off --section SpeedOfLight ... -o rep \\
        python3 benchmarks/profile_prefill.py --profile                 # one launch each

Question (NOTES.md session 20): the kernel's CTA tile is 128 weight rows x 128 x rows, so each
128-wide K step moves 64 KB of bf16 tiles into shared memory for 4.2 MFLOP (64 FLOP/B); at
XLA's ~700 TFLOP/s that is ~11 TB/s out of L2. If L2 -> SMEM traffic is the bound, JAX's example
at a 128x128 CTA tile trails its 128x256 tile, and a 2-CTA cluster multicasting the shared
operand recovers it. Also timed: the widening pass alone against XLA's convert (and its
tile variants), the dense per-channel W8A16 path, MX deterministic mode's predecode (XLA's
dequantization of codes and e8m0 scales), and the example at a 192-row tile on 4032 rows (the
accumulator a 192-row x tile would give the swap-AB kernel). On CPU this is a smoke run at
small sizes (interpret mode; the example and the clusters are skipped).
"""

from __future__ import annotations

import argparse
import re
import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jqlin import bench

M, N, K = 4096, 8192, 8192


def _example(m: int, n: int, k: int, *, tile_m: int, tile_n: int, wg: str,
             cluster: str | None = None, delay_release: int = 0):
    """JAX's Hopper matmul example (jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu) on
    a (m, k) @ (k, n) bf16, as its `matmul` launches it, with delay_release passed through."""
    import jax.experimental.pallas.mosaic_gpu as plgpu
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
    dim = hm.MatmulDimension
    config = hm.TuningConfig(tile_m=tile_m, tile_n=tile_n, tile_k=64, max_concurrent_steps=4,
                             epi_tile_m=64, epi_tile_n=64, grid_minor_dim=dim.N,
                             grid_tile_width=8, wg_dimension=dim[wg],
                             cluster_dimension=None if cluster is None else dim[cluster])
    size = 1 + (cluster is not None)
    f = plgpu.kernel(
        functools.partial(hm.kernel, config=config, delay_release=delay_release),
        out_type=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
        grid=(hm.get_num_sms() // size,), grid_names=("cluster_grid",), cluster=(size,),
        cluster_names=("cluster",), num_threads=3, thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
    return lambda a, b: f(a, b, None)


def cases(m: int, n: int, k: int, gpu: bool):
    """(name, jitted fn, args) of every case; the fp8 weight (n, k), its bf16 form (k, n)."""
    from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
    from pallas_kernels.fp8_dense import fp8_dense_matmul
    from pallas_kernels.fp8_widen import widen_e4m3
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w8 = jnp.asarray(rng.standard_normal((n, k)) * 8, jnp.float32).astype(jnp.float8_e4m3fn)
    ws = jnp.asarray(rng.uniform(0.5, 2.0, (n // 128, k // 128)), jnp.float32)
    wt = w8.astype(jnp.bfloat16).T  # (k, n): the example's B, XLA's rhs
    yield "xla_bf16_dot", jax.jit(lambda a, b: jnp.dot(a, b)), (x, wt)
    for parts in (1, 2):
        kw = dict(predecode=True, k_parts=parts, a_in_registers=gpu, interpret=not gpu)
        if not gpu:
            kw.pop("predecode")  # (the interpreter's operands come from shared memory anyway)
        yield (f"a16_predecoded_kparts{parts}",
               jax.jit(lambda a, w, s, kw=kw: fp8_block_a16_matmul_mgpu(a, w, s, **kw)),
               (x, w8, ws))
    # the predecoding pass alone: XLA's convert (session 19's) and fp8_widen's (session 20)
    yield "xla_convert", jax.jit(lambda w: w.astype(jnp.bfloat16)), (w8,)
    yield "widen_e4m3", jax.jit(lambda w: widen_e4m3(w, interpret=not gpu)), (w8,)
    for rows, warps in ((32, 8), (8, 4), (64, 8)):
        yield (f"widen_e4m3_r{rows}_w{warps}", jax.jit(lambda w, r=rows, nw=warps: widen_e4m3(
            w, interpret=not gpu, rows=r, num_warps=nw)), (w8,))
    # the dense W8A16 path of whole-K scales (per-channel), which widens the same way
    wc = jnp.asarray(rng.uniform(0.5, 2.0, (n, 1)), jnp.float32)
    yield "dense_per_channel_a16", jax.jit(lambda a, w, s: fp8_dense_matmul(
        a, None, w, s, x_scale_kind="none", w_scale_kind="channel",
        out_dtype=jnp.bfloat16, interpret=not gpu)), (x, w8, wc)
    # the group-scaled formats' dequantization (the dense path's, and deterministic mode's
    # predecode -- predecode_weights is this pass): XLA's (session 20 measured MX's) beside
    # group_dequant's Pallas pass (session 21), codes of (n, k)
    e8m0 = jnp.asarray(rng.integers(120, 130, (n, k // 32)), jnp.uint8)
    nib = jnp.asarray(rng.integers(0, 256, (n, k // 2)), jnp.uint8)
    from pallas_kernels.group_dequant import dequantize_groups
    from pallas_kernels.mx_dense import dequantize_bf16
    e4m3s = jnp.asarray(rng.uniform(0.01, 2.0, (n, k // 16)), jnp.float32).astype(
        jnp.float8_e4m3fn)
    for fmt, w_, s_, elem, scale, group in (("mxfp8", w8, e8m0, "e4m3", "e8m0", 32),
                                            ("mxfp4", nib, e8m0, "e2m1", "e8m0", 32),
                                            ("nvfp4", nib, e4m3s, "e2m1", "e4m3", 16)):
        kw = dict(elem=elem, scale=scale, group=group)
        yield f"xla_dequant_{fmt}", jax.jit(lambda w, s, kw=kw: dequantize_bf16(
            w, s, **kw)), (w_, s_)
        yield f"group_dequant_{fmt}", jax.jit(lambda w, s, kw=kw: dequantize_groups(
            w, s, interpret=not gpu, **kw)), (w_, s_)
        if gpu and elem == "e2m1":  # the default is the asm decode (session 22); before it:
            yield f"group_dequant_{fmt}_jnp", jax.jit(lambda w, s, kw=kw: dequantize_groups(
                w, s, decode="jnp", **kw)), (w_, s_)
    if not gpu:
        return
    for name, kw in (("ex_cta128x256", dict(tile_m=128, tile_n=128, wg="N")),
                     ("ex_cta128x256_dr1", dict(tile_m=128, tile_n=128, wg="N",
                                                delay_release=1)),
                     ("ex_cta128x256_clM", dict(tile_m=128, tile_n=128, wg="N", cluster="M")),
                     ("ex_cta128x128", dict(tile_m=64, tile_n=128, wg="M")),
                     ("ex_cta128x128_dr1", dict(tile_m=64, tile_n=128, wg="M", delay_release=1)),
                     ("ex_cta128x128_clM", dict(tile_m=64, tile_n=128, wg="M", cluster="M")),
                     ("ex_cta128x128_clN", dict(tile_m=64, tile_n=128, wg="M", cluster="N"))):
        try:
            yield name, jax.jit(_example(m, n, k, **kw)), (x, wt)
        except Exception as e:  # recorded, the others go on
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)
    # x tiles of 192 rows (three 64-row wgmma blocks a warpgroup, weight tiles of 64 rows a
    # warpgroup: the accumulator a 192-row x tile would give our swap-AB kernel) on 4032 rows
    m192 = m // 192 * 192
    for name, kw in (("ex_cta192x128_m4032", dict(tile_m=192, tile_n=64, wg="N")),
                     ("ex_cta128x128_m4032", dict(tile_m=64, tile_n=128, wg="M"))):
        try:
            yield name, jax.jit(_example(m192, n, k, **kw)), (x[:m192], wt)
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


def _check(name: str, y: jax.Array, ref: jax.Array) -> float:
    err = float(jnp.linalg.norm((y.astype(jnp.float32) - ref)) / jnp.linalg.norm(ref))
    print(f"{name}: rel err vs f32 {err:.2e}", flush=True)
    return err


def times(m: int, n: int, k: int, calls: int, only: str | None = None) -> list[dict]:
    """only: a regular expression; cases whose names it does not find are skipped (the first,
    XLA's dot, always runs: it is the others' reference)."""
    gpu = jax.default_backend() == "gpu"
    records = []
    ref = dequant_ref = None
    for name, fn, args in cases(m, n, k, gpu):
        if only and ref is not None and not re.search(only, name):
            continue
        try:
            y = jax.block_until_ready(fn(*args))
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            records.append(dict(case=name, error=f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        if ref is None:  # the first case is XLA's dot of the same bf16 values
            x, wt = args
            ref = jnp.dot(x.astype(jnp.float32), wt.astype(jnp.float32),
                          precision=jax.lax.Precision.HIGHEST)
        if name.startswith("xla_dequant"):  # the reference of the next case's bits
            err, dequant_ref = None, y
        elif name.startswith("group_dequant"):  # bitwise XLA's dequantization (NaN: any NaN)
            a, b = np.asarray(y), np.asarray(dequant_ref)  # bits, NaNs masked (signed zeros
            nan = np.isnan(b.astype(np.float32))  # count)
            err = float(not (np.array_equal(np.isnan(a.astype(np.float32)), nan) and
                             np.array_equal(np.where(nan, 0, a.view(np.uint16)),
                                            np.where(nan, 0, b.view(np.uint16)))))
            print(f"{name}: bitwise XLA's dequantization: {err == 0}", flush=True)
        elif name == "xla_convert" or name.startswith("widen"):  # bitwise the codes' bf16 values
            err = float(not np.array_equal(np.asarray(y).view(np.uint16),
                                           np.asarray(args[0].astype(jnp.bfloat16))
                                           .view(np.uint16)))
            print(f"{name}: bitwise astype: {err == 0}", flush=True)
        elif name == "dense_per_channel_a16":
            x, w8, wc = args
            err = _check(name, y, jnp.dot(x.astype(jnp.float32),
                                          (w8.astype(jnp.float32) * wc).T,
                                          precision=jax.lax.Precision.HIGHEST))
        elif name.startswith("a16"):  # block scales: its own float32 reference
            x, w8, ws = args
            wf = w8.astype(jnp.float32) * jnp.repeat(jnp.repeat(ws, 128, 0), 128, 1)
            err = _check(name, y, jnp.dot(x.astype(jnp.float32), wf.T,
                                          precision=jax.lax.Precision.HIGHEST))
        else:
            err = _check(name, y, ref[:y.shape[0]])
        kernels = bench.kernel_medians_us(fn, args, calls)
        total = sum(kernels.values())
        passes = name == "xla_convert" or name.startswith(("widen", "xla_dequant",
                                                           "group_dequant"))
        rows = args[0].shape[0] if name.startswith("ex_") else m
        flops = 0 if passes else 2 * rows * n * k
        rec = dict(case=name, m=m, n=n, k=k, rel_err=err, kernels_us=kernels, total_us=total,
                   tflops=flops / (total * 1e-6) / 1e12 if total else None,
                   convert_tb_s=(sum(a.nbytes for a in args) + y.nbytes) / (total * 1e-6) / 1e12
                   if total and not flops else None)
        print(f"{name}: {total:.1f} us, {rec['tflops'] or 0:.0f} TFLOP/s "
              f"{rec['convert_tb_s'] or 0:.2f} TB/s  {kernels}", flush=True)
        records.append(rec)
    return records


def profile(m: int, n: int, k: int) -> None:
    """Each case once between cuProfilerStart / Stop (ncu --profile-from-start off)."""
    gpu = jax.default_backend() == "gpu"
    libcuda = ctypes.CDLL("libcuda.so.1") if gpu else None
    for name, fn, args in cases(m, n, k, gpu):
        try:
            jax.block_until_ready(fn(*args))  # compile and warm up outside the profiled range
        except Exception as e:
            print(f"{name}: {type(e).__name__}", flush=True)
            continue
        if libcuda:
            libcuda.cuProfilerStart()
        jax.block_until_ready(fn(*args))
        if libcuda:
            libcuda.cuProfilerStop()
        print(f"profiled {name}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="JSON results")
    p.add_argument("--profile", action="store_true", help="one launch each, for ncu")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--only", help="regular expression: the cases to time (and XLA's dot)")
    args = p.parse_args(argv)
    small = jax.default_backend() == "cpu"
    shape = (128, 256, 256) if small else (M, N, K)
    if args.profile:
        profile(*shape)
        return 0
    records = times(*shape, calls=2 if small else args.calls, only=args.only)
    if args.out:
        bench.write_records(args.out, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
