"""Every registered format: quantize, dequantize and the XLA matmul against the NumPy oracle."""

import dataclasses

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import jqlin
import jqlin.numerics
import oracle
from jqlin.spec import GlobalScale, ScaleRule

F32 = np.float32
STATIC_ACT = {"fp8_per_tensor", "nvfp4"}
# Relative Frobenius error of dequantized Gaussian weights (e4m3: 3 mantissa bits; e2m1: 1;
# MX power-of-two scales waste up to a bit of range, and CT's rounding-down may clip at 6).
DEQUANT_BOUND = {"fp8": 0.04, "nvfp4": 0.13, "mxfp4": 0.17}


def _with_rule(spec, rule):
    gs = lambda k: k.global_scale and (GlobalScale.DIVISOR if rule is ScaleRule.CT else GlobalScale.MULTIPLIER)
    rep = lambda k: None if k is None else dataclasses.replace(k, rule=rule, global_scale=gs(k))
    return jqlin.QuantSpec(rep(spec.weight), rep(spec.activation))


def weights(rng, n, k):
    """Gaussian weights with strongly varying row/column magnitudes, plus an outlier."""
    w = rng.standard_normal((n, k)) * np.exp(0.7 * rng.standard_normal((n, 1))) \
        * np.exp(0.7 * rng.standard_normal((1, k)))
    w[rng.integers(n), rng.integers(k)] *= 30
    return w.astype(F32)


