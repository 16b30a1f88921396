"""Row-local computation whose bits cannot depend on the batch size (batch invariance).

XLA picks dot and reduction strategies by shape, so a row computed inside a larger batch can
differ in its last bits from the same row alone. Mapping a fixed per-row computation through a
sequential loop compiles one body for every M. A loop of one iteration, however, is inlined
into the surrounding program, where it is fused and contracted (mul+add -> FMA) differently,
so maps here always run at least two iterations.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def seq_map(fn: Callable, xs):
    """`lax.map` over the leading axis that always runs at least two iterations."""
    n = jax.tree.leaves(xs)[0].shape[0]
    if n == 1:
        xs = jax.tree.map(lambda a: jnp.concatenate([a, a], axis=0), xs)
    out = jax.lax.map(fn, xs)
    return jax.tree.map(lambda a: a[:n], out) if n == 1 else out


def rowwise(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    """Apply fn to each row (last axis) of x in a sequential map."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    out = seq_map(fn, rows)
    return out.reshape(*lead, *out.shape[1:])
