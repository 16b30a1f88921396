"""IEEE division as the producers compute it.

XLA's algebraic simplifier rewrites `a / c` (c a constant or a broadcast) into `a * (1/c)`,
which is one ulp off for many values. Producers (torch) divide, and their stored scales and
codes are what jqlin must reproduce bit for bit, so every division of a producer's rule goes
through `div`, whose divisor is hidden behind an optimization barrier at full shape -- or,
where the quotient should fuse with its neighbours (a barrier ends an XLA fusion), through
`div_fused`.
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


def div_fused(a, b, like) -> jax.Array:
    """a / b as `div` computes it (a true IEEE division), without a barrier: b, broadcast to
    a's shape, is made to depend on `like` elementwise (b + 0 * min(like, 1); XLA does not fold
    x * 0 for floats), so no rewrite sees a constant or broadcast divisor, and the division
    fuses with what precedes and follows it. like: non-negative values of a's shape (|x|, an
    amax) from the data a comes from -- where it is NaN the divisor is NaN, and so was a's
    source; inf gives 1, so a finite b stays b."""
    a = jnp.asarray(a)
    shape = jnp.broadcast_shapes(a.shape, jnp.shape(b), jnp.shape(like))
    guard = 0.0 * jnp.minimum(jnp.asarray(like, a.dtype), 1.0)
    return jnp.broadcast_to(a, shape) / (jnp.asarray(b, a.dtype) + guard)
