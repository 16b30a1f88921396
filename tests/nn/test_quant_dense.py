"""QuantDense (NNX): construction, numerics against float64 references, NNX state behaviour
(split/merge, jit, Orbax), fusion, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import jqlin
from jqlin.nn import FusedLinear, QuantDense, QuantizedParam

F32 = np.float32
WEIGHT_ONLY = ["fp8_per_tensor_a16", "fp8_block_a16", "nvfp4_a16", "mxfp4_a16"]
ACTIVATION = ["fp8_ptpc", "fp8_block", "mxfp8", "nvfp4"]  # fp8_per_tensor: the Orbax test


def _linear(rng, k, n, bias=True):
    lin = nnx.Linear(k, n, use_bias=bias, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    # rows and columns of very different magnitude: a transposed scale layout cannot pass
    w = rng.standard_normal((k, n)) * np.exp(rng.standard_normal((k, 1))) * np.exp(
        rng.standard_normal((1, n)))
    lin.kernel.set_value(jnp.asarray(w, jnp.float32))
    if bias:
        lin.bias.set_value(jnp.asarray(rng.standard_normal(n), jnp.float32))
    return lin


def _x(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape) * rng.uniform(0.5, 4), jnp.float32)


def _ref(x, qd):
    """float64 x @ W.T + b with W the layer's dequantized weight (activations unquantized)."""
    w = np.asarray(qd.qweight.dequantize(), np.float64)
    y = np.asarray(x, np.float64) @ w.T
    return y + (0 if qd.bias is None else np.asarray(qd.bias.get_value(), np.float64))


def _rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("fmt", WEIGHT_ONLY)
def test_from_linear_weight_only_matches_float64(rng, fmt):
    # square weight (a transposed kernel would still run) with K=72: partial blocks/groups
    lin = _linear(rng, 72, 72)
    qd = QuantDense.from_linear(lin, fmt)
    assert qd.qweight.shape == (72, 72) and qd.bias is not None
    w_float = np.asarray(lin.kernel.get_value()).T  # (out, in)
    assert _rel(qd.qweight.dequantize(), w_float) < (0.15 if "fp4" in fmt else 0.06)
    for shape in [(1, 72), (2, 3, 72)]:  # M=1 and extra leading dims
        x = _x(rng, *shape)
        y = qd(x)
        assert y.shape == shape[:-1] + (72,) and y.dtype == jnp.float32
        assert _rel(y, _ref(x, qd)) < 2e-6


@pytest.mark.parametrize("fmt", ACTIVATION)
def test_from_linear_activation_formats_run_the_dispatcher(rng, fmt):
    lin = _linear(rng, 96, 40)
    x = _x(rng, 5, 96)
    qd = QuantDense.from_linear(lin, fmt, calibration=x if jqlin.formats.get(fmt).activation.global_scale
                                or not jqlin.formats.get(fmt).activation.dynamic else None)
    b = lin.bias.get_value()
    np.testing.assert_array_equal(np.asarray(qd(x)), np.asarray(jqlin.matmul(x, qd.qweight) + b))
    # weight_only: explicit opt-in to float activations; per call or as an option
    y_wo = qd(x, weight_only=True)
    assert _rel(y_wo, _ref(x, qd)) < 2e-6
    assert not np.array_equal(np.asarray(y_wo), np.asarray(qd(x)))
    qd.weight_only = True
    np.testing.assert_array_equal(np.asarray(qd(x)), np.asarray(y_wo))


def test_init_draws_and_quantizes_like_nnx_linear():
    qd = QuantDense(48, 24, "fp8_block_a16", rngs=nnx.Rngs(3))
    w = nnx.initializers.lecun_normal()(nnx.Rngs(3).params(), (48, 24), jnp.float32)
    expect = jqlin.quantize(w.T, "fp8_block_a16")
    np.testing.assert_array_equal(np.asarray(qd.data.get_value()).view(np.uint8),
                                  np.asarray(expect.data).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(qd.scale.get_value()), np.asarray(expect.scale))
    np.testing.assert_array_equal(np.asarray(qd.bias.get_value()), np.zeros(24, F32))
    assert isinstance(qd.data, QuantizedParam) and isinstance(qd.bias, nnx.Param)
    assert QuantDense(48, 24, "nvfp4_a16", use_bias=False, rngs=nnx.Rngs(0)).bias is None


