"""How a QuantKey's scales tile a 2-D operand: tile amax and scale broadcast.

The scale array's shape is the tiling (as in qwix's QArray): (1,1) tensor, (N,1) channel,
(N/bn, K/bk) block, (N, K/g) group. Operands here are already padded to whole tiles.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
import jax.numpy as jnp

from ..spec import Granularity, QuantKey

# Mesh axes (rows_axis, cols_axis) splitting the operand whose amax is taken, inside shard_map
# (jqlin.nn.sharding): a tile that spans every row (per-tensor) or every column (per-tensor,
# per-token) of the global operand reduces its amax across them, so a sharded quantizer picks
# the unsharded scale. A jit-cache-sensitive context: a kernel traced under it is another
# program, never a cache hit of the unsharded one.
_SHARDED_AMAX = jax.make_user_context(default_value=None)


@contextlib.contextmanager
def sharded_amax(rows_axis: str | None, cols_axis: str | None) -> Iterator[None]:
    """Within: row- / column-spanning tile amaxes are `pmax`ed over these mesh axes."""
    with _SHARDED_AMAX((rows_axis, cols_axis)):
        yield


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


def _magnitude_bits(x: jax.Array) -> jax.Array:
    """|x|'s bit patterns as signed integers of x's width: they order like the magnitudes,
    every NaN above inf, so an integer max is the float max that keeps NaN."""
    ints = jnp.dtype(f"int{8 * x.dtype.itemsize}")
    return jax.lax.bitcast_convert_type(x, ints) & jnp.array(jnp.iinfo(ints).max, ints)


def abs_max(x: jax.Array, axis=None) -> jax.Array:
    """max |x| over `axis` (x floating, not empty), NaN wherever the values reduced hold a NaN
    -- whatever the backend's float max does with NaN: XLA:CPU's vectorized max reductions
    pass over it at some shapes (groups of 16 of a (13, 384) array gave the finite maximum, or
    -inf where all were NaN; a whole (13, 384) array's max gave 1.0; openxla/xla#21461, open).

    One integer max of the magnitudes' bits (_magnitude_bits). Before session 40 a separate
    any(isnan) flag: XLA:GPU made it a second pass over x (H100, fp8_block 4096 x 18432: 52 us
    of a 1265 us product)."""
    x = jnp.asarray(x)
    return jax.lax.bitcast_convert_type(jnp.max(_magnitude_bits(x), axis=axis), x.dtype)


def tile_amax(x: jax.Array, key: QuantKey) -> jax.Array:
    """max |x| per tile; x is (rows, cols) padded to whole tiles. Returns the scale grid."""
    rows, cols = x.shape
    tr, tc = tile_shape(key, rows, cols)
    # a tile holding a NaN: its scale is NaN, its values dequantize to NaN, and a NaN activation
    # reaches the output instead of a number (abs_max's reduction, on the bits)
    bits = jnp.max(_magnitude_bits(x.reshape(rows // tr, tr, cols // tc, tc)), axis=(1, 3))
    axes = _SHARDED_AMAX.value
    if axes is not None:  # max is exact: the same value in any order, on any device
        rows_axis, cols_axis = axes
        g = key.granularity
        spans = ([rows_axis, cols_axis] if g is Granularity.TENSOR
                 else [cols_axis] if g in (Granularity.TOKEN, Granularity.CHANNEL) else [])
        # still on the bits: a NaN survives the collective (a float max across devices may
        # drop it)
        for axis in filter(None, spans):
            bits = jax.lax.pmax(bits, axis)
    return jax.lax.bitcast_convert_type(bits, x.dtype)


def expand(scale: jax.Array, rows: int, cols: int) -> jax.Array:
    """Broadcast a scale grid back over the (rows, cols) operand it tiles."""
    gr, gc = scale.shape
    return jnp.repeat(jnp.repeat(scale, rows // gr, axis=0), cols // gc, axis=1)