def _storage_cols(spec, n, k):
    return max(spec.weight.storage_shape(n, k)[1], -(-k // spec.k_align) * spec.k_align)


def oracle_weight(w, spec):
    """(dequantized float64 weight (N, K), global/scale facts) straight from the oracle."""
    key = spec.weight
    n, k = w.shape
    rows = key.storage_shape(n, k)[0]
    cols = _storage_cols(spec, n, k)
    wp = oracle.pad_to(w, rows, cols)
    g = key.granularity.value
    if key.scale_dtype == "float8_e8m0fnu":
        deq = oracle.weight_mx(wp, key.group_size, key.is_fp4,
                               "modelopt" if key.rule is ScaleRule.MODELOPT else "ct")[2]
    elif key.scale_dtype == "float8_e4m3fn":
        fn = oracle.weight_nvfp4_ct if key.global_scale is GlobalScale.DIVISOR else oracle.weight_nvfp4_modelopt
        deq = fn(wp, key.group_size)[3]
    else:
        tr, tc = {"tensor": (rows, cols), "channel": (1, cols), "group": (1, key.k_tile or 1),
                  "block": key.block}[g]
        deq = oracle.weight_fp8(wp, tr, tc)[2]
    return deq[:n, :k]


def oracle_matmul(x, qw_ref, spec, input_scale):
    """float64 y from the oracle's own activation rule and dequantized weight."""
    k = x.shape[1]
    a = spec.activation
    kp = _storage_cols(spec, qw_ref.shape[0], k)
    xp = oracle.pad_to(x, x.shape[0], kp)
    rule = "modelopt" if a is not None and a.rule is ScaleRule.MODELOPT else "ct"
    if a is None:
        xq = xp.astype(np.float64)
    elif a.scale_dtype == "float8_e8m0fnu":
        xq = oracle.act_mx(xp, a.group_size, a.is_fp4, rule)
    elif a.scale_dtype == "float8_e4m3fn":
        xq = oracle.act_nvfp4(xp, input_scale, rule, a.group_size)
    elif a.granularity.value == "tensor":
        xq = oracle.act_fp8_static(xp, input_scale, rule)
    else:
        xq = oracle.act_fp8_dynamic(xp, a.group_size, vllm=a.rule is ScaleRule.VLLM)
    return xq[:, :k] @ qw_ref.T


def make(name, rng, n, k, m, rule=ScaleRule.CT):
    spec = _with_rule(jqlin.formats.get(name), rule)
    w = weights(rng, n, k)
    x = (rng.standard_normal((m, k)) * 2).astype(F32)
    qw = jqlin.quantize(w, spec, calibration=x if name in STATIC_ACT else None)
    return spec, w, x, qw


NAMES = jqlin.formats.names()
RULES = [ScaleRule.CT, ScaleRule.MODELOPT]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_oracle(name, rule, rng):
    spec, w, _, qw = make(name, rng, 70, 96, 3, rule)
    ref = oracle_weight(w, spec)
    got = np.asarray(qw.dequantize())
    assert got.shape == w.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=2e-7, atol=0)
    err = np.linalg.norm(got - w) / np.linalg.norm(w)
    family = "fp8" if not spec.weight.is_fp4 else name.split("_")[0]
    assert err < DEQUANT_BOUND[family], err


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("name", NAMES)
def test_xla_matmul_matches_oracle(name, rule, rng):
    spec, w, x, qw = make(name, rng, 130, 160, 5, rule)
    y = jqlin.matmul(jnp.asarray(x), qw, kernel="xla")
    ref = oracle_matmul(x, oracle_weight(w, spec), spec,
                        None if qw.input_scale is None else float(qw.input_scale))
    assert y.shape == (5, 130) and y.dtype == jnp.float32
    rel = np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)
    assert rel < 1e-5, rel


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
@pytest.mark.parametrize("name", ["fp8_per_channel_a16", "fp8_block_a16", "nvfp4_a16", "mxfp8_a16", "mxfp4_a16"])
def test_stored_codes_and_scales_are_bitwise_the_producers(name, rule, rng):
    """Not just the dequantized values: the stored bytes must be what the producer writes."""
    spec, w, _, qw = make(name, rng, 256, 256, 1, rule)
    key = spec.weight
    data = np.asarray(qw.data)
    if key.scale_dtype == "float32":
        q, s, _ = oracle.weight_fp8(w, *((1, 256) if key.granularity.value == "channel" else key.block))
    elif key.scale_dtype == "float8_e8m0fnu":
        q, s, _ = oracle.weight_mx(w, 32, key.is_fp4, "modelopt" if rule is ScaleRule.MODELOPT else "ct")
    else:
        fn = oracle.weight_nvfp4_ct if rule is ScaleRule.CT else oracle.weight_nvfp4_modelopt
        q, s, g, _ = fn(w)
        assert np.float32(qw.global_scale) == g
    if key.is_fp4:
        data = np.asarray(jqlin.numerics.unpack_e2m1(qw.data)).view(np.uint8) & 0xF
        q = q.view(np.uint8) & 0xF
    np.testing.assert_array_equal(data.view(np.uint8), q.view(np.uint8))
    np.testing.assert_array_equal(np.asarray(qw.scale).view(np.uint8), np.asarray(s).view(np.uint8))


def test_vllm_token_rule_floors_the_scale(rng):
    spec = jqlin.QuantSpec(jqlin.formats.get("fp8_ptpc").weight,
                           dataclasses.replace(jqlin.formats.get("fp8_ptpc").activation, rule=ScaleRule.VLLM))
    w = weights(rng, 16, 64)
    x = np.zeros((2, 64), F32)
    x[1] = rng.standard_normal(64) * 1e-6  # amax/448 below 1/(448*512): the floor applies
    qw = jqlin.quantize(w, spec)
    y = np.asarray(jqlin.matmul(x, qw))
    ref = oracle.act_fp8_dynamic(x, vllm=True) @ np.asarray(qw.dequantize(), np.float64).T
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-12)
    assert np.all(y[0] == 0)


@pytest.mark.parametrize("name", NAMES)
def test_overflow_and_zero_blocks_never_nan(name, rng):
    w = weights(rng, 40, 64)
    w[:, :32] = 0.0  # all-zero groups/blocks
    w[3, 40] = 1e30  # far beyond any element max
    x = rng.standard_normal((3, 64)).astype(F32)
    x[0] = 0.0  # an all-zero activation row
    qw = jqlin.quantize(w, name, calibration=x if name in STATIC_ACT else None)
    deq = np.asarray(qw.dequantize())
    assert np.isfinite(deq).all()
    assert np.all(deq[:, :32] == 0)
    y = np.asarray(jqlin.matmul(x, qw))
    assert np.isfinite(y).all() and np.all(y[0] == 0)


