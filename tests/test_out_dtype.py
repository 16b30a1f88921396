"""out_dtype: every kernel rounds its float32 accumulator once to the requested dtype, so a
caller that wants float32 outputs (row-parallel partial sums, logits) keeps x in its own dtype
-- and its kernel path: a float32 x is three bf16 parts on the GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin import dispatch, formats

F32, BF16 = jnp.float32, jnp.bfloat16


def _kernels_of(fmt: str) -> list[str]:
    spec = formats.get(fmt)
    return [name for name, k in sorted(dispatch.registered_kernels().items())
            if k.spec_mismatch(spec) is None and name != "xla"]


CASES = [(fmt, kernel) for fmt in formats.names() for kernel in _kernels_of(fmt) + ["xla"]]


def _weight(rng, fmt, n, k):
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * 0.05
    spec = formats.get(fmt)
    kw = {}
    if spec.static_input_scale:
        kw["calibration"] = jnp.asarray(rng.standard_normal((4, k)), F32)
    return jqlin.quantize(jnp.asarray(w, F32), spec, **kw)


def _x(rng, m, k, dtype):
    # rows of different magnitudes: per-token scales differ
    x = rng.standard_normal((m, k)) * np.exp(rng.standard_normal((m, 1)))
    return jnp.asarray(x, dtype)


def _close_to_reference(y, x, qw, rtol):
    """y against the XLA reference's float32 output for the same x values (float32 sums of
    exact products: the kernels differ only in summation order)."""
    ref = np.asarray(jqlin.matmul(x.astype(F32), qw, kernel="xla"), np.float64)
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all()
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err <= rtol, f"relative error {err:.3g} > {rtol:.3g}"


@pytest.mark.parametrize("fmt,kernel", CASES)
def test_the_output_is_the_float32_accumulator_rounded_once(rng, fmt, kernel):
    """Deterministic mode: the float32 output rounded to bf16 is bitwise the bf16 output, and
    a float32 x's bf16 output is its float32 output rounded; both modes' float32 outputs from
    a bf16 x are the float32 product. M=5 and N=40 leave partial tiles."""
    qw = _weight(rng, fmt, n=40, k=256)
    x = _x(rng, 5, 256, BF16)
    y32 = jqlin.matmul(x, qw, kernel=kernel, deterministic=True, out_dtype=F32)
    y16 = jqlin.matmul(x, qw, kernel=kernel, deterministic=True)
    assert y32.dtype == F32 and y16.dtype == BF16 and y32.shape == (5, 40)
    np.testing.assert_array_equal(np.asarray(y32.astype(BF16)), np.asarray(y16))
    _close_to_reference(y32, x, qw, 1e-5)
    y = jqlin.matmul(x, qw, kernel=kernel, out_dtype=F32)
    assert y.dtype == F32
    _close_to_reference(y, x, qw, 1e-5)

    x32 = _x(rng, 5, 256, F32)
    down = jqlin.matmul(x32, qw, kernel=kernel, deterministic=True, out_dtype=BF16)
    assert down.dtype == BF16
    np.testing.assert_array_equal(
        np.asarray(down),
        np.asarray(jqlin.matmul(x32, qw, kernel=kernel, deterministic=True).astype(BF16)))


@pytest.mark.parametrize("bad", [jnp.float64, jnp.int8, jnp.float8_e4m3fn, "e4m3", 3])
def test_an_unsupported_out_dtype_is_named(rng, bad):
    qw = _weight(rng, "fp8_per_channel_a16", n=8, k=128)
    x = _x(rng, 2, 128, BF16)
    with pytest.raises(ValueError, match="out_dtype must be bfloat16, float16, float32"):
        jqlin.matmul(x, qw, out_dtype=bad)
    with pytest.raises(ValueError, match="out_dtype"):
        jqlin.explain(x, qw, out_dtype=bad)


def test_explain_names_the_output_dtype_and_an_empty_batch_has_it(rng):
    qw = _weight(rng, "fp8_block", n=8, k=128)
    x = _x(rng, 3, 128, BF16)
    assert "out_dtype=float32" in str(jqlin.explain(x, qw, out_dtype=F32))
    assert "out_dtype" not in str(jqlin.explain(x, qw, out_dtype=BF16))  # (x's own)
    empty = jqlin.matmul(jnp.zeros((0, 128), BF16), qw, out_dtype=F32)
    assert empty.shape == (0, 8) and empty.dtype == F32


def test_grad_and_vmap_keep_the_output_dtype(rng):
    """The derivative is that of x @ W.T in float32, its cotangent back in x's dtype; vmap
    folds the batch into rows of the same call."""
    qw = _weight(rng, "fp8_ptpc", n=16, k=128)
    x = _x(rng, 4, 128, BF16)
    mm = lambda xb: jqlin.matmul(xb, qw, deterministic=True, out_dtype=F32)
    dx = jax.grad(lambda xb: jnp.sum(mm(xb)))(x)
    assert dx.dtype == BF16
    want = jnp.sum(qw.dequantize(), axis=0)  # d(sum(x @ W.T)) / dx
    np.testing.assert_allclose(np.asarray(dx[0], np.float32),
                               np.asarray(want.astype(BF16), np.float32), rtol=0, atol=0)
    xs = jnp.stack([x, x[::-1]])
    mapped = jax.vmap(mm)(xs)
    assert mapped.dtype == F32
    np.testing.assert_array_equal(np.asarray(mapped[1]), np.asarray(mm(x[::-1])))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", formats.names())
def test_gpu_float32_outputs_at_real_sizes(rng, fmt):
    """The auto kernel on the GPU, decode to prefill M (each path: decode, Mosaic, dense),
    N with a partial tile."""
    n, k = 2072, 4096
    qw = _weight(rng, fmt, n, k)
    for m in (1, 16, 300, 1024):
        x = _x(rng, m, k, BF16)
        y32 = jqlin.matmul(x, qw, deterministic=True, out_dtype=F32)
        y16 = jqlin.matmul(x, qw, deterministic=True)
        np.testing.assert_array_equal(np.asarray(y32.astype(BF16)), np.asarray(y16),
                                      err_msg=f"{fmt} M={m}")
        # tensor-core float32 sums are not IEEE round-to-nearest: the GPU kernels' bound
        _close_to_reference(y32, x, qw, 2e-5)
        _close_to_reference(jqlin.matmul(x, qw, out_dtype=F32), x, qw, 2e-5)
