"""Float32 scales that are subnormal, on the GPU: XLA:GPU keeps them (session 45: a weight of
largest magnitude 1e-36 quantizes there, its amax / 448 below float32's least normal), so every
kernel the dispatcher picks must apply them as they are -- a kernel compiled to flush subnormal
operands to zero would return zeros. Each FP8 format through the dispatcher (default and
deterministic mode, M from the decode kernels to the prefill paths) against float64 of the
stored codes and scales. Not the MX / NVFP4 formats: MX weights decode to bf16 in the kernels,
where code x 2^-127 is not exact for the smaller codes (a representability limit, not a flush),
and NVFP4's compressed-tensors global scale 2688 / amax overflows at such weights (refused)."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jqlin
from float64_bound import GPU_ACC_RTOL_FP8, assert_within_bound, w8a8_float64

FP8_NAMES = ["fp8_per_tensor_a16", "fp8_per_channel_a16", "fp8_block_a16", "fp8_per_tensor",
             "fp8_ptpc", "fp8_block"]
STATIC_ACT = {"fp8_per_tensor"}
TINY = np.float32(1e-36)  # amax / 448 = 2.2e-39 < 2^-126 = 1.18e-38
WEIGHT_ONLY_ACC_RTOL = 1e-4  # float32 sums of exact products (as test_pallas_fp8's GPU tests)
XLA_NORMWISE_RTOL = 5e-2
BF16_LEAST_SUBNORMAL = float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_subnormal)


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP8_NAMES)
def test_gpu_kernels_apply_subnormal_scales(name, rng):
    n, k = 1024, 4096
    w = rng.standard_normal((n, k)).astype(np.float32)
    w = w / np.abs(w).max(axis=1, keepdims=True) * TINY  # every row's amax 1e-36
    cal = (rng.standard_normal((4, k)) * 2).astype(np.float32) if name in STATIC_ACT else None
    qw = jqlin.quantize(w, name, calibration=cal)
    scales = np.asarray(qw.scale, np.float64)
    assert np.all((scales > 0) & (scales < np.finfo(np.float32).tiny)), "scales not subnormal"
    wd = np.asarray(qw.dequantize(), np.float64)
    assert np.count_nonzero(wd) > wd.size // 2
    weight_only = qw.spec.activation is None
    for m in (1, 8, 16, 64, 300):
        x = jnp.asarray(rng.standard_normal((m, k)) * rng.uniform(0.5, 3, (m, 1)), jnp.bfloat16)
        if weight_only:
            xd = np.asarray(x.astype(jnp.float32), np.float64)
            ref, bound, rtol = xd @ wd.T, np.abs(xd) @ np.abs(wd).T, WEIGHT_ONLY_ACC_RTOL
        else:
            ref, bound = w8a8_float64(x, qw)
            rtol = GPU_ACC_RTOL_FP8
        assert np.count_nonzero(ref) == ref.size
        for det in (False, True):
            y = jqlin.matmul(x, qw, deterministic=det)
            _assert_not_flushed(y, ref, rtol * bound, f"{name} M={m} det={det}")
            assert_within_bound(y, ref, bound, rtol, jnp.bfloat16)
        # XLA's path is no float64 oracle for fp8 activations (float64_bound.w8a8_float64: 2.7e-2
        # normwise on the GPU), so it is held to a normwise bound: a flush is an error of 1.
        y = np.asarray(jqlin.matmul(x, qw, kernel="xla").astype(jnp.float32), np.float64)
        err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert err <= XLA_NORMWISE_RTOL, f"{name} M={m} xla: normwise error {err:.3g}"


def _assert_not_flushed(y, ref, acc_tol, what: str) -> None:
    """Zeros in y only where float64's value is within the accumulation's error bound (acc_tol)
    plus bf16's least subnormal of zero: an output that small may round to zero. A few do at
    these sizes (session 47, H100: "no zero at all" failed 4 formats at M=64 / 300; with
    weights ~100x smaller still, 2e-4 of the outputs were zero and XLA's path's alike)."""
    y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    flushed = (y == 0) & (np.abs(ref) > acc_tol + BF16_LEAST_SUBNORMAL)
    assert not flushed.any(), (f"{what}: {int(flushed.sum())} outputs zero where float64's are "
                               f"up to {np.abs(ref[flushed]).max():.3g} -- a subnormal scale "
                               "flushed?")
