"""IEEE division as the producers compute it.

XLA's algebraic simplifier rewrites `a / c` (c a constant or a broadcast) into `a * (1/c)`,
which is one ulp off for many values. Producers (torch) divide, and their stored scales and
codes are what jqlin must reproduce bit for bit, so every division of a producer's rule goes
through `div`, whose divisor is hidden behind an optimization barrier at full shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def div(a, b) -> jax.Array:
    a = jnp.asarray(a)
    b = jnp.asarray(b, a.dtype) if jnp.issubdtype(a.dtype, jnp.floating) else jnp.asarray(b)
    shape = jnp.broadcast_shapes(a.shape, b.shape)
    a = jnp.broadcast_to(a, shape)
    return a / jax.lax.optimization_barrier(jnp.broadcast_to(b, shape))
