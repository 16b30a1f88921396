"""How a QuantKey's scales tile a 2-D operand: tile amax and scale broadcast.

The scale array's shape is the tiling (as in qwix's QArray): (1,1) tensor, (N,1) channel,
(N/bn, K/bk) block, (N, K/g) group. Operands here are already padded to whole tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..spec import Granularity, QuantKey


def tile_shape(key: QuantKey, rows: int, cols: int) -> tuple[int, int]:
    """(rows, cols) of elements that share one scale in a padded (rows, cols) operand."""
    g = key.granularity
    if g is Granularity.TENSOR:
        return rows, cols
    if g in (Granularity.CHANNEL, Granularity.TOKEN):
        return 1, cols
    if g is Granularity.BLOCK:
        return key.block
    return 1, key.group_size


def tile_amax(x: jax.Array, key: QuantKey) -> jax.Array:
    """max |x| per tile; x is (rows, cols) padded to whole tiles. Returns the scale grid."""
    rows, cols = x.shape
    tr, tc = tile_shape(key, rows, cols)
    t = jnp.abs(x).reshape(rows // tr, tr, cols // tc, tc)
    return jnp.max(t, axis=(1, 3))


def expand(scale: jax.Array, rows: int, cols: int) -> jax.Array:
    """Broadcast a scale grid back over the (rows, cols) operand it tiles."""
    gr, gc = scale.shape
    return jnp.repeat(jnp.repeat(scale, rows // gr, axis=0), cols // gc, axis=1)
