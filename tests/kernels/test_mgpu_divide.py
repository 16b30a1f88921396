"""A finish's division is XLA:GPU's div.full.f32 wherever it runs (session 44): mgpu_common.div_full
inside Mosaic GPU kernels (spelled out: Mosaic's own `/` is IEEE div.rn.f32), common.finish_rows
in XLA (a division even where the divisor is a jit constant, which XLA's simplifier would make a
reciprocal multiply). CPU: a dividing kernel's CUDA lowering carries the instruction and no
arith.divf. GPU (marked): the kernel's quotients of fresh random float32 tiles are jnp's and
finish_rows' (XLA, constant divisor), bit for bit."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.mgpu_common import WG_ROWS, div_full, finish_rows, mgpu_kernel

TILE = (WG_ROWS, 128)


def _divide_kernel(a: jax.Array, b: jax.Array, *, scalar: bool) -> jax.Array:
    """a / b by div_full on the GPU, one (64, 128) tile per CTA (b: a's shape, or (1,) when
    scalar)."""
    rows, cols = a.shape

    def body(a_gmem, b_gmem, out_gmem):
        rs = pl.ds(jax.lax.axis_index("tile") * WG_ROWS, WG_ROWS)

        @pl.when(jax.lax.axis_index("wg") == 0)
        def _():
            x = plgpu.load(a_gmem.at[rs], layout=plgpu.Layout.WGMMA, optimized=False)
            y = (b_gmem[0] if scalar else
                 plgpu.load(b_gmem.at[rs], layout=plgpu.Layout.WGMMA, optimized=False))
            out_gmem[rs] = div_full(x, y, interpret=False)

    out = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    return mgpu_kernel(body, out, rows // WG_ROWS, interpret=False, compute_wgs=1)(a, b)


def _operands(rng, rows: int, scalar: bool):
    # quotients across many binades; denominators like NVFP4 global scales and FP8 scales
    a = rng.standard_normal((rows, TILE[1])) * np.exp2(rng.integers(-20, 20, (rows, TILE[1])))
    shape = (1,) if scalar else (rows, TILE[1])
    b = rng.uniform(0.5, 2, shape) * np.exp2(rng.integers(-12, 12, shape))
    return jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)


@pytest.mark.parametrize("scalar", [False, True])
def test_div_full_lowers_to_ptx_div_full_on_cpu(rng, scalar):
    """The CUDA lowering (on CPU) of a kernel that divides carries div.full.f32 and no
    arith.divf (Mosaic's IEEE division)."""
    a, b = _operands(rng, 2 * WG_ROWS, scalar)
    f = jax.jit(functools.partial(_divide_kernel, scalar=scalar))
    text = f.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert "div.full.f32" in text and "arith.divf" not in text


def test_xla_finish_keeps_a_division_by_a_constant(rng):
    """finish_rows in XLA with the column closed over by jit: the traced program divides by
    the column behind an optimization barrier (no constant for the simplifier to invert)."""
    a, _ = _operands(rng, 2 * WG_ROWS, False)
    col = jnp.asarray(rng.uniform(0.5, 2, (a.shape[0], 1)), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda t: finish_rows(t, col, 1.0, "div"))(a)
    eqns = [e.primitive.name for e in jaxpr.eqns]
    assert "optimization_barrier" in eqns and "div" in eqns
    assert eqns.index("optimization_barrier") < eqns.index("div")


@pytest.mark.gpu
@pytest.mark.parametrize("scalar", [False, True])
def test_gpu_div_full_is_xlas_division_bitwise(rng, scalar):
    """Half a million fresh random quotients (64 tiles of 64 x 128): the kernel's are jnp's
    `/` on the same GPU and finish_rows' with the divisor a jit constant, bit for bit. How many
    differ from IEEE (NumPy) is printed, not asserted: the hardware's."""
    a, b = _operands(rng, 64 * WG_ROWS, scalar)
    got = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar))(a, b))
    want = np.asarray(jax.jit(lambda a, b: a / b)(a, b))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    b_const = b if scalar else b[:, :1]  # a column: RowFinish's shape
    got_col = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar))(
        a, b if scalar else jnp.broadcast_to(b_const, a.shape)))
    fin = np.asarray(jax.jit(lambda a: finish_rows(a, b_const, 1.0, "div"))(a))
    np.testing.assert_array_equal(got_col.view(np.uint32), fin.view(np.uint32))
    ieee = (np.asarray(a) / np.asarray(b)).astype(np.float32)
    print(f"XLA:GPU quotients not IEEE's: {np.count_nonzero(want != ieee)} of {want.size}")
