"""Division in the kernels' finishes is IEEE's everywhere (session 44): mgpu_common.div_rn inside
Mosaic GPU kernels (PTX div.rn.f32 spelled out; the interpreter: exact.div_corrected),
exact.div in XLA (XLA's own division is div.full.f32 on the GPU and a reciprocal multiply where
the divisor is a constant or a broadcast). CPU: a dividing kernel's CUDA lowering carries the
instruction and no arith.divf; the interpreter's quotients are NumPy's. GPU (marked): the
kernel's quotients of fresh random float32 tiles are NumPy's and exact.div's, bit for bit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels import exact
from pallas_kernels.mgpu_common import WG_ROWS, div_rn, finish_rows, mgpu_kernel

TILE = (WG_ROWS, 128)


def _divide_kernel(a: jax.Array, b: jax.Array, *, scalar: bool, interpret: bool) -> jax.Array:
    """a / b by div_rn, one (64, 128) tile per CTA (b: a's shape, or (1,) when scalar)."""
    rows, cols = a.shape

    def body(a_gmem, b_gmem, out_gmem):
        rs = pl.ds(jax.lax.axis_index("tile") * WG_ROWS, WG_ROWS)

        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            x = plgpu.load(a_gmem.at[rs], layout=plgpu.Layout.WGMMA, optimized=False)
            y = (b_gmem[0] if scalar else
                 plgpu.load(b_gmem.at[rs], layout=plgpu.Layout.WGMMA, optimized=False))
            out_gmem[rs] = div_rn(x, y, interpret=interpret)

    out = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    return mgpu_kernel(body, out, rows // WG_ROWS, interpret=interpret, compute_wgs=1)(a, b)


def _operands(rng, rows: int, scalar: bool):
    # quotients across many binades; denominators like NVFP4 global scales and FP8 scales
    a = rng.standard_normal((rows, TILE[1])) * np.exp2(rng.integers(-20, 20, (rows, TILE[1])))
    shape = (1,) if scalar else (rows, TILE[1])
    b = rng.uniform(0.5, 2, shape) * np.exp2(rng.integers(-12, 12, shape))
    return jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


def _ieee(a, b) -> np.ndarray:
    return (np.asarray(a) / np.asarray(b)).astype(np.float32)


@pytest.mark.parametrize("scalar", [False, True])
def test_div_rn_lowers_to_ptx_div_rn_on_cpu(rng, scalar):
    """The CUDA lowering (on CPU) of a kernel that divides carries div.rn.f32 and no arith.divf
    (Mosaic's own `/`, whose rounding is the compiler's to choose)."""
    a, b = _operands(rng, 2 * WG_ROWS, scalar)
    f = jax.jit(functools.partial(_divide_kernel, scalar=scalar, interpret=False))
    text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert "div.rn.f32" in text and "arith.divf" not in text


@pytest.mark.parametrize("scalar", [False, True])
def test_interpreter_div_rn_is_numpys_division(rng, scalar):
    """In the interpreter div_rn is exact.div_corrected: NumPy's quotients, bit for bit, also
    where a broadcast divisor would let XLA multiply by a reciprocal."""
    a, b = _operands(rng, 2 * WG_ROWS, scalar)
    got = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar,
                                               interpret=True))(a, b))
    np.testing.assert_array_equal(got.view(np.uint32), _ieee(a, b).view(np.uint32))


def test_xla_finish_divides_by_a_constant_column_as_ieee(rng):
    """finish_rows in XLA (RowFinish.xla) with the column closed over by jit -- a constant
    broadcast, which XLA's simplifier would make a reciprocal multiply -- is NumPy's division."""
    a, _ = _operands(rng, 4 * WG_ROWS, False)
    col = np.asarray(rng.uniform(0.5, 2, (a.shape[0], 1)) * 3.7, np.float32)
    got = np.asarray(jax.jit(lambda t: finish_rows(t, jnp.asarray(col), 1.0, "div"))(a))
    np.testing.assert_array_equal(got.view(np.uint32), _ieee(a, col).view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("scalar", [False, True])
def test_gpu_div_rn_is_ieee_and_exact_div_bitwise(rng, scalar):
    """Half a million fresh random quotients (64 tiles of 64 x 128): the kernel's are NumPy's
    and exact.div's (XLA) on the same GPU. How many of XLA's own `/` differ is printed, not
    asserted (the hardware's): the reason neither side uses it."""
    a, b = _operands(rng, 64 * WG_ROWS, scalar)
    got = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar,
                                               interpret=False))(a, b))
    ieee = _ieee(a, b)
    np.testing.assert_array_equal(got.view(np.uint32), ieee.view(np.uint32))
    xla_exact = np.asarray(jax.jit(exact.div)(a, b))
    np.testing.assert_array_equal(xla_exact.view(np.uint32), ieee.view(np.uint32))
    plain = np.asarray(jax.jit(lambda a, b: a / b)(a, b))
    print(f"XLA:GPU `/` quotients not IEEE's: {np.count_nonzero(plain != ieee)} of {plain.size}")
