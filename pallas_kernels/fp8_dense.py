"""Default-mode path of the fp8 kernels with whole-K scales where XLA's own GEMM wins (prefill
sizes; weight-only also M = 2-8, fp8_paths): XLA's GEMM on the exact stored operands, then the
scales on the float32 result.

At prefill sizes the Triton kernels lose to XLA's GEMMs (session 3-4 grids, H200: fp8 x fp8
per-tensor / per-token 1.02-1.10x bf16 against 1.6-1.8x for XLA's e4m3 x e4m3 dot; W8A16 0.62-0.66x,
its e4m3 -> bf16 conversion sitting between the MMAs). With per-tensor / per-channel weight scales
and per-tensor / per-token activation scales every scale is constant along K, so

    y = (sum_k xq[m, k] * wq[n, k]) * xs[m] * ws[n]

and the sum is a plain GEMM of the stored codes: e4m3 x e4m3 (cuBLASLt fp8 on Hopper) for W8A8,
activations x codes converted to the activation dtype (exact: every e4m3 value is a bf16 / f16
number) for W8A16. Products are exact and accumulate in float32 (precision HIGHEST: no fast
fp8 accumulation); the scales apply to the float32 sum in the kernels' order (x's, then w's).
The summation order is cuBLAS's, chosen by shape, so this path serves default mode only
(fp8_paths.fp8_path). Block / group scales change along K: fp8_block_mgpu serves those.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .fp8_widen import WIDEN_COLS, WIDEN_ROWS, widen_e4m3

__all__ = ["fp8_dense_matmul", "widens", "FUSED_CONVERT_MAX_M"]

F32 = jnp.float32
_DIMS = (((1,), (1,)), ((), ()))
# Up to this M XLA fuses the codes' conversion into its own GEMM, which then reads one byte a
# weight, and the widening pass would only add a pass: H200, session 24 (sweep_fp8.py --parts
# a16_small_m, 11 shapes, same run), without the pass the dense path ran 1.43-1.94x bf16 at
# M = 2-8 (fp8_paths.DENSE_A16_DECODE_M). At prefill sizes XLA converted in a pass of its own
# (81 us on 8192x8192, session 20): there the widening pass pays (widens).
FUSED_CONVERT_MAX_M = 8


def fp8_dense_matmul(x: jax.Array, x_scale: jax.Array | None, w: jax.Array, w_scale: jax.Array,
                     *, x_scale_kind: str, w_scale_kind: str, out_dtype,
                     interpret: bool = False) -> jax.Array:
    """y (M, N) = x (M, K) @ w (N, K)^T with whole-K scales, through one XLA dot (see module).

    x: e4m3 codes (x_scale (1,1) "tensor" or (M,1) "row") or float activations ("none").
    w: e4m3 (N, K); w_scale float32 (1,1) "tensor" or (N,1) "channel".
    interpret: the widening pass of 16-bit activations' weights in Pallas' interpreter."""
    if x_scale_kind not in ("none", "tensor", "row") or w_scale_kind not in ("tensor", "channel"):
        raise ValueError(f"the dense fp8 path needs whole-K scales, got x {x_scale_kind!r}, "
                         f"w {w_scale_kind!r}")
    b = (w if x.dtype == jnp.dtype(jnp.float8_e4m3fn) else
         _widened(w, x.dtype, interpret, x.shape[0]))
    y = lax.dot_general(x, b, _DIMS, precision=lax.Precision.HIGHEST, preferred_element_type=F32)
    if x_scale_kind == "tensor":
        y = y * x_scale[0, 0]
    elif x_scale_kind == "row":
        y = y * x_scale
    y = y * (w_scale[0, 0] if w_scale_kind == "tensor" else w_scale[:, 0][None, :])
    return y.astype(out_dtype)


def widens(n: int, k: int, dtype, m: int) -> bool:
    """Whether an (n, k) e4m3 weight beside m rows of activations of dtype goes through
    fp8_widen's pass (16-bit activations, more than FUSED_CONVERT_MAX_M rows, the pass's tiles
    fitting the weight) rather than XLA's astype."""
    return (jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
            and m > FUSED_CONVERT_MAX_M and n % WIDEN_ROWS == 0 and k % WIDEN_COLS[-1] == 0)


def _widened(w: jax.Array, dtype, interpret: bool, m: int) -> jax.Array:
    """w's values in the activations' dtype (exact): fp8_widen's pass where `widens` (H200,
    session 20: 50-53 us against XLA's convert's 81 for an 8192 x 8192 weight, bitwise the
    same), else XLA's astype (fused into XLA's GEMM up to FUSED_CONVERT_MAX_M rows)."""
    if widens(*w.shape, dtype, m):
        return widen_e4m3(w, dtype, interpret=interpret)
    return w.astype(dtype)
