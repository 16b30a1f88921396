"""Pieces the Mosaic GPU fp8 kernels share: CTA tiles of 64 rows per compute warpgroup (two
warpgroups: 128 x 128 in fp8_block_mgpu, 128 x 8..128 in fp8_block_a16_mgpu; four, an option
of fp8_block_a16_mgpu: 256 x 8..32), fed by a TMA warpgroup (plgpu's warp-specialized pipeline),
launched in groups of tile rows, each warpgroup's rows stored through shared memory by TMA."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import dtypes  # itemsize_bits: the public dtype API has no sub-byte sizes
from jax._src.pallas.mosaic_gpu import pipeline as _pipeline  # _register_budget's workaround
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu

from .common import finish_rows

__all__ = ["BLOCK", "WG_ROWS", "SMEM_BYTES", "swizzled", "tile_index", "warpgroup_pipeline",
           "store_rows", "store_wg_rows", "store_piece", "zero_total", "weight_scale_rows",
           "TMA_ROW_F32", "block_scale_tiles", "walk_tiles", "pad_x_tiles",
           "interpret_params", "mgpu_kernel", "COMPUTE_WGS", "RowFinish",
           "finish_rows", "div_full"]

BLOCK = 128  # K-block of the scales, and the CTA tile in M and N
WG_ROWS = 64  # output rows per compute warpgroup
COMPUTE_WGS = (2, 4)  # compute warpgroups per CTA (plus the TMA one)
# shared memory a CTA may allocate on sm_90 (what Mosaic GPU reports on the H200), less 2 KB
# for the pipeline's barriers and alignment
SMEM_BYTES = 232448 - 2048
# float32 values in 128 bytes: TMA writes shared memory at 128-byte-aligned addresses, so a
# pipeline buffer of narrower float32 rows puts the next stage's off that alignment
# (CUDA_ERROR_MISALIGNED_ADDRESS on an H100, session 49: rows of 8 / 16 values)
TMA_ROW_F32 = 32


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


def walk_tiles(run_tile, count: int, persistent: bool) -> None:
    """run_tile(t) for this CTA's launch indices t < count: persistent, every programs-th from
    its own (the TMA warpgroup prefetches the next tile's operands while the compute
    warpgroups finish this one, and this tile's output store overlaps the next tile's MMAs);
    else the CTA's one index (a CTA per tile)."""
    if persistent:
        @plgpu.nd_loop((count,), collective_axes="tile")
        def _tiles(info):
            run_tile(info.index[0])
    else:
        run_tile(lax.axis_index("tile"))


