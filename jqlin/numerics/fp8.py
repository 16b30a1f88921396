"""E4M3FN element numerics."""

from __future__ import annotations

import jax
import jax.numpy as jnp

E4M3_MAX = 448.0
E4M3 = jnp.float8_e4m3fn


def cast_e4m3(x: jax.Array) -> jax.Array:
    """Round to e4m3fn, saturating: e4m3fn has no infinity and `astype` maps |x| > 464 to NaN."""
    return jnp.clip(x, -E4M3_MAX, E4M3_MAX).astype(E4M3)
