"""The dispatcher: choices, explanations and every error path."""

import re

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

    def impl(x2d, qw, *, spec, deterministic, interpret, out_dtype):
        calls.append(spec)
        return jqlin.matmul(x2d, qw.with_spec(spec), kernel="xla", out_dtype=out_dtype)

    k = Kernel(name="test_w8a16", impl=impl, platforms=("cpu",), batch_invariant=False,
               priority=50, honours=((KeyPattern(dtype=("float8_e4m3fn",), scale_dtype=("float32",)),
                                      WEIGHT_ONLY),))
    dispatch.register_kernel(k)
    yield k, calls
    dispatch.unregister_kernel("test_w8a16")


@pytest.fixture
def on_cpu():
    """For tests of the CPU platform's choices: on a GPU machine they run under a CPU default
    device (the dispatcher follows jax.default_device)."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def _qw(rng, name="fp8_ptpc", n=32, k=64):
    return jqlin.quantize(rng.standard_normal((n, k)).astype(F32), name,
                          calibration=np.ones((1, k), F32) if name in ("fp8_per_tensor", "nvfp4") else None)


def test_auto_on_cpu_is_xla_and_explained(rng, on_cpu):
    qw = _qw(rng)
    ex = jqlin.explain((3, 64), qw)
    assert ex.chosen == "xla" and ex.platform == "cpu"
    assert "fp8_ptpc" in str(ex) and "chosen: xla" in str(ex)


def test_weight_only_kernel_never_serves_quantized_activations(rng, on_cpu, fake_weight_only_kernel):
    kernel, calls = fake_weight_only_kernel
    qw = _qw(rng, "fp8_ptpc")
    ex = jqlin.explain((2, 64), qw)
    assert ex.chosen == "xla"
    assert "weight-only" in ex.rejected["test_w8a16"]
    with pytest.raises(jqlin.UnsupportedSpecError, match="test_w8a16.*weight-only"):
        jqlin.matmul(np.ones((2, 64), F32), qw, kernel="test_w8a16")
    assert not calls


def test_weight_only_opt_in_is_explicit_and_reported(rng, on_cpu, fake_weight_only_kernel):
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


def test_weight_only_kernel_serves_a16_spec(rng, on_cpu, fake_weight_only_kernel):
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
    with pytest.raises(ValueError, match="x must be bfloat16, float16 or float32"):
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


def test_no_kernel_for_platform_raises(rng, on_cpu):
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


def _replaced(qw, **changes):
    import dataclasses
    return dataclasses.replace(qw, **changes)


_BAD_WEIGHTS = {  # name: (format, change of a good weight, words of the error)
    "channel scale transposed": ("fp8_per_channel_a16", lambda q: {"scale": q.scale.T},
                                 "scale has shape (1, 64)"),
    "channel scale half the rows": ("fp8_per_channel_a16", lambda q: {"scale": q.scale[:32]},
                                    "needs the scale grid (64, 1)"),
    "channel scale 1-D": ("fp8_per_channel_a16", lambda q: {"scale": q.scale[:, 0]},
                          "scale has shape (64,)"),
    "scale bf16": ("fp8_per_channel_a16", lambda q: {"scale": q.scale.astype(jnp.bfloat16)},
                   "scale has dtype bfloat16"),
    "data not codes": ("fp8_per_channel_a16", lambda q: {"data": q.data.astype(jnp.float32)},
                       "data has dtype float32; a float8_e4m3fn weight is stored as float8_e4m3fn"),
    "data e5m2": ("fp8_per_channel_a16", lambda q: {"data": q.data.astype(jnp.float8_e5m2)},
                  "data has dtype float8_e5m2"),
    "data half the columns": ("fp8_per_channel_a16", lambda q: {"data": q.data[:, :64]},
                              "data holds 64 stored columns"),
    "data twice the rows": ("fp8_per_channel_a16",
                            lambda q: {"data": jnp.concatenate([q.data, q.data])},
                            "data holds 128 stored rows"),
    "logical N beyond the data": ("fp8_per_channel_a16", lambda q: {"shape": (72, 128)},
                                  "stored with 72"),
    "layout kn": ("fp8_per_channel_a16", lambda q: {"layout": "kn"}, "layout must be 'nk'"),
    "overlapping segments": ("fp8_per_channel_a16", lambda q: {"segments": ((0, 32), (0, 32))},
                             "non-overlapping"),
    "segments past the data": ("fp8_per_channel_a16", lambda q: {"segments": ((0, 32), (40, 32))},
                               "reach row 72"),
    "spec of another granularity": ("fp8_per_channel_a16",
                                    lambda q: {"spec": jqlin.formats.get("fp8_block_a16")},
                                    "data holds 64 stored rows"),
    "nvfp4 unpacked codes": ("nvfp4_a16",
                             lambda q: {"data": jnp.zeros((64, 128), jnp.float4_e2m1fn)},
                             "stored as uint8 (e2m1 codes packed two per byte)"),
    "nvfp4 int8 codes": ("nvfp4_a16", lambda q: {"data": q.data.astype(jnp.int8)},
                         "data has dtype int8"),
    "nvfp4 no global": ("nvfp4_a16", lambda q: {"global_scale": None}, "global_scale is missing"),
    "nvfp4 global a Python float": ("nvfp4_a16", lambda q: {"global_scale": 1.0},
                                    "global_scale must be an array, got float"),
    "nvfp4 global of 2": ("nvfp4_a16", lambda q: {"global_scale": jnp.ones((2,), jnp.float32)},
                          "global_scale must be float32 of shape () or (64,)"),
    "nvfp4 scale f32": ("nvfp4_a16", lambda q: {"scale": q.scale.astype(jnp.float32)},
                        "scale has dtype float32"),
    "mx scale as e8m0 values": (
        "mxfp8_a16", lambda q: {"scale": jax.lax.bitcast_convert_type(q.scale, jnp.float8_e8m0fnu)},
        "stored as uint8 (e8m0 exponents as their raw bytes)"),
    "mx scale f32": ("mxfp8_a16", lambda q: {"scale": q.scale.astype(jnp.float32)},
                     "scale has dtype float32"),
    "static input scale missing": ("fp8_per_tensor", lambda q: {"input_scale": None},
                                   "input_scale is missing"),
    "static input scale of 2": ("fp8_per_tensor",
                                lambda q: {"input_scale": jnp.full((2,), 0.1, jnp.float32)},
                                "input_scale must be one float32 number"),
    "input scale on a dynamic spec": ("fp8_ptpc", lambda q: {"input_scale": jnp.float32(0.1)},
                                      "input_scale must be None"),
}


@pytest.mark.parametrize("case", sorted(_BAD_WEIGHTS))
def test_inconsistent_weights_are_refused_before_any_kernel(rng, case):
    """A hand-built or restored QuantizedWeight whose arrays disagree with its spec, shape or
    segments: the reference used to broadcast a scale grid that merely divides the storage and
    read e8m0-typed scales by value (wrong numbers); now every kernel's call names the array."""
    fmt, change, words = _BAD_WEIGHTS[case]
    kw = {"input_scale": 0.1} if fmt == "fp8_per_tensor" else {}
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((64, 128)), jnp.float32), fmt, **kw)
    bad = _replaced(qw, **change(qw))
    x = jnp.asarray(rng.standard_normal((2, 128)), jnp.bfloat16)
    pallas = {"fp8": "pallas_fp8_w8a16", "nvf": "pallas_nvfp4", "mxf": "pallas_mxfp8"}[fmt[:3]]
    for kernel in ("auto", "xla", pallas):
        with pytest.raises(ValueError, match=re.escape(words)):
            jqlin.matmul(x, bad, kernel=kernel)
        with pytest.raises(ValueError, match=re.escape(words)):
            jqlin.explain(x, bad, kernel=kernel)
    jqlin.matmul(x, qw, kernel="xla")  # (the good weight passes the same check)


