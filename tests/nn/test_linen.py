"""jqlin.linen.QuantDense: init/apply, converting Dense params, jit, errors."""

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin


def test_init_apply_matches_matmul(rng):
    layer = jqlin.linen.QuantDense(features=24, spec="fp8_ptpc")
    x = jnp.asarray(rng.standard_normal((2, 5, 48)), jnp.float32)
    params = layer.init(jax.random.key(0), x)
    qw = params["params"]["qweight"]
    assert isinstance(qw, jqlin.QuantizedWeight) and qw.shape == (24, 48)
    assert qw.spec == jqlin.formats.get("fp8_ptpc")
    y = layer.apply(params, x)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jqlin.matmul(x, qw) + params["params"]["bias"]))
    y_jit = jax.jit(layer.apply)(params, x)
    np.testing.assert_allclose(np.asarray(y_jit), np.asarray(y), rtol=1e-6,
                               atol=1e-6 * float(jnp.abs(y).max()))


def test_convert_dense_params(rng):
    dense = nn.Dense(32)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    dparams = dense.init(jax.random.key(1), x)["params"]
    dparams = {"kernel": dparams["kernel"] * jnp.exp(jnp.asarray(rng.standard_normal((1, 32)), jnp.float32)),
               "bias": jnp.asarray(rng.standard_normal(32), jnp.float32)}
    qparams = jqlin.linen.QuantDense.convert_params(dparams, "nvfp4_a16")
    layer = jqlin.linen.QuantDense(features=32, spec="nvfp4_a16")
    y = layer.apply({"params": qparams}, x)
    w = np.asarray(qparams["qweight"].dequantize(), np.float64)
    ref = np.asarray(x, np.float64) @ w.T + np.asarray(dparams["bias"], np.float64)
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    # the quantized weight is the Dense kernel transposed, not reinterpreted
    rel = np.linalg.norm(w - np.asarray(dparams["kernel"]).T) / np.linalg.norm(dparams["kernel"])
    assert rel < 0.15
    stored = jqlin.linen.QuantDense.params_from_quantized(qparams["qweight"], dparams["bias"])
    np.testing.assert_array_equal(np.asarray(layer.apply({"params": stored}, x)), np.asarray(y))


def test_wrong_params_are_named():
    layer = jqlin.linen.QuantDense(features=8, spec="fp8_block_a16", use_bias=False)
    qw = jqlin.quantize(jnp.ones((8, 16)), "fp8_ptpc")
    with pytest.raises(flax.errors.ScopeParamShapeError, match="qweight"):
        layer.apply({"params": {"qweight": qw}}, jnp.ones((1, 16)))
    with pytest.raises(ValueError, match="kernel"):
        jqlin.linen.QuantDense.convert_params({"w": jnp.ones((2, 2))}, "fp8_ptpc")


def test_a_float32_dtype_keeps_a_bf16_x_and_writes_float32(rng, monkeypatch):
    """dtype=float32 with a bf16 x: the kernel takes x as it is (a float32 x is the GPU's slower
    float32-activation path) and writes float32 -- the product of the same values."""
    layer = jqlin.linen.QuantDense(features=16, spec="mxfp8_a16", dtype=jnp.float32)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.bfloat16)
    params = layer.init(jax.random.key(2), x)
    seen = []
    real = jqlin.nn.linen.matmul
    monkeypatch.setattr("jqlin.nn.linen.matmul",
                        lambda xx, qw, **kw: seen.append((xx.dtype, kw["out_dtype"])) or
                        real(xx, qw, **kw))
    y = layer.apply(params, x)
    assert seen == [(jnp.bfloat16, jnp.float32)] and y.dtype == jnp.float32
    qw = params["params"]["qweight"]
    ref = np.asarray(x, np.float64) @ np.asarray(qw.dequantize(), np.float64).T
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
