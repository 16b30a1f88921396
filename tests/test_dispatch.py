"""The dispatcher: choices, explanations and every error path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin import dispatch, formats
from jqlin.dispatch import WEIGHT_ONLY, Kernel, KeyPattern

F32 = np.float32


@pytest.fixture
def fake_weight_only_kernel():
    """A weight-only fp8 kernel registered for the test (and removed after)."""
    calls = []

    def impl(x2d, qw, *, spec, deterministic, interpret):
        calls.append(spec)
        return jqlin.matmul(x2d, qw.with_spec(spec), kernel="xla")

    k = Kernel(name="test_w8a16", impl=impl, platforms=("cpu",), batch_invariant=False,
               priority=50, honours=((KeyPattern(dtype=("float8_e4m3fn",), scale_dtype=("float32",)),
                                      WEIGHT_ONLY),))
    dispatch.register_kernel(k)
    yield k, calls
    dispatch.unregister_kernel("test_w8a16")


def _qw(rng, name="fp8_ptpc", n=32, k=64):
    return jqlin.quantize(rng.standard_normal((n, k)).astype(F32), name,
                          calibration=np.ones((1, k), F32) if name in ("fp8_per_tensor", "nvfp4") else None)


def test_auto_on_cpu_is_xla_and_explained(rng):
    qw = _qw(rng)
    ex = jqlin.explain((3, 64), qw)
    assert ex.chosen == "xla" and ex.platform == "cpu"
    assert "fp8_ptpc" in str(ex) and "chosen: xla" in str(ex)


def test_weight_only_kernel_never_serves_quantized_activations(rng, fake_weight_only_kernel):
    kernel, calls = fake_weight_only_kernel
    qw = _qw(rng, "fp8_ptpc")
    ex = jqlin.explain((2, 64), qw)
    assert ex.chosen == "xla"
    assert "weight-only" in ex.rejected["test_w8a16"]
    with pytest.raises(jqlin.UnsupportedSpecError, match="test_w8a16.*weight-only"):
        jqlin.matmul(np.ones((2, 64), F32), qw, kernel="test_w8a16")
    assert not calls


def test_weight_only_opt_in_is_explicit_and_reported(rng, fake_weight_only_kernel):
    kernel, calls = fake_weight_only_kernel
    qw = _qw(rng, "fp8_ptpc")
    x = rng.standard_normal((2, 64)).astype(F32)
    ex = jqlin.explain(x, qw, weight_only=True)
    assert ex.chosen == "test_w8a16" and ex.weight_only
    assert "NOT quantized" in str(ex)
    y = jqlin.matmul(x, qw, weight_only=True)
    assert calls and calls[-1].activation is None
    ref = x @ np.asarray(qw.dequantize()).T
    np.testing.assert_allclose(np.asarray(y), ref, rtol=1e-5, atol=1e-5)
    # and the default still quantizes the activations
    assert not np.allclose(np.asarray(jqlin.matmul(x, qw)), ref, rtol=1e-6, atol=0)


def test_weight_only_kernel_serves_a16_spec(rng, fake_weight_only_kernel):
    assert jqlin.explain((1, 64), _qw(rng, "fp8_per_channel_a16")).chosen == "test_w8a16"
    # deterministic asks for batch invariance, which this kernel does not declare
    ex = jqlin.explain((1, 64), _qw(rng, "fp8_per_channel_a16"), deterministic=True)
    assert ex.chosen == "xla" and "not batch-invariant" in ex.rejected["test_w8a16"]


def test_spec_mismatch_message_names_field(rng, fake_weight_only_kernel):
    ex = jqlin.explain((1, 64), _qw(rng, "mxfp8_a16"))
    assert "scale_dtype='float8_e8m0fnu'" in ex.rejected["test_w8a16"]


def test_unknown_kernel_and_bad_x(rng):
    qw = _qw(rng)
    with pytest.raises(jqlin.UnsupportedSpecError, match="not a registered kernel"):
        jqlin.matmul(np.ones((1, 64), F32), qw, kernel="nope")
    with pytest.raises(ValueError, match=r"x has shape \(2, 63\).*K=64"):
        jqlin.matmul(np.ones((2, 63), F32), qw)
    with pytest.raises(ValueError, match="floating point"):
        jqlin.matmul(np.ones((2, 64), np.int32), qw)
    with pytest.raises(TypeError, match="QuantizedWeight"):
        jqlin.matmul(np.ones((2, 64), F32), np.ones((4, 64)))


def test_deterministic_rejects_dynamic_per_tensor_activations(rng):
    base = jqlin.formats.get("fp8_ptpc")
    act = jqlin.QuantKey("float8_e4m3fn", "tensor", dynamic=True)
    qw = _qw(rng).with_spec(jqlin.QuantSpec(base.weight, act))
    y = jqlin.matmul(np.ones((2, 64), F32), qw)  # fine without the batch-invariance promise
    assert np.isfinite(np.asarray(y)).all()
    with pytest.raises(jqlin.UnsupportedSpecError, match="per-tensor activation scales"):
        jqlin.matmul(np.ones((2, 64), F32), qw, deterministic=True)


def test_no_kernel_for_platform_raises(rng):
    only_gpu = Kernel(name="test_gpu_only", impl=lambda *a, **k: None, platforms=("gpu",),
                      batch_invariant=True, honours=((KeyPattern(), dispatch.ANY_ACTIVATION),))
    dispatch.register_kernel(only_gpu)
    try:
        with pytest.raises(jqlin.UnsupportedSpecError, match="runs on \\['gpu'\\], this is cpu"):
            jqlin.matmul(np.ones((1, 64), F32), _qw(rng), kernel="test_gpu_only")
    finally:
        dispatch.unregister_kernel("test_gpu_only")


def test_register_twice_is_an_error():
    xla = jqlin.registered_kernels()["xla"]
    with pytest.raises(ValueError, match="already registered"):
        dispatch.register_kernel(Kernel(name="xla", impl=xla.impl, honours=xla.honours,
                                        platforms=("cpu",), batch_invariant=True))


def test_quantkey_and_spec_validation():
    with pytest.raises(ValueError, match="block"):
        jqlin.QuantKey("float8_e4m3fn", "block")
    with pytest.raises(ValueError, match="dtype"):
        jqlin.QuantKey("int8", "channel")
    with pytest.raises(ValueError, match="static"):
        jqlin.QuantSpec(jqlin.QuantKey("float8_e4m3fn", "channel", dynamic=True))
    with pytest.raises(ValueError, match="nest"):
        jqlin.QuantSpec(jqlin.QuantKey("float8_e4m3fn", "group", group_size=48),
                        jqlin.QuantKey("float8_e4m3fn", "group", group_size=32, dynamic=True))
    spec = jqlin.formats.get("nvfp4")
    assert hash(spec) == hash(jqlin.formats.get("nvfp4")) and spec.activation.row_local
    assert jqlin.formats.name_of(spec) == "nvfp4"


@pytest.mark.parametrize("fmt,kernel,field,bad,message", [
    ("fp8_per_channel_a16", "pallas_fp8_w8a16", "scale", "bfloat16",
     "needs float32 weight scales for float32, got bfloat16"),
    ("nvfp4_a16", "pallas_nvfp4", "data", "int8",
     "needs uint8 weight data for float4_e2m1fn, got int8"),
    ("mxfp8_a16", "pallas_mxfp8", "scale", "float32",
     "needs uint8 weight scales for float8_e8m0fnu, got float32"),
])
def test_pallas_kernels_name_a_wrongly_stored_weight(rng, fmt, kernel, field, bad, message):
    import dataclasses
    import jax.numpy as jnp
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((64, 128)), jnp.float32), fmt)
    wrong = dataclasses.replace(qw, **{field: getattr(qw, field).astype(bad)})
    x = jnp.asarray(rng.standard_normal((2, 128)), jnp.bfloat16)
    with pytest.raises(jqlin.UnsupportedSpecError, match=message):
        jqlin.matmul(x, wrong, kernel=kernel)


def test_explain_says_what_the_chosen_kernel_runs(rng):
    """The glue's describe_config: the tile config, or the path a kernel takes at this M (the
    fp8 and MX kernels run one XLA GEMM at prefill sizes in default mode)."""
    qw = _qw(rng, "fp8_ptpc", n=128, k=256)
    small = jqlin.explain((16, 256), qw, kernel="pallas_fp8_w8a8")
    assert small.detail["path"] == "pallas" and small.detail["block_m"] >= 16
    large = jqlin.explain((1024, 256), qw, kernel="pallas_fp8_w8a8")
    assert large.detail["path"].startswith("dense")
    assert "runs: path=dense" in str(large)
    det = jqlin.explain((1024, 256), qw, kernel="pallas_fp8_w8a8", deterministic=True)
    assert det.detail["path"] == "pallas"  # cuBLAS's order would follow M
    mx = jqlin.explain((4096, 256), _qw(rng, "mxfp8_a16", n=128, k=256), kernel="pallas_mxfp8")
    assert mx.detail["path"].startswith("dense")
    assert jqlin.explain((3, 64), _qw(rng)).detail is None  # the XLA kernel: nothing to add


@pytest.mark.parametrize("fmt", formats.names())
def test_explain_takes_abstract_weights_for_every_kernel(fmt):
    """Benchmarks and jit-time callers explain ShapeDtypeStruct weights (eval_shape of quantize):
    no describe_config may touch their values (session 5: a per-tensor scale reshape did)."""
    from jqlin.bench import _abstract_qweight
    qw = _abstract_qweight(formats.get(fmt), 256, 512)
    kernels = [k for k in jqlin.registered_kernels()
               if jqlin.explain((1, 512), qw, kernel=k).chosen == k]
    assert kernels  # at least the XLA reference honours every format
    for kernel in kernels:
        for m, det in ((1, False), (4096, False), (4096, True)):
            ex = jqlin.explain(jax.ShapeDtypeStruct((m, 512), jnp.bfloat16), qw, kernel=kernel,
                               deterministic=det)
            assert ex.chosen == kernel
            assert ex.detail is None or ex.detail.get("path"), (kernel, ex.detail)


@pytest.mark.parametrize("fmt", formats.names())
def test_an_empty_batch_gives_an_empty_result(rng, fmt):
    """M = 0 (a zero in the leading dims): the empty (..., N) result in x's dtype, eagerly and
    under jit, from the XLA reference and every kernel that honours the format (interpret mode
    here) -- the activation rules' scale grids once failed on it with a ZeroDivisionError --
    while the kernel choice is checked as for any M (a kernel that cannot honour the spec still
    raises); explain says nothing runs."""
    static = fmt in ("fp8_per_tensor", "nvfp4")
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((64, 256)), jnp.float32), fmt,
                        calibration=jnp.ones((1, 256)) if static else None)
    kernels = [k for k in jqlin.registered_kernels()
               if jqlin.explain((1, 256), qw, kernel=k).chosen == k]
    for kernel in kernels:
        for shape in ((0, 256), (2, 0, 256)):
            x = jnp.ones(shape, jnp.bfloat16)
            for run in (jqlin.matmul, jax.jit(jqlin.matmul, static_argnames="kernel")):
                y = run(x, qw, kernel=kernel)
                assert y.shape == shape[:-1] + (64,) and y.dtype == jnp.bfloat16, kernel
        ex = jqlin.explain((0, 256), qw, kernel=kernel)
        assert ex.chosen == kernel and "nothing runs" in str(ex)
    others = [k for k in jqlin.registered_kernels() if k not in kernels]
    for kernel in others:
        with pytest.raises(jqlin.UnsupportedSpecError):
            jqlin.matmul(jnp.ones((0, 256), jnp.bfloat16), qw, kernel=kernel)
