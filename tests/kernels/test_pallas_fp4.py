"""Pallas NVFP4 / MXFP4 / MXFP8 kernels against the XLA reference (CPU: interpret mode).

The kernels decode each weight tile to bf16 exactly (e2m1 * e4m3, e2m1 * 2**k, e4m3 * 2**k all
fit a bf16 significand) and feed activations as exact bf16 parts, so they differ from the
float32 reference only by float32 summation order and where the global scale enters:
relative Frobenius error ~1e-7 for float32 outputs. bf16 outputs add one rounding of each
side (<= 2**-8 relative per element). Anything numerically different -- a W4A16 result for a
W4A4 spec, a rounded activation, a wrong scale -- is orders of magnitude above these bounds.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jqlin import dispatch, formats, qweight
from jqlin.errors import UnsupportedSpecError
from jqlin.spec import GlobalScale, QuantSpec, ScaleRule
from invariance import assert_rows_batch_invariant

KERNEL_OF = {
    "nvfp4_a16": "pallas_nvfp4", "nvfp4": "pallas_nvfp4",
    "mxfp4_a16": "pallas_mxfp4", "mxfp4": "pallas_mxfp4",
    "mxfp8_a16": "pallas_mxfp8", "mxfp8": "pallas_mxfp8",
}
# Relative Frobenius error allowed: float32 summation order (f32 outputs), plus one bf16
# rounding of each side's output (bf16 outputs).
REL_TOL = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2.0 ** -8,
           jnp.dtype(jnp.float16): 2.0 ** -10}


def spec_with_rule(name: str, rule: ScaleRule) -> QuantSpec:
    """The named spec with every key's scale rule (and NVFP4 global direction) set to `rule`."""
    spec = formats.get(name)

    def rep(k):
        if k is None:
            return None
        gs = k.global_scale and (GlobalScale.DIVISOR if rule is ScaleRule.CT
                                 else GlobalScale.MULTIPLIER)
        return dataclasses.replace(k, rule=rule, global_scale=gs)
    return QuantSpec(rep(spec.weight), rep(spec.activation))


def make(rng, spec: QuantSpec, m: int, n: int, k: int, dtype, *, w_scale: float = 1.0):
    """Fresh random x (M, K) and a quantized (N, K) weight with varied row/column magnitudes."""
    w = rng.standard_normal((n, k)) * np.exp(0.5 * rng.standard_normal((n, 1))) * w_scale
    w[rng.integers(n), rng.integers(k)] *= 20  # an outlier
    x = rng.standard_normal((m, k)) * np.exp(0.5 * rng.standard_normal((m, 1)))
    x = jnp.asarray(x, dtype)
    static = spec.activation is not None and spec.activation.global_scale is not None
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), spec, calibration=x if static else None)
    return x, qw


def rel_err(y, ref) -> float:
    y64 = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    r64 = np.asarray(jnp.asarray(ref, jnp.float32), np.float64)
    assert y64.shape == r64.shape
    assert np.isfinite(y64).all(), "non-finite output (unwritten or poisoned element)"
    return float(np.linalg.norm(y64 - r64) / np.linalg.norm(r64))


def check(x, qw, kernel, **kw):
    y = dispatch.matmul(x, qw, kernel=kernel, **kw)
    ref = dispatch.matmul(x, qw, kernel="xla", **kw)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = rel_err(y, ref)
    assert err <= REL_TOL[jnp.dtype(x.dtype)], f"relative Frobenius error {err:.3g}"
    return y, ref


# -- through the dispatcher (heuristic configs), interpret mode ---------------------------------

@pytest.mark.parametrize("fmt", sorted(KERNEL_OF))
@pytest.mark.parametrize("m,dtype", [(1, jnp.float32), (7, jnp.bfloat16), (33, jnp.float32)],
                         ids=["m1-f32", "m7-bf16", "m33-f32"])
def test_matches_reference(rng, fmt, m, dtype):
    # N=72: a partial N tile; K=80: partial MX group (stored K 96), 5 NVFP4 groups.
    x, qw = make(rng, formats.get(fmt), m, 72, 80, dtype)
    check(x, qw, KERNEL_OF[fmt])


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "nvfp4", "mxfp4", "mxfp8"])
def test_modelopt_rule(rng, fmt):
    # ModelOpt: NVFP4 globals are multipliers; MX activation exponents use ceil(log2) and
    # round fp4 ties toward zero. The weight global is not a power of two here.
    x, qw = make(rng, spec_with_rule(fmt, ScaleRule.MODELOPT), 5, 72, 96, jnp.float32)
    check(x, qw, KERNEL_OF[fmt])


def test_float16_activations_are_exact_parts(rng):
    x, qw = make(rng, formats.get("nvfp4_a16"), 3, 64, 64, jnp.float16)
    check(x, qw, "pallas_nvfp4")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_w4a4_is_not_w4a16(rng, fmt):
    # The W4A4 kernel must reproduce the quantized-activation reference, which is far from the
    # weight-only product of the same weight.
    x, qw = make(rng, formats.get(fmt), 4, 64, 128, jnp.float32)
    y, ref = check(x, qw, KERNEL_OF[fmt])
    a16 = dispatch.matmul(x, qw, kernel="xla", weight_only=True)
    assert rel_err(y, a16) > 100 * max(rel_err(y, ref), 1e-7)


@pytest.mark.parametrize("rule", [ScaleRule.CT, ScaleRule.MODELOPT], ids=["ct", "modelopt"])
@pytest.mark.parametrize("fmt", ["nvfp4_a16", "nvfp4"])
def test_fused_weight_per_row_globals(rng, fmt, rule):
    # Parts of different magnitude keep their own globals: a per-stored-row vector.
    spec = spec_with_rule(fmt, rule)
    x, a = make(rng, spec, 6, 40, 96, jnp.float32)
    _, b = make(rng, spec, 6, 56, 96, jnp.float32, w_scale=7.0)
    if a.input_scale is not None:  # one activation global for the fused layer
        b = dataclasses.replace(b, input_scale=a.input_scale)
    qw = qweight.fuse([a, b])
    assert qw.global_scale.shape == (96,)
    y, _ = check(x, qw, "pallas_nvfp4")
    assert y.shape == (6, 96)


@pytest.mark.parametrize("fmt", ["nvfp4_a16", "nvfp4", "mxfp4", "mxfp8_a16", "mxfp8"])
def test_batch_invariant_rows(rng, fmt):
    k, n = 128, 72
    _, qw = make(rng, formats.get(fmt), 1, n, k, jnp.float32)
    assert_rows_batch_invariant(qw, k, jnp.float32, rng, (2, 7, 64, 300), fmt,
                                kernel=KERNEL_OF[fmt])


def test_declarations_and_refusals(rng):
    x, qw = make(rng, formats.get("nvfp4"), 2, 64, 64, jnp.bfloat16)
    for name in ("pallas_nvfp4", "pallas_mxfp4", "pallas_mxfp8"):
        k = dispatch.registered_kernels()[name]
        assert k.batch_invariant and k.min_compute_capability == (9, 0)
        assert k.priority > dispatch.registered_kernels()["xla"].priority
        assert "cpu" in k.interpret_on and "cpu" not in k.platforms
    with pytest.raises(UnsupportedSpecError, match="pallas_mxfp8"):
        dispatch.matmul(x, qw, kernel="pallas_mxfp8")
    # auto never picks interpret mode: on a CPU the reference serves it.
    if jax.default_backend() == "cpu":
        assert dispatch.explain(x, qw).chosen == "xla"