def pad_x_tiles(xq: jax.Array, x_scale: jax.Array) -> tuple[jax.Array, jax.Array, int]:
    """x's codes and scales padded to whole 128-row tiles -- zero codes, unit scales: rows the
    caller slices off -- and the padded row count."""
    m = xq.shape[0]
    mp = -(-m // BLOCK) * BLOCK
    if mp != m:
        xq = jnp.pad(xq, ((0, mp - m), (0, 0)))
        x_scale = jnp.pad(x_scale, ((0, mp - m), (0, 0)), constant_values=1.0)
    return xq, x_scale, mp


MEMORY_REGISTERS = 40  # per thread of the TMA warpgroup (setmaxnreg.dec)


def _register_budget(compute_wgs: int) -> int:
    """Registers per compute thread that `setmaxnreg.inc` can get: ptxas launches a kernel that
    uses setmaxnreg at its cap, 65536 / threads rounded down to 8 (168 for three warpgroups, 96
    for five), and an increase draws only on what the TMA warpgroup's decrease frees. Upstream
    (jax 0.11.2 pipeline._compute_registers) divides 512 - 40 per 128 threads instead: right
    for two compute warpgroups (232), but 112 for four, which the pool cannot give -- the
    kernel hangs (H200, session 8: 104 runs)."""
    cap = 65536 // (128 * (compute_wgs + 1)) // 8 * 8
    return (cap + (cap - MEMORY_REGISTERS) // compute_wgs) // 8 * 8


@contextlib.contextmanager
def _patched_register_split():
    # the pipeline reads the budget when traced, inside the kernel: patched for that call only
    original = _pipeline._compute_registers
    _pipeline._compute_registers = lambda memory, n: _register_budget(n)
    try:
        yield
    finally:
        _pipeline._compute_registers = original


def warpgroup_pipeline(body, context, *, steps: int, in_specs, stages: int,
                       compute_wgs: int = 2):
    """plgpu's warp-specialized pipeline over `steps` K-steps: a TMA warpgroup, compute_wgs
    (two by default) compute warpgroups running `body` inside `context`, with the registers
    per compute thread of _register_budget (232 for two, 104 for four -- enough for x tiles of
    up to 32 rows)."""
    pipeline = plgpu.emit_pipeline_warp_specialized(
        body, grid=(steps,), memory_registers=MEMORY_REGISTERS, in_specs=in_specs,
        wg_axis="wg", num_compute_wgs=compute_wgs, max_concurrent_steps=stages,
        compute_context=context)

    if _register_budget(compute_wgs) == _pipeline._compute_registers(MEMORY_REGISTERS,
                                                                     compute_wgs):
        return pipeline  # upstream's split is right here (two compute warpgroups)

    def run(*gmem_refs, **kw):
        with _patched_register_split():
            return pipeline(*gmem_refs, **kw)
    run.get_allocations = pipeline.get_allocations
    return run


def zero_total(shape) -> jax.Array:
    """A float32 zero in wgmma's accumulator layout (a warpgroup's running total)."""
    return plgpu.layout_cast(jnp.zeros(shape, jnp.float32), plgpu.Layout.WGMMA)


class RowFinish(NamedTuple):
    """What a swap-AB kernel's float32 sums (rows: weight rows, i.e. output columns) go through
    before their rounding: times `factor`, then times (op "mul") or divided by ("div") `col`,
    one float32 value per weight row (NVFP4's decode factor and global scale; FP8's channel
    scales), one for every row ((1,): a tensor scale) or none (None: the factor alone, MX's).
    Applied by the
    kernel where its CTAs round their own output, else by XLA after the sums -- the same float32
    operations in the same order, so the same bits."""
    col: jax.Array | None  # (N,) or (1,) float32 (the caller's cast: group_a16_mgpu), or None
    factor: float
    op: str  # "mul" | "div"

    def xla(self, yt: jax.Array) -> jax.Array:
        """On y^T (N, M), outside the kernel."""
        return finish_rows(yt, None if self.col is None else self.col[:, None], self.factor,
                           self.op)


def div_full(a: jax.Array, b: jax.Array, *, interpret: bool) -> jax.Array:
    """float32 a / b inside a Mosaic GPU kernel (b: a's shape, or one value to broadcast) as
    XLA:GPU divides: PTX div.full.f32 (XLA compiles with -nvptx-prec-divf32=1; Triton's `/` is
    the same instruction), where Mosaic's own `/` is IEEE div.rn.f32 -- the two differ in the
    last bit of ~30% of quotients (H100, session 44), enough to move a bf16 rounding now and
    then (common.finish_rows). a, b in Layout.WGMMA on the GPU; the interpreter divides as its
    XLA does (`/`)."""
    if b.ndim == 0:
        b = lax.broadcast_in_dim(b, a.shape, ())
    if interpret:
        return a / b
    layout = plgpu.Layout.WGMMA
    out = plgpu.ShapeDtypeStruct(a.shape, a.dtype, layout=layout)

    @plgpu.inline_mgpu(arg_types=(layout, layout), return_type=out)
    def div(ctx, num, den):
        del ctx
        return num._pointwise(mgpu.FragmentedArray._lift_fast_instr("div.full.f32"), den)

    return div(plgpu.layout_cast(a, layout), plgpu.layout_cast(b, layout))


def store_wg_rows(total, *, out_smem, out_gmem, row_slice, col_slice,
                  transposed: bool = False) -> None:
    """Store this warpgroup's 64 rows of the tile (row_slice, col_slice of out_gmem) through its
    slot of out_smem ((compute warpgroups, 64, columns)), once the slot's last store has read
    it -- in pieces of out_smem's columns where it holds fewer than the tile's.
    transposed: out_gmem holds the transpose ((columns, rows) of the same tile: a swap-AB
    kernel writing y, not y^T) and out_smem's slots are (columns, 64), written through a
    transposed view (stmatrix .trans), so no XLA pass transposes the output after."""
    wg = lax.axis_index("wg")
    cols = out_smem.shape[1 if transposed else 2]
    wg_rows = pl.ds(wg * WG_ROWS, WG_ROWS)
    for c in range(0, total.shape[1], cols):
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        piece_cols = pl.ds(col_slice.start + c, cols)
        store_piece(total if cols == total.shape[1] else total[:, c:c + cols], out_smem.at[wg],
                    out_gmem.at[piece_cols, row_slice].at[:, wg_rows] if transposed else
                    out_gmem.at[row_slice].at[wg_rows, piece_cols], transposed)


def store_piece(piece, slot, out_piece, transposed: bool = False) -> None:
    """piece (64 rows, columns) -> out_piece, its place in the output, through the staging slot
    (whose last store the caller has waited for): rounded to the slot's dtype, written, and
    copied out by TMA. transposed: out_piece is its (columns, 64) place in a transposed output
    and the slot is (columns, 64), written through a transposed view (stmatrix .trans)."""
    if transposed:
        slot.transpose((1, 0))[...] = piece.astype(slot.dtype)
    else:
        slot[...] = piece.astype(slot.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(slot, out_piece)


def store_rows(run, *, out_smem, out_gmem, row_slice, col_slice, parts: bool = False,
               transposed: bool = False, finish=None) -> None:
    """A pipeline's compute context: run it from a zero float32 total, then store this
    warpgroup's 64 rows of the tile (store_wg_rows; transposed: as its transpose).
    parts: the carry is (running part, sum of finished parts), both from zero; the latter is
    stored. finish: applied to the warpgroup's float32 total before (RowFinish, in the CTA)."""
    zero = zero_total((WG_ROWS, out_smem.shape[1]) if transposed else out_smem.shape[1:])
    total = run((zero, zero))[1] if parts else run(zero)
    if finish is not None:
        total = finish(total)
    store_wg_rows(total, out_smem=out_smem, out_gmem=out_gmem, row_slice=row_slice,
                  col_slice=col_slice, transposed=transposed)


def weight_scale_rows(w_scale: jax.Array, kind: str, n: int, k: int) -> jax.Array:
    """A weight's scales as one float32 row per 128-wide K-block with one value per weight row,
    (K/128, N), so TMA moves a K-block's row beside its tiles. kind: "block" (N/128, K/128),
    "channel" (N, 1) or "tensor" (1, 1)."""
    ws = w_scale.astype(jnp.float32).T
    if kind == "block":
        return jnp.repeat(ws, BLOCK, axis=1)
    return jnp.broadcast_to(ws, (k // BLOCK, n))


def block_scale_tiles(w_scale: jax.Array) -> jax.Array:
    """128x128 block scales (N/128, K/128) as one float32 row per K-block holding each
    128-wide weight tile's scale TMA_ROW_F32 times, (K/128, N/128 * TMA_ROW_F32): a tile's
    pipeline buffer is then one aligned 128-byte row a K-block rather than weight_scale_rows'
    128 copies (512 bytes), and the whole array a quarter of that layout's."""
    return jnp.repeat(w_scale.astype(jnp.float32).T, TMA_ROW_F32, axis=1)


def interpret_params(interpret) -> plgpu.InterpretGPUParams | bool:
    """Mosaic GPU's interpreter parameters for `interpret` (True: the defaults, with every
    buffer -- outputs and shared memory -- starting as NaN, so an element a kernel never
    writes stays NaN: the interpreter tests' poisoned outputs), or False on a GPU."""
    if isinstance(interpret, plgpu.InterpretGPUParams):
        return interpret
    return plgpu.InterpretGPUParams(uninitialized_memory="nan") if interpret else False


def mgpu_kernel(body, out_type: jax.ShapeDtypeStruct, ctas: int, interpret,
                compute_wgs: int = 2):
    """plgpu.kernel with a 1-D grid named "tile" and compute_wgs + 1 warpgroups named "wg"."""
    return plgpu.kernel(
        body, out_type=out_type, grid=(ctas,), grid_names=("tile",), num_threads=compute_wgs + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
        interpret=interpret_params(interpret))