def test_dtype_option_casts_inputs(rng):
    qd = QuantDense.from_linear(_linear(rng, 64, 32), "fp8_per_channel_a16", dtype=jnp.bfloat16)
    x = _x(rng, 3, 64)
    y = qd(x)
    assert y.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(y), np.asarray(
        jqlin.matmul(x.astype(jnp.bfloat16), qd.qweight) + qd.bias.get_value().astype(jnp.bfloat16)))


def test_split_merge_and_jit(rng):
    qd = QuantDense.from_linear(_linear(rng, 64, 48), "nvfp4", calibration=_x(rng, 4, 64))
    x = _x(rng, 3, 64)
    y = np.asarray(qd(x))
    graphdef, state = nnx.split(qd)
    flat = dict(nnx.to_flat_state(state))
    assert set(flat) == {("data",), ("scale",), ("global_scale",), ("input_scale",), ("bias",)}
    assert flat[("data",)].get_value().dtype == jnp.uint8  # packed e2m1
    assert flat[("scale",)].get_value().dtype == jnp.float8_e4m3fn
    merged = nnx.merge(graphdef, state)
    np.testing.assert_array_equal(np.asarray(merged(x)), y)
    jitted = nnx.jit(lambda m, v: m(v))
    np.testing.assert_allclose(np.asarray(jitted(qd, x)), y, rtol=1e-6, atol=1e-6 * np.abs(y).max())
    # a pure function of (graphdef, state) under jax.jit, as libraries built on NNX do
    pure = jax.jit(lambda s, v: nnx.merge(graphdef, s)(v))
    np.testing.assert_allclose(np.asarray(pure(state, x)), y, rtol=1e-6, atol=1e-6 * np.abs(y).max())


@pytest.mark.parametrize("fmt", ["fp8_block", "nvfp4", "mxfp8_a16", "fp8_per_tensor"])
def test_orbax_save_restore_roundtrip(rng, tmp_path, fmt):
    x = _x(rng, 3, 80)
    needs_scale = fmt in ("nvfp4", "fp8_per_tensor")
    qd = QuantDense.from_linear(_linear(rng, 80, 40), fmt, calibration=x if needs_scale else None)
    _, state = nnx.split(qd)
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "layer", state)
    ckpt.wait_until_finished()
    abstract = nnx.eval_shape(lambda: QuantDense(80, 40, fmt, rngs=nnx.Rngs(0),
                                                 input_scale=1.0 if needs_scale else None))
    graphdef, target = nnx.split(abstract)
    restored = nnx.merge(graphdef, ckpt.restore(tmp_path / "layer", target))
    for name in ("data", "scale", "global_scale", "input_scale", "bias"):
        a, b = getattr(qd, name), getattr(restored, name)
        assert (a is None) == (b is None), name
        if a is not None:
            va, vb = a.get_value(), b.get_value()
            assert va.dtype == vb.dtype and va.shape == vb.shape, name
            np.testing.assert_array_equal(np.asarray(va).view(np.uint8) if va.dtype.itemsize == 1
                                          else np.asarray(va), np.asarray(vb).view(np.uint8)
                                          if vb.dtype.itemsize == 1 else np.asarray(vb))
    np.testing.assert_array_equal(np.asarray(restored(x)), np.asarray(qd(x)))


