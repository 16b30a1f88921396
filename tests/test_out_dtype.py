"""out_dtype: every kernel rounds its float32 accumulator once to the requested dtype, so a
caller that wants float32 outputs (row-parallel partial sums, logits) keeps x in its own dtype
-- and its kernel path: a float32 x is three bf16 parts on the GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin import dispatch, formats
from jqlin.spec import Granularity

from float64_bound import GPU_ACC_RTOL_FP8, assert_within_bound, w8a8_float64
from invariance import assert_rows_batch_invariant

F32, BF16 = jnp.float32, jnp.bfloat16


def _kernels_of(fmt: str) -> list[str]:
    return [name for name in dispatch.kernels_for(formats.get(fmt)) if name != "xla"]


CASES = [(fmt, kernel) for fmt in formats.names() for kernel in _kernels_of(fmt) + ["xla"]]
# whole weight tiles (the Mosaic GPU kernels' N, K) and a partial one (the Triton kernels)
GPU_SHAPES = [(4096, m) for m in (1, 16, 300, 1024)] + [(2072, 1), (2072, 300)]


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


def _fp8_mma(spec) -> bool:
    """The FP8 W8A8 formats: fp8 x fp8 MMAs (the others multiply exact bf16 / f16 operands)."""
    return spec.activation is not None and spec.weight.granularity in (
        Granularity.TENSOR, Granularity.CHANNEL, Granularity.BLOCK)


def _close_to_reference(y, x, qw, rtol):
    """y against the XLA reference's float32 output for the same x values (float32 sums of
    exact products: the kernels differ only in summation order) -- but on the GPU an fp8 MMA
    sums inside the tensor core with ~14 bits: there against float64 of the same codes within
    that accumulation's bound (test_pallas_fp8's)."""
    if _fp8_mma(qw.spec) and jax.default_backend() == "gpu":
        ref, bound = w8a8_float64(x, qw)
        assert_within_bound(y, ref, bound, GPU_ACC_RTOL_FP8, F32)
        return
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


WIDER_X = [(fmt, kernel, dt) for fmt, kernel in CASES if kernel != "xla"
           and formats.get(fmt).activation is None
           for dt in ((F32,) if kernel == "pallas_fp8_w8a16" else (F32, jnp.float16))]


@pytest.mark.parametrize("fmt,kernel,x_dtype", WIDER_X)
def test_a_wider_x_runs_as_its_exact_bf16_parts(rng, fmt, kernel, x_dtype):
    """Weight-only with a float32 x (float16 for the 4-bit / MX kernels, whose fast paths take
    one bf16 operand): its exact bf16 parts run stacked as rows (explain says so; on the 4-bit /
    MX dense path at prefill, as a list), so the result is the product of x's own values --
    within float32 summation of float64's (measured 3e-8 - 7e-8 in interpret mode), where x
    rounded to bf16 would be ~1e-3 off -- in both modes, rows batch-invariant."""
    qw = _weight(rng, fmt, n=40, k=256)
    x = _x(rng, 5, 256, x_dtype)
    x = x + jnp.asarray(rng.standard_normal(x.shape) * 2.0 ** -12, x_dtype) * x  # low bits
    ref = np.asarray(x, np.float64) @ np.asarray(qw.dequantize(), np.float64).T
    parts = 3 if x_dtype == F32 else 2
    detail = jqlin.explain(x, qw, kernel=kernel).detail
    assert f"{parts} exact bf16 parts" in detail["activation_parts"], detail
    for det in (False, True):
        y = jqlin.matmul(x, qw, kernel=kernel, deterministic=det, out_dtype=F32)
        err = np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)
        assert err <= 1e-5, (det, err)
    assert_rows_batch_invariant(qw, 256, x_dtype, rng, (2, 7), f"{fmt} {x_dtype}",
                                kernel=kernel)
    if kernel != "pallas_fp8_w8a16":  # prefill: the dense path takes the parts as a list
        x = _x(rng, 1024, 256, x_dtype)
        detail = jqlin.explain(x, qw, kernel=kernel).detail
        assert "each one dot of the once-dequantized weight" in detail["activation_parts"]
        ref = np.asarray(x, np.float64) @ np.asarray(qw.dequantize(), np.float64).T
        y = np.asarray(jqlin.matmul(x, qw, kernel=kernel, out_dtype=F32), np.float64)
        assert np.linalg.norm(y - ref) / np.linalg.norm(ref) <= 1e-5


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
    N of whole Mosaic tiles and N with a partial tile (Triton); weight-only with a float32 x
    (its bf16 parts as rows) at M=1 and 300 against float64 of x's own values."""
    k = 4096
    for n, m in GPU_SHAPES:
        qw = _weight(rng, fmt, n, k)
        x = _x(rng, m, k, BF16)
        y32 = jqlin.matmul(x, qw, deterministic=True, out_dtype=F32)
        y16 = jqlin.matmul(x, qw, deterministic=True)
        np.testing.assert_array_equal(np.asarray(y32.astype(BF16)), np.asarray(y16),
                                      err_msg=f"{fmt} N={n} M={m}")
        # tensor-core float32 sums are not IEEE round-to-nearest: the GPU kernels' bound
        _close_to_reference(y32, x, qw, 2e-5)
        _close_to_reference(jqlin.matmul(x, qw, out_dtype=F32), x, qw, 2e-5)
        if formats.get(fmt).activation is None and m in (1, 300):  # (its parts as rows)
            x32 = _x(rng, m, k, F32) * (1 + 2.0 ** -12 * jnp.asarray(
                rng.standard_normal((m, k)), F32))
            ref = np.asarray(x32, np.float64) @ np.asarray(qw.dequantize(), np.float64).T
            y = np.asarray(jqlin.matmul(x32, qw), np.float64)
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            assert err <= 2e-5, f"{fmt} float32 x N={n} M={m}: relative error {err:.3g}"


