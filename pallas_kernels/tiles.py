"""Output-tile bookkeeping shared by the kernel bodies (fp8_core, mx_core, mx_fp8mma; gemv too).

A program owns one (block_m, block_n) output tile and, with split-K, one slice of the K loop;
partial tiles at the M / N edges are masked. These helpers are traced inside the kernels.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

__all__ = ["Tile", "tile_coords", "row_tile_coords", "store_tile", "grouped_pid", "mask2",
           "load2"]


class Tile(NamedTuple):
    m0: jax.Array  # first output row
    n0: jax.Array  # first output column
    rm: jax.Array  # (block_m,) row indices
    rn: jax.Array  # (block_n,) column indices
    m_lim: int | None  # M when the last M tile is partial, else None (no mask needed)
    n_lim: int | None
    step0: jax.Array | int  # first K step of this program's split


def grouped_pid(pid, num_m: int, num_n: int, group_m: int):
    """Programs that share an N tile run together (L2 reuse of the weight tile)."""
    group_m = min(group_m, num_m)
    per_group = group_m * num_n
    group_id = lax.div(pid, per_group)
    first_m = group_id * group_m
    size_m = jnp.minimum(num_m - first_m, group_m)
    within = lax.rem(pid, per_group)
    return first_m + lax.rem(within, size_m), lax.div(within, size_m)


def tile_coords(m: int, n: int, bm: int, bn: int, group_m: int, split_k: int,
                steps_per_split: int) -> Tile:
    """This program's tile, from grid axis 0 (tiles, grouped along M) and 1 (K splits)."""
    pid_m, pid_n = grouped_pid(pl.program_id(0), -(-m // bm), -(-n // bn), group_m)
    m0, n0 = pid_m * bm, pid_n * bn
    return Tile(m0, n0, m0 + jnp.arange(bm, dtype=jnp.int32), n0 + jnp.arange(bn, dtype=jnp.int32),
                m if m % bm else None, n if n % bn else None,
                pl.program_id(1) * steps_per_split if split_k > 1 else 0)


def row_tile_coords(n: int, bn: int, split_k: int, steps_per_split: int) -> Tile:
    """A gemv program's tile (grid axis 0 over N only): block_n columns; rows are kept apart
    by the body and written one at a time with `store_tile(o_ref, t._replace(m0=r), ...)`."""
    n0 = pl.program_id(0) * bn
    return Tile(0, n0, jnp.zeros((1,), jnp.int32), n0 + jnp.arange(bn, dtype=jnp.int32), None,
                n if n % bn else None, pl.program_id(1) * steps_per_split if split_k > 1 else 0)


def mask2(rows, rows_lim, cols, cols_lim):
    """Boolean mask for a tile, or None when statically in bounds."""
    mask = None
    if rows_lim is not None:
        mask = (rows < rows_lim)[:, None]
    if cols_lim is not None:
        cm = (cols < cols_lim)[None, :]
        mask = cm if mask is None else mask & cm
    return mask


def load2(ref, r0, nr, c0, nc, mask):
    view = ref.at[pl.ds(r0, nr), pl.ds(c0, nc)]
    if mask is None:
        return view[...]
    return pltriton.load(view, mask=mask, other=jnp.zeros((), view.dtype))


def store_tile(o_ref, t: Tile, acc: jax.Array, m: int, split_k: int) -> None:
    """Write the (block_m, block_n) tile; with split_k > 1 the output is (split_k * M, N) and
    split s owns rows [s*M, (s+1)*M)."""
    bm, bn = acc.shape
    row0 = t.m0 + pl.program_id(1) * m if split_k > 1 else t.m0
    view = o_ref.at[pl.ds(row0, bm), pl.ds(t.n0, bn)]
    mask = mask2(t.rm, t.m_lim, t.rn, t.n_lim)
    val = acc.astype(view.dtype)
    if mask is None:
        view[...] = val
    else:
        pltriton.store(view, val, mask=mask)
