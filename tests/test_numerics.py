"""Element numerics against hand-computed values and the independent NumPy oracle."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import oracle
from jqlin.numerics import (cast_e2m1, cast_e4m3, e8m0_to_f32, exponent_ct, exponent_modelopt,
                            pack_e2m1, unpack_e2m1)


def test_e4m3_cast_saturates_instead_of_nan():
    x = jnp.array([500.0, 449.0, -1000.0, 1e30, -448.0, 0.3], jnp.float32)
    got = np.asarray(cast_e4m3(x).astype(jnp.float32))
    np.testing.assert_array_equal(got, [448, 448, -448, 448, -448, 0.3125])
    assert not np.isnan(got).any()


def test_e2m1_codes_decode_in_order():
    codes = jnp.arange(16, dtype=jnp.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(jnp.uint8)  # low nibble = even element
    got = np.asarray(unpack_e2m1(packed).astype(jnp.float32))
    np.testing.assert_array_equal(got, oracle.E2M1_VALUES)


@pytest.mark.parametrize("vals,byte", [((0.5, 1.0), 0x21), ((6.0, -0.5), 0x97), ((-6.0, 0.0), 0x0F),
                                       ((1.5, 4.0), 0x63)])
def test_pack_matches_hand_computed_bytes(vals, byte):
    q = jnp.array(vals, jnp.float32).astype(jnp.float4_e2m1fn)
    assert int(pack_e2m1(q)[0]) == byte
    np.testing.assert_array_equal(np.asarray(unpack_e2m1(jnp.array([byte], jnp.uint8)).astype(jnp.float32)),
                                  vals)


def test_pack_unpack_roundtrip_all_bytes():
    b = jnp.arange(256, dtype=jnp.uint8).reshape(4, 64)
    np.testing.assert_array_equal(np.asarray(pack_e2m1(unpack_e2m1(b))), np.asarray(b))


def test_pack_rejects_odd_length_and_wrong_dtype():
    with pytest.raises(ValueError, match="even"):
        pack_e2m1(jnp.zeros((3,), jnp.float4_e2m1fn))
    with pytest.raises(TypeError, match="float4_e2m1fn"):
        pack_e2m1(jnp.zeros((4,), jnp.float32))


def test_e2m1_rounding_modes():
    x = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.75, -5.0, 0.26, 0.2])
    even = np.asarray(cast_e2m1(jnp.asarray(x)).astype(jnp.float32))
    np.testing.assert_array_equal(even, [0, 1, 1, 2, 2, 4, 4, 6, 6, -1, -4, 0.5, 0])
    zero = np.asarray(cast_e2m1(jnp.asarray(x), ties="zero").astype(jnp.float32))
    np.testing.assert_array_equal(zero, [0, 0.5, 1, 1.5, 2, 3, 4, 6, 6, -0.5, -4, 0.5, 0])
    np.testing.assert_array_equal(zero, oracle.e2m1_toward_zero(x).astype(np.float32))


def test_e8m0_decode():
    u = jnp.array([0, 1, 126, 127, 128, 254, 255], jnp.uint8)
    got = np.asarray(e8m0_to_f32(u))
    np.testing.assert_array_equal(got[:-1], [2.0**-127, 2.0**-126, 0.5, 1, 2, 2.0**127])
    assert np.isnan(got[-1])
    ref = ml_dtypes.float8_e8m0fnu
    np.testing.assert_array_equal(got[:-1], np.asarray(u[:-1]).view(ref).astype(np.float32))


def test_mx_exponent_rules_match_oracle(rng):
    amax = np.abs(rng.standard_normal(4000).astype(np.float32)) * np.exp2(rng.integers(-30, 30, 4000))
    amax = amax.astype(np.float32)
    amax[:6] = [0.0, 448.0, 1.75, 1.7499999, 1.5, 6.0]
    for emax in (8, 2):
        np.testing.assert_array_equal(np.asarray(exponent_ct(jnp.asarray(amax), emax)),
                                      oracle.ct_mx_exponent(amax, emax))
    for m in (448.0, 6.0):
        np.testing.assert_array_equal(np.asarray(exponent_modelopt(jnp.asarray(amax), m)).astype(int),
                                      oracle.modelopt_mx_exponent(amax, m) + 127)


def test_numerics_are_jittable(rng):
    x = jnp.asarray(rng.standard_normal((4, 32)), jnp.float32)
    f = jax.jit(lambda v: unpack_e2m1(pack_e2m1(cast_e2m1(v))).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(f(x)), np.asarray(cast_e2m1(x).astype(jnp.float32)))


def _same_values(a, b) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return np.array_equal(a, b, equal_nan=True) and np.array_equal(np.signbit(a), np.signbit(b))


def test_convert_free_roundings_are_the_casts_bitwise():
    """round_e4m3 / round_e2m1 (reduce_precision, no convert pair: fusable) give cast_e4m3's /
    cast_e2m1's values for every 997th float32 bit pattern (NaN, inf, subnormals included)
    and every value on a fine grid around both formats' ranges."""
    from jqlin.numerics.fp4 import round_e2m1
    from jqlin.numerics.fp8 import round_e4m3
    bits = np.arange(0, 2 ** 32, 997, dtype=np.uint64).astype(np.uint32)
    grid = np.arange(-500, 500, 1 / 4096, dtype=np.float64).astype(np.float32)
    for v in (bits.view(np.float32), grid):
        x = jnp.asarray(v)
        assert _same_values(jax.jit(round_e4m3)(x), cast_e4m3(x).astype(jnp.float32))
        assert _same_values(jax.jit(round_e2m1)(x), cast_e2m1(x).astype(jnp.float32))


