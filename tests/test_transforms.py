"""matmul under JAX transformations: vmap keeps the producers' numerics, the derivative with
respect to x is one rule for every kernel, and jax_enable_x64 changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin

# one kernel of each Pallas family (forced: interpret mode on CPU) and the XLA reference
KERNELS = [("fp8_per_channel_a16", "pallas_fp8_w8a16"), ("fp8_ptpc", "pallas_fp8_w8a8"),
           ("fp8_block", "pallas_fp8_block"), ("nvfp4_a16", "pallas_nvfp4"),
           ("nvfp4", "pallas_nvfp4"), ("mxfp8", "pallas_mxfp8"), ("mxfp4_a16", "pallas_mxfp4"),
           ("fp8_ptpc", "xla"), ("fp8_block", "xla"), ("nvfp4_a16", "xla")]


def _weight(rng, fmt, n=48, k=256):
    kw = {}
    if fmt == "nvfp4":  # (a static activation global)
        kw["calibration"] = jnp.asarray(rng.standard_normal((4, k)), jnp.float32)
    return jqlin.quantize(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), fmt, **kw)


@pytest.mark.parametrize("fmt", ["fp8_ptpc", "fp8_block", "nvfp4", "mxfp8"])
def test_vmap_gives_the_codes_of_each_call(rng, fmt):
    """vmap used to move the activation scales' division by a constant 1 ulp (XLA's
    reciprocal rewrite reached the divisor broadcast after the barrier): codes at ties moved."""
    qw = _weight(rng, fmt)
    # bf16 inputs put many quotients x / s on e4m3 ties
    x = jnp.asarray(rng.standard_normal((3, 8, 256)), jnp.bfloat16).astype(jnp.float32)
    mapped = np.asarray(jax.vmap(lambda xb: jqlin.matmul(xb, qw, kernel="xla"))(x))
    one_by_one = np.stack([np.asarray(jqlin.matmul(x[b], qw, kernel="xla")) for b in range(3)])
    np.testing.assert_array_equal(mapped, one_by_one)
    stacked = jax.tree.map(lambda a: jnp.stack([a] * 3), qw)  # a stacked weight, mapped along
    both = np.asarray(jax.vmap(lambda xb, w: jqlin.matmul(xb, w, kernel="xla"))(x, stacked))
    np.testing.assert_array_equal(both, one_by_one)


@pytest.mark.parametrize("fmt,kernel", KERNELS)
def test_gradient_wrt_x_is_that_of_the_dequantized_product(rng, fmt, kernel):
    """d/dx sum(c * matmul(x, W)) = c @ W_deq for every kernel and x dtype (Pallas calls have
    no derivative, and the 4-bit / MX kernels' exact split of float32 rows differentiated to
    zero); through quantized activations this is the straight-through estimator."""
    qw = _weight(rng, fmt)
    w64 = np.asarray(qw.dequantize(), np.float64)
    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.asarray(rng.standard_normal((3, 256)), dtype)
        c = jnp.asarray(rng.standard_normal((3, 48)), jnp.float32)

        def loss(xx):
            return jnp.sum(c * jqlin.matmul(xx, qw, kernel=kernel).astype(jnp.float32))

        g = jax.jit(jax.grad(loss))(x)
        assert g.dtype == dtype
        want = np.asarray(c, np.float64) @ w64
        tol = 2e-6 if dtype == jnp.float32 else 8e-3  # (float32 sums; bf16's last bit)
        np.testing.assert_allclose(np.asarray(g, np.float64), want, rtol=tol,
                                   atol=tol * np.abs(want).max())


def test_gradient_wrt_the_weight_is_a_clear_error(rng):
    qw = _weight(rng, "fp8_ptpc")
    x = jnp.asarray(rng.standard_normal((2, 256)), jnp.float32)
    with pytest.raises(ValueError, match="no derivative with respect to the quantized weight"):
        jax.grad(lambda w: jnp.sum(jqlin.matmul(x, w, kernel="xla")), allow_int=True)(qw)
    # a weight that is an argument but not differentiated is fine (forward mode too)
    y, dy = jax.jvp(lambda xx: jqlin.matmul(xx, qw), (x,), (jnp.ones_like(x),))
    np.testing.assert_allclose(np.asarray(dy), np.ones((2, 256)) @ np.asarray(qw.dequantize()).T,
                               rtol=2e-6, atol=1e-4)


@pytest.mark.parametrize("fmt,kernel", [("fp8_ptpc", "pallas_fp8_w8a8"),
                                        ("nvfp4_a16", "pallas_nvfp4"), ("mxfp8", "pallas_mxfp8"),
                                        ("fp8_block", "xla")])
def test_x64_mode_changes_nothing(rng, fmt, kernel):
    """Under jax_enable_x64 the Pallas kernels' index arithmetic became int64 and failed."""
    qw = _weight(rng, fmt)
    x = jnp.asarray(rng.standard_normal((5, 256)), jnp.bfloat16)
    want = np.asarray(jqlin.matmul(x, qw, kernel=kernel))
    with jax.enable_x64(True):
        got = jqlin.matmul(x, qw, kernel=kernel)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got), want)
