"""Non-finite activations reach the output as they do in x @ W.

A NaN activation reaches the output. Every rule that quantizes activations gives the scale
tile holding a NaN (the token, the 1x128 group, the group of 16 or 32) a NaN scale, so the
tile's values and its row's outputs are NaN; a static per-tensor scale leaves the NaN's own
code NaN. The same through the Pallas kernels (the act_quant passes forced; interpret mode
computes min / max the GPU's NaN-ignoring way). Before session 33 MXFP4 turned a NaN into finite
outputs (e2m1 codes hold no NaN and the e8m0 exponent came out 0), and XLA:CPU's max reductions
dropped NaN at some shapes ((13, 384) in groups of 16), so NVFP4 did too there. An inf
activation in a float32 / float16 row of a 4-bit / MX weight-only product came out NaN across
the row (its bf16 parts were inf, inf - inf, ...), where x @ W gives +-inf.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jqlin import dispatch, formats, qweight
from jqlin.numerics import fake_quantize_activation
from jqlin.numerics.tiling import tile_shape
from jqlin.spec import GlobalScale, ScaleRule

RULES = [("fp8_per_tensor", "compressed-tensors"), ("fp8_ptpc", "compressed-tensors"),
         ("fp8_ptpc", "vllm"), ("fp8_block", "compressed-tensors"),
         ("nvfp4", "compressed-tensors"), ("nvfp4", "modelopt"),
         ("mxfp4", "compressed-tensors"), ("mxfp4", "modelopt"),
         ("mxfp8", "compressed-tensors"), ("mxfp8", "modelopt")]


def _key(name, rule):
    key = dataclasses.replace(formats.get(name).activation, rule=ScaleRule(rule))
    if name == "nvfp4" and rule == "modelopt":  # (ModelOpt's global scale multiplies)
        key = dataclasses.replace(key, global_scale=GlobalScale.MULTIPLIER)
    return key


@pytest.mark.parametrize("name,rule", RULES)
def test_a_nan_makes_its_scale_tile_nan(rng, name, rule):
    """fake_quantize_activation, jitted, on (13, 384): NaN exactly over the tiles holding a NaN
    (one NaN; a tile of NaN), every other value bitwise what it is with the NaN made 0."""
    key = _key(name, rule)
    x = rng.standard_normal((13, 384)) * np.exp2(rng.uniform(-20, 20, (13, 1)))
    x[2, 5] = np.nan
    x[7, 128:256] = np.nan
    x = x.astype(np.float32)
    g = None if key.dynamic and key.global_scale is None else jnp.float32(0.37)
    run = jax.jit(lambda v: fake_quantize_activation(v, key, g))
    got = np.asarray(run(jnp.asarray(x)))
    if key.dynamic:
        tr, tc = tile_shape(key, *x.shape)
        tiles = np.isnan(x).reshape(13 // tr, tr, 384 // tc, tc).any(axis=(1, 3))
        want = np.repeat(np.repeat(tiles, tr, 0), tc, 1)
    else:  # a static scale: the NaN's own code only
        want = np.isnan(x)
    np.testing.assert_array_equal(np.isnan(got), want)
    clean = np.asarray(run(jnp.asarray(np.where(np.isnan(x), 0, x))))
    assert np.isfinite(clean).all()
    np.testing.assert_array_equal(got[~want].view(np.uint32), clean[~want].view(np.uint32))


KERNEL = {"fp8_per_tensor": "pallas_fp8_w8a8", "fp8_ptpc": "pallas_fp8_w8a8",
          "fp8_block": "pallas_fp8_block", "nvfp4": "pallas_nvfp4", "mxfp4": "pallas_mxfp4",
          "mxfp8": "pallas_mxfp8"}


@pytest.mark.parametrize("fmt", sorted(KERNEL))
@pytest.mark.parametrize("kernel", ["xla", "pallas"])
def test_a_nan_activation_makes_its_output_row_nan(rng, monkeypatch, fmt, kernel):
    """jqlin.matmul: the row holding a NaN comes out NaN in every column; the other rows are
    the bits they have when the NaN is 0 (the Pallas kernels with their activation passes
    forced: act_quant's codes / operand kernels, interpret mode)."""
    from jqlin.kernels import pallas_fp4, pallas_fp8
    x = rng.standard_normal((5, 256)).astype(np.float32)
    w = rng.standard_normal((128, 256)).astype(np.float32)
    calib = jnp.asarray(x) if fmt in ("fp8_per_tensor", "nvfp4") else None
    qw = qweight.quantize(jnp.asarray(w), fmt, calibration=calib)
    if kernel == "pallas":
        monkeypatch.setattr(pallas_fp8, "codes_path", lambda *a, **k: "pallas")
        monkeypatch.setattr(pallas_fp4, "nvfp4_operand_path", lambda *a, **k: "pallas")
        monkeypatch.setattr(pallas_fp4, "mx_operand_path", lambda *a, **k: "pallas")
        dispatch._jitted.cache_clear()  # (the patched paths are read at trace time)
    name = KERNEL[fmt] if kernel == "pallas" else "xla"
    try:
        x[1, 37] = np.nan
        y = np.asarray(dispatch.matmul(jnp.asarray(x, jnp.bfloat16), qw, kernel=name),
                       np.float32)
        x[1, 37] = 0
        y0 = np.asarray(dispatch.matmul(jnp.asarray(x, jnp.bfloat16), qw, kernel=name),
                        np.float32)
    finally:  # (no trace with the patched paths outlives the test)
        dispatch._jitted.cache_clear()
    assert np.isnan(y[1]).all(), f"{fmt} {kernel}: {np.isnan(y[1]).sum()} of 128 NaN"
    rest = np.arange(5) != 1
    assert np.isfinite(y0).all()
    np.testing.assert_array_equal(y[rest].view(np.uint32), y0[rest].view(np.uint32))


A16 = {"nvfp4_a16": "pallas_nvfp4", "mxfp4_a16": "pallas_mxfp4", "mxfp8_a16": "pallas_mxfp8",
       "fp8_per_channel_a16": "pallas_fp8_w8a16", "fp8_block_a16": "pallas_fp8_w8a16"}


@pytest.mark.parametrize("fmt", sorted(A16))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16],
                         ids=["f32", "f16", "bf16"])
def test_an_inf_activation_gives_the_references_infinities(rng, fmt, dtype):
    """Weight-only: a row holding +-inf comes out +-inf where the XLA reference's does (NaN
    where it multiplies a zero weight), through the Pallas kernel (interpret mode), in every
    activation dtype (a float32 row reaches the kernels as exact bf16 parts, and so does a
    float16 one the 4-bit / MX kernels)."""
    qw = qweight.quantize(jnp.asarray(rng.standard_normal((128, 256)), jnp.float32), fmt)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    x[1, 7], x[2, 100] = np.inf, -np.inf
    x = jnp.asarray(x, dtype)
    ref = np.asarray(dispatch.matmul(x, qw, kernel="xla"), np.float32)
    got = np.asarray(dispatch.matmul(x, qw, kernel=A16[fmt]), np.float32)
    for row in (1, 2):
        assert np.isinf(ref[row]).sum() > 64  # (the test's premise)
        np.testing.assert_array_equal(np.isnan(got[row]), np.isnan(ref[row]))
        inf = np.isinf(ref[row])
        np.testing.assert_array_equal(got[row][inf], ref[row][inf])
        assert np.isfinite(got[row][~inf & ~np.isnan(ref[row])]).all()
    assert np.isfinite(got[0]).all()