def test_flags_must_be_booleans(rng):
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((16, 64)), jnp.float32), "fp8_ptpc")
    x = jnp.ones((1, 64), jnp.float32)
    with pytest.raises(TypeError, match="deterministic must be True or False, got 'no'"):
        jqlin.matmul(x, qw, deterministic="no")
    with pytest.raises(TypeError, match="weight_only must be True or False"):
        jqlin.explain(x, qw, weight_only=1)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float64", "int8"])
def test_x_of_another_dtype_is_refused(rng, dtype):
    """fp8 x gave an fp8 output (|y| > 448 became NaN); f64 was computed in f32."""
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((16, 64)), jnp.float32), "fp8_ptpc")
    words = f"x must be bfloat16, float16 or float32.*got {dtype}"
    with pytest.raises(ValueError, match=words):  # (float64 arrays exist only with jax_enable_x64)
        jqlin.explain(jax.ShapeDtypeStruct((2, 64), dtype), qw)
    if dtype != "float64":
        with pytest.raises(ValueError, match=words):
            jqlin.matmul(jnp.asarray(rng.standard_normal((2, 64)), dtype), qw)


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
    with jax.default_device(jax.devices("cpu")[0]):
        assert jqlin.explain((3, 64), _qw(rng)).detail is None  # the XLA kernel: nothing to add


@pytest.mark.gpu
def test_a_cpu_default_device_runs_the_cpu_kernel_on_a_gpu_machine(rng):
    """`jax.default_device(cpu)` on a GPU machine: the computation runs on the CPU, where the
    GPU kernels cannot lower; the dispatcher chose them from jax.devices()[0] (session 35)."""
    qw, x = _qw(rng, "fp8_ptpc"), rng.standard_normal((3, 64)).astype(F32)
    assert jqlin.explain(x.shape, qw).platform == "gpu"
    with jax.default_device(jax.devices("cpu")[0]):
        ex = jqlin.explain(x.shape, qw)
        assert ex.chosen == "xla" and ex.platform == "cpu"
        y = jqlin.matmul(jnp.asarray(x), qw)
        assert y.devices() == {jax.devices("cpu")[0]}
    with jax.default_device("cpu"):  # (a platform name)
        assert jqlin.explain(x.shape, qw).platform == "cpu"
    on_gpu = np.asarray(jqlin.matmul(x, qw, kernel="xla"))  # (the same codes; float32 sums)
    np.testing.assert_allclose(np.asarray(y), on_gpu, rtol=1e-5, atol=1e-5 * np.abs(on_gpu).max())


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


