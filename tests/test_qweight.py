"""QuantizedWeight: pytree behaviour, quantize() errors, lossless fuse()."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from jqlin.spec import Granularity

F32 = np.float32


def _w(rng, n, k):
    return (rng.standard_normal((n, k)) * np.exp(rng.standard_normal((n, 1)))).astype(F32)


def test_pytree_roundtrip_through_jit_and_vmap(rng):
    qw = jqlin.quantize(_w(rng, 64, 128), "nvfp4_a16")
    leaves, treedef = jax.tree_util.tree_flatten(qw)
    assert len(leaves) == 3  # data, scale, global_scale (no input_scale)
    back = jax.tree_util.tree_unflatten(treedef, leaves)
    assert back.spec == qw.spec and back.shape == qw.shape
    x = jnp.asarray(rng.standard_normal((4, 128)), jnp.float32)
    f = jax.jit(lambda q, v: jqlin.matmul(v, q))
    np.testing.assert_array_equal(np.asarray(f(qw, x)), np.asarray(jqlin.matmul(x, qw)))
    stacked = jax.tree_util.tree_map(lambda a: jnp.stack([a, a]), qw)
    deq = jax.vmap(lambda q: q.dequantize())(stacked)
    np.testing.assert_array_equal(np.asarray(deq[1]), np.asarray(qw.dequantize()))


def test_quantize_errors_name_the_argument(rng):
    with pytest.raises(ValueError, match="2-D"):
        jqlin.quantize(np.ones((2, 3, 4), F32), "fp8_ptpc")
    with pytest.raises(ValueError, match="floating"):
        jqlin.quantize(np.ones((2, 4), np.int32), "fp8_ptpc")
    with pytest.raises(ValueError, match="input_scale= or calibration="):
        jqlin.quantize(_w(rng, 4, 32), "fp8_per_tensor")
    for bad_scale in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="input_scale must be finite and > 0"):
            jqlin.quantize(_w(rng, 4, 32), "fp8_per_tensor", input_scale=bad_scale)
    with pytest.raises(ValueError, match=r"input_scale must be one number .* shape \(2,\)"):
        jqlin.quantize(_w(rng, 4, 32), "nvfp4", input_scale=[1.0, 2.0])
    with pytest.raises(ValueError, match="no static scale"):
        jqlin.quantize(_w(rng, 4, 32), "fp8_ptpc", input_scale=1.0)
    with pytest.raises(jqlin.UnknownFormatError, match="fp8_block, fp8_block_a16"):
        jqlin.quantize(_w(rng, 4, 32), "fp9")
    with pytest.raises(KeyError):  # also a KeyError, for dict-like callers
        jqlin.formats.get("nope")
    for shape in ((0, 32), (4, 0)):
        with pytest.raises(ValueError, match="at least one row and one column"):
            jqlin.quantize(np.ones(shape, F32), "nvfp4_a16")
    with pytest.raises(ValueError, match="calibration activations are empty"):
        jqlin.quantize(_w(rng, 4, 32), "fp8_per_tensor", calibration=np.ones((0, 32), F32))
    bad = np.ones((13, 384), F32)  # (a shape where XLA:CPU's max reduction drops NaN)
    bad[1, 3] = np.nan
    with pytest.raises(ValueError,
                       match=r"weight holds 1 NaN or inf value\(s\) \(first at index \(1, 3\)\)"):
        jqlin.quantize(bad, "mxfp4_a16")
    for fmt in ("fp8_per_tensor", "nvfp4"):
        with pytest.raises(ValueError, match="NaN or inf"):
            jqlin.quantize(_w(rng, 4, 384), fmt, calibration=bad)
    # traced (no value to check): a NaN calibration gives the NaN scale, not a made-up one
    scale = jax.jit(lambda c: jqlin.calibrate_input_scale(
        jqlin.formats.get("fp8_per_tensor").activation, c))(bad)
    assert np.isnan(np.asarray(scale))


def test_fuse_per_tensor_becomes_per_channel_losslessly(rng):
    parts = [jqlin.quantize(_w(rng, n, 96), "fp8_per_tensor_a16") for n in (40, 8, 8)]
    fused = jqlin.fuse(parts)
    assert fused.spec.weight.granularity is Granularity.CHANNEL and fused.shape == (56, 96)
    np.testing.assert_array_equal(np.asarray(fused.dequantize()),
                                  np.concatenate([np.asarray(p.dequantize()) for p in parts]))


def test_fuse_block_parts_with_partial_blocks_uses_segments(rng):
    # hidden 320: q (320) and k, v (64) all end in partial 128-row blocks
    parts = [jqlin.quantize(_w(rng, n, 320), "fp8_block") for n in (320, 64, 64)]
    fused = jqlin.fuse(parts)
    assert fused.shape == (448, 320) and fused.storage_shape == (384 + 128 + 128, 384)
    assert fused.segments == ((0, 320), (384, 64), (512, 64))
    np.testing.assert_array_equal(np.asarray(fused.dequantize()),
                                  np.concatenate([np.asarray(p.dequantize()) for p in parts]))
    x = rng.standard_normal((3, 320)).astype(F32)
    y = np.asarray(jqlin.matmul(x, fused))
    np.testing.assert_array_equal(y, np.concatenate([np.asarray(jqlin.matmul(x, p)) for p in parts], -1))


def test_fuse_nvfp4_with_different_globals_keeps_per_row_globals(rng):
    parts = [jqlin.quantize(_w(rng, 32, 64) * s, "nvfp4_a16") for s in (1.0, 7.0)]
    assert float(parts[0].global_scale) != float(parts[1].global_scale)
    fused = jqlin.fuse(parts)
    assert fused.global_scale.shape == (64,)
    np.testing.assert_array_equal(np.asarray(fused.dequantize()),
                                  np.concatenate([np.asarray(p.dequantize()) for p in parts]))


def test_fuse_static_input_scales_warn_and_take_widest(rng):
    x = rng.standard_normal((4, 64)).astype(F32)
    a = jqlin.quantize(_w(rng, 16, 64), "fp8_per_tensor", calibration=x)
    b = jqlin.quantize(_w(rng, 16, 64), "fp8_per_tensor", calibration=3 * x)
    with pytest.warns(UserWarning, match="differ"):
        fused = jqlin.fuse([a, b])
    assert float(fused.input_scale) == max(float(a.input_scale), float(b.input_scale))
    c = jqlin.quantize(_w(rng, 16, 64), "nvfp4", calibration=x)
    d = jqlin.quantize(_w(rng, 16, 64), "nvfp4", calibration=3 * x)
    with pytest.warns(UserWarning):
        fused = jqlin.fuse([c, d])  # CT's input_global_scale is a divisor: the widest is the min
    assert float(fused.input_scale) == min(float(c.input_scale), float(d.input_scale))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jqlin.fuse([a, a])


def test_fuse_under_jit_keeps_every_parts_values(rng):
    """Traced parts' values cannot be compared: per-tensor scales and NVFP4 globals stay one a
    row (lossless), and differing static input scales still warn, when the values arrive."""
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    for fmt in ("fp8_per_tensor", "nvfp4"):
        a = jqlin.quantize(_w(rng, 16, 64), fmt, calibration=x)
        b = jqlin.quantize(_w(rng, 32, 64), fmt, calibration=3 * x)
        with pytest.warns(UserWarning, match="differ"):
            eager = jqlin.fuse([a, b])
        with pytest.warns(UserWarning, match="differ"):
            traced = jax.jit(jqlin.fuse)([a, b])
            jax.effects_barrier()
        assert traced.shape == eager.shape == (48, 64)
        np.testing.assert_array_equal(np.asarray(traced.dequantize()),
                                      np.asarray(eager.dequantize()))
        np.testing.assert_array_equal(np.asarray(jqlin.matmul(x, traced, kernel="xla")),
                                      np.asarray(jqlin.matmul(x, eager, kernel="xla")))
        same = jax.jit(jqlin.fuse)([a, a])  # (no warning for equal scales, traced or not)
        assert same.shape == (32, 64)


def test_repr_of_mapped_and_stacked_weights(rng):
    """Flax's tree.map(jnp.shape, params) and vmap / scan's stacked weights are printable."""
    qw = jqlin.quantize(_w(rng, 16, 64), "nvfp4_a16")
    assert "storage=(16, 64)" in repr(qw)
    assert "data=(16, 32), scale=(16, 4)" in repr(jax.tree.map(jnp.shape, qw))
    assert "(2, 16, 32)" in repr(jax.tree.map(lambda a: jnp.stack([a, a]), qw))
    assert qw == qw and qw != jqlin.quantize(_w(rng, 16, 64), "nvfp4_a16")  # (identity)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(qw)[0]]
    assert paths == [".data", ".scale", ".global_scale"]


def test_fuse_rejects_mismatched_parts(rng):
    a = jqlin.quantize(_w(rng, 16, 64), "fp8_ptpc")
    with pytest.raises(ValueError, match="K=32"):
        jqlin.fuse([a, jqlin.quantize(_w(rng, 16, 32), "fp8_ptpc")])
    with pytest.raises(ValueError, match="spec"):
        jqlin.fuse([a, jqlin.quantize(_w(rng, 16, 64), "mxfp8")])
    with pytest.raises(ValueError, match="at least one"):
        jqlin.fuse([])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_quantize_and_dequantize_compile_to_the_rules_op_by_op_bits(rng, dtype):
    """quantize / dequantize run their rules as one jitted program per shape and key: the same
    bits as the rules dispatched op by op (eager), for every registered format's weight key,
    with partial tiles (N = 200, K = 320)."""
    from jqlin.numerics import dequantize_weight, quantize_weight
    w = jnp.asarray(_w(rng, 200, 320), dtype)
    first = {}  # one format per weight key (the W4A16 / W8A16 rows share their W+A rows' keys);
    for name in jqlin.formats.names():  # 16-bit weights: the FP8 keys, the rules that compute
        key = jqlin.formats.get(name).weight  # in the weight's dtype (the rest widen first)
        if dtype == jnp.float32 or key.dtype == "float8_e4m3fn" and key.scale_dtype == "float32":
            first.setdefault(key, name)
    for name in first.values():
        spec = jqlin.formats.get(name)
        cal = jnp.asarray(_w(rng, 4, 320)) if spec.static_input_scale else None
        qw = jqlin.quantize(w, name, calibration=cal)
        rows, cols = qw.storage_shape
        with jax.disable_jit():
            data, scale, gscale = quantize_weight(jnp.pad(w, ((0, rows - 200), (0, cols - 320))),
                                                  spec.weight)
            deq = dequantize_weight(qw.data, qw.scale, qw.global_scale, spec.weight)
        for got, want, what in ((qw.data, data, "data"), (qw.scale, scale, "scale"),
                                (qw.global_scale, gscale, "global scale")):
            assert (got is None) == (want is None), (name, what)
            if got is not None:
                np.testing.assert_array_equal(np.atleast_1d(got).view(np.uint8),
                                              np.atleast_1d(want).view(np.uint8),
                                              err_msg=f"{name} {what}")
        np.testing.assert_array_equal(np.asarray(qw.dequantize_storage()).view(np.uint32),
                                      np.asarray(deq).view(np.uint32), err_msg=name)
