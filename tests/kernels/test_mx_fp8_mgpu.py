"""MXFP8 W8A8 on Mosaic GPU fp8 MMAs (pallas_kernels.mx_fp8_mgpu, session 52; experimental,
reached through mxfp8_w8a8_matmul's "fp8mma_mgpu" variants): it lowers for CUDA on CPU, matches
float64 in Mosaic GPU's interpreter (partial M tiles, several K-blocks whose chunks all carry
other scales, a persistent grid) and, through the variant, the format's XLA reference; on the
GPU (marked) float64 at a real size."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jqlin
from float64_bound import GPU_ACC_RTOL_FP8, assert_within_bound
from interpreter_races import run_checking_races
from pallas_kernels.mx_fp8 import mxfp8_w8a8_matmul
from pallas_kernels.mx_fp8_mgpu import CHUNK, mxfp8_matmul_mgpu

F32 = jnp.float32
CPU_ACC_RTOL = 1e-5  # the interpreter's float32 sums


def _operands(rng, m, n, k):
    """e4m3 codes (rows of varied magnitude) and power-of-two float32 scales per 32 along K,
    each chunk its own, all fresh random."""
    xq = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(1, 64, (m, 1)), jnp.float8_e4m3fn)
    w = jnp.asarray(rng.standard_normal((n, k)) * 16, jnp.float8_e4m3fn)
    xs = jnp.asarray(2.0 ** rng.integers(-12, 4, (m, k // CHUNK)), F32)
    ws = jnp.asarray(2.0 ** rng.integers(-12, 4, (n, k // CHUNK)), F32)
    return xq, xs, w, ws


def _float64(xq, xs, w, ws):
    xf = np.asarray(xq.astype(F32), np.float64) * np.repeat(np.asarray(xs, np.float64), CHUNK, 1)
    wf = np.asarray(w.astype(F32), np.float64) * np.repeat(np.asarray(ws, np.float64), CHUNK, 1)
    return xf @ wf.T, np.abs(xf) @ np.abs(wf).T


@pytest.mark.parametrize("m,n,k,in_flight,programs,out_dtype", [
    (1, 128, 128, 1, None, jnp.bfloat16),  # M=1: one row of a 128-row tile
    (3, 256, 256, 2, None, F32),  # two N tiles, two K-blocks
    (130, 256, 384, 4, 3, F32),  # partial second M tile, 3 K-blocks, 3 CTAs over 4 tiles
    (77, 128, 512, 2, 1, jnp.bfloat16)])  # one persistent CTA walks both tiles
def test_interpreter_matches_float64(rng, m, n, k, in_flight, programs, out_dtype):
    xq, xs, w, ws = _operands(rng, m, n, k)
    y = jax.jit(lambda *a: mxfp8_matmul_mgpu(*a, out_dtype=out_dtype, in_flight=in_flight,
                                             programs=programs, interpret=True))(xq, xs, w, ws)
    assert y.shape == (m, n) and y.dtype == out_dtype
    ref, bound = _float64(xq, xs, w, ws)
    assert_within_bound(y, ref, bound, CPU_ACC_RTOL, out_dtype)  # (finite: no NaN poison left)


@pytest.mark.parametrize("in_flight", [2, 4])
def test_interpreter_finds_no_races(rng, in_flight):
    """The interpreter's race detector over the TMA / wgmma / shared-memory traffic, with no
    more K-steps than stages (as test_fp8_block_mgpu's: this jax's detector misreports the
    scale rows' loads racing a stage's refill)."""
    xq, xs, w, ws = _operands(rng, 130, 256, 256)
    _, races = run_checking_races(lambda params: mxfp8_matmul_mgpu(
        xq, xs, w, ws, in_flight=in_flight, interpret=params))
    assert not races


def test_variant_matches_the_formats_reference(rng):
    """Through mxfp8_w8a8_matmul's variants: the activation's MX codes by the format's rule, the
    stored weight's e8m0 scales decoded -- the XLA reference's product within float32 sums."""
    from jqlin.kernels.pallas_fp4 import _mx_activation
    n, k = 256, 384
    qw = jqlin.quantize(rng.standard_normal((n, k)).astype(np.float32), "mxfp8")
    x = jnp.asarray(rng.standard_normal((5, k)) * rng.uniform(0.1, 4, (5, 1)), jnp.bfloat16)
    q, s = _mx_activation(x, qw, qw.spec.activation)
    ref = np.asarray(jqlin.matmul(x, qw, kernel="xla", out_dtype=F32), np.float64)
    for variant in ("fp8mma_mgpu", "fp8mma_mgpu_f4"):
        y = mxfp8_w8a8_matmul(q, s, qw.data, qw.scale, out_dtype=F32, variant=variant,
                              interpret=True)
        err = np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)
        assert err <= 1e-6, (variant, err)


def test_rejects_bad_operands(rng):
    xq, xs, w, ws = _operands(rng, 8, 128, 256)
    with pytest.raises(ValueError, match="xq and w must be float8_e4m3fn"):
        mxfp8_matmul_mgpu(xq.astype(jnp.bfloat16), xs, w, ws)
    with pytest.raises(ValueError, match=r"N and K positive multiples of 128; got w \(128, 192\)"):
        mxfp8_matmul_mgpu(xq[:, :192], xs[:, :6], w[:, :192], ws[:, :6])
    with pytest.raises(ValueError, match=r"x_scale must be float32 \(8, 8\)"):
        mxfp8_matmul_mgpu(xq, xs[:, :4], w, ws)
    with pytest.raises(ValueError,
                       match=r"w_scale float32 \(128, 8\), got float32\(8, 8\) and uint8"):
        mxfp8_matmul_mgpu(xq, xs, w, ws.astype(jnp.uint8))
    with pytest.raises(ValueError, match="in_flight must be 1, 2 or 4, got 3"):
        mxfp8_matmul_mgpu(xq, xs, w, ws, in_flight=3)
    with pytest.raises(ValueError, match="programs must be None or a positive int"):
        mxfp8_matmul_mgpu(xq, xs, w, ws, programs=0)
    u8 = jnp.full((128, 8), 127, jnp.uint8)
    with pytest.raises(ValueError, match="no batch-invariant launch"):
        mxfp8_w8a8_matmul(xq, xs, w, u8, variant="fp8mma_mgpu", deterministic=True)
    with pytest.raises(ValueError, match="variant must be one of"):
        mxfp8_w8a8_matmul(xq, xs, w, u8, variant="fp8mma_mgpu_f3")


@pytest.mark.parametrize("in_flight,programs", [(2, 132), (4, 132), (1, None)])
def test_lowers_for_cuda_on_cpu(in_flight, programs):
    """Mosaic GPU's lowering (layouts, the 32-byte swizzled chunk slices wgmma takes, TMA
    shapes) runs in Python: it must pass at a prefill size."""
    m, n, k = 4096, 8192, 8192
    args = [jax.ShapeDtypeStruct((m, k), jnp.float8_e4m3fn),
            jax.ShapeDtypeStruct((m, k // CHUNK), F32),
            jax.ShapeDtypeStruct((n, k), jnp.float8_e4m3fn),
            jax.ShapeDtypeStruct((n, k // CHUNK), F32)]
    low = jax.jit(lambda *a: mxfp8_matmul_mgpu(*a, in_flight=in_flight, programs=programs)
                  ).trace(*args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in low.as_text() and low.out_info.shape == (m, n)


@pytest.mark.gpu
@pytest.mark.parametrize("in_flight", [2, 4])
@pytest.mark.parametrize("m", [1, 255, 4096])
def test_gpu_matches_float64(rng, m, in_flight):
    xq, xs, w, ws = _operands(rng, m, 2560, 7168)
    y = jax.jit(lambda *a: mxfp8_matmul_mgpu(*a, out_dtype=F32, in_flight=in_flight))(
        xq, xs, w, ws)
    ref, bound = _float64(xq, xs, w, ws)
    assert_within_bound(y, ref, bound, GPU_ACC_RTOL_FP8, F32)
