"""Element numerics against hand-computed values and the independent NumPy oracle."""

import dataclasses

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
    amax[:8] = [0.0, 448.0, 1.75, 1.7499999, 1.5, 6.0, np.inf, np.nan]
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


def _codes_times(q, scale, group):
    """float64 codes times their group's scale (exact: few-bit codes)."""
    q = np.asarray(q.astype(jnp.float32), np.float64)
    return q * np.repeat(np.asarray(scale, np.float64), group, axis=1)


@pytest.mark.parametrize("rule", ["ct", "modelopt"])
def test_nvfp4_activations_are_the_oracle_bitwise(rng, rule):
    """quantize_activation's NVFP4 codes times block steps (computed without barriers since
    session 30, so XLA fuses them) are the NumPy oracle's, bitwise, under jit: rows of many
    magnitudes, rows on e2m1 ties with inexact reciprocals, zero groups (the eps / 1 scale),
    inf; several global scales. A NaN activation gives the code -0 (XLA's convert) and its
    group the NaN block step (tests/test_nonfinite_activations.py: the NaN reaches the output)."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.spec import GlobalScale, ScaleRule
    key = formats.get("nvfp4").activation
    if rule == "modelopt":
        key = dataclasses.replace(key, rule=ScaleRule.MODELOPT,
                                  global_scale=GlobalScale.MULTIPLIER)
    k = 256
    x = rng.standard_normal((12, k)) * np.exp2(rng.uniform(-60, 60, (12, 1)))
    x = np.concatenate([x, oracle.nvfp4_ties(rng, 8, k // 16)]).astype(np.float32)
    x[0, :16] = 0  # a zero group
    x[1, 3], x[2, 40] = np.inf, -np.inf
    x[4, 16:32] = 3e38

    run = jax.jit(lambda x, g: quantize_activation(x, key, g))
    for g in (1.0, 448.0 * 6 / 2.5, 0.37, 2.0 ** 20):
        q, t = run(jnp.asarray(x), jnp.float32(g))
        got = _codes_times(q, t, 16)
        assert _same_values(got, oracle.act_nvfp4(x, g, rule)), float(g)
    x[3, 7] = np.nan
    q, t = run(jnp.asarray(x), jnp.float32(1.0))
    code = np.asarray(q.astype(jnp.float32))[3, 7]
    assert code == 0 and np.signbit(code)
    assert np.isnan(np.asarray(t)[3, 0]) and np.isfinite(np.asarray(t)[3, 1:]).all()


@pytest.mark.parametrize("rule", ["ct", "modelopt"])
def test_mxfp4_activations_are_the_oracle_bitwise(rng, rule):
    """quantize_activation's MXFP4 codes times e8m0 scales (no barrier since session 30) are
    the NumPy oracle's, bitwise, under jit: magnitudes 2**-100..2**100, values on e2m1 ties
    after the power-of-two scaling, zero groups, groups holding inf (ModelOpt: e = 127, the
    clamped ceil(log2(inf)); CT: the bits' exponent field) or NaN (the NaN scale, u = 255)."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.spec import ScaleRule
    key = formats.get("mxfp4").activation
    if rule == "modelopt":
        key = dataclasses.replace(key, rule=ScaleRule.MODELOPT)
    k = 256
    x = rng.standard_normal((12, k)) * np.exp2(rng.uniform(-100, 100, (12, 1)))
    ties = np.float32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x = np.concatenate([x, rng.choice(ties, (4, k)) * np.exp2(rng.integers(-20, 20, (4, 1)))
                        * rng.choice([-1, 1], (4, k))]).astype(np.float32)
    x[0, :32] = 0
    # (the inf group's other values non-negative: times 2**-127 they underflow, and a -0.0
    # takes the code -0 here, +0 in the oracle's np.sign -- not a question of inf)
    x[1, 32:64] = np.abs(x[1, 32:64])
    x[1, 40], x[2, 70], x[3, 0:32] = np.inf, np.nan, np.nan
    q, sc = jax.jit(lambda x: quantize_activation(x, key))(jnp.asarray(x))
    with np.errstate(invalid="ignore", over="ignore"):
        assert _same_values(_codes_times(q, sc, 32), oracle.act_mx(x, 32, True, rule))


@pytest.mark.parametrize("name,rule", [("fp8_ptpc", "compressed-tensors"), ("fp8_ptpc", "vllm"),
                                       ("fp8_block", "compressed-tensors")])
def test_fp8_dynamic_activations_are_the_oracle_bitwise(rng, name, rule):
    """quantize_activation's dynamic FP8 codes times scales (barrier-free since session 31, so
    XLA fuses the pass after the amax) are the NumPy oracle's, bitwise, under jit: rows of
    2**-100..2**120 (subnormal codes, the vLLM floor), rows on e4m3 ties with inexact
    reciprocals, a zero row (eps / floor scale); inf and NaN give the cast's NaN codes."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.spec import ScaleRule
    key = dataclasses.replace(formats.get(name).activation, rule=ScaleRule(rule))
    group = key.group_size if name == "fp8_block" else None
    k = 512
    # (from 2**-100: below ~2**-118 amax / 448 is a float32 subnormal, which CPU XLA flushes
    # to zero and NumPy keeps -- not a rule difference)
    x = rng.standard_normal((10, k)) * np.exp2(rng.uniform(-100, 120, (10, 1)))
    x[9] = rng.standard_normal(k) * 2.0 ** -22  # the vLLM floor binds: subnormal codes
    s = rng.choice([1013.0, 2021.0, 4093.0], (6, 1)) * np.exp2(rng.integers(-30, -5, (6, 1)))
    ties = oracle.e4m3_ties(rng, (6, k), s)
    ties[:, ::128] = 448 * s  # the amax of every row and group: the scale is s
    x = np.concatenate([x, ties]).astype(np.float32)
    x[0] = 0
    run = jax.jit(lambda x: quantize_activation(x, key))
    q, sc = run(jnp.asarray(x))
    assert q.dtype == jnp.float8_e4m3fn
    assert _same_values(_codes_times(q, sc, group or k),
                        oracle.act_fp8_dynamic(x, group, vllm=rule == "vllm"))
    x[1, 3], x[2, 300], x[3, 7] = np.inf, -np.inf, np.nan
    q, sc = run(jnp.asarray(x))
    with np.errstate(invalid="ignore"):  # (inf / inf)
        ref = oracle.e4m3(x / np.repeat(np.asarray(sc), group or k, 1)).astype(np.float32)
    got = np.asarray(q).astype(np.float32)
    nan = np.isnan(ref)  # (a NaN code's sign bit is the device's: 0x7f or 0xff, both NaN)
    assert np.array_equal(np.isnan(got), nan) and _same_values(got[~nan], ref[~nan])


def test_deepseek_ue8m0_activations_are_the_oracle_bitwise(rng):
    """ScaleRule.DEEPSEEK (`scale_fmt: "ue8m0"`): codes times power-of-two scales are the
    oracle's, bitwise, under jit -- groups of 2**-60..2**100, amaxes exactly 448 * 2**j (the
    scale is 2**j: never doubled by the float32 product with 1/448), just above (doubled),
    below the 1e-4 floor, zero; a group holding NaN or inf gets the NaN scale."""
    from jqlin.numerics import quantize_activation
    from jqlin.spec import Granularity, QuantKey, ScaleRule
    key = QuantKey("float8_e4m3fn", Granularity.GROUP, scale_dtype="float8_e8m0fnu",
                   dynamic=True, group_size=128, rule=ScaleRule.DEEPSEEK)
    k = 512
    x = (rng.standard_normal((8, k)) * np.exp2(rng.uniform(-60, 100, (8, k // 128)).repeat(128, 1))
         ).astype(np.float32)
    x[0, :128] = 0
    x[1, :128] *= 1e-6 / np.abs(x[1, :128]).max()  # under the floor
    j = rng.integers(-20, 20, (4,))
    for r in range(2, 6):  # the amax exactly 448 * 2**j, then the next float32 above it
        x[r, 128:256] = np.clip(x[r, 128:256], -1, 1) * np.exp2(j[r - 2])
        x[r, 130] = np.float32(448 * 2.0 ** j[r - 2])
        x[r, 256:384] = x[r, 128:256]
        x[r, 258] = np.nextafter(x[r, 130], np.float32(np.inf))
    run = jax.jit(lambda x: quantize_activation(x, key))
    q, sc = run(jnp.asarray(x))
    want, s = oracle.act_fp8_ue8m0(x)
    assert q.dtype == jnp.float8_e4m3fn and sc.shape == (8, 4)
    np.testing.assert_array_equal(np.asarray(sc), s)
    assert _same_values(_codes_times(q, sc, 128), want)
    sc = np.asarray(sc)
    assert np.all(sc[2:6, 1] == np.exp2(j)) and np.all(sc[2:6, 2] == np.exp2(j + 1))
    assert sc[0, 0] == sc[1, 0] == 2.0 ** -22  # ceil(log2(1e-4 / 448))
    x[6, 5], x[7, 400] = np.nan, np.inf
    q, sc = run(jnp.asarray(x))
    sc = np.asarray(sc)
    assert np.isnan(sc[6, 0]) and np.isnan(sc[7, 3])
    assert np.isfinite(np.delete(sc.reshape(-1), [6 * 4, 7 * 4 + 3])).all()
    q = np.asarray(q.astype(jnp.float32))  # those groups' codes NaN too (x / NaN, as the kernel)
    assert np.isnan(q[6, :128]).all() and np.isnan(q[7, 384:]).all()


def test_the_deepseek_rule_is_defined_for_e4m3_e8m0_activation_groups_only():
    from jqlin.spec import Granularity, QuantKey, ScaleRule
    for kw in (dict(dynamic=False), dict(scale_dtype="float32"), dict(dtype="float4_e2m1fn")):
        args = {**dict(dtype="float8_e4m3fn", granularity=Granularity.GROUP, group_size=128,
                       scale_dtype="float8_e8m0fnu", dynamic=True, rule=ScaleRule.DEEPSEEK), **kw}
        with pytest.raises(ValueError, match="rule 'deepseek'"):
            QuantKey(**args)
    QuantKey("float8_e4m3fn", Granularity.GROUP, scale_dtype="float8_e8m0fnu", dynamic=True,
             group_size=128, rule=ScaleRule.DEEPSEEK)  # the one it is defined for


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,tile", [("fp8_per_tensor", None), ("fp8_per_channel_a16", (1, 0)),
                                       ("fp8_block", (128, 128))])
def test_ct_fp8_weights_in_their_own_dtype_are_the_oracle_bitwise(rng, dtype, name, tile):
    """compressed-tensors quantizes FP8 weights in the weight's dtype: s = amax / 448 and the
    quotient w / s each rounded to that dtype (torch's 16-bit division: correctly rounded),
    then e4m3. jqlin's codes and scales are the NumPy oracle's (NumPy / ml_dtypes 16-bit
    arithmetic), eager and under jit -- where XLA kept float32 excess precision and turned the
    division into a reciprocal multiply (float16 codes differed on the CPU before
    exact.div rounded 16-bit quotients itself). Rows of tiny magnitude give subnormal float16
    scales."""
    from jqlin import formats
    from jqlin.numerics import quantize_weight
    dt = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    n, k = 256, 384
    w = (rng.standard_normal((n, k)) * np.exp(rng.uniform(-4, 4, (n, 1)))).astype(dt)
    w[:8] = (w[:8].astype(np.float32) * np.float32(1e-4)).astype(dt)
    key = formats.get(name).weight
    tr, tc = (n, k) if tile is None else (tile[0], tile[1] or k)
    tiles = np.abs(w).reshape(n // tr, tr, k // tc, tc)
    s = (tiles.max(axis=(1, 3)) / dt(448)).astype(dt)
    s = np.where(s == 0, ml_dtypes.finfo(dt).eps, s).astype(dt)
    full = np.repeat(np.repeat(s, tr, 0), tc, 1)
    want_q = np.clip(w / full, dt(-448), dt(448)).astype(ml_dtypes.float8_e4m3fn)
    if dtype == "float16":
        assert (s.astype(np.float32) < 2.0 ** -14).any() or tile != (1, 0)  # (subnormals met)
    for how, f in (("eager", quantize_weight), ("jit", jax.jit(quantize_weight,
                                                                static_argnums=1))):
        q, sc, _ = f(jnp.asarray(w), key)
        np.testing.assert_array_equal(np.asarray(q).view(np.uint8), want_q.view(np.uint8),
                                      err_msg=how)
        np.testing.assert_array_equal(np.asarray(sc).reshape(s.shape), s.astype(np.float32),
                                      err_msg=how)


@pytest.mark.parametrize("granularity", ["token", "group"])
def test_bounded_amax_activations_are_the_oracle_bitwise(rng, granularity):
    """QuantKey.amax_bound (fbgemm_fp8's activation_scale_ub): the vLLM rule on min(amax,
    bound), codes and scales bitwise the oracle's under jit; rows (groups) past the bound
    saturate at +-448 and only those change; a NaN row keeps its NaN scale; the bound is a
    float32 (0.1 is float32(0.1) on both sides)."""
    from jqlin.numerics import quantize_activation
    from jqlin.spec import Granularity, QuantKey, ScaleRule
    group = 128 if granularity == "group" else None
    for bound in (3.0, 0.1):
        key = QuantKey("float8_e4m3fn", Granularity(granularity), dynamic=True,
                       group_size=group, rule=ScaleRule.VLLM, amax_bound=bound)
        free = dataclasses.replace(key, amax_bound=None)
        x = (rng.standard_normal((8, 512)) * np.exp2(rng.uniform(-6, 6, (8, 1)))).astype(
            np.float32)
        x[1, 7] = 1e5
        run = jax.jit(lambda x, key=key: quantize_activation(x, key))
        q, sc = run(jnp.asarray(x))
        tc = group or 512
        ref = oracle.act_fp8_dynamic(x, group, vllm=True, amax_bound=bound)
        assert _same_values(_codes_times(q, sc, tc), ref), bound
        past = np.abs(x).reshape(8, -1, tc).max(axis=2) > np.float32(bound)
        assert past.any() and not past.all()
        qf = np.asarray(q.astype(jnp.float32)).reshape(8, -1, tc)
        assert (np.abs(qf).max(axis=2)[past] == 448).all()
        q0, s0 = jax.jit(lambda x: quantize_activation(x, free))(jnp.asarray(x))
        same = np.asarray(sc) == np.asarray(s0)
        assert np.array_equal(same, ~past)
        x[3, 9] = np.nan
        _, sc = run(jnp.asarray(x))
        assert np.isnan(np.asarray(sc)[3, 0]) and np.isfinite(np.delete(np.asarray(sc), 3, 0)).all()


def test_amax_bound_is_defined_for_dynamic_e4m3_float32_scales_only():
    from jqlin.spec import Granularity, QuantKey, ScaleRule
    ok = dict(dtype="float8_e4m3fn", granularity=Granularity.TOKEN, dynamic=True,
              rule=ScaleRule.VLLM)
    assert "amax<=1200" in QuantKey(**ok, amax_bound=1200).describe()
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1200"):
        with pytest.raises(ValueError, match="amax_bound must be a finite positive number"):
            QuantKey(**ok, amax_bound=bad)
    for kw in (dict(granularity=Granularity.TENSOR, dynamic=False),
               dict(dtype="float4_e2m1fn", granularity=Granularity.GROUP, group_size=16),
               dict(granularity=Granularity.GROUP, group_size=32,
                    scale_dtype="float8_e8m0fnu")):
        with pytest.raises(ValueError, match="amax_bound caps the amax of dynamic e4m3"):
            QuantKey(**{**ok, **kw}, amax_bound=10.0)


@pytest.mark.parametrize("rule", ["compressed-tensors", "modelopt"])
def test_fp8_static_activations_are_the_oracle_bitwise(rng, rule):
    """Static per-tensor FP8 (barrier-free since session 31): codes times scale bitwise the
    oracle's for input scales with inexact reciprocals and activations on e4m3 ties."""
    import dataclasses
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    from jqlin.spec import ScaleRule
    key = dataclasses.replace(formats.get("fp8_per_tensor").activation, rule=ScaleRule(rule))
    run = jax.jit(lambda x, s: quantize_activation(x, key, s))
    for c in (1013.0, 2021.0, 4093.0):
        s = np.float32(c * 2.0 ** -13)
        x = np.concatenate([oracle.e4m3_ties(rng, (4, 256), s),
                            rng.standard_normal((4, 256)) * s * 50]).astype(np.float32)
        q, sc = run(jnp.asarray(x), jnp.float32(s))
        assert _same_values(_codes_times(q, sc, 256), oracle.act_fp8_static(x, s, rule)), c


def _normal_quotient_pairs(rng, n):
    """float32 pairs of many magnitudes and both signs whose quotients are normal floats, with
    runs of equal significands (quotient exactly a power of two) and near-equal ones."""
    a = rng.standard_normal(n) * np.exp2(rng.uniform(-40, 40, n))
    b = rng.standard_normal(n) * np.exp2(rng.uniform(-40, 40, n))
    a[: n // 8] = b[: n // 8] * np.exp2(rng.integers(-20, 20, n // 8))
    a[n // 8: n // 4] = np.nextafter(b[n // 8: n // 4].astype(np.float32), np.float32(np.inf))
    return a.astype(np.float32), b.astype(np.float32)


def test_division_is_ieee():
    """exact.div -- and its GPU path div_corrected, run here directly -- is NumPy's correctly
    rounded float32 division, bit for bit, for normal operands and quotients (broadcast
    divisors too: XLA's simplifier makes those a reciprocal multiply, which the correction
    undoes)."""
    from jqlin.numerics.exact import div, div_corrected
    a, b = _normal_quotient_pairs(np.random.default_rng(5), 1 << 18)
    x = a.reshape(-1, 256)
    s = np.abs(b[: x.shape[0], None]) + np.float32(1e-30)
    for f in (div, lambda a, b: div_corrected(*jnp.broadcast_arrays(a, b))):
        assert _same_values(jax.jit(f)(a, b), a / b)
        assert _same_values(jax.jit(f)(x, s), x / s)
        assert _same_values(jax.jit(lambda x: f(x, np.float32(448.0)))(x), x / np.float32(448.0))


def test_division_corrects_guesses_several_ulps_off():
    """The integer correction rounds the significand quotient from any guess within 4 units --
    what the GPU's approximate division (2 ulp) or a reciprocal multiply (3) may give; on this
    CPU the guess is already exact, so the correction is checked here from perturbed guesses."""
    from jqlin.numerics.exact import _round_significand_quotient
    rng = np.random.default_rng(6)
    n = 1 << 16
    sa = (rng.integers(0, 1 << 23, n) | (1 << 23)).astype(np.uint32)
    sb = (rng.integers(0, 1 << 23, n) | (1 << 23)).astype(np.uint32)
    sb[:1000] = sa[:1000]  # quotient 2**23
    sb[1000:2000] = sa[1000:2000] - 1  # quotients just above 2**23: q rounds to the top, 2**24
    k = np.where(sa >= sb, 23, 24).astype(np.uint32)
    exact = np.round(sa.astype(np.float64) * np.exp2(k) / sb).astype(np.int64)  # (never a tie)
    run = jax.jit(_round_significand_quotient)
    for d in range(-4, 5):
        q = run(jnp.asarray(sa), jnp.asarray(sb), jnp.asarray(k),
                jnp.asarray((exact + d).astype(np.int32)))
        np.testing.assert_array_equal(np.asarray(q), exact, err_msg=f"guess off by {d}")


@pytest.mark.gpu
def test_gpu_division_and_activation_codes_are_ieee(rng):
    """On the GPU (whose XLA division is `div.full.f32`, up to 2 ulp off): exact.div is NumPy's
    division bitwise on 4M pairs, and the FP8 / NVFP4 activation rules' codes -- the ties
    cases of the tests above -- are the oracle's."""
    from jqlin.numerics.exact import div
    a, b = _normal_quotient_pairs(np.random.default_rng(7), 1 << 22)
    got = jax.jit(div)(jnp.asarray(a), jnp.asarray(b))
    plain = np.asarray(jax.jit(jnp.divide)(jnp.asarray(a), jnp.asarray(b)))
    differ = int(np.sum(plain.view(np.uint32) != (a / b).view(np.uint32)))
    print("plain XLA division differs on", differ, "of", a.size)
    assert _same_values(got, a / b)
    _every_dividing_rule_against_the_oracle(rng)
    for rule in ("ct", "modelopt"):
        test_mxfp4_activations_are_the_oracle_bitwise(rng, rule)


def _every_dividing_rule_against_the_oracle(rng):
    """The oracle ties tests of every activation rule that divides (FP8, NVFP4)."""
    for name, rule in [("fp8_ptpc", "compressed-tensors"), ("fp8_ptpc", "vllm"),
                       ("fp8_block", "compressed-tensors")]:
        test_fp8_dynamic_activations_are_the_oracle_bitwise(rng, name, rule)
    for rule in ("compressed-tensors", "modelopt"):
        test_fp8_static_activations_are_the_oracle_bitwise(rng, rule)
    for rule in ("ct", "modelopt"):
        test_nvfp4_activations_are_the_oracle_bitwise(rng, rule)


@pytest.mark.parametrize("name", ["fp8_ptpc", "fp8_block", "fp8_per_tensor", "nvfp4", "mxfp4"])
def test_activation_rules_have_no_barriers(name):
    """Lowered for the GPU, the activation rules keep no optimization barrier (each would end
    an XLA fusion: the FP8 / NVFP4 rules ran as 5-7 kernels with them at decode sizes on the
    H200). (The CPU lowering divides behind one: exact.div.)"""
    from jqlin import formats
    from jqlin.numerics import quantize_activation
    key = formats.get(name).activation
    scale = None if key.dynamic and key.global_scale is None else jnp.float32(0.5)
    text = jax.jit(lambda x: quantize_activation(x, key, scale)).trace(
        jnp.ones((2, 256), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    assert "optimization_barrier" not in text


def test_rules_on_the_gpu_division_path_are_the_oracle_bitwise(rng, monkeypatch):
    """The oracle ties tests above with the rules dividing by div_corrected (the GPU's path of
    exact.div, whose CPU lowering divides behind a barrier instead) -- on this CPU."""
    from jqlin.numerics import activations
    from jqlin.numerics.exact import div_corrected

    def corrected(a, b):
        a = jnp.asarray(a, jnp.float32)
        return div_corrected(*jnp.broadcast_arrays(a, jnp.asarray(b, jnp.float32)))

    monkeypatch.setattr(activations, "div", corrected)
    _every_dividing_rule_against_the_oracle(rng)