def _nvfp4_operand_reference(xf, key, g):
    """What jqlin.kernels.pallas_fp4 fed the kernel before session 30: quantize_activation's
    codes times the block scale recovered from its step t."""
    from jqlin.numerics import quantize_activation
    from jqlin.numerics.tiling import expand
    from jqlin.spec import GlobalScale
    q, t = quantize_activation(xf, key, g)
    s = cast_e4m3(t * g if key.global_scale is GlobalScale.DIVISOR else t / g)
    return q.astype(jnp.float32) * expand(s.astype(jnp.float32), *q.shape)


def _nvfp4_ties(rng, m, groups):
    """Activations whose quotients x / t fall exactly on e2m1 rounding ties (0.25 .. 5) with
    block steps t whose reciprocal is inexact: a reciprocal multiply would round them the
    other way. With g = 1 both rules give t = s = amax / 6."""
    e4 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    e4 = e4[np.isfinite(e4) & (e4 >= 2.0 ** -6) & (e4 <= 64)]
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    s = rng.choice(e4, (m, groups, 1))
    x = rng.choice(ties, (m, groups, 16)) * s * rng.choice([-1, 1], (m, groups, 16))
    x[:, :, 0] = 6 * s[:, :, 0]  # the amax: x / t = 6
    return x.reshape(m, groups * 16).astype(np.float32)


