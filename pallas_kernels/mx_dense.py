"""Large-M path of the group-scaled formats: exact bf16 dequantization, then one XLA dot.

At prefill sizes the product is MMA-bound, and the Triton kernels decode every weight tile once
per M-tile on the CUDA cores between MMAs (no warp specialization), which costs as much as the
MMAs themselves. Dequantizing the weight once per call instead (a memory pass of ~2.6 bytes per
weight: read 0.53-1.03, write 2) and handing exact bf16 operands to XLA's dot (cuBLAS bf16 MMAs,
float32 accumulation) computes the same function: every operand is the exact stored value
(e2m1 * e4m3, e2m1 * 2**k, e4m3 * 2**k are bf16 numbers), products are exact in float32, the
NVFP4 global scale still enters the float32 result per column. Only the float32 summation order
differs, as between any two tilings -- and it depends on M (cuBLAS picks its blocking by shape),
so this path serves default mode only, never deterministic=True.

The dot's output: where nothing follows the float32 sums but the rounding (one bf16 / f16
activation operand, no global scale: MX formats), the dot rounds them itself
(preferred_element_type = the output dtype: cuBLAS accumulates in float32 and rounds once in
its epilogue) -- no float32 (M, N) written and converted by a second pass (H200, session 21:
that pass was 47 us of ~750 at M=4096 on 8192x8192, benchmarks/probe_dense_kernels.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .common import finish_rows
from .group_dequant import CODES_PER_BYTE, dequant_pass_fits, dequantize_groups
from .mx_decode import e8m0_to_f32

__all__ = ["dense_dequant_matmul", "dequantize_bf16", "dequantized", "xla_dequantization",
           "DENSE_MIN_M"]

F32, BF16 = jnp.float32, jnp.bfloat16
DENSE_MIN_M = 1024  # default mode switches to this path from here (benchmarks/NOTES.md)


def dequantize_bf16(w: jax.Array, w_scale: jax.Array, *, elem: str, scale: str,
                    group: int, factor: float = 1.0) -> jax.Array:
    """(N, K) bf16 equal to element * group scale (* factor, a power of two, in float32 before
    the one rounding), exactly (no global scale). w: packed e2m1 bytes (N, K/2) or e4m3 (N, K);
    w_scale: e4m3 or e8m0, as stored or viewed as uint8 (N, K/group)."""
    if elem == "e2m1":
        codes = lax.bitcast_convert_type(w, jnp.float4_e2m1fn)  # (N, K/2, 2): [low, high]
        q = codes.reshape(w.shape[0], w.shape[1] * 2).astype(F32)
    else:
        q = lax.bitcast_convert_type(w, jnp.float8_e4m3fn).astype(F32)
    if scale == "e8m0":
        s = e8m0_to_f32(lax.bitcast_convert_type(w_scale, jnp.uint8))
    else:
        s = lax.bitcast_convert_type(w_scale, jnp.float8_e4m3fn).astype(F32)
    v = q * jnp.repeat(s, group, axis=1)
    return (v if factor == 1.0 else v * factor).astype(BF16)


# xla_dequantization's override, per thread: jqlin.bench traces its ops in a thread pool, where
# a module-level patch leaks into the other ops' traces (session 21's first A/B did)
_XLA_DEQUANT = threading.local()


@contextlib.contextmanager
def xla_dequantization() -> Iterator[None]:
    """Within, in this thread (at trace time): `dequantized` takes XLA's dequantization even
    where the Pallas pass fits -- the same values, for comparisons (benchmarks)."""
    saved = getattr(_XLA_DEQUANT, "on", False)
    _XLA_DEQUANT.on = True
    try:
        yield
    finally:
        _XLA_DEQUANT.on = saved


def dequantized(w: jax.Array, w_scale: jax.Array, *, elem: str, scale: str, group: int,
                factor: float = 1.0, interpret: bool = False) -> jax.Array:
    """dequantize_bf16's values: by group_dequant's Pallas pass where its tiles fit the weight
    (H200: see group_dequant), else by XLA -- bit for bit the same either way."""
    n = w.shape[0]
    k = w.shape[1] * CODES_PER_BYTE[elem]
    if dequant_pass_fits(n, k, elem=elem, group=group) and not getattr(_XLA_DEQUANT, "on",
                                                                         False):
        return dequantize_groups(w, w_scale, elem=elem, scale=scale, group=group,
                                 factor=factor, interpret=interpret)
    return dequantize_bf16(w, w_scale, elem=elem, scale=scale, group=group, factor=factor)


def dense_dequant_matmul(x_parts: Sequence[jax.Array], w: jax.Array, w_scale: jax.Array,
                         col_scale: jax.Array | None, *, elem: str, scale: str, group: int,
                         post: str, out_dtype, interpret: bool = False) -> jax.Array:
    """Same contract as mx_core.mx_dequant_matmul (see there): the weight dequantized once
    (`dequantized`; interpret: its Pallas pass in the interpreter), then XLA's dot."""
    wb = dequantized(w, w_scale, elem=elem, scale=scale, group=group, interpret=interpret)
    dims = (((1,), (1,)), ((), ()))
    out_dtype = jnp.dtype(out_dtype)
    if (len(x_parts) == 1 and post == "none" and out_dtype.itemsize == 2
            and x_parts[0].dtype == wb.dtype):  # the dot rounds its float32 sums itself
        return lax.dot_general(x_parts[0], wb, dims, preferred_element_type=out_dtype)
    y = None
    for xp in x_parts:  # fixed part order
        part = lax.dot_general(xp, wb, dims, preferred_element_type=F32)
        y = part if y is None else y + part
    return finish_rows(y, None if post == "none" else col_scale[None, :], 1.0,
                       post).astype(out_dtype)
