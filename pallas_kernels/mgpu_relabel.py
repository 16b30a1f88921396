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
M). The same mapping with another pairing of each register's 8 values ("halves": v0 v4, v1 v5,
...) serves the 4-bit codes of mgpu_group_decode.decode_words.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.mosaic.gpu import fragmented_array as fa
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

__all__ = ["TILE", "PAIRINGS", "column_permutation", "permute_k", "permute_cols", "relabel",
           "pair_slots"]

TILE = (64, 128)  # one compute warpgroup's weight tile (rows, K)
# How the 8 values of an UPCAST_4X register are cut into the pairs wgmma's registers hold:
# "consecutive" (v0 v1, v2 v3, ...: 8-bit weights, relabel) or "halves" (v0 v4, v1 v5, ...:
# 4-bit codes decoded from one 32-bit word, mgpu_group_decode.decode_words -- each pair's
# codes sit at the same place in the word's two 16-bit halves, so one shift and mask decode
# both)
PAIRINGS = {"consecutive": (0, 1, 2, 3, 4, 5, 6, 7), "halves": (0, 4, 1, 5, 2, 6, 3, 7)}
# the same permutations as reshape / transpose (a kernel may not close over index arrays):
# column c of a 32-column chunk, written as digits of `shape`, goes to the digits in `axes`
# order (checked against column_permutation by tests)
_AS_TRANSPOSE = {"consecutive": ((4, 4, 2), (1, 0, 2)), "halves": ((4, 2, 4), (2, 0, 1))}


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
def _mapping(pairing: str = "consecutive", cols: int = TILE[1]
             ) -> tuple[dict[int, int], np.ndarray]:
    """(pair slot of UPCAST_4X -> register of WGMMA, column map P) for a (64, cols) tile, or an
    error. Pair slot s is register s // 4's pair s % 4 in `pairing`'s order."""
    shape = (TILE[0], cols)
    src, dst = _positions(fa.WGMMA_LAYOUT_UPCAST_4X, shape), _positions(fa.WGMMA_LAYOUT, shape)
    vec = fa.WGMMA_LAYOUT_UPCAST_4X.vector_length
    src = src.reshape(128, -1, vec)[:, :, list(PAIRINGS[pairing])]
    pairs_src, pairs_dst = src.reshape(128, -1, 2), dst.reshape(128, -1, 2)
    slots, col_map = None, {}
    for t in range(128):
        here = {}
        for row in np.unique(pairs_src[t, :, 0] // cols):
            a = sorted(np.flatnonzero(pairs_src[t, :, 0] // cols == row),
                       key=lambda i: pairs_src[t, i, 0])
            b = sorted(np.flatnonzero(pairs_dst[t, :, 0] // cols == row),
                       key=lambda j: pairs_dst[t, j, 0])
            if len(a) != len(b):
                raise AssertionError("the layouts give a thread different rows")
            for i, j in zip(a, b):
                here[int(i)] = int(j)
                for e in range(2):
                    c_src, c_dst = pairs_src[t, i, e] % cols, pairs_dst[t, j, e] % cols
                    if col_map.setdefault(c_src, c_dst) != c_dst:
                        raise AssertionError("no single column permutation")
        if slots is None:
            slots = here
        elif slots != here:
            raise AssertionError("the register relabelling differs between threads")
    return slots, np.array([col_map[c] for c in range(cols)])


def column_permutation(pairing: str = "consecutive") -> np.ndarray:
    """P (128,): the weight value at column c of a K-block is seen by the MMA at column P[c]."""
    return _mapping(pairing)[1]


def pair_slots(pairing: str, cols: int = TILE[1]) -> dict[int, int]:
    """pair slot (register s // 4, its pair s % 4 in `pairing`'s order) -> WGMMA register, of
    a (64, cols) tile (cols: 128, or 64 for half a K-block)."""
    return _mapping(pairing, cols)[0]


def permute_cols(a: jax.Array, pairing: str) -> jax.Array:
    """permute_k of a (rows, 128) tile by reshapes and a transpose: usable inside a kernel
    (the interpreter's route)."""
    shape, axes = _AS_TRANSPOSE[pairing]
    rows = a.shape[0]
    t = a.reshape(rows, TILE[1] // 32, *shape)
    return t.transpose(0, 1, *(2 + i for i in axes)).reshape(rows, TILE[1])


def permute_k(a: jax.Array, pairing: str = "consecutive") -> jax.Array:
    """a (rows, K) with every 128-column K-block permuted as relabel() shows the weight to the
    MMA: a'[:, P[c]] = a[:, c]. Applied to x it keeps the product (sum_c w[n, c] x[m, c] =
    sum_p w'[n, p] x'[m, p]); applied to w it gives the tile relabel() hands over, which is how
    the interpreter (no inline Mosaic GPU) runs the same arithmetic."""
    rows, k = a.shape
    inverse = np.argsort(column_permutation(pairing))
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