@pytest.mark.parametrize("rule", ["ct", "modelopt"])
def test_fused_nvfp4_operand_is_the_reference_bitwise(rng, rule):
    """nvfp4_codes_times_scales (two XLA fusions, no barriers) gives the barrier-built
    reference's values, bitwise, under jit: random rows of many magnitudes, rows landing on
    e2m1 ties with inexact reciprocals, zero groups (the eps / 1 scale), inf and NaN, huge
    and tiny values; several global scales."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics.activations import nvfp4_codes_times_scales
    from jqlin.spec import GlobalScale, ScaleRule
    key = formats.get("nvfp4").activation
    if rule == "modelopt":
        key = dataclasses.replace(key, rule=ScaleRule.MODELOPT,
                                  global_scale=GlobalScale.MULTIPLIER)
    k = 256
    x = rng.standard_normal((12, k)) * np.exp(rng.uniform(-12, 12, (12, 1)))
    x = np.concatenate([x, _nvfp4_ties(rng, 8, k // 16)]).astype(np.float32)
    x[0, :16] = 0  # a zero group
    x[1, 3], x[2, 40], x[3, 7] = np.inf, -np.inf, np.nan
    x[4, 16:32] = 3e38
    x[5, 32:48] = 1e-30
    x = jnp.asarray(x)
    fused = jax.jit(nvfp4_codes_times_scales, static_argnums=1)
    ref = jax.jit(_nvfp4_operand_reference, static_argnums=1)
    for g in (1.0, 448.0 * 6 / 2.5, 0.37, 2.0 ** 20):
        g = jnp.float32(g)
        got, want = fused(x, key, g), ref(x, key, g)
        assert np.isfinite(np.asarray(want)[8:]).all()  # (the ties rows)
        assert _same_values(got, want), (rule, float(g))


@pytest.mark.parametrize("rule", ["ct", "modelopt"])
def test_fused_mxfp4_operand_is_the_reference_bitwise(rng, rule):
    """mx_codes_times_scales (no barrier) gives quantize_activation's MXFP4 codes times their
    e8m0 scales, bitwise, under jit: magnitudes from 2**-140 to 2**120, values on e2m1 ties
    after the power-of-two scaling, zero groups, inf and NaN."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.numerics.activations import mx_codes_times_scales
    from jqlin.numerics.tiling import expand
    from jqlin.spec import ScaleRule
    key = formats.get("mxfp4").activation
    if rule == "modelopt":
        key = dataclasses.replace(key, rule=ScaleRule.MODELOPT)
    k = 256
    x = rng.standard_normal((12, k)) * np.exp2(rng.uniform(-140, 120, (12, 1)))
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x = np.concatenate([x, rng.choice(ties, (4, k)) * np.exp2(rng.integers(-20, 20, (4, 1)))
                        * rng.choice([-1, 1], (4, k))]).astype(np.float32)
    x[0, :32] = 0
    x[1, 3], x[2, 40], x[3, 7] = np.inf, -np.inf, np.nan

    def ref(x):
        q, s = quantize_activation(x, key)
        return q.astype(jnp.float32) * expand(s, *q.shape)
    x = jnp.asarray(x)
    got = jax.jit(lambda x: mx_codes_times_scales(x, key))(x)
    assert _same_values(got, jax.jit(ref)(x))
    with pytest.raises(ValueError, match="MXFP4 activations"):
        mx_codes_times_scales(x, formats.get("mxfp8").activation)


@pytest.mark.parametrize("name,rule", [("fp8_ptpc", "compressed-tensors"), ("fp8_ptpc", "vllm"),
                                       ("fp8_block", "compressed-tensors")])
def test_fused_fp8_dynamic_codes_are_the_reference_bitwise(rng, name, rule):
    """fp8_dynamic_codes_fused (prepared, not routed) gives quantize_activation's e4m3 codes
    and scales bitwise under jit: rows of 2**-140..2**120, quotients on e4m3 rounding ties
    with inexact reciprocals of the scale, zero rows (the floor / eps scale), inf and NaN."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.numerics.activations import fp8_dynamic_codes_fused
    from jqlin.spec import ScaleRule
    key = formats.get(name).activation
    key = dataclasses.replace(key, rule=ScaleRule(rule))
    k = 512
    x = rng.standard_normal((10, k)) * np.exp2(rng.uniform(-140, 120, (10, 1)))
    # ties: amax 448 * s with s = c * 2**j, other values (e4m3 midpoints) * s, where c's
    # reciprocal is far enough off that x * (1 / s) rounds every midpoint the other way
    e4 = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    e4 = e4[np.isfinite(e4) & (e4 > 0)]
    mids = ((e4[:-1] + e4[1:]) / 2)[e4[:-1] >= 2.0 ** -6]
    s = rng.choice([1013.0, 2021.0, 4093.0], (6, 1)) * np.exp2(rng.integers(-30, -5, (6, 1)))
    ties = rng.choice(mids, (6, k)) * s * rng.choice([-1, 1], (6, k))
    ties[:, ::128] = 448 * s
    x = np.concatenate([x, ties]).astype(np.float32)
    x[0] = 0
    x[1, 3], x[2, 300], x[3, 7] = np.inf, -np.inf, np.nan
    x = jnp.asarray(x)
    q, sc = jax.jit(lambda x: fp8_dynamic_codes_fused(x, key))(x)
    rq, rs = jax.jit(lambda x: quantize_activation(x, key))(x)
    assert q.dtype == rq.dtype and sc.shape == rs.shape
    assert _same_values(sc, rs)
    assert _same_values(q.astype(jnp.float32), rq.astype(jnp.float32))
    with pytest.raises(ValueError, match="dynamic fp8"):
        fp8_dynamic_codes_fused(x, formats.get("nvfp4").activation)
