"""The FP8 activation codes kernel (pallas_kernels.act_quant) against jqlin's rule: bitwise.

CPU: interpret mode (plain division, IEEE there); GPU (marked): the kernel's div.rn.f32 and
e4m3 conversion against quantize_activation's exact XLA division, on rows whose quotients sit
on e4m3 rounding ties with scales whose reciprocals are inexact.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from jqlin import formats, qweight
from jqlin.kernels.pallas_fp8 import quantize_x
from jqlin.spec import ScaleRule
from pallas_kernels.act_quant import e4m3_codes

CASES = [("fp8_ptpc", "compressed-tensors"), ("fp8_ptpc", "vllm"),
         ("fp8_block", "compressed-tensors"), ("fp8_per_tensor", "compressed-tensors")]


def _activations(rng, m, k):
    """Rows of many magnitudes, rows of e4m3 ties (x = midpoint * s, s = c * 2**j with c in
    {1013, 2021, 4093}; the row's and every group's amax 448 * s, so the rule's scale is s),
    a zero row; bf16 where exact (ties rows are float32)."""
    x = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-20, 20, (m, 1)))
    t = m // 2
    s = rng.choice([1013.0, 2021.0, 4093.0], (t, 1)) * np.exp2(rng.integers(-30, -5, (t, 1)))
    x[:t] = oracle.e4m3_ties(rng, (t, k), s)
    x[:t, ::128] = 448 * s
    x[-1] = 0
    return jnp.asarray(x, jnp.float32)


def _weight(fmt, rule, n, k, x):
    spec = formats.get(fmt)
    key = dataclasses.replace(spec.activation, rule=ScaleRule(rule))
    w = np.random.default_rng(3).standard_normal((n, k))
    calib = None if key.dynamic else x
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), fmt, calibration=calib)
    if not key.dynamic:  # an input scale with an inexact reciprocal
        qw = dataclasses.replace(qw, input_scale=jnp.float32(2021.0 * 2.0 ** -12))
    return qw, dataclasses.replace(spec, activation=key)


def _check(rng, fmt, rule, m, k, interpret):
    x = _activations(rng, m, k)
    qw, spec = _weight(fmt, rule, 256, k, x)
    run = lambda codes: jax.jit(lambda x: quantize_x(  # noqa: E731
        x, qw, spec, codes=codes, interpret=interpret)[:2])(x)
    (qk, sk), (qx, sx) = run("pallas"), run("xla")
    np.testing.assert_array_equal(np.asarray(sk), np.asarray(sx))
    a, b = np.asarray(qk).view(np.uint8), np.asarray(qx).view(np.uint8)
    bad = np.argwhere(a != b)
    assert not len(bad), (f"{fmt} {rule} M={m} K={k}: {len(bad)} codes differ, e.g. (row, col, "
                          "x, kernel, rule): " + str([(i, j, float(x[i, j]), a[i, j], b[i, j])
                                                     for i, j in bad[:4]]))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "interpret mode divides with the backend's division: IEEE on the CPU, not on the GPU (where "
    "test_gpu_codes_kernel_is_the_rule_bitwise runs the kernel itself)"))
@pytest.mark.parametrize("fmt,rule", CASES)
@pytest.mark.parametrize("m,k", [(1, 384), (1, 1024), (13, 384), (40, 1024)])
def test_codes_kernel_is_the_rule_bitwise(rng, fmt, rule, m, k):
    _check(rng, fmt, rule, m, k, interpret=True)


def test_codes_kernel_rejects_bad_arguments():
    x = jnp.ones((4, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        e4m3_codes(jnp.ones((4, 200)), jnp.ones((1, 1)), interpret=True)
    with pytest.raises(ValueError, match="scale must be float32"):
        e4m3_codes(x, jnp.ones((3, 1)), interpret=True)
    with pytest.raises(ValueError, match="per-group scale"):
        e4m3_codes(x, jnp.ones((4, 3)), interpret=True)
    qw, spec = _weight("fp8_ptpc", "vllm", 128, 256, x)
    with pytest.raises(ValueError, match="codes must be"):
        quantize_x(x, qw, spec, codes="triton")
    qw, spec = _weight("fp8_per_tensor", "modelopt", 128, 256, x)
    with pytest.raises(ValueError, match="multiplies"):
        quantize_x(x, qw, spec, codes="pallas", interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rule", CASES)
def test_gpu_codes_kernel_is_the_rule_bitwise(rng, fmt, rule):
    for m, k in [(1, 384), (1, 1024), (77, 4096), (300, 1536)]:
        _check(rng, fmt, rule, m, k, interpret=False)


def test_codes_path_rule(monkeypatch):
    """The codes kernel serves the division-form rules on the GPU from CODES_KERNEL_MIN_M with
    K a multiple of 128; ModelOpt's static rule (a multiply), interpret mode and the CPU keep
    the XLA codes; describe_config says which."""
    from jqlin.kernels import pallas_fp8
    from jqlin.kernels.pallas_fp8 import CODES_KERNEL_MIN_M, codes_path, describe_config
    ptpc = formats.get("fp8_ptpc").activation
    static_mo = dataclasses.replace(formats.get("fp8_per_tensor").activation,
                                    rule=ScaleRule.MODELOPT)
    assert codes_path(4096, 4096, ptpc) == "xla"  # (this CPU)
    monkeypatch.setattr(pallas_fp8.jax, "default_backend", lambda: "gpu")
    assert codes_path(CODES_KERNEL_MIN_M, 4096, ptpc) == "pallas"
    assert codes_path(CODES_KERNEL_MIN_M - 1, 4096, ptpc) == "xla"
    assert codes_path(4096, 4000, ptpc) == "xla"
    assert codes_path(4096, 4096, ptpc, interpret=True) == "xla"
    assert codes_path(4096, 4096, static_mo) == "xla"
    qw, spec = _weight("fp8_ptpc", "vllm", 256, 512, jnp.ones((1, 512)))
    monkeypatch.undo()
    assert "XLA" in describe_config("pallas_fp8_w8a8", 4096, qw, spec, jnp.bfloat16,
                                    False)["activation_codes"]
