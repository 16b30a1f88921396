"""e4m3 weights widened to bf16 / f16 by one Pallas (Triton) pass: the predecoded weights of the
Mosaic W8A16 kernel's prefill launches and the dense W8A16 path's GEMM operand.

Exact: every e4m3 value (NaN included) is a bf16 and an f16 number, and the conversion is the
compiler's own (`astype`), so the result equals `w.astype(dtype)` bit for bit. Why a kernel of
our own: XLA's convert of an e4m3 (8192, 8192) weight ran at 2.1 TB/s (44% of DRAM, 4 bytes
read a thread; H200, session 20, benchmarks/profile_prefill.py: 80.6 us of the 896 us
fp8_block_a16 product at M=4096) -- each program here reads a (ROWS, cols) tile, 16 bytes a
load.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

__all__ = ["widen_e4m3", "WIDEN_ROWS", "WIDEN_COLS"]

WIDEN_ROWS = 16  # weight rows per program
WIDEN_COLS = (1024, 512, 256, 128)  # K columns per program: the widest dividing K
_WARPS = 4


def _kernel(w_ref, o_ref):
    o_ref[...] = w_ref[...].astype(o_ref.dtype)


def widen_e4m3(w: jax.Array, dtype=jnp.bfloat16, *, interpret: bool = False,
               rows: int = WIDEN_ROWS, num_warps: int = _WARPS) -> jax.Array:
    """w (N, K) float8_e4m3fn -> the same values as dtype (bfloat16 or float16), N a multiple
    of `rows` (weight rows per program) and K of 128 (as the Mosaic kernel's weights are)."""
    dtype = jnp.dtype(dtype)
    if w.dtype != jnp.dtype(jnp.float8_e4m3fn):
        raise ValueError(f"widen_e4m3: w must be float8_e4m3fn, got {w.dtype}")
    if dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"widen_e4m3: dtype must be bfloat16 or float16, got {dtype}")
    if w.ndim != 2 or w.shape[0] % rows or w.shape[1] % WIDEN_COLS[-1]:
        raise ValueError(f"widen_e4m3: w must be (N, K) with N a multiple of {rows} and "
                         f"K of {WIDEN_COLS[-1]}, got {tuple(w.shape)}")
    n, k = w.shape
    cols = next(c for c in WIDEN_COLS if k % c == 0)
    block = pl.BlockSpec((rows, cols), lambda i, j: (i, j))
    return pl.pallas_call(
        _kernel, out_shape=jax.ShapeDtypeStruct((n, k), dtype),
        grid=(n // rows, k // cols), in_specs=[block], out_specs=block,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret, name="widen_e4m3")(w)
