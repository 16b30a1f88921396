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
