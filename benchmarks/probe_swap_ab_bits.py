"""Does a swap-AB fp8 wgmma give a K-block's chain the same bits as the plain one? (GPU probe,
session 49.)

Deterministic block W8A8 (`fp8_block`) runs Triton's kernels at every M: the Mosaic kernel
(fp8_block_mgpu, default mode from M = 256) is 1.29-1.55x faster at M = 4096 (H100, session
48) but has no decode launch of its own bits. A decode launch that reads each weight byte once
at M = 1-16 is swap-AB: the weight tile (64 rows, 128 K) as wgmma's A operand, x^T (8-64 rows)
as its B, giving part^T. fp8_block_mgpu computes part = x-tile (64 rows) @ w-tile^T. Each
output's products are the same; whether the tensor core adds them in the same order and
precision with the operands' roles swapped is what this probe measures.

Per case (K = 128, one wgmma chain from zero, as each of fp8_block_mgpu's K-blocks):
  plain: A = x (64 rows), B = w (128 rows)^T  -> (64, 128)
  swap:  A = w (64 of those rows), B = x (`rows` of its rows)^T -> (64, rows)
and compares swap[i, j] with plain[j, i] bit for bit, rows in {8, 16, 64}; also the fraction
of either equal to the float64 sum (how far the fp8 accumulation is from exact). Random e4m3
codes over their whole range (not zeros), fresh per seed.
Prediction: bitwise at every width (the same k-ordered products per output); both a little
off float64 (fp8 wgmma accumulates with fewer than float32's bits).
Measured: see NOTES.md, session 49.

    PYTHONPATH=. python3 benchmarks/probe_swap_ab_bits.py --out $OUT/swap_ab_bits.json
    PYTHONPATH=. python3 benchmarks/probe_swap_ab_bits.py --seeds 1 --out /tmp/s.json  (CPU:
        Mosaic GPU's interpreter, a smoke run)
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mgpu_common import BLOCK, WG_ROWS, interpret_params, swizzled

F32, E4M3 = jnp.float32, jnp.float8_e4m3fn
WIDTHS = (8, 16, 64)


def chain(a: jax.Array, b: jax.Array, *, interpret: bool) -> jax.Array:
    """(rows of a, rows of b) float32 = a @ b^T by one fp8 wgmma chain from zero (a: 64 rows,
    b: 8-256 rows, both (rows, 128) e4m3, K-major)."""
    ra, rb = a.shape[0], b.shape[0]

    def body(a_gmem, b_gmem, out_gmem, a_smem, b_smem, out_smem, a_bar, b_bar):
        plgpu.copy_gmem_to_smem(a_gmem, a_smem, a_bar)
        plgpu.copy_gmem_to_smem(b_gmem, b_smem, b_bar)
        plgpu.barrier_wait(a_bar)
        plgpu.barrier_wait(b_bar)

        def run(acc):
            plgpu.wgmma(acc, a_smem, b_smem.transpose((1, 0)))
            plgpu.wgmma_wait(0)
            return acc[...]

        out_smem[...] = pl.run_scoped(run, plgpu.ACC((ra, rb), F32))
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(out_smem, out_gmem)
        plgpu.wait_smem_to_gmem(0)

    call = plgpu.kernel(
        body, out_type=jax.ShapeDtypeStruct((ra, rb), F32), grid=(1,), grid_names=("tile",),
        num_threads=1, thread_name="wg",
        scratch_types=[plgpu.SMEM((ra, BLOCK), E4M3, transforms=swizzled(E4M3)),
                       plgpu.SMEM((rb, BLOCK), E4M3, transforms=swizzled(E4M3)),
                       plgpu.SMEM((ra, rb), F32), plgpu.Barrier(num_arrivals=1),
                       plgpu.Barrier(num_arrivals=1)],
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params(interpret))
    return call(a, b)


def _codes(rng, shape) -> jax.Array:
    """Random finite e4m3 codes over the whole range (NaN codes 0x7f / 0xff excluded)."""
    raw = rng.integers(0, 256, shape, dtype=np.uint8)
    raw = np.where((raw & 0x7F) == 0x7F, raw ^ 0x01, raw)
    return jnp.asarray(raw.view(jnp.dtype(E4M3)))


def _same(a, b) -> float:
    return float((np.asarray(a, np.float32).view(np.uint32)
                  == np.asarray(b, np.float32).view(np.uint32)).mean())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, default=8)
    args = p.parse_args(argv)
    interpret = jax.default_backend() == "cpu"
    run = jax.jit(lambda a, b: chain(a, b, interpret=interpret))
    rows = []
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        x = _codes(rng, (WG_ROWS, BLOCK))
        w = _codes(rng, (BLOCK, BLOCK))
        exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T  # (64, 128)
        plain = np.asarray(run(x, w))
        for width in WIDTHS:
            for half in (0, 1):  # w rows 0-63 and 64-127 as the swap's A tile
                w_rows = slice(half * WG_ROWS, (half + 1) * WG_ROWS)
                swap = np.asarray(run(w[w_rows], x[:width]))  # (64 w rows, width x rows)
                ref = plain[:width, w_rows].T
                rows.append(dict(seed=seed, width=width, w_half=half,
                                 bitwise=bool(_same(swap, ref) == 1.0),
                                 equal_frac=_same(swap, ref),
                                 plain_exact_frac=_same(ref, exact[:width, w_rows].T),
                                 swap_exact_frac=_same(swap, exact[:width, w_rows].T),
                                 max_abs_diff=float(np.abs(swap - ref).max())))
                print(json.dumps(rows[-1]), flush=True)
    summary = dict(device=str(jax.devices()[0].device_kind), jax=jax.__version__,
                   interpret=interpret, cases=len(rows),
                   all_bitwise=all(r["bitwise"] for r in rows),
                   by_width={w: all(r["bitwise"] for r in rows if r["width"] == w)
                             for w in WIDTHS}, rows=rows)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print("all bitwise:", summary["all_bitwise"], summary["by_width"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