@pytest.mark.parametrize("fmt", formats.names())
def test_kernels_for_lists_the_declaring_kernels_in_autos_order(rng, fmt):
    """Every kernel kernels_for names declares the spec (forced, it is not refused for the
    spec); every other registered kernel is refused; the order is auto's (priority, xla last)."""
    spec = formats.get(fmt)
    names = jqlin.kernels_for(spec)
    registry = jqlin.registered_kernels()
    assert names[-1] == "xla" and len(set(names)) == len(names)
    prios = [registry[n].priority for n in names]
    assert prios == sorted(prios, reverse=True)
    qw = jqlin.quantize(jnp.asarray(rng.standard_normal((64, 256)), jnp.float32), fmt,
                        calibration=jnp.ones((1, 256)) if spec.static_input_scale else None)
    for name in registry:
        ex = jqlin.explain((1, 256), qw, kernel=name)
        assert (ex.chosen == name) == (name in names), (name, ex.rejected)


def _fake(name, **kw):
    """A kernel over every spec that runs the XLA reference (removed by the caller)."""
    def impl(x2d, qw, *, spec, deterministic, interpret, out_dtype):
        return jqlin.matmul(x2d, qw.with_spec(spec), kernel="xla", out_dtype=out_dtype)
    return Kernel(name=name, impl=impl, platforms=("cpu",), batch_invariant=True, priority=90,
                  honours=((KeyPattern(), dispatch.ANY_ACTIVATION),), **kw)


def test_a_compute_capability_floor_rejects_and_auto_moves_on(rng, on_cpu):
    """The CPU has no compute capability: a kernel that needs one is passed over (and said so),
    and forcing it is an error naming both."""
    dispatch.register_kernel(_fake("test_sm90", min_compute_capability=(9, 0)))
    try:
        ex = jqlin.explain((2, 64), _qw(rng))
        assert ex.chosen == "xla"
        assert ex.rejected["test_sm90"] == "needs compute capability >= (9, 0), device has None"
        with pytest.raises(jqlin.UnsupportedSpecError, match=r"test_sm90.*>= \(9, 0\)"):
            jqlin.matmul(np.ones((2, 64), F32), _qw(rng), kernel="test_sm90")
    finally:
        dispatch.unregister_kernel("test_sm90")


def test_a_kernels_shape_check_decides_per_call(rng, on_cpu):
    """check_shapes(m, k, qw) sees the call's M and the weight's K: a refusal names the reason
    and auto moves on; an accepted shape runs the kernel."""
    seen = []

    def check(m, k, qw):
        seen.append((m, k, qw.shape))
        return None if k % 64 == 0 else f"K={k} is not a multiple of 64"
    dispatch.register_kernel(_fake("test_shapes", check_shapes=check))
    try:
        odd = _qw(rng, n=32, k=96)
        x = rng.standard_normal((3, 96)).astype(F32)
        assert jqlin.explain(x, odd).rejected["test_shapes"] == "K=96 is not a multiple of 64"
        assert jqlin.explain(x, odd).chosen == "xla"
        with pytest.raises(jqlin.UnsupportedSpecError, match="K=96 is not a multiple of 64"):
            jqlin.matmul(x, odd, kernel="test_shapes")
        even = _qw(rng, n=32, k=128)
        x = rng.standard_normal((5, 128)).astype(F32)
        assert jqlin.explain(x, even).chosen == "test_shapes"
        np.testing.assert_array_equal(np.asarray(jqlin.matmul(x, even)),
                                      np.asarray(jqlin.matmul(x, even, kernel="xla")))
        assert (3, 96, (32, 96)) in seen and (5, 128, (32, 128)) in seen
    finally:
        dispatch.unregister_kernel("test_shapes")


def test_a_format_is_a_registered_row(rng):
    """formats.register: a new name serves quantize / explain like a built-in one; the same
    spec again is a no-op; another spec under a taken name is an error."""
    spec = jqlin.QuantSpec(jqlin.QuantKey("float8_e4m3fn", "group", group_size=32))
    formats.register("test_fp8_g32_a16", spec)
    try:
        formats.register("test_fp8_g32_a16", spec)
        assert formats.get("test_fp8_g32_a16") == spec
        assert formats.name_of(spec) == "test_fp8_g32_a16"
        qw = jqlin.quantize(rng.standard_normal((8, 64)).astype(F32), "test_fp8_g32_a16")
        assert qw.spec == spec and qw.scale.shape == (8, 2)
        with pytest.raises(ValueError, match="already registered with another spec"):
            formats.register("test_fp8_g32_a16", formats.get("fp8_block_a16"))
    finally:
        formats.REGISTRY.pop("test_fp8_g32_a16")