def test_fuse_keeps_every_part_and_fused_linear_splits(rng):
    # block parts ending in partial 128-row blocks: the fused weight keeps row segments
    lins = [_linear(rng, 96, n) for n in (130, 20, 20)]
    parts = [QuantDense.from_linear(l, "fp8_block") for l in lins]
    fused = QuantDense.fuse(parts)
    assert fused.out_features == 170 and fused.segments
    x = _x(rng, 4, 96)
    y = np.asarray(fused(x))
    sep = np.concatenate([np.asarray(p(x)) for p in parts], axis=-1)
    np.testing.assert_allclose(y, sep, rtol=1e-6, atol=1e-6 * np.abs(sep).max())
    fl = FusedLinear({"q": parts[0], "k": parts[1], "v": parts[2]})
    outs_before = fl(x)
    assert fl.fuse() and fl.parts is None and isinstance(fl.fused, QuantDense)
    for a, b in zip(fl(x), outs_before):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6,
                                   atol=1e-6 * np.abs(np.asarray(b)).max())
    # parts of different specs stay separate
    mixed = FusedLinear({"a": QuantDense.from_linear(lins[1], "fp8_block"),
                         "b": QuantDense.from_linear(lins[2], "mxfp8")})
    assert not mixed.fuse() and mixed.fused is None
    with pytest.raises(ValueError, match="fuse: part 1"):
        QuantDense.fuse([QuantDense.from_linear(lins[1], "fp8_block"),
                         QuantDense.from_linear(lins[2], "mxfp8")])


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "nvfp4_a16", "fp8_per_tensor_a16"])
def test_interleave_for_shards_keeps_every_output_bitwise(rng, fmt):
    # q/k/v rows interleaved for a 2-way column split: each part's output is the same, bitwise
    from jqlin.nn.sharding import interleave_parts
    lins = [_linear(rng, 256, n, bias=n == 256) for n in (512, 256, 256)]  # q without bias
    parts = [QuantDense.from_linear(l, fmt, deterministic=True) for l in lins]
    fl = FusedLinear({"q": parts[0], "k": parts[1], "v": parts[2]})
    assert fl.fuse()
    x = _x(rng, 3, 256)
    before = [np.asarray(o) for o in fl(x)]
    stored = fl.fused.qweight
    assert fl.interleave_for(2) and fl.shards == 2
    moved = fl.fused.qweight
    # shard 1 starts with q's second half, in the stored codes themselves
    np.testing.assert_array_equal(np.asarray(moved.data[512]).view(np.uint8),
                                  np.asarray(stored.data[256]).view(np.uint8))
    for a, b in zip(fl(x), before):
        np.testing.assert_array_equal(np.asarray(a), b)
    # a part that does not split into whole 128-row blocks: nothing changes, clear error below
    blk = FusedLinear({"q": QuantDense.from_linear(_linear(rng, 256, 256, bias=False), "fp8_block"),
                       "k": QuantDense.from_linear(_linear(rng, 256, 128, bias=False), "fp8_block")})
    assert blk.fuse() and not blk.interleave_for(2) and blk.shards == 1
    with pytest.raises(ValueError, match="128-row scale blocks"):
        interleave_parts(blk.fused.qweight, blk.sizes, 2)


def test_explain_and_set_qweight(rng):
    qd = QuantDense.from_linear(_linear(rng, 64, 32), "fp8_ptpc")
    ex = qd.explain((7, 64))
    assert ex.chosen is not None and ex.spec == qd.spec
    assert qd.explain((7, 64), weight_only=True).spec == qd.spec.without_activation()
    other = jqlin.quantize(_x(rng, 32, 64), "fp8_ptpc")
    qd.set_qweight(other)
    x = _x(rng, 2, 64)
    np.testing.assert_array_equal(np.asarray(qd(x)),
                                  np.asarray(jqlin.matmul(x, other) + qd.bias.get_value()))
    with pytest.raises(ValueError, match="set_qweight"):
        qd.set_qweight(jqlin.quantize(_x(rng, 32, 64), "fp8_block"))


def test_errors_name_the_argument(rng):
    qw = jqlin.quantize(_x(rng, 32, 64), "fp8_ptpc")
    with pytest.raises(ValueError, match="bias has shape"):
        QuantDense.from_quantized(qw, jnp.zeros(31))
    with pytest.raises(TypeError, match="QuantizedWeight"):
        QuantDense.from_quantized(np.zeros((32, 64)))
    with pytest.raises(ValueError, match="logical shape"):
        QuantDense(32, 64, "fp8_ptpc", qweight=qw)
    with pytest.raises(ValueError, match="differs from"):
        QuantDense(64, 32, "fp8_block", qweight=qw)
    with pytest.raises(ValueError, match="rngs="):
        QuantDense(64, 32, "fp8_ptpc")
    with pytest.raises(TypeError, match="nnx.Linear"):
        QuantDense.from_linear(QuantDense.from_quantized(qw), "fp8_ptpc")
    with pytest.raises(jqlin.UnknownFormatError):
        QuantDense(64, 32, "fp7", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"expected \(\.\.\., 64\)"):
        QuantDense.from_quantized(qw)(jnp.ones((2, 63)))
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="in_features must be a positive int"):
            QuantDense(bad, 32, "fp8_ptpc", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="out_features must be a positive int, got -3"):
        QuantDense(64, -3, "fp8_ptpc", rngs=nnx.Rngs(0))
    sized = QuantDense(np.int64(64), np.int32(32), "fp8_ptpc", rngs=nnx.Rngs(0))  # numpy ints
    assert (sized.in_features, sized.out_features) == (64, 32)
    assert type(sized.in_features) is int and sized(jnp.ones((2, 64))).shape == (2, 32)
    with pytest.raises(ValueError, match="use_bias=False but a bias was given"):
        QuantDense(64, 32, "fp8_ptpc", use_bias=False, bias=jnp.ones(32), rngs=nnx.Rngs(0))


