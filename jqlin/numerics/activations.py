"""Activation quantization: static scales and the producers' dynamic rules (FORMATS.md sec. 10).

Every function takes a float (M, Kp) activation padded with zeros to whole groups along K
(zero padding never changes a group's amax) and returns element codes plus float32
dequantization scales shaped like the key's grid: (1,1) tensor, (M,1) token, (M, Kp/g) group.
Everything is computed in float32. Only TENSOR-dynamic keys look beyond one row.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..spec import GlobalScale, Granularity, QuantKey, ScaleRule
from .exact import div, div_fused
from .e8m0 import e8m0_reciprocal, e8m0_to_f32, exponent_ct, exponent_modelopt
from .fp4 import E2M1_MAX, cast_e2m1, round_e2m1
from .fp8 import E4M3_MAX, cast_e4m3, round_e4m3
from .tiling import expand, tile_amax
from .weights import E4M3_EPS, _MX_EMAX, family

F32 = jnp.float32
_VLLM_MIN_SCALE = 1.0 / (E4M3_MAX * 512.0)  # vLLM's CUDA per-token kernels floor the scale here


def quantize_activation(x: jax.Array, key: QuantKey, input_scale: jax.Array | None = None):
    """Returns (q, scale): codes in the key's element dtype (unpacked) and f32 dequant scales."""
    xf = x.astype(F32)
    fam = family(key)
    if fam == "fp8":
        return _fp8(xf, key, input_scale)
    if fam == "mx":
        return _mx(xf, key)
    return _nvfp4(xf, key, input_scale)


def fake_quantize_activation(x: jax.Array, key: QuantKey,
                             input_scale: jax.Array | None = None) -> jax.Array:
    """Quantize-dequantize in float32: what the producer's forward feeds the matmul."""
    q, s = quantize_activation(x, key, input_scale)
    return q.astype(F32) * expand(s, *q.shape)


def _need_static(key: QuantKey, input_scale):
    if input_scale is None:
        raise ValueError(
            f"activation key [{key.describe()}] needs a static input_scale, and none was given")
    return jnp.asarray(input_scale, F32).reshape(())


def _fp8(xf, key, input_scale):
    if not key.dynamic:
        s = _need_static(key, input_scale)
        if key.rule is ScaleRule.MODELOPT:
            inv = div(E4M3_MAX, s * E4M3_MAX)  # ModelOpt multiplies by 448/amax, then divides back
            q = cast_e4m3(xf * inv)
            return q, jnp.reshape(div(1.0, inv), (1, 1))
        q = cast_e4m3(div(xf, s))
        return q, jnp.reshape(s, (1, 1))
    s = div(tile_amax(xf, key), E4M3_MAX)
    if key.rule is ScaleRule.VLLM:
        s = jnp.maximum(s, _VLLM_MIN_SCALE)
    else:
        s = jnp.where(s == 0, jnp.finfo(F32).eps, s)
    q = cast_e4m3(div(xf, expand(s, *xf.shape)))
    return q, s


def _mx(xf, key):
    if key.granularity is not Granularity.GROUP or not key.dynamic:
        raise ValueError(f"MX activations are dynamic groups along K, got [{key.describe()}]")
    amax = tile_amax(xf, key)
    if key.rule is ScaleRule.MODELOPT:
        u = exponent_modelopt(amax, key.max_value)
        ties = "zero"
    else:
        u = exponent_ct(amax, _MX_EMAX[key.dtype])
        ties = "even"
    scaled = xf * expand(e8m0_reciprocal(u), *xf.shape)
    q = cast_e2m1(scaled, ties=ties) if key.is_fp4 else cast_e4m3(scaled)
    return q, e8m0_to_f32(u)


def _nvfp4(xf, key, input_scale):
    g = _need_static(key, input_scale)
    amax = tile_amax(xf, key)
    if key.global_scale is GlobalScale.DIVISOR:  # compressed-tensors: input_global_scale
        s = cast_e4m3(div(g * amax, E2M1_MAX)).astype(F32)
        s = jnp.where(s == 0, E4M3_EPS, s)
        t = div(s, g)
        q = cast_e2m1(jnp.clip(div(xf, expand(t, *xf.shape)), -E2M1_MAX, E2M1_MAX))
    else:  # ModelOpt: input_scale is a multiplier
        b = div(amax, E2M1_MAX * g)
        b = jnp.where(b == 0, 1.0, b)
        b = cast_e4m3(jnp.clip(b, 2.0 ** -9, E4M3_MAX)).astype(F32)
        t = b * g
        q = cast_e2m1(div(xf, expand(t, *xf.shape)))
    return q, t


