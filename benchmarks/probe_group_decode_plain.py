"""NVFP4 / MXFP4 / MXFP8 weight-only decode on Mosaic GPU's plain pipeline, several CTAs an SM
(session 26, prepared: the device budget was spent before it could run; a probe, not wired into
the dispatcher).

Why: session 26 moved FP8 W8A16 decode with whole-K scales from the warp-specialized Mosaic
kernel (fp8_block_a16_mgpu: setmaxnreg, so one CTA an SM) to a plain-pipeline kernel of one
warpgroup and 64 weight rows a CTA (pallas_kernels.fp8_a16_decode_mgpu: 85-91 registers, about
five CTAs an SM), +5% geomean at M=1 and 16 over 11 shapes. The group formats' decode
(group_a16_mgpu) runs on the same one-CTA-an-SM kernel: at M=1 1.96x (NVFP4) / 1.78x (MXFP4)
bf16 geomean, at best 2.42x / 2.09x, against a 3.0x target (README). Here: that plain kernel with the group decode in registers
(mgpu_group_decode.decode: e2m1 codes x group scales -> bf16, exact, wgmma's A operand), one
step = the K-blocks whose scale bytes fill a 16-byte TMA row (NVFP4 2, MX 4), each range's
float32 sums to a slab, XLA adds them in K order and applies NVFP4's post factor and global
scale (RowFinish, as group_a16_mgpu's XLA finish). The launch is the FP8 kernel's
(fp8_a16_decode_mgpu.plain_slabs), the group decode its A operand.

Prediction: registers ~110-130 (the decoded tile, the splats), so 3-4 CTAs an SM; with the
decode's extra ALU work per byte the gain over group_a16_mgpu at M=1 should be at least the
FP8 one (+5%) on the small shapes, where the fixed cost dominates. First run:
    MOSAIC_GPU_DUMP_PTXAS=1 PYTHONPATH=. python3 benchmarks/probe_group_decode_plain.py --check
    PYTHONPATH=. python3 benchmarks/probe_group_decode_plain.py --shapes all --m 1,16 \
        --grid 1,2,4,8:2,4 --out $OUT/group_plain.json
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

from jqlin import bench, qweight
from jqlin.kernels.pallas_fp4 import nvfp4_post_scale
from pallas_kernels.fp8_a16_decode_mgpu import plain_slabs
from pallas_kernels.launch import sum_splits
from pallas_kernels.mgpu_common import BLOCK, WG_ROWS, RowFinish
from pallas_kernels.mgpu_group_decode import FORMATS, decode, decode_jnp

F32 = jnp.float32
FORMAT_OF = {"nvfp4_a16": "nvfp4", "mxfp4_a16": "mxfp4", "mxfp8_a16": "mxfp8"}


def group_decode_plain(fmt: str, x: jax.Array, w: jax.Array, w_scale: jax.Array,
                       finish: RowFinish | None, *, splits: int, stages: int,
                       interpret: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) bf16 @ (code(w) * scale(w_scale))^T, then `finish` per column
    (NVFP4's post factor and global scale); M <= 16. w, w_scale as group_a16_matmul_mgpu takes
    them: packed e2m1 uint8 (N, K/2) or e4m3 (N, K); e4m3 (N, K/16) or e8m0 uint8 (N, K/32).
    The launch is the FP8 decode kernel's (fp8_a16_decode_mgpu.plain_slabs) with the group
    decode as its A operand."""
    f = FORMATS[fmt]
    m, k = x.shape
    n = w.shape[0]
    blocks = max(1, 16 // f.scale_bytes)  # K-blocks a step: a 16-byte TMA row of scales
    if m > 16 or n % WG_ROWS or k % (blocks * BLOCK * splits):
        raise ValueError(f"group_decode_plain: M <= 16, N % {WG_ROWS} == 0, K % "
                         f"{blocks * BLOCK * splits} == 0 (splits={splits}), got M={m}, N={n}, "
                         f"K={k}")
    codes = lax.bitcast_convert_type(w, jnp.int4).reshape(n, k) if f.elem == "e2m1" else w

    def a_tile(w_ref, s_ref):  # one K-block's codes and group scales -> bf16 weights
        if interpret:  # the values decode gives, by jnp
            return decode_jnp(w_ref[...], s_ref[...], f)
        if f.elem == "e2m1":
            return decode(plgpu.load(w_ref, layout=plgpu.Layout.WGMMA), s_ref, f)
        return decode(w_ref[...].astype(F32).astype(x.dtype), s_ref, f)  # e4m3: exact first

    parts = plain_slabs(x, codes, lax.bitcast_convert_type(w_scale, jnp.uint8), splits=splits,
                        stages=stages, a_tile=a_tile, blocks=blocks, interpret=interpret)
    total = sum_splits(parts, splits, n, parts.shape[2])  # ranges in K order
    total = total * f.post_factor if finish is None else finish.xla(total)
    return total.T[:m].astype(x.dtype)


def _operands(qw):
    """(fmt, w, w_scale, finish) of a weight-only group QuantizedWeight, as the dispatcher
    reads them (jqlin.kernels.pallas_fp4.apply)."""
    wk = qw.spec.weight
    fmt = "nvfp4" if wk.scale_dtype == "float8_e4m3fn" else "mxfp4" if wk.is_fp4 else "mxfp8"
    finish = None
    if fmt == "nvfp4":
        col, post = nvfp4_post_scale(qw, qw.spec)
        finish = RowFinish(col.astype(F32), FORMATS[fmt].post_factor, post)
    return fmt, qw.data, qw.scale, finish


def plain_op(spec_name: str, splits: int, stages: int) -> bench.Op:
    interpret = jax.default_backend() == "cpu"

    def fn(x, qw):
        fmt, w, s, finish = _operands(qw)
        return group_decode_plain(fmt, x, w, s, finish, splits=splits, stages=stages,
                                  interpret=interpret)
    return bench.Op(f"plain_k{splits}_st{stages}", spec_name, "default", fn)


def check(interpret: bool) -> float:
    """Worst |y - ref| / bound against the float64 product of the dequantized weights, each
    format at M=1 (one and two K ranges) and M=11."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for spec_name in FORMAT_OF:
        for m, n, k, splits in ((1, 128, 1024, 2), (11, 64, 512, 1)):
            w = jnp.asarray(rng.standard_normal((n, k)) * rng.uniform(0.1, 3, (n, 1)), F32)
            qw = qweight.quantize(w, spec_name)
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
            fmt, wq, s, finish = _operands(qw)
            y = np.asarray(group_decode_plain(fmt, x, wq, s, finish, splits=splits, stages=2,
                                              interpret=interpret).astype(F32), np.float64)
            xd = np.asarray(x.astype(F32), np.float64)
            wd = np.asarray(qw.dequantize(), np.float64)
            ref = xd @ wd.T
            bound = (np.abs(xd) @ np.abs(wd).T) * 1e-5 + np.abs(ref) * 2.0 ** -8
            if not np.isfinite(y).all():  # (the interpreter starts every buffer as NaN)
                return math.inf
            worst = max(worst, float((np.abs(y - ref) / bound).max()))
    return worst


def lowers_for_cuda(spec_name: str, m: int = 1, n: int = 4096, k: int = 4096) -> bool:
    """Whether the GPU form of the kernel (decode in registers, inline PTX) lowers for CUDA."""
    qw = qweight.quantize(jnp.ones((n, k), F32), spec_name)
    fmt, w, s, finish = _operands(qw)
    x = jnp.ones((m, k), jnp.bfloat16)
    f = jax.jit(lambda x, w, s: group_decode_plain(fmt, x, w, s, finish, splits=2, stages=2))
    return "mosaic_gpu" in f.trace(x, w, s).lower(lowering_platforms=("cuda",)).as_text()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true")
    p.add_argument("--lower", action="store_true",
                   help="lower each format's GPU kernel for CUDA (works on CPU) and exit")
    p.add_argument("--out", default="")
    p.add_argument("--shapes", default="4096x4096,8192x8192,4096x28672,14336x4096")
    p.add_argument("--m", default="1,16")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--formats", default="nvfp4_a16,mxfp4_a16")
    p.add_argument("--grid", default="1,2,4,8:2,4", help="SPLITS:STAGES lists")
    args = p.parse_args(argv)
    cpu = jax.default_backend() == "cpu"
    if args.lower:
        for spec_name in FORMAT_OF:
            print(spec_name, "lowers for CUDA:", lowers_for_cuda(spec_name))
        return 0
    if args.check:
        worst = check(cpu)
        print(f"group_decode_plain vs float64: worst |y-ref|/bound {worst:.3g}")
        return 0 if worst <= 1 else 1
    shapes = [("tiny", 1024, 256)] if cpu else bench.parse_shapes(args.shapes)
    splits, stages = (tuple(int(v) for v in part.split(",")) for part in args.grid.split(":"))
    ops = [bench.bf16_op()]
    for spec_name in args.formats.split(","):
        kernel = "pallas_nvfp4" if spec_name.startswith("nvfp4") else (
            "pallas_mxfp4" if spec_name.startswith("mxfp4") else "pallas_mxfp8")
        ops += [bench.kernel_op(kernel, spec_name)] + [
            plain_op(spec_name, sp, st) for sp in splits for st in stages]
    bench.run_and_report(shapes, tuple(int(v) for v in args.m.split(",")), ops, reps=args.reps,
                         out=args.out, smoke=cpu)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
