"""The accuracy check of the Mosaic GPU kernel tests: y against a float64 reference, within
acc_rtol of the |.|-sum bound (accumulation) plus one rounding to y's dtype."""

import jax.numpy as jnp
import numpy as np

# fp8 MMAs (W8A8) accumulate inside the tensor core with ~14 significant bits (DeepSeek-V3
# report, sec. 3.3.2) for promote_k = 128 elements (4 MMAs of K=32) before the float32 add:
# <= 4 roundings of 2^-13 relative to that interval's |.|-sum, i.e. 5e-4 overall.
GPU_ACC_RTOL_FP8 = 5e-4


def assert_within_bound(y, ref, bound, acc_rtol: float, out_dtype) -> None:
    y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    assert y.shape == ref.shape and np.isfinite(y).all()
    ulp = 2.0 ** -23 if out_dtype == jnp.float32 else 2.0 ** -7
    tol = acc_rtol * bound + ulp * np.maximum(np.abs(ref), np.abs(y))
    excess = np.abs(y - ref) / tol
    assert excess.max() <= 1.0, f"max |y-ref|/tol {excess.max():.3g}"


def w8a8_float64(x, qw):
    """float64 y and |.|-sum bound from the activation codes + scales the W8A8 glue computes.

    On the GPU the XLA reference path is not an oracle for fp8-activation specs: run 2 measured
    it 2.7e-2 (normwise) away from float64 of the same codes (XLA rewrites the dequantize ->
    dot pattern), while the codes themselves are the reference's (test_pallas_fp8, CPU)."""
    from jqlin.kernels.pallas_fp8 import quantize_x
    q, s, kind = quantize_x(x, qw, qw.spec)
    sx = np.asarray(s, np.float64)
    xq = np.asarray(q.astype(jnp.float32), np.float64) * (
        np.repeat(sx, 128, 1) if kind == "group" else sx)
    wd = np.asarray(qw.dequantize_storage(), np.float64)
    y, bound = xq @ wd.T, np.abs(xq) @ np.abs(wd).T
    trim = lambda a: np.asarray(qw.trim_rows(jnp.asarray(a, jnp.float32)), np.float64)
    return trim(y), trim(bound)


def block_w8a8_operands(rng, m, n, k):
    """Block-scaled W8A8 operands for the Mosaic kernels' direct calls: e4m3 x (rows of varied
    magnitude) and w, float32 1x128 x scales and 128x128 w scales, all fresh random."""
    x = rng.standard_normal((m, k)) * rng.uniform(0.1, 3, (m, 1))
    xq = jnp.asarray(x, jnp.float8_e4m3fn)
    w = jnp.asarray(rng.standard_normal((n, k)), jnp.float8_e4m3fn)
    xs = jnp.asarray(rng.uniform(0.5, 2, (m, k // 128)), jnp.float32)
    ws = jnp.asarray(rng.uniform(0.5, 2, (n // 128, k // 128)), jnp.float32)
    return xq, xs, w, ws


def block_w8a8_float64(xq, xs, w, ws):
    """float64 y and |.|-sum bound of block_w8a8_operands' product."""
    xf = np.asarray(xq.astype(jnp.float32), np.float64) * np.repeat(np.asarray(xs, np.float64),
                                                                   128, 1)
    wf = np.asarray(w.astype(jnp.float32), np.float64) * np.repeat(
        np.repeat(np.asarray(ws, np.float64), 128, 0), 128, 1)
    return xf @ wf.T, np.abs(xf) @ np.abs(wf).T
