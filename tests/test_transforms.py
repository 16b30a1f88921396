"""matmul under JAX transformations: vmap keeps the producers' numerics, the derivative with
respect to x is one rule for every kernel, and jax_enable_x64 changes nothing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin.kernels.xla import reference_activation

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
    reciprocal rewrite reached the divisor broadcast after the barrier): codes at ties moved.
    The codes are compared, and the products in deterministic mode (default mode's float32
    sums may follow the batch size: XLA:GPU's dot of 24 rows is not 3 of 8, session 35)."""
    qw = _weight(rng, fmt)
    # bf16 inputs put many quotients x / s on e4m3 ties
    x = jnp.asarray(rng.standard_normal((3, 8, 256)), jnp.bfloat16).astype(jnp.float32)
    codes = lambda xb: reference_activation(xb, qw, qw.spec)
    np.testing.assert_array_equal(np.asarray(jax.vmap(codes)(x)),
                                  np.stack([np.asarray(codes(x[b])) for b in range(3)]))
    kernels = ["xla"] + ([] if jax.default_backend() == "cpu" else ["auto"])
    for kernel in kernels:  # (on the GPU, auto is the format's Pallas kernel)
        mm = lambda xb, w: jqlin.matmul(xb, w, kernel=kernel, deterministic=True)
        mapped = np.asarray(jax.vmap(lambda xb: mm(xb, qw))(x))
        one_by_one = np.stack([np.asarray(mm(x[b], qw)) for b in range(3)])
        np.testing.assert_array_equal(mapped, one_by_one, err_msg=kernel)
    others = [qw] + [_weight(rng, fmt) for _ in range(2)]  # a stacked weight, mapped along
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *others)
    for kernel in kernels:
        mm = lambda xb, w: jqlin.matmul(xb, w, kernel=kernel, deterministic=True)
        both = np.asarray(jax.vmap(mm)(x, stacked))
        np.testing.assert_array_equal(
            both, np.stack([np.asarray(mm(x[b], others[b])) for b in range(3)]), err_msg=kernel)


@pytest.mark.parametrize("kernel", ["xla", "pallas_fp8_w8a8"])
def test_vmap_composes(rng, kernel):
    """Nested vmap, a batch axis not first, vmap under jit, vmap of grad; default mode with a
    stacked weight (JAX's batching) and deterministic mode (one call per entry) give each
    entry's own rows."""
    qws = [_weight(rng, "fp8_ptpc", n=16, k=128) for _ in range(2)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *qws)
    x = jnp.asarray(rng.standard_normal((2, 3, 5, 128)), jnp.float32)
    mm = lambda xb, w: jqlin.matmul(xb, w, kernel=kernel, deterministic=True)
    each = np.stack([np.stack([np.asarray(mm(x[a, b], qws[0])) for b in range(3)])
                     for a in range(2)])
    # (the weight an argument, as a model passes it; closed over it compiles the same since
    # session 45: test_closed_over_weights)
    inner = jax.vmap(mm, in_axes=(0, None))
    nested = jax.jit(jax.vmap(inner, in_axes=(0, None)))(x, qws[0])
    np.testing.assert_array_equal(np.asarray(nested), each)
    axis1 = jax.vmap(lambda xb: mm(xb, qws[0]), in_axes=1, out_axes=1)(x[0].transpose(1, 0, 2))
    np.testing.assert_array_equal(np.asarray(axis1).transpose(1, 0, 2), each[0])
    default = jax.vmap(lambda xb, w: jqlin.matmul(xb, w, kernel=kernel))(x[:, 0], stacked)
    for a in range(2):
        np.testing.assert_allclose(np.asarray(default[a]),
                                   np.asarray(jqlin.matmul(x[a, 0], qws[a], kernel=kernel)),
                                   rtol=1e-6, atol=1e-6)
    loss = lambda xb: jnp.sum(mm(xb, qws[0]) ** 2)
    grads = jax.vmap(jax.grad(loss))(x[0])
    of_mapped = jax.grad(lambda xx: jnp.sum(jax.vmap(lambda xb: mm(xb, qws[0]))(xx) ** 2))(x[0])
    for b in range(3):
        want = np.asarray(jax.grad(loss)(x[0, b]))
        np.testing.assert_allclose(np.asarray(grads[b]), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(of_mapped[b]), want, rtol=1e-5, atol=1e-5)


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
