"""The group-scaled weights' dequantization pass (pallas_kernels.group_dequant): every code with
every scale byte (NaN codes and scales included), bit for bit XLA's dequantize_bf16, in Pallas'
interpreter and on the GPU; it lowers for CUDA (an abstract H200); bad operands are named; the
dense path and its explanation take it where its tiles fit, XLA where not."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from jqlin import dispatch, qweight
from pallas_kernels.group_dequant import DEQUANT_ROWS, dequant_pass_fits, dequantize_groups
from pallas_kernels.mx_dense import dequantize_bf16, dequantized

# (elem, scale, group): NVFP4, MXFP4, MXFP8
FORMATS = {"nvfp4": ("e2m1", "e4m3", 16), "mxfp4": ("e2m1", "e8m0", 32),
           "mxfp8": ("e4m3", "e8m0", 32)}


def _operands(rng, fmt: str, n: int, k: int):
    """Random codes holding every code byte, scales holding every scale byte, at random places
    (as many of them as fit, where fewer than 256)."""
    elem, _, group = FORMATS[fmt]

    def every_byte(count):
        first = rng.permutation(256).astype(np.uint8)[:count]
        return rng.permutation(np.concatenate(
            [first, rng.integers(0, 256, count - first.size, dtype=np.uint8)]))

    return (every_byte(n * (k // 2 if elem == "e2m1" else k)).reshape(n, -1),
            every_byte(n * k // group).reshape(n, -1))


def _same_bits(got, want) -> None:
    """Bitwise, except that a NaN is any NaN: a NaN code times a NaN scale may keep either
    operand's sign (IEEE 754 leaves open which NaN operand's payload a product keeps)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype == jnp.bfloat16 and got.shape == want.shape
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(np.where(nan, 0, got.view(np.uint16)),
                                  np.where(nan, 0, want.view(np.uint16)))


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n,k", [(16, 1024), (32, 1536), (48, 256)])
def test_every_code_and_scale_dequantizes_as_xla(rng, fmt, n, k):
    """K tiled by 512, 256, 128 or 64 bytes a program (e2m1: 1024, 512 or 128 weights); NVFP4
    also with the predecode's 2**-8 factor."""
    elem, scale, group = FORMATS[fmt]
    w, s = _operands(rng, fmt, n, k)
    for factor in ((1.0, 2.0 ** -8) if fmt == "nvfp4" else (1.0,)):
        got = jax.jit(lambda a, b: dequantize_groups(a, b, elem=elem, scale=scale, group=group,
                                                     factor=factor, interpret=True))(w, s)
        _same_bits(got, dequantize_bf16(jnp.asarray(w), jnp.asarray(s), elem=elem,
                                        scale=scale, group=group, factor=factor))


def test_dequantized_falls_back_to_xla_where_the_tiles_do_not_fit(rng):
    """N not a multiple of the pass's rows: XLA's dequantization, the same values."""
    assert not dequant_pass_fits(DEQUANT_ROWS + 8, 256, elem="e2m1", group=16)
    assert not dequant_pass_fits(32, 96, elem="e4m3", group=32)
    assert dequant_pass_fits(32, 128, elem="e2m1", group=32)
    w, s = _operands(rng, "nvfp4", DEQUANT_ROWS + 8, 1024)
    run = lambda a, b: dequantized(a, b, elem="e2m1", scale="e4m3", group=16,  # noqa: E731
                                   interpret=True)
    assert "dequantize_e2m1" not in str(jax.make_jaxpr(run)(w, s))
    _same_bits(run(w, s), dequantize_bf16(jnp.asarray(w), jnp.asarray(s), elem="e2m1",
                                          scale="e4m3", group=16))


