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
from .exact import div
from .e8m0 import divide_by_e8m0, e8m0_to_f32, exponent_ct, exponent_deepseek, exponent_modelopt
from .fp4 import E2M1, E2M1_MAX, cast_e2m1, round_e2m1
from .fp8 import E4M3, E4M3_MAX, cast_e4m3, round_e4m3
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


def fp8_division_scale(xf: jax.Array, key: QuantKey,
                       input_scale: jax.Array | None = None) -> jax.Array | None:
    """The float32 scales s, shaped like the key's grid, of an FP8 rule whose codes are
    e4m3(clip(x / s, +-448)) -- every FP8 rule but ModelOpt's static one (None there: it
    multiplies), DeepSeek's power-of-two e8m0 groups included (x / 2**j is the exact product
    _mx takes). What a fused codes kernel needs besides x (pallas_kernels.act_quant)."""
    if key.rule is ScaleRule.DEEPSEEK:
        return e8m0_to_f32(_deepseek_exponents(xf, key))
    if not key.dynamic:
        s = _need_static(key, input_scale)
        return None if key.rule is ScaleRule.MODELOPT else jnp.reshape(s, (1, 1))
    amax = tile_amax(xf, key)
    if key.amax_bound is not None:  # (a NaN amax stays NaN)
        amax = jnp.minimum(amax, jnp.float32(key.amax_bound))
    s = div(amax, E4M3_MAX)
    if key.rule is ScaleRule.VLLM:
        return jnp.maximum(s, _VLLM_MIN_SCALE)
    return jnp.where(s == 0, jnp.finfo(F32).eps, s)


def _deepseek_exponents(xf: jax.Array, key: QuantKey) -> jax.Array:
    """The e8m0 exponent bytes u of ScaleRule.DEEPSEEK's groups. The barrier keeps the exponent
    out of the amax reduction's fusion: fused, XLA:GPU emitted that reduction 6.5x slower
    (H100, 4096 x 18432 bf16: 336 us against the float32 rule's 52 us; NOTES.md session 40)."""
    return exponent_deepseek(jax.lax.optimization_barrier(tile_amax(xf, key)))


def _fp8(xf, key, input_scale):
    # Barrier-free (round_e4m3: cast_e4m3's values without a convert pair; div: no barrier
    # either) so that XLA computes everything after the amax in one fusion, as in _nvfp4 (tests:
    # bitwise the NumPy oracle, e4m3 ties whose scales have inexact reciprocals included).
    s = fp8_division_scale(xf, key, input_scale)
    if s is None:  # ModelOpt static: multiplies by 448/amax, then divides back
        inv = div(E4M3_MAX, _need_static(key, input_scale) * E4M3_MAX)
        return round_e4m3(xf * inv).astype(E4M3), jnp.reshape(div(1.0, inv), (1, 1))
    return round_e4m3(div(xf, expand(s, *xf.shape))).astype(E4M3), s


def _mx(xf, key):
    if key.granularity is not Granularity.GROUP or not key.dynamic:
        raise ValueError(f"MX activations are dynamic groups along K, got [{key.describe()}]")
    if key.rule is ScaleRule.DEEPSEEK:  # (e4m3 only: spec.QuantKey; x / s never passes 448)
        u = _deepseek_exponents(xf, key)
        ue = expand(u, *xf.shape)
        # a NaN-scale group's codes NaN too: the quotient x / NaN the codes kernel computes
        scaled = jnp.where(ue == 255, jnp.nan, divide_by_e8m0(xf, ue))
        return cast_e4m3(jnp.clip(scaled, -E4M3_MAX, E4M3_MAX)), e8m0_to_f32(u)
    amax = tile_amax(xf, key)
    if key.rule is ScaleRule.MODELOPT:
        u = exponent_modelopt(amax, key.max_value)
        ties = "zero"
    else:
        u = exponent_ct(amax, _MX_EMAX[key.dtype])
        ties = "even"
    scaled = divide_by_e8m0(xf, expand(u, *xf.shape))
    if not key.is_fp4:
        q = cast_e4m3(scaled)
    elif ties == "even":  # (no barrier: the pass after the amax stays one fusion, session 30)
        q = round_e2m1(scaled).astype(E2M1)
    else:  # (a select of exact values: no barrier either)
        q = cast_e2m1(scaled, ties=ties)
    return q, e8m0_to_f32(u)


def _nvfp4(xf, key, input_scale):
    # Barrier-free arithmetic (div, round_e4m3 / round_e2m1: the casts' values), so that XLA
    # computes all after the amax in one fusion -- seven with barriers at decode sizes
    # (session 30; tests: bitwise the NumPy oracle, e2m1 ties whose block steps have inexact
    # reciprocals included).
    g = _need_static(key, input_scale)
    amax = tile_amax(xf, key)
    if key.global_scale is GlobalScale.DIVISOR:  # compressed-tensors: input_global_scale
        s = round_e4m3(div(g * amax, E2M1_MAX))
        s = jnp.where(s == 0, E4M3_EPS, s)
        t = div(s, g)
        q = round_e2m1(jnp.clip(div(xf, expand(t, *xf.shape)), -E2M1_MAX, E2M1_MAX))
    else:  # ModelOpt: input_scale is a multiplier
        b = div(amax, E2M1_MAX * g)
        b = jnp.where(b == 0, 1.0, b)
        b = round_e4m3(jnp.clip(b, 2.0 ** -9, E4M3_MAX))
        t = b * g
        q = round_e2m1(div(xf, expand(t, *xf.shape)))
    return q.astype(E2M1), t

