"""Weight quantization and dequantization, once per QuantKey family.

Scales are computed the way the key's producer computes them (FORMATS.md sec. 4, 5, 7):
every stored scale is a dequantization multiplier except a DIVISOR global scale
(compressed-tensors' `weight_global_scale`). Inputs are padded to whole tiles by the caller.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..spec import GlobalScale, QuantKey, ScaleRule
from .exact import div
from .e8m0 import divide_by_e8m0, e8m0_to_f32, exponent_ct, exponent_modelopt
from .fp4 import E2M1_MAX, cast_e2m1, pack_e2m1, unpack_e2m1
from .fp8 import E4M3_MAX, cast_e4m3
from .tiling import abs_max, expand, tile_amax

F32 = jnp.float32
_MX_EMAX = {"float8_e4m3fn": 8, "float4_e2m1fn": 2}
E4M3_EPS = 0.125  # torch.finfo(float8_e4m3fn).eps: compressed-tensors' replacement for 0 scales


def family(key: QuantKey) -> str:
    if key.scale_dtype == "float8_e8m0fnu":
        return "mx"
    if key.scale_dtype == "float8_e4m3fn":
        return "nvfp4"
    if key.dtype == "float8_e4m3fn":
        return "fp8"
    raise ValueError(f"no numerics for {key.describe()}")


def quantize_weight(w: jax.Array, key: QuantKey):
    """Quantize a padded float (rows, cols) weight. Returns (data, scale, global_scale).

    data: e4m3 (rows, cols) or packed uint8 (rows, cols/2); scale: the key's grid in float32,
    e4m3 or uint8 (e8m0 exponent bytes); global_scale: float32 scalar or None.
    """
    fam = family(key)
    if fam == "fp8":
        q, s = _quantize_fp8(w, key)
        return q, s, None
    if fam == "mx":
        q, u = _quantize_mx(w, key)
        return _store(q), u, None
    q, s, g = _quantize_nvfp4(w, key)
    return _store(q), s, g


def dequantize_weight(data: jax.Array, scale: jax.Array, global_scale: jax.Array | None,
                      key: QuantKey) -> jax.Array:
    """Stored weight -> float32 (rows, cols), in the producer's order of float operations."""
    q = unpack_e2m1(data) if key.is_fp4 else data
    rows, cols = q.shape
    qf = q.astype(F32)
    fam = family(key)
    if fam == "fp8":
        return qf * expand(scale.astype(F32), rows, cols)
    if fam == "mx":
        return qf * expand(e8m0_to_f32(scale), rows, cols)
    s = scale.astype(F32)
    g = jnp.asarray(global_scale, F32)
    g = g.reshape(-1, 1) if g.ndim == 1 else g  # per-row globals after a lossless fuse
    s = div(s, g) if key.global_scale is GlobalScale.DIVISOR else s * g
    return qf * expand(s, rows, cols)


def _store(q: jax.Array) -> jax.Array:
    return pack_e2m1(q) if q.dtype == jnp.float4_e2m1fn else q


def _quantize_fp8(w, key):
    if key.rule is ScaleRule.CT and jnp.issubdtype(w.dtype, jnp.floating):
        ct = w.dtype  # compressed-tensors computes the scale and the division in the weight dtype
    else:
        ct = F32
    wc = w.astype(ct)
    s = div(tile_amax(wc, key), E4M3_MAX)
    s = jnp.where(s == 0, jnp.finfo(ct).eps, s).astype(ct)
    q = cast_e4m3(jnp.clip(div(wc, expand(s, *w.shape)), -E4M3_MAX, E4M3_MAX))
    return q, s.astype(F32)


def _quantize_mx(w, key):
    wf = w.astype(F32)
    amax = tile_amax(wf, key)
    if key.rule is ScaleRule.MODELOPT:
        u = exponent_modelopt(amax, key.max_value)
    else:
        u = exponent_ct(amax, _MX_EMAX[key.dtype])
    scaled = divide_by_e8m0(wf, expand(u, *w.shape))
    return _cast_elems(scaled, key), u


def _quantize_nvfp4(w, key):
    wf = w.astype(F32)
    amax_t = abs_max(wf)
    amax_b = tile_amax(wf, key)
    if key.global_scale is GlobalScale.DIVISOR:  # compressed-tensors
        g = jnp.where(amax_t > 0, div(E4M3_MAX * E2M1_MAX, amax_t), 1.0).astype(F32)
        s = cast_e4m3(div(g * amax_b, E2M1_MAX))
        s = jnp.where(s.astype(F32) == 0, E4M3_EPS, s.astype(F32)).astype(jnp.float8_e4m3fn)
        t = div(s.astype(F32), g)
    else:  # ModelOpt: weight_scale_2 is a multiplier
        g = jnp.where(amax_t > 0, div(amax_t, E2M1_MAX * E4M3_MAX), 1.0).astype(F32)
        b = div(amax_b, E2M1_MAX * g)
        s = cast_e4m3(jnp.where(b == 0, 1.0, jnp.maximum(b, 2.0 ** -9)))
        t = s.astype(F32) * g
    q = cast_e2m1(div(wf, expand(t, *w.shape)))
    return q, s, g


def _cast_elems(x: jax.Array, key: QuantKey) -> jax.Array:
    if key.is_fp4:
        return cast_e2m1(x, ties="zero" if key.rule is ScaleRule.MODELOPT else "even")
    return cast_e4m3(x)