def _flushes_subnormals() -> bool:
    """Whether the default device's XLA flushes float32 subnormal results to zero (its CPU
    compiler does; XLA:GPU keeps them -- session 45, H100)."""
    return float(jax.jit(lambda a: a / 448)(F32(1e-36))) == 0


@pytest.mark.parametrize("name", NAMES)
def test_a_weight_too_small_for_float32_scales_is_refused(name, rng):
    # 1e-36: amax / 448 (FP8), amax / 2688 (NVFP4) and the MX e8m0 step are float32
    # subnormals. Where XLA flushes them every code would be zero: refused. Where it keeps
    # them (the GPU) the weight quantizes, as torch's tools do -- except NVFP4's
    # compressed-tensors global 2688 / amax, which overflows to inf (NaN weights) anywhere.
    # 1e-30 still quantizes everywhere.
    cal = np.ones((1, 64), F32) if name in STATIC_ACT else None
    w = weights(rng, 8, 64)
    w /= np.abs(w).max()
    small = jqlin.quantize(w * F32(1e-30), name, calibration=cal)
    assert np.any(np.asarray(small.dequantize()) != 0)
    if name.startswith("mxfp4"):  # e2m1 x 2^-127 still holds the largest values
        return
    if _flushes_subnormals() or name.startswith("nvfp4"):
        with pytest.raises(ValueError, match=r"largest magnitude is 1e-36: too small for "
                                             rf"{name}'s float32 scales"):
            jqlin.quantize(w * F32(1e-36), name, calibration=cal)
    else:
        tiny = np.asarray(jqlin.quantize(w * F32(1e-36), name, calibration=cal).dequantize())
        assert np.isfinite(tiny).all() and np.any(tiny != 0)


@pytest.mark.parametrize("name", NAMES)
def test_all_zero_weight(name):
    qw = jqlin.quantize(np.zeros((8, 64), F32), name,
                        calibration=np.ones((1, 64), F32) if name in STATIC_ACT else None)
    assert np.all(np.asarray(qw.dequantize()) == 0)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_rows_are_batch_invariant(name, rng):
    spec, w, x, qw = make(name, rng, 70, 200, 300)
    f = lambda xs: jqlin.matmul(xs, qw, deterministic=True)
    alone = np.asarray(f(x[:1]))
    for m in (2, 7, 64, 300):
        batch = np.asarray(f(np.concatenate([x[:1], rng.standard_normal((m - 1, 200)).astype(F32)])))
        np.testing.assert_array_equal(batch[:1], alone)


def test_bf16_activations_give_bf16_output(rng):
    _, _, x, qw = make("fp8_block", rng, 64, 256, 4)
    y = jqlin.matmul(jnp.asarray(x, jnp.bfloat16), qw)
    assert y.dtype == jnp.bfloat16
    y3 = jqlin.matmul(jnp.asarray(x).reshape(2, 2, 256), qw)
    assert y3.shape == (2, 2, 64)


@pytest.mark.slow(25)
@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(NAMES), m=st.integers(1, 9), n=st.integers(1, 150),
       k=st.integers(1, 300), seed=st.integers(0, 2**31))
def test_property_shapes(name, m, n, k, seed):
    rng = np.random.default_rng(seed)
    spec, w, x, qw = make(name, rng, n, k, m)
    deq = np.asarray(qw.dequantize())
    assert deq.shape == (n, k)
    np.testing.assert_allclose(deq, oracle_weight(w, spec), rtol=2e-7, atol=0)
    y = np.asarray(jqlin.matmul(x, qw))
    ref = oracle_matmul(x, oracle_weight(w, spec), spec,
                        None if qw.input_scale is None else float(qw.input_scale))
    assert y.shape == (m, n)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * (np.abs(ref).max() + 1e-30))