def test_lowers_for_cuda_on_an_abstract_h200():
    mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
        device_kind="NVIDIA H200", num_cores=132, platform="gpu"))
    for fmt, (elem, scale, group) in FORMATS.items():
        n, k = 8192, 7168
        w = jax.ShapeDtypeStruct((n, k // 2 if elem == "e2m1" else k), jnp.uint8)
        s = jax.ShapeDtypeStruct((n, k // group), jnp.uint8)
        with jax.sharding.use_abstract_mesh(mesh):
            text = jax.jit(lambda a, b, e=elem, sc=scale, g=group: dequantize_groups(
                a, b, elem=e, scale=sc, group=g)).trace(w, s).lower(
                    lowering_platforms=("cuda",)).as_text()
        assert f"dequantize_{elem}_{scale}" in text, fmt


@pytest.mark.parametrize("kw,match", [
    (dict(w=np.zeros((16, 64), np.uint8), s=np.zeros((16, 8), np.uint8), elem="e2m2"),
     r"elem must be e2m1 or e4m3"),
    (dict(w=np.zeros((24, 64), np.uint8), s=np.zeros((24, 8), np.uint8)),
     r"N a multiple of 16 .* got \(24, 64\)"),
    (dict(w=np.zeros((16, 64), np.uint8), s=np.zeros((16, 4), np.uint8)),
     r"w_scale must be \(N, K/16\) = \(16, 8\), got \(16, 4\)"),
    (dict(w=np.zeros((16, 64), np.int8), s=np.zeros((16, 8), np.uint8)),
     r"packed e2m1 codes must be uint8, got int8"),
    (dict(w=np.zeros((16, 128), np.float32), s=np.zeros((16, 4), np.uint8), elem="e4m3",
          scale="e8m0", group=32),
     r"e4m3 codes must be uint8 or float8_e4m3fn, got float32"),
    (dict(w=np.zeros((16, 64), np.uint8), s=np.zeros((16, 8), np.float32)),
     r"w_scale must hold one byte a scale \(e4m3 or its bytes\), got float32"),
    (dict(w=np.zeros((16, 64), np.uint8), s=np.zeros((16, 8), np.uint8), factor=0.3),
     r"factor must be a power of two .* got 0.3"),
    (dict(w=np.zeros((16, 64), np.uint8), s=np.zeros((16, 8), np.uint8), decode="asm"),
     r"decode='asm' is PTX and cannot run in interpret mode"),
    (dict(w=np.zeros((16, 128), np.uint8), s=np.zeros((16, 4), np.uint8), elem="e4m3",
          scale="e8m0", group=32, decode="asm"),
     r"decode must be one of \('jnp', 'asm'\) \('asm' for e2m1 only\), got 'asm' for e4m3"),
])
def test_bad_operands_are_named(kw, match):
    kw = {"elem": "e2m1", "scale": "e4m3", "group": 16, **kw}
    w, s = kw.pop("w"), kw.pop("s")
    with pytest.raises(ValueError, match=match):
        dequantize_groups(w, s, interpret=True, **kw)


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "mxfp4_a16", "mxfp8_a16"])
def test_dense_path_takes_the_pass_and_says_so(rng, fmt):
    """jqlin.matmul at M=1024 (CPU: forced kernel, interpreted) runs the dense path through the
    pass, within bf16 rounding of the XLA reference; describe_config names the pass where
    the weight fits it and XLA's dequantization where not. MX formats' dot rounds to bf16
    itself (nothing follows its float32 sums); NVFP4's keeps float32 for its global scale."""
    from jqlin.kernels.pallas_fp4 import describe_config
    kernel = "pallas_" + fmt.removesuffix("_a16")
    x = jnp.asarray(rng.standard_normal((1024, 256)), jnp.bfloat16)
    for n, fits in ((48, True), (40, False)):
        qw = qweight.quantize(jnp.asarray(rng.standard_normal((n, 256)), jnp.float32), fmt)
        path = describe_config(kernel, 1024, qw, qw.spec, x.dtype, False)["path"]
        assert path.startswith("dense") and ("group_dequant" in path) == fits, path
        run = lambda a, q=qw: dispatch.matmul(a, q, kernel=kernel)  # noqa: E731
        jaxpr = str(jax.make_jaxpr(run)(x))
        assert ("dequantize_" in jaxpr) == fits
        rounds_itself = "preferred_element_type=bfloat16" in jaxpr
        assert rounds_itself == (not fmt.startswith("nvfp4")), jaxpr
        y = np.asarray(run(x), np.float64)
        ref = np.asarray(dispatch.matmul(x, qw, kernel="xla"), np.float64)
        np.testing.assert_allclose(y, ref, rtol=2 ** -7, atol=2 ** -7 * np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,decode", [("nvfp4", "asm"), ("nvfp4", "jnp"), ("mxfp4", "asm"),
                                        ("mxfp4", "jnp"), ("mxfp8", None)])
@pytest.mark.parametrize("n,k", [(8192, 8192), (7168, 18432), (4112, 7168), (32, 128)])
def test_gpu_dequantizes_as_xla(rng, fmt, decode, n, k):
    """On the GPU at real sizes and the narrowest (every code and scale byte, NaNs included),
    e2m1 by both decodes: bitwise XLA's."""
    elem, scale, group = FORMATS[fmt]
    w, s = _operands(rng, fmt, n, k)
    w, s = jnp.asarray(w), jnp.asarray(s)
    for factor in ((1.0, 2.0 ** -8) if fmt == "nvfp4" else (1.0,)):
        got = jax.jit(lambda a, b: dequantize_groups(a, b, elem=elem, scale=scale, group=group,
                                                     factor=factor, decode=decode))(w, s)
        want = jax.jit(lambda a, b: dequantize_bf16(a, b, elem=elem, scale=scale, group=group,
                                                    factor=factor))(w, s)
        _same_bits(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4_a16", "mxfp4_a16", "mxfp8_a16", "mxfp4"])
def test_gpu_dense_path_matches_the_reference(rng, fmt):
    """The dense path on the GPU (default mode, M=1024, N=6144 fitting the pass; MX: the dot
    rounding to bf16 itself) within bf16 rounding of the XLA reference (the bound of
    test_pallas_fp4_gpu), and the pass in the program."""
    from jqlin.kernels.pallas_fp4 import describe_config
    n, k, m = 6144, 4096, 1024
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * 0.05
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), fmt)
    kernel = "pallas_" + fmt.removesuffix("_a16")
    assert "group_dequant" in describe_config(kernel, m, qw, qw.spec, x.dtype, False)["path"]
    y = np.asarray(jax.jit(lambda a: dispatch.matmul(a, qw))(x).astype(jnp.float32), np.float64)
    ref = np.asarray(dispatch.matmul(x, qw, kernel="xla").astype(jnp.float32), np.float64)
    assert np.isfinite(y).all()
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err <= 2.0 ** -8, f"{fmt}: relative error {err:.3g}"