def nvfp4_codes_times_scales(xf: jax.Array, key: QuantKey, input_scale) -> jax.Array:
    """float32 (M, Kp): _nvfp4's e2m1 codes times their e4m3 block scale (the block step times
    the global factor, rounded back to e4m3 as jqlin.kernels.pallas_fp4 does), bit for bit, in
    two XLA fusions (the amax reduction and one elementwise pass) where quantize_activation's
    barriers make seven: round_e4m3 / round_e2m1 for the casts, div_fused for the divisions
    (session 30; tests compare every value with the reference, ties included)."""
    g = _need_static(key, input_scale)
    amax = tile_amax(xf, key)
    if key.global_scale is GlobalScale.DIVISOR:
        s = round_e4m3(div_fused(g * amax, E2M1_MAX, amax))
        s = jnp.where(s == 0, E4M3_EPS, s)
        t = div_fused(s, g, amax)
        q = round_e2m1(jnp.clip(div_fused(xf, expand(t, *xf.shape), jnp.abs(xf)),
                                -E2M1_MAX, E2M1_MAX))
        s2 = round_e4m3(t * g)
    else:
        b = div_fused(amax, E2M1_MAX * g, amax)
        b = jnp.where(b == 0, 1.0, b)
        b = round_e4m3(jnp.clip(b, 2.0 ** -9, E4M3_MAX))
        t = b * g
        q = round_e2m1(div_fused(xf, expand(t, *xf.shape), jnp.abs(xf)))
        s2 = round_e4m3(t / g)
    return q * expand(s2, *xf.shape)


def mx_codes_times_scales(xf: jax.Array, key: QuantKey) -> jax.Array:
    """float32 (M, Kp): _mx's e2m1 codes times their e8m0 scale (MXFP4 activations), bit for
    bit, with no barrier (round_e2m1 for ties to even; ModelOpt's ties-toward-zero cast has
    none), so the pass after the amax reduction is one XLA fusion (session 30)."""
    if key.granularity is not Granularity.GROUP or not key.dynamic or not key.is_fp4:
        raise ValueError(f"expected MXFP4 activations (dynamic e2m1 groups along K), got "
                         f"[{key.describe()}]")
    amax = tile_amax(xf, key)
    if key.rule is ScaleRule.MODELOPT:
        u = exponent_modelopt(amax, key.max_value, fused=True)
    else:
        u = exponent_ct(amax, _MX_EMAX[key.dtype])
    scaled = xf * expand(e8m0_reciprocal(u), *xf.shape)
    if key.rule is ScaleRule.MODELOPT:
        q = cast_e2m1(scaled, ties="zero").astype(F32)  # (a select of exact values)
    else:
        q = round_e2m1(scaled)
    return q * expand(e8m0_to_f32(u), *xf.shape)


def fp8_dynamic_codes_fused(xf: jax.Array, key: QuantKey) -> tuple[jax.Array, jax.Array]:
    """_fp8's dynamic rule (per token, per group, per tensor) -- e4m3 codes and float32 scales,
    bit for bit -- without barriers (div_fused, round_e4m3), so the pass after the amax
    reduction is one XLA fusion: on CPU XLA fp8_ptpc's quantize_activation compiles to 5
    fusions and fp8_block's to 6 at (1, 4096), this to 2. Prepared in session 30, not routed:
    the GPU's bits are unchecked (tests/test_numerics.py -k fused on the H200 first; then
    jqlin.kernels.pallas_fp8.quantize_x may take it)."""
    if not key.dynamic or family(key) != "fp8":
        raise ValueError(f"expected a dynamic fp8 activation key, got [{key.describe()}]")
    amax = tile_amax(xf, key)
    s = div_fused(amax, E4M3_MAX, amax)
    if key.rule is ScaleRule.VLLM:
        s = jnp.maximum(s, _VLLM_MIN_SCALE)
    else:
        s = jnp.where(s == 0, jnp.finfo(F32).eps, s)
    q = round_e4m3(div_fused(xf, expand(s, *xf.shape), jnp.abs(xf)))
    return q.astype(jnp.float8_e4m3fn), s
