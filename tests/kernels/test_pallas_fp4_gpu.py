"""Pallas NVFP4 / MXFP4 / MXFP8 kernels on a Hopper GPU at real sizes (marked `gpu`).

Tensor-core float32 accumulation is not IEEE round-to-nearest, so float32 outputs get a
relative Frobenius bound of 2e-5 (the CPU bound is 1e-5); the fp8-MMA MXFP8 variant sums 32
products per MMA in Hopper's reduced-precision fp8 accumulator: 5e-4. Either is orders of
magnitude below what a wrong scale, a rounded activation or a W4A16-for-W4A4 mix-up gives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jqlin import dispatch, formats, qweight
from jqlin.kernels.pallas_fp4 import apply
from invariance import assert_rows_batch_invariant

pytestmark = pytest.mark.gpu

KERNEL_OF = {
    "nvfp4_a16": "pallas_nvfp4", "nvfp4": "pallas_nvfp4",
    "mxfp4_a16": "pallas_mxfp4", "mxfp4": "pallas_mxfp4",
    "mxfp8_a16": "pallas_mxfp8", "mxfp8": "pallas_mxfp8",
}
REL_TOL = {jnp.dtype(jnp.float32): 2e-5, jnp.dtype(jnp.bfloat16): 2.0 ** -8}


def make(rng, fmt, m, n, k, dtype):
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * 0.05
    x = jnp.asarray(rng.standard_normal((m, k)) * np.exp(0.5 * rng.standard_normal((m, 1))),
                    dtype)
    spec = formats.get(fmt)
    static = spec.activation is not None and spec.activation.global_scale is not None
    return x, qweight.quantize(jnp.asarray(w, jnp.float32), spec,
                               calibration=x if static else None)


def rel_err(y, ref) -> float:
    y64 = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    r64 = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
    assert np.isfinite(y64).all()
    return float(np.linalg.norm(y64 - r64) / np.linalg.norm(r64))


@pytest.mark.parametrize("fmt", sorted(KERNEL_OF))
def test_gpu_matches_reference_and_auto_picks_pallas(rng, fmt):
    # K=4096, N=6144 - 40: partial N tiles; M sweeps decode to prefill (fp8-MMA MXFP8 at 4096).
    n, k = 6104, 4096
    for m, dtype in ((1, jnp.bfloat16), (7, jnp.float32), (255, jnp.bfloat16),
                     (4096, jnp.bfloat16)):
        x, qw = make(rng, fmt, m, n, k, dtype)
        assert dispatch.explain(x, qw).chosen == KERNEL_OF[fmt]
        y = dispatch.matmul(x, qw)
        ref = dispatch.matmul(x, qw, kernel="xla")
        assert y.shape == (m, n) and y.dtype == x.dtype
        err = rel_err(y, ref)
        tol = REL_TOL[jnp.dtype(dtype)]
        assert err <= tol, f"{fmt} M={m}: relative error {err:.3g} > {tol:.3g}"
        if m == 4096:  # the dense path serves auto here; the Triton kernel must agree too
            y = jax.jit(lambda x: apply(x, qw, qw.spec, path="pallas"))(x)
            assert rel_err(y, ref) <= tol, f"{fmt} M={m} pallas path"


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "mxfp4_a16", "mxfp8_a16", "nvfp4"])
def test_gpu_mid_m_takes_the_mosaic_kernel_or_dense(rng, fmt):
    """M between MGPU_MAX_M and DENSE_MIN_M (session 19's rule): the Mosaic kernel where its
    launch fills its waves (N=8192 at M=520), else the dense path (N=4096 at M=700) -- never
    the Triton kernel; both agree with the XLA reference."""
    from pallas_kernels.fp8_block_a16_mgpu import mid_m_fills
    for m, n in ((520, 8192), (700, 4096)):
        x, qw = make(rng, fmt, m, n, 2048, jnp.bfloat16)
        want = "mgpu" if mid_m_fills(m, n) else "dense"
        path = (dispatch.explain(x, qw).detail or {}).get("path", "")
        assert path.startswith(want), (fmt, m, n, path)
        err = rel_err(dispatch.matmul(x, qw), dispatch.matmul(x, qw, kernel="xla"))
        assert err <= REL_TOL[jnp.dtype(jnp.bfloat16)], f"{fmt} M={m} N={n}: {err:.3g}"


def test_gpu_w4a4_codes_are_quantized(rng):
    # Quantized activations must differ from the weight-only product (a compiler that drops
    # the rounding of a narrowing convert pair would silently run W4A16 instead).
    for fmt in ("nvfp4", "mxfp4", "mxfp8"):
        x, qw = make(rng, fmt, 8, 1024, 1024, jnp.float32)
        y = dispatch.matmul(x, qw)
        a16 = dispatch.matmul(x, qw, kernel="xla", weight_only=True)
        ref = dispatch.matmul(x, qw, kernel="xla")
        assert rel_err(y, ref) <= 2e-5
        assert rel_err(ref, a16) > 3e-3, f"{fmt}: the reference did not quantize activations"


def test_gpu_fp8mma_variant(rng):
    from pallas_kernels.common import MatmulConfig
    x, qw = make(rng, "mxfp8", 1000, 2040, 4096, jnp.float32)
    y = jax.jit(lambda x: apply(x, qw, qw.spec, mxfp8_variant="fp8mma",
                                config=MatmulConfig(64, 128, 128, num_warps=4)))(x)
    # Hopper's fp8 MMA sums each 32-chunk in its reduced-precision accumulator.
    assert rel_err(y, dispatch.matmul(x, qw, kernel="xla")) <= 5e-4


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "mxfp4_a16", "nvfp4"])
def test_gpu_asm_and_jnp_decoders_agree(rng, fmt):
    # The PTX e2m1 decoder and the portable one give the same exact bf16 weights.
    x, qw = make(rng, fmt, 16, 2048, 2048, jnp.float32)  # (the Triton kernel: path='pallas')
    a = jax.jit(lambda x: apply(x, qw, qw.spec, decode="asm", path="pallas"))(x)
    b = jax.jit(lambda x: apply(x, qw, qw.spec, decode="jnp", path="pallas"))(x)
    ref = dispatch.matmul(x, qw, kernel="xla")
    assert rel_err(a, ref) <= 2e-5 and rel_err(b, ref) <= 2e-5
    assert rel_err(a, b) <= 2e-5


@pytest.mark.parametrize("fmt", sorted(KERNEL_OF))
def test_gpu_batch_invariant_rows(rng, fmt):
    n, k = 4096, 4096
    _, qw = make(rng, fmt, 1, n, k, jnp.float32)
    assert_rows_batch_invariant(qw, k, jnp.float32, rng, (2, 7, 64, 300), fmt)
