"""Rotary position embeddings as Llama-family configs define them (HF `rope_parameters` /
`rope_theta` + `rope_scaling`): default, linear and llama3 frequency scaling.

Frequencies and angles are float32, as in the reference implementation; cos/sin are cast to the
activation dtype before they multiply q and k.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["inv_frequencies", "rope_cos_sin", "apply_rope", "SUPPORTED_ROPE_TYPES"]

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def inv_frequencies(head_dim: int, theta: float,
                    scaling: Mapping[str, Any] | None = None) -> np.ndarray:
    """float32 (head_dim/2,) inverse frequencies, scaled as `scaling` (rope_type) says."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (np.float32(1.0) / (np.float32(theta) ** exps)).astype(np.float32)
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return (inv / np.float32(_param(scaling, "factor"))).astype(np.float32)
    if kind == "llama3":
        return _llama3(inv, scaling)
    raise NotImplementedError(
        f"rope_type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")


def _param(scaling: Mapping[str, Any], name: str) -> float:
    if name not in scaling:
        raise ValueError(f"rope scaling {dict(scaling)} lacks {name!r}")
    return float(scaling[name])


def _llama3(inv: np.ndarray, scaling: Mapping[str, Any]) -> np.ndarray:
    # Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band
    # between interpolated smoothly (in float32, as the reference computes it).
    f32 = np.float32
    factor = f32(_param(scaling, "factor"))
    low, high = f32(_param(scaling, "low_freq_factor")), f32(_param(scaling, "high_freq_factor"))
    old_len = f32(_param(scaling, "original_max_position_embeddings"))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = f32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv).astype(f32)
    smooth = ((old_len / wavelen - low) / (high - low)).astype(f32)
    smoothed = ((f32(1) - smooth) * scaled / factor + smooth * scaled).astype(f32)
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32)


@functools.lru_cache(maxsize=32)
def _cached_inv(head_dim: int, theta: float, scaling_items: tuple | None) -> np.ndarray:
    return inv_frequencies(head_dim, theta, dict(scaling_items) if scaling_items else None)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float,
                 scaling_items: tuple | None = None) -> tuple[jax.Array, jax.Array]:
    """float32 cos, sin of shape (*positions.shape, head_dim) (halves repeated, HF layout)."""
    inv = jnp.asarray(_cached_inv(head_dim, float(theta), scaling_items))
    angles = positions.astype(jnp.float32)[..., None] * inv
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, *,
               separate_products: bool = False) -> jax.Array:
    """x (B, T, H, d) rotated by cos/sin (B, T, d): x*cos + rotate_half(x)*sin.

    separate_products: round both products before the sum. XLA contracts a mul+add into one
    FMA when they land in the same fused loop, and which product it contracts depends on the
    surrounding program (e.g. the batch size); the barrier makes the result independent of it.
    """
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    a, b = x * cos, rotated * sin
    if separate_products:
        a, b = jax.lax.optimization_barrier((a, b))
    return a + b
