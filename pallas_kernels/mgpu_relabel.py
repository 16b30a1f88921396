"""A weight tile read with 64-bit shared-memory loads, handed to wgmma without moving data.

The W8A16 decode kernel reads its 8-bit weight tile straight into wgmma's register layout: two
values per load, 32 loads per thread and 128 x 128 block (benchmarks/NOTES.md, session 8: the
suspected floor). Mosaic GPU's WGMMA_UPCAST_4X layout gives each thread 8 consecutive values of
a row per load instead. Its registers, split into pairs, hold exactly the row positions that
wgmma's layout gives the same thread -- at other columns, by one fixed permutation P of the
columns inside every 32-column chunk, the same for all threads and rows (derived below from the
layouts' tiling expressions, checked by tests). So the pairs are relabelled as the WGMMA layout
(no instruction) and the tile the MMA sees is the weight with its K columns permuted by P; the
product is the same if x is permuted likewise (`permute_k`), done once per call outside the
kernel. The products are exact either way; the float32 sums run in another order than with
a_load="wgmma", so the bits may differ from it (not for deterministic mode unless used at every
M).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["TILE", "column_permutation", "permute_k", "relabel"]

TILE = (64, 128)  # one compute warpgroup's weight tile (rows, K)


def _positions(layout: fa.TiledLayout, shape=TILE) -> np.ndarray:
    """(128 threads, elements) -> row-major logical index of each element a thread holds, in
    register order then vector order (what thread_idxs computes in IR, here in numpy)."""
    strides = layout.tiling.tile_strides((shape[1], 1))
    rank, tiled = layout.tiled_tiling_rank, layout.tiled_tiling_shape
    dyn = strides[-rank:]

    def delinearize(idx: int, dims) -> list[int]:
        sizes = [d.times if isinstance(d, fa.Replicated) else tiled[d] for d in dims]
        full = [0] * rank
        for pos, (d, size) in enumerate(zip(dims, sizes)):
            if not isinstance(d, fa.Replicated):
                full[d] = idx // int(np.prod(sizes[pos + 1:], dtype=int)) % size
        return full

    out = []
    for t in range(128):
        base = (np.dot(delinearize(t // 32, layout.warp_dims), dyn)
                + np.dot(delinearize(t % 32, layout.lane_dims), dyn))
        out.append([base + np.dot(r, strides) + v * strides[layout.vector_dim]
                    for r in np.ndindex(layout.registers_shape(shape))
                    for v in range(layout.vector_length)])
    return np.asarray(out)


@functools.cache
def _mapping() -> tuple[dict[int, int], np.ndarray]:
    """(pair slot of UPCAST_4X -> register of WGMMA, column map P) or an error."""
    src, dst = _positions(fa.WGMMA_LAYOUT_UPCAST_4X), _positions(fa.WGMMA_LAYOUT)
    pairs_src, pairs_dst = src.reshape(128, -1, 2), dst.reshape(128, -1, 2)
    slots, cols = None, {}
    for t in range(128):
        here = {}
        for row in np.unique(pairs_src[t, :, 0] // TILE[1]):
            a = sorted(np.flatnonzero(pairs_src[t, :, 0] // TILE[1] == row),
                       key=lambda i: pairs_src[t, i, 0])
            b = sorted(np.flatnonzero(pairs_dst[t, :, 0] // TILE[1] == row),
                       key=lambda j: pairs_dst[t, j, 0])
            if len(a) != len(b):
                raise AssertionError("the layouts give a thread different rows")
            for i, j in zip(a, b):
                here[int(i)] = int(j)
                for e in range(2):
                    c_src, c_dst = pairs_src[t, i, e] % TILE[1], pairs_dst[t, j, e] % TILE[1]
                    if cols.setdefault(c_src, c_dst) != c_dst:
                        raise AssertionError("no single column permutation")
        if slots is None:
            slots = here
        elif slots != here:
            raise AssertionError("the register relabelling differs between threads")
    return slots, np.array([cols[c] for c in range(TILE[1])])


def column_permutation() -> np.ndarray:
    """P (128,): the weight value at column c of a K-block is seen by the MMA at column P[c]."""
    return _mapping()[1]


def permute_k(a: jax.Array) -> jax.Array:
    """a (rows, K) with every 128-column K-block permuted as relabel() shows the weight to the
    MMA: a'[:, P[c]] = a[:, c]. Applied to x it keeps the product (sum_c w[n, c] x[m, c] =
    sum_p w'[n, p] x'[m, p]); applied to w it gives the tile relabel() hands over, which is how
    the interpreter (no inline Mosaic GPU) runs the same arithmetic."""
    rows, k = a.shape
    inverse = np.argsort(column_permutation())
    return a.reshape(rows, k // TILE[1], TILE[1])[:, :, inverse].reshape(rows, k)


def relabel(w):
    """w: an 8-bit (64, 128) tile loaded in Layout.WGMMA_UPCAST_4X inside a Mosaic GPU kernel
    -> the same registers declared as Layout.WGMMA (columns permuted by P). GPU only (inline
    Mosaic GPU; the interpreter takes the jnp route in fp8_block_a16_mgpu)."""
    slots, _ = _mapping()
    out = plgpu.ShapeDtypeStruct(w.shape, w.dtype, layout=plgpu.Layout.WGMMA)

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA_UPCAST_4X,), return_type=out)
    def cast(ctx, arr):
        del ctx
        pairs = [mgpu_utils.vector_slice(reg, slice(h, h + 2)) for reg in arr.registers.flat
                 for h in range(0, fa.WGMMA_LAYOUT_UPCAST_4X.vector_length, 2)]
        regs = np.empty(fa.WGMMA_LAYOUT.registers_shape(TILE), dtype=object)
        for i, j in slots.items():
            regs.flat[j] = pairs[i]
        return mgpu.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT,
                                    _is_signed=arr.is_signed)

    return cast(w)
