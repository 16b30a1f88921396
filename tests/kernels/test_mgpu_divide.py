"""A finish's division is XLA:GPU's div.full.f32 wherever it runs (session 44): mgpu_common.div_full
inside Mosaic GPU kernels (spelled out: Mosaic's own `/` is IEEE div.rn.f32), common.finish_rows
in XLA (a division: the divisor is built from `kept` leaves, where XLA's simplifier would make a
constant one a reciprocal multiply). CPU: a dividing kernel's CUDA lowering carries the
instruction and no arith.divf; a closed-over NVFP4 weight's finish still divides. GPU (marked):
the kernel's quotients of fresh random float32 tiles are jnp's and finish_rows' (XLA, a kept
constant divisor), bit for bit."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jqlin import formats, qweight
from jqlin.kernels.pallas_fp4 import nvfp4_post_scale
from jqlin.spec import GlobalScale
from pallas_kernels.common import kept
from pallas_kernels.mgpu_common import WG_ROWS, RowFinish, div_full, finish_rows, mgpu_kernel

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


@pytest.mark.parametrize("case", ["a16", "w4a4", "w4a4_mixed"])
def test_nvfp4_global_scales_closed_over_are_divided_by(rng, case):
    """jit closing over an NVFP4 (compressed-tensors) weight: its global scales enter `kept`
    as stored (the barrier on the leaves, never on the (N,) column a broadcast would
    materialize), and XLA's compiled finish still divides -- without the barrier its simplifier
    multiplies by the constant's reciprocal. W4A16 divides by the weight's global scale;
    W4A4 by the product of both, or (ModelOpt activation rule) multiplies by their quotient,
    which the device now divides out too (a constant one was folded on the host, in IEEE)."""
    spec = formats.get("nvfp4_a16" if case == "a16" else "nvfp4")
    if case == "w4a4_mixed":
        spec = dataclasses.replace(spec, activation=dataclasses.replace(
            spec.activation, global_scale=GlobalScale.MULTIPLIER))
    n = 2 * WG_ROWS
    w = jnp.asarray(rng.standard_normal((n, 64)), jnp.float32)
    calibration = None if case == "a16" else jnp.asarray(rng.standard_normal((4, 64)))
    qw = qweight.quantize(w, spec, calibration=calibration)
    total = jnp.asarray(rng.standard_normal((n, 3)), jnp.float32)

    def finish(t):
        col, post = nvfp4_post_scale(qw, spec)
        return RowFinish(col, 1.0, post).xla(t)

    jaxpr = jax.make_jaxpr(finish)(total)
    barriers = [e for e in jaxpr.eqns if e.primitive.name == "optimization_barrier"]
    leaves = {np.shape(qw.global_scale), np.shape(qw.input_scale)}
    assert barriers and all(v.aval.shape in leaves for e in barriers for v in e.invars)
    hlo = jax.jit(finish).lower(total).compile().as_text()
    assert "divide(" in hlo, hlo


@pytest.mark.gpu
@pytest.mark.parametrize("scalar", [False, True])
def test_gpu_div_full_is_xlas_division_bitwise(rng, scalar):
    """Half a million fresh random quotients (64 tiles of 64 x 128): the kernel's are jnp's
    `/` on the same GPU and finish_rows' with the divisor a kept jit constant, bit for bit. How many
    differ from IEEE (NumPy) is printed, not asserted: the hardware's."""
    a, b = _operands(rng, 64 * WG_ROWS, scalar)
    got = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar))(a, b))
    want = np.asarray(jax.jit(lambda a, b: a / b)(a, b))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    b_const = b if scalar else b[:, :1]  # a column: RowFinish's shape
    got_col = np.asarray(jax.jit(functools.partial(_divide_kernel, scalar=scalar))(
        a, b if scalar else jnp.broadcast_to(b_const, a.shape)))
    fin = np.asarray(jax.jit(lambda a: finish_rows(a, kept(b_const), 1.0, "div"))(a))
    np.testing.assert_array_equal(got_col.view(np.uint32), fin.view(np.uint32))
    ieee = (np.asarray(a) / np.asarray(b)).astype(np.float32)
    print(f"XLA:GPU quotients not IEEE's: {np.count_nonzero(want != ieee)} of {want.size}")
