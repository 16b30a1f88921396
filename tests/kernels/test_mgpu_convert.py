"""pallas_kernels.mgpu_convert: the e4m3 -> bf16 register conversion's integer trick, emulated
bit for bit from the PTX it ships (CPU), and the kernel with it against Mosaic GPU's astype
route on the GPU (marked): every finite e4m3 value, bitwise."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from pallas_kernels.fp8_block_a16_mgpu import fp8_block_a16_matmul_mgpu
from pallas_kernels.mgpu_convert import E4M3_TO_BF16_PTX


def _finite_e4m3_codes() -> np.ndarray:
    codes = np.arange(256, dtype=np.uint8)
    return codes[~np.isnan(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32))]


def _emulate(pairs: np.ndarray) -> np.ndarray:
    """The PTX's steps on uint8 pairs (n, 2) -> bf16 (n, 2): cvt to f16x2, then the and / shr /
    lop3 with the shipped constants, then the bf16 multiply (exact: checked)."""
    mask, sign, scale = (int(c, 16) for c in re.findall(
        r"and\.b32 t, h, (0x[0-9A-F]+);.*lop3\.b32 t, t, h, (0x[0-9A-F]+), 0xF8;.*"
        r"mov\.b32 s, (0x[0-9A-F]+);", E4M3_TO_BF16_PTX, re.S)[0])
    assert re.search(r"shr\.b32 t, t, 3;", E4M3_TO_BF16_PTX)
    f16 = pairs.view(ml_dtypes.float8_e4m3fn).astype(np.float16).view(np.uint16)
    h = f16[:, 0].astype(np.uint32) | (f16[:, 1].astype(np.uint32) << 16)  # lane 0 low
    t = ((h & mask) >> 3) | (h & sign)  # lop3 0xF8: a | (b & c)
    lanes = np.stack([t & 0xFFFF, t >> 16], axis=1).astype(np.uint16)
    factor = np.float64(np.uint16(scale & 0xFFFF).view(ml_dtypes.bfloat16))
    assert scale >> 16 == scale & 0xFFFF
    prod = lanes.view(ml_dtypes.bfloat16).astype(np.float64) * factor
    out = prod.astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.astype(np.float64), prod)  # the multiply is exact
    return out


def test_bit_trick_is_astype_for_every_finite_e4m3_pair():
    codes = _finite_e4m3_codes()
    a, b = np.meshgrid(codes, codes)  # every ordered pair: no lane leaks into the other
    pairs = np.stack([a.ravel(), b.ravel()], axis=1)
    want = pairs.view(ml_dtypes.float8_e4m3fn).astype(np.float32).astype(ml_dtypes.bfloat16)
    got = _emulate(pairs)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))  # signed zeros too


@pytest.mark.gpu
@pytest.mark.parametrize("m,params", [(1, dict(block_m=8, k_splits=4)),
                                      (16, dict(block_m=16, k_splits=2, blocks_per_step=2)),
                                      (300, {})])
@pytest.mark.parametrize("x_dtype", [jnp.bfloat16, jnp.float16])
def test_gpu_fast_convert_gives_the_astype_bits(rng, m, params, x_dtype):
    """Every finite e4m3 code in the weight (tiled), random x and scales: the kernel's outputs
    bitwise equal with either conversion, and both within the float64 bound."""
    n, k = 512, 2048
    codes = np.resize(_finite_e4m3_codes(), n * k)
    w = jnp.asarray(rng.permutation(codes).reshape(n, k).view(ml_dtypes.float8_e4m3fn))
    x = jnp.asarray(rng.standard_normal((m, k)) * 0.01, x_dtype)
    ws = jnp.asarray(rng.uniform(0.01, 2, (n // 128, k // 128)), jnp.float32)
    ys = [np.asarray(jax.jit(lambda *a, f=f: fp8_block_a16_matmul_mgpu(
        *a, out_dtype=jnp.float32, fast_convert=f, **params))(x, w, ws)) for f in (False, True)]
    np.testing.assert_array_equal(ys[1], ys[0])
    wd = (np.asarray(w.astype(jnp.float32), np.float64)
          * np.repeat(np.repeat(np.asarray(ws, np.float64), 128, 0), 128, 1))
    ref = np.asarray(x.astype(jnp.float32), np.float64) @ wd.T
    bound = np.abs(np.asarray(x.astype(jnp.float32), np.float64)) @ np.abs(wd).T
    assert np.all(np.abs(ys[1] - ref) <= 1e-5 * bound + 1e-30)