def test_fuse_keeps_every_bias_value(rng):
    """A bf16 first bias rounded the others to bf16 (the fused output moved)."""
    a = QuantDense(64, 32, "fp8_ptpc", rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
    b = QuantDense(64, 16, "fp8_ptpc", rngs=nnx.Rngs(1))
    a.bias.set_value(jnp.asarray(rng.standard_normal(32), jnp.bfloat16))
    b.bias.set_value(jnp.asarray(rng.standard_normal(16), jnp.float32))
    fused = QuantDense.fuse([a, b])
    bias = fused.bias.get_value()
    assert bias.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(bias), np.concatenate(
        [np.asarray(a.bias.get_value(), F32), np.asarray(b.bias.get_value())]))
    # what fusing promises: the parts' outputs, bitwise (deterministic: the same K order)
    x = _x(rng, 3, 64)
    parts = [layer(x, deterministic=True) for layer in (a, b)]
    np.testing.assert_array_equal(np.asarray(fused(x, deterministic=True)),
                                  np.concatenate([np.asarray(y) for y in parts], -1))


def test_from_linear_keeps_the_linears_output_dtype(rng):
    """nnx.Linear(dtype=None) promotes x with its parameters: bf16 x and f32 parameters give a
    float32 output, and so must the quantized layer (it returned bf16, its bias rounded)."""
    lin = _linear(rng, 64, 32)
    x = _x(rng, 3, 64).astype(jnp.bfloat16)
    q = QuantDense.from_linear(lin, "fp8_per_channel_a16")
    y = q(x)
    assert lin(x).dtype == y.dtype == jnp.float32 and q.promote == jnp.float32
    want = np.asarray(x, np.float64) @ np.asarray(q.qweight.dequantize(), np.float64).T + \
        np.asarray(lin.bias.get_value(), np.float64)
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # x stays bf16 (a float32 x is the GPU kernels' slower float32 path): the kernel writes
    # float32, the product of the same values
    ex = q.explain(x)
    assert ex.out_dtype == "float32" and "out_dtype=float32" in str(ex)
    if jax.default_backend() == "cpu":  # (the XLA kernel: the same computation as before)
        np.testing.assert_array_equal(
            np.asarray(y), np.asarray(jqlin.matmul(x.astype(jnp.float32), q.qweight)
                                      + lin.bias.get_value()))
    fixed = QuantDense.from_linear(nnx.Linear(64, 32, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)),
                                   "fp8_per_channel_a16")
    assert fixed(x.astype(jnp.float32)).dtype == jnp.bfloat16 and fixed.promote is None


def test_explain_applies_the_layers_cast(rng, monkeypatch):
    """explain described float32 x for a layer that casts x to bf16 (another path on the GPU),
    and explain_model float32 x for every layer (a shape tuple)."""
    seen = []
    monkeypatch.setattr("jqlin.nn.dense.explain", lambda x, qw, **kw: seen.append(x.dtype))
    q = QuantDense.from_linear(_linear(rng, 64, 32), "fp8_per_channel_a16", dtype=jnp.bfloat16)
    q.explain(_x(rng, 2, 64))
    q.explain((2, 64))
    assert seen == [jnp.bfloat16] * 2
    from jqlin.nn import explain_model
    seen.clear()
    explain_model(nnx.Dict({"l": q}), 8, dtype=jnp.float32)
    assert seen == [jnp.bfloat16]
    # no cast of its own: x's dtype is what runs, bf16 activations unless told otherwise
    free = QuantDense.from_quantized(q.qweight)
    seen.clear()
    explain_model(nnx.Dict({"free": free}), 8)
    explain_model(nnx.Dict({"free": free}), 8, dtype=jnp.float16)
    assert seen == [jnp.bfloat16, jnp.float16]
