"""The e4m3 -> bf16 / f16 widening pass (pallas_kernels.fp8_widen): every code, bit for bit as
astype, in Pallas' interpreter; it lowers for CUDA (an abstract H200); bad operands are named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import AbstractDevice, AbstractMesh

from pallas_kernels.fp8_widen import WIDEN_ROWS, widen_e4m3


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("n,k", [(16, 256), (48, 384), (32, 2048)])
def test_every_code_widens_as_astype(rng, dtype, n, k):
    """All 256 codes (NaN and -0 included) in random places of the weight, both dtypes, K
    tiled by 1024, 512, 256 or 128 columns."""
    codes = np.concatenate([np.arange(256, dtype=np.uint8),
                            rng.integers(0, 256, n * k - 256, dtype=np.uint8)])
    w = jnp.asarray(rng.permutation(codes).reshape(n, k).view(ml_dtypes.float8_e4m3fn))
    got = np.asarray(jax.jit(lambda a: widen_e4m3(a, dtype, interpret=True))(w))
    want = np.asarray(w.astype(dtype))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_lowers_for_cuda_on_an_abstract_h200():
    mesh = AbstractMesh((1,), ("x",), abstract_device=AbstractDevice(
        device_kind="NVIDIA H200", num_cores=132, platform="gpu"))
    w = jax.ShapeDtypeStruct((8192, 7168), jnp.float8_e4m3fn)
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(widen_e4m3).trace(w).lower(lowering_platforms=("cuda",)).as_text()
    assert "widen_e4m3" in text


@pytest.mark.parametrize("w,dtype,match", [
    (jnp.zeros((16, 128), jnp.bfloat16), jnp.bfloat16, r"w must be float8_e4m3fn, got bfloat16"),
    (jnp.zeros((16, 128), jnp.float8_e4m3fn), jnp.float32, r"dtype must be bfloat16 or float16"),
    (jnp.zeros((WIDEN_ROWS + 1, 128), jnp.float8_e4m3fn), jnp.bfloat16, r"\(17, 128\)"),
    (jnp.zeros((16, 100), jnp.float8_e4m3fn), jnp.bfloat16, r"K of 128, got \(16, 100\)"),
])
def test_bad_operands_are_named(w, dtype, match):
    with pytest.raises(ValueError, match=match):
        widen_e4m3(w, dtype, interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", [(8192, 8192), (7168, 18432), (4112, 7168)])
def test_gpu_widens_as_astype(rng, n, k):
    """On the GPU at real sizes (K tiled by 1024 and by 512 columns): bitwise astype."""
    codes = rng.integers(0, 256, (n, k), dtype=np.uint8)
    w = jnp.asarray(codes.view(ml_dtypes.float8_e4m3fn))
    for dtype in (jnp.bfloat16, jnp.float16):
        got = np.asarray(jax.jit(lambda a, d=dtype: widen_e4m3(a, d))(w))
        np.testing.assert_array_equal(got.view(np.uint16),
                                      np.asarray(w.astype(dtype)).view(np.uint16))