def _choose_as_on_sm90(monkeypatch) -> None:
    """Kernel paths chosen as on an H200: wgmma available, the activation kernels routed as on
    the GPU (with `triton_sm90`, a lowering for CUDA then runs the Pallas Triton and Mosaic GPU
    lowering rules of those paths)."""
    from pallas_kernels import act_quant, fp8_paths
    monkeypatch.setattr(fp8_paths, "mosaic_wgmma_ok", lambda interpret: True)
    monkeypatch.setattr(act_quant, "_on_gpu", lambda: True)


@pytest.mark.parametrize("fmt", formats.names())
def test_the_gpu_paths_lower_with_each_output_dtype(monkeypatch, triton_sm90, fmt):
    """Every Pallas kernel of the format, both modes, decode to prefill M: its GPU path with a
    bf16 x and out_dtype=float32 (at M=1 also float32 x -> bf16, float16 x -> float32, bf16 x
    -> float16) lowers for sm_90 and returns (M, N) in out_dtype: what the interpreter cannot
    check of the decode / Mosaic / dense paths (test_gpu_float32_outputs_at_real_sizes runs
    them). At M=1 with whole tiles a Mosaic GPU kernel runs, in both modes, for every format
    but the FP8 W8A8 ones (Triton; block W8A8's deterministic mode: Mosaic)."""
    _choose_as_on_sm90(monkeypatch)
    spec = formats.get(fmt)
    k = 4096
    kw = {"calibration": jax.ShapeDtypeStruct((4, k), F32)} if spec.static_input_scale else {}
    mosaic = set()
    for name in _kernels_of(fmt):
        impl = dispatch.registered_kernels()[name].impl
        # (and at M=1 the other pairs: a float32 x's bf16 parts, float16)
        cases = [(n, m, BF16, F32) for n, m in GPU_SHAPES] + [
            (4096, 1, F32, BF16), (4096, 1, jnp.float16, F32), (4096, 1, BF16, jnp.float16)]
        for n, m, x_dtype, out_dtype in cases:
            qw = jax.eval_shape(lambda w, **c: jqlin.quantize(w, spec, **c),
                                jax.ShapeDtypeStruct((n, k), F32), **kw)
            for det in (False, True):
                f = lambda x, q, det=det, o=out_dtype: impl(  # noqa: E731
                    x, q, spec=spec, deterministic=det, interpret=False, out_dtype=o)
                low = jax.jit(f).trace(jax.ShapeDtypeStruct((m, k), x_dtype), qw).lower(
                    lowering_platforms=("cuda",))
                out = low.out_info
                assert (out.shape, out.dtype) == ((m, n), out_dtype), (name, n, m, det, out)
                if (n, m, x_dtype) == (4096, 1, BF16) and "mosaic_gpu" in low.as_text():
                    mosaic.add(det)
    # (block W8A8's deterministic mode: fp8_block_det's swap-AB decode, session 49)
    block_w8a8 = _fp8_mma(spec) and spec.weight.granularity is Granularity.BLOCK
    want = {True} if block_w8a8 else set() if _fp8_mma(spec) else {False, True}
    assert mosaic == want, (fmt, mosaic)
