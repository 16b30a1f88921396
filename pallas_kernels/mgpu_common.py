"""Pieces the Mosaic GPU fp8 kernels share: CTA tiles of 128 rows (128 x 128 in fp8_block_mgpu,
128 x 8..128 in fp8_block_a16_mgpu) computed by two compute warpgroups of 64 rows each, fed by a
TMA warpgroup (plgpu's warp-specialized pipeline), launched in groups of tile rows, each
warpgroup's rows stored through shared memory by TMA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import dtypes  # itemsize_bits: the public dtype API has no sub-byte sizes
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["BLOCK", "WG_ROWS", "SMEM_BYTES", "swizzled", "tile_index", "two_warpgroup_pipeline",
           "store_rows", "weight_scale_rows", "interpret_params", "mgpu_kernel"]

BLOCK = 128  # K-block of the scales, and the CTA tile in M and N
WG_ROWS = 64  # output rows per compute warpgroup (two per CTA)
# shared memory a CTA may allocate on sm_90 (what Mosaic GPU reports on the H200), less 2 KB
# for the pipeline's barriers and alignment
SMEM_BYTES = 232448 - 2048


def swizzled(dtype, cols: int = BLOCK) -> tuple:
    """Shared-memory transforms for rows of `cols` elements of dtype (sub-byte ones included), as
    TMA and wgmma read them."""
    bits = dtypes.itemsize_bits(dtype)
    swizzle = plgpu.find_swizzle(cols * bits)
    return plgpu.TilingTransform((8, swizzle * 8 // bits)), plgpu.SwizzleTransform(swizzle)


def tile_index(t, m_tiles: int, n_tiles: int, group_m: int):
    """(m, n) tile of launch index t: groups of group_m tile rows walked column by column, so
    the CTAs resident at once share their A rows and B columns in L2."""
    width = group_m * n_tiles
    first_m = (t // width) * group_m
    rows = jnp.minimum(m_tiles - first_m, group_m)
    return first_m + (t % width) % rows, (t % width) // rows


def two_warpgroup_pipeline(body, context, *, steps: int, in_specs, stages: int):
    """plgpu's warp-specialized pipeline over `steps` K-steps: a TMA warpgroup, two compute
    warpgroups running `body` inside `context`."""
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(steps,), memory_registers=40, in_specs=in_specs, wg_axis="wg",
        num_compute_wgs=2, max_concurrent_steps=stages, compute_context=context)


def store_rows(run, *, out_smem, out_gmem, row_slice, col_slice, parts: bool = False) -> None:
    """A pipeline's compute context: run it from a zero float32 total, then store this
    warpgroup's 64 rows of the tile through shared memory (out_smem: (2, 64, tile columns)).
    parts: the carry is (running part, sum of finished parts), both from zero; the latter is
    stored."""
    wg = lax.axis_index("wg")
    zero = plgpu.layout_cast(jnp.zeros(out_smem.shape[1:], jnp.float32), plgpu.Layout.WGMMA)
    total = run((zero, zero))[1] if parts else run(zero)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the previous tile's store has read it
    out_smem[wg] = total.astype(out_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(
        out_smem.at[wg], out_gmem.at[row_slice].at[pl.ds(wg * WG_ROWS, WG_ROWS), col_slice])


def weight_scale_rows(w_scale: jax.Array, kind: str, n: int, k: int) -> jax.Array:
    """A weight's scales as one float32 row per 128-wide K-block with one value per weight row,
    (K/128, N), so TMA moves a K-block's row beside its tiles. kind: "block" (N/128, K/128),
    "channel" (N, 1) or "tensor" (1, 1)."""
    ws = w_scale.astype(jnp.float32).T
    if kind == "block":
        return jnp.repeat(ws, BLOCK, axis=1)
    return jnp.broadcast_to(ws, (k // BLOCK, n))


def interpret_params(interpret) -> plgpu.InterpretGPUParams | bool:
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    return plgpu.InterpretGPUParams() if interpret else False


def mgpu_kernel(body, out_type: jax.ShapeDtypeStruct, ctas: int, interpret):
    """plgpu.kernel with a 1-D grid named "tile" and three warpgroups named "wg"."""
    return plgpu.kernel(
        body, out_type=out_type, grid=(ctas,), grid_names=("tile",), num_threads=3,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params(interpret))
