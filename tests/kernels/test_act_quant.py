"""The activation kernels of pallas_kernels.act_quant against jqlin's rules: bitwise.

FP8 codes (e4m3_codes) and the NVFP4 W4A4 operand (nvfp4_operand: e2m1 code * e4m3 block
scale). CPU: interpret mode (plain division, IEEE there); GPU (marked): the kernels'
div.rn.f32 and roundings against quantize_activation's exact XLA division, on rows whose
quotients sit on rounding ties with scales whose reciprocals are inexact.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from jqlin import formats, qweight
from jqlin.checkpoint.hf_fp8 import ue8m0_activation
from jqlin.kernels.pallas_fp4 import mx_activation_operand, nvfp4_activation_operand
from jqlin.kernels.pallas_fp8 import quantize_x
from jqlin.spec import GlobalScale, ScaleRule
from pallas_kernels import act_quant
from pallas_kernels.act_quant import e4m3_codes, e4m3_group_codes, mx_operand, nvfp4_operand


@pytest.fixture(params=["launch", "whole"])
def tiles(request, monkeypatch):
    """The kernels' tiles as `tile` picks them for the launch ("launch": (1, 128) at the CPU
    tests' sizes) or the largest, (16, 512) ("whole"; 128 columns where K is not a multiple of
    512), whose last row block is partial for M not a multiple of 16 -- the masked loads and
    stores. The CPU tests name the pairs that differ; the GPU tests run both."""
    if request.param == "whole":
        monkeypatch.setattr(act_quant, "_MIN_PROGRAMS", 0)
    return request.param


# "fbgemm": the vLLM rule with the amax bounded (QuantKey.amax_bound, fbgemm_fp8 checkpoints) at
# FBGEMM_BOUND, amid _activations' row amaxes: about half the rows' quotients pass 448
CASES = [("fp8_ptpc", "compressed-tensors"), ("fp8_ptpc", "vllm"), ("fp8_ptpc", "fbgemm"),
         ("fp8_block", "compressed-tensors"), ("fp8_block", "vllm"), ("fp8_block", "deepseek"),
         ("fp8_block", "fbgemm"), ("fp8_per_tensor", "compressed-tensors")]
FBGEMM_BOUND = 1.0


def _activations(rng, m, k):
    """Rows of many magnitudes, rows of e4m3 ties (x = midpoint * s, s = c * 2**j with c in
    {1013, 2021, 4093}; the row's and every group's amax 448 * s, so the rule's scale is s),
    a zero row, a NaN (M > 2); bf16 where exact (ties rows are float32)."""
    x = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-20, 20, (m, 1)))
    t = m // 2
    s = rng.choice([1013.0, 2021.0, 4093.0], (t, 1)) * np.exp2(rng.integers(-30, -5, (t, 1)))
    x[:t] = oracle.e4m3_ties(rng, (t, k), s)
    x[:t, ::128] = 448 * s
    x[-1] = 0
    if m > 2:
        x[-2, 5] = np.nan
    return jnp.asarray(x, jnp.float32)


def _bits_where_not_nan(a, b):
    """(row, col) where a and b differ: one NaN and the other not, or unequal bits elsewhere
    (a NaN's sign and payload are not part of any contract)."""
    fa, fb = (np.isnan(np.asarray(v, np.float32)) for v in (a, b))
    ua, ub = (np.asarray(v).view(f"u{np.asarray(v).dtype.itemsize}") for v in (a, b))
    return np.argwhere((fa != fb) | (~fa & (ua != ub))), ua, ub


def _weight(fmt, rule, n, k):
    spec = formats.get(fmt)
    if rule == "deepseek":  # (DeepSeek-V3.1's e8m0 groups)
        key = ue8m0_activation(128)
    elif rule == "fbgemm":
        key = dataclasses.replace(spec.activation, rule=ScaleRule.VLLM, amax_bound=FBGEMM_BOUND)
    else:
        key = dataclasses.replace(spec.activation, rule=ScaleRule(rule))
    w = np.random.default_rng(3).standard_normal((n, k))
    calib = None if key.dynamic else jnp.ones((1, k), jnp.float32)  # (replaced below)
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), fmt, calibration=calib)
    if not key.dynamic:  # an input scale with an inexact reciprocal
        qw = dataclasses.replace(qw, input_scale=jnp.float32(2021.0 * 2.0 ** -12))
    return qw, dataclasses.replace(spec, activation=key)


def _check(rng, fmt, rule, m, k, interpret):
    x = _activations(rng, m, k)
    qw, spec = _weight(fmt, rule, 256, k)
    run = lambda codes: jax.jit(lambda x: quantize_x(  # noqa: E731
        x, qw, spec, codes=codes, interpret=interpret)[:2])(x)
    qx, sx = run("xla")
    group = spec.activation.granularity.value == "group" and spec.activation.amax_bound is None
    kernels = ["pallas"] + (["pallas_group"] if group else [])
    for codes in kernels:  # (the group rules: e4m3_codes on XLA's scales, and the whole pass)
        qk, sk = run(codes)
        np.testing.assert_array_equal(np.asarray(sk), np.asarray(sx), err_msg=codes)
        bad, a, b = _bits_where_not_nan(qk, qx)
        assert not len(bad), (f"{codes} {fmt} {rule} M={m} K={k}: {len(bad)} codes differ, e.g. "
                              "(row, col, x, kernel, rule): " + str(
                                  [(i, j, float(x[i, j]), a[i, j], b[i, j]) for i, j in bad[:4]]))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "interpret mode divides with the backend's division: IEEE on the CPU, not on the GPU (where "
    "test_gpu_codes_kernel_is_the_rule_bitwise runs the kernel itself)"))
@pytest.mark.parametrize("fmt,rule", CASES)
@pytest.mark.parametrize("m,k,tiles", [(1, 384, "launch"), (1, 1024, "whole"), (13, 384, "whole"),
                                       (40, 1024, "whole")], indirect=["tiles"])
def test_codes_kernel_is_the_rule_bitwise(rng, fmt, rule, m, k, tiles):
    _check(rng, fmt, rule, m, k, interpret=True)


def test_codes_kernel_rejects_bad_arguments():
    x = jnp.ones((4, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        e4m3_codes(jnp.ones((4, 200)), jnp.ones((1, 1)), interpret=True)
    with pytest.raises(ValueError, match="scale must be float32"):
        e4m3_codes(x, jnp.ones((3, 1)), interpret=True)
    with pytest.raises(ValueError, match="per-group scale"):
        e4m3_codes(x, jnp.ones((4, 3)), interpret=True)
    with pytest.raises(ValueError, match="rule must be one of"):
        e4m3_group_codes(x, rule="fbgemm", interpret=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        e4m3_group_codes(jnp.ones((4, 200)), rule="vllm", interpret=True)
    qw, spec = _weight("fp8_ptpc", "vllm", 128, 256)
    with pytest.raises(ValueError, match="codes must be"):
        quantize_x(x, qw, spec, codes="triton")
    qw, spec = _weight("fp8_per_tensor", "modelopt", 128, 256)
    with pytest.raises(ValueError, match="multiplies"):
        quantize_x(x, qw, spec, codes="pallas", interpret=True)
    with pytest.raises(ValueError, match="dynamic 1 x 128 group"):
        quantize_x(x, qw, spec, codes="pallas_group", interpret=True)
    qw, spec = _weight("fp8_block", "fbgemm", 128, 256)  # (its scales see a bound)
    with pytest.raises(ValueError, match="unbounded amaxes"):
        quantize_x(x, qw, spec, codes="pallas_group", interpret=True)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rule", CASES)
def test_gpu_codes_kernel_is_the_rule_bitwise(rng, fmt, rule, tiles):
    for m, k in [(1, 384), (1, 1024), (77, 4096), (300, 1536), (1001, 4096)]:
        _check(rng, fmt, rule, m, k, interpret=False)


def test_codes_path_rule(monkeypatch):
    """The codes kernel serves the division-form rules on the GPU from CODES_KERNEL_MIN_M with
    K a multiple of 128; ModelOpt's static rule (a multiply), interpret mode and the CPU keep
    the XLA codes; describe_config says which."""
    from jqlin.kernels import pallas_fp8
    from jqlin.kernels.pallas_fp8 import (CODES_KERNEL_MIN_M, GROUP_CODES_KERNEL_MIN_M,
                                          codes_path, describe_config)
    ptpc = formats.get("fp8_ptpc").activation
    static_mo = dataclasses.replace(formats.get("fp8_per_tensor").activation,
                                    rule=ScaleRule.MODELOPT)
    monkeypatch.setattr(pallas_fp8.jax, "default_backend", lambda: "cpu")
    assert codes_path(4096, 4096, ptpc) == "xla"
    monkeypatch.setattr(pallas_fp8.jax, "default_backend", lambda: "gpu")
    assert codes_path(CODES_KERNEL_MIN_M, 4096, ptpc) == "pallas"
    group = _weight("fp8_block", "deepseek", 128, 256)[1].activation
    if GROUP_CODES_KERNEL_MIN_M is None:  # (not routed before its GPU tests have run)
        assert codes_path(1 << 20, 4096, group) == "pallas"
    else:
        assert codes_path(GROUP_CODES_KERNEL_MIN_M, 4096, group) == "pallas_group"
    monkeypatch.setattr(pallas_fp8, "GROUP_CODES_KERNEL_MIN_M", 64)
    assert [codes_path(m, 4096, group) for m in (63, 64)] == ["pallas", "pallas_group"]
    bounded = _weight("fp8_block", "fbgemm", 128, 256)[1].activation  # (the pass has no bound)
    assert codes_path(64, 4096, bounded) == "pallas"
    assert codes_path(64, 4096, ptpc) == "pallas"  # (per-token: rows span many tiles)
    if CODES_KERNEL_MIN_M > 1:
        assert codes_path(CODES_KERNEL_MIN_M - 1, 4096, ptpc) == "xla"
    assert codes_path(4096, 4000, ptpc) == "xla"
    assert codes_path(4096, 4096, ptpc, interpret=True) == "xla"
    assert codes_path(4096, 4096, static_mo) == "xla"
    qw, spec = _weight("fp8_ptpc", "vllm", 256, 512)
    assert "Pallas" in describe_config("pallas_fp8_w8a8", 4096, qw, spec, jnp.bfloat16,
                                       False)["activation_codes"]
    qb, block = _weight("fp8_block", "deepseek", 256, 512)  # groups: the scales in the pass
    assert "e4m3_group_codes" in describe_config("pallas_fp8_block", 64, qb, block, jnp.bfloat16,
                                                 False)["activation_codes"]
    assert "e4m3_codes" in describe_config("pallas_fp8_block", 63, qb, block, jnp.bfloat16,
                                           False)["activation_codes"]
    monkeypatch.setattr(pallas_fp8.jax, "default_backend", lambda: "cpu")
    assert "XLA" in describe_config("pallas_fp8_w8a8", 4096, qw, spec, jnp.bfloat16,
                                    False)["activation_codes"]


NVFP4_RULES = ["compressed-tensors", "modelopt"]
_GLOBALS = (1.0, 448.0 * 6 / 2.5, 0.37, 2.0 ** 20)  # CT calibrations, a small and a huge one


def _nvfp4_weight(rule, k):
    spec = formats.get("nvfp4")
    if rule == "modelopt":  # (ModelOpt's global scale multiplies)
        spec = dataclasses.replace(spec, activation=dataclasses.replace(
            spec.activation, rule=ScaleRule.MODELOPT, global_scale=GlobalScale.MULTIPLIER))
    w = np.random.default_rng(5).standard_normal((128, k))
    qw = qweight.quantize(jnp.asarray(w, jnp.float32), "nvfp4",
                          calibration=jnp.ones((1, k), jnp.float32))
    return qw, spec


def _nvfp4_activations(rng, m, k):
    """Rows of many magnitudes (2**-60 .. 2**60), rows of e2m1 ties (oracle.nvfp4_ties), a zero
    group, +-inf, a group of 3e38 (its scale's product with a large global scale overflows), a
    NaN in a group, a group of NaN (M > 2)."""
    x = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-60, 60, (m, 1)))
    t = (m + 1) // 2
    x[:t] = oracle.nvfp4_ties(rng, t, k // 16)
    return jnp.asarray(_special_groups(x, 16), jnp.float32)


def _special_groups(x, group):
    """x (float64, K >= 128) with, in groups of `group` along K: a zero group, +-inf, a NaN
    (last row); a group of 3e38 (first row, M > 1); a group of NaN (second row, M > 2)."""
    x[-1, :group] = 0
    x[-1, group] = np.inf
    x[-1, 100] = np.nan
    if len(x) > 1:
        x[0, 40] = -np.inf
        x[0, 64:64 + group] = 3e38
    if len(x) > 2:
        x[1, 32:32 + group] = np.nan
    return x


def _check_nvfp4(rng, rule, m, k, interpret, dtype=jnp.float32):
    x = _nvfp4_activations(rng, m, k).astype(dtype)
    qw, spec = _nvfp4_weight(rule, k)
    for g in _GLOBALS:
        qw = dataclasses.replace(qw, input_scale=jnp.float32(g))
        _same_operands(lambda x, operand, qw=qw: nvfp4_activation_operand(
            x, qw, spec.activation, operand=operand, interpret=interpret),
            x, f"{rule} g={g} M={m} K={k}", 16)


def _same_operands(operand_of, x, what, group):
    """operand_of(x, operand), jitted, is bitwise the same bf16 array for "pallas" and "xla"
    (NaN at the same places; the x's NaN groups must be NaN throughout)."""
    a, b = (np.asarray(jax.jit(lambda x, o=o: operand_of(x, o))(x)) for o in ("pallas", "xla"))
    bad, a16, b16 = _bits_where_not_nan(a, b)
    assert not len(bad), (
        f"{what}: {len(bad)} of {a.size} differ, e.g. (row, col, x, kernel, rule): "
        + str([(i, j, float(x[i, j]), hex(a16[i, j]), hex(b16[i, j])) for i, j in bad[:4]]))
    groups = np.isnan(np.asarray(x, np.float32)).reshape(x.shape[0], -1, group).any(-1)
    np.testing.assert_array_equal(
        np.isnan(np.asarray(b, np.float32)).reshape(groups.shape + (group,)),
        np.broadcast_to(groups[..., None], groups.shape + (group,)), err_msg=f"{what}: NaN groups")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason=(
    "interpret mode divides with the backend's division: IEEE on the CPU, not on the GPU (where "
    "test_gpu_nvfp4_operand_is_the_rule_bitwise runs the kernel itself)"))
@pytest.mark.parametrize("rule", NVFP4_RULES)
@pytest.mark.parametrize("m,k,tiles", [(1, 128, "launch"), (1, 1024, "whole"), (13, 384, "whole")],
                         indirect=["tiles"])
def test_nvfp4_operand_is_the_rule_bitwise(rng, rule, m, k, tiles):
    """The kernel's operand is the XLA rule's (quantize_activation, then code * e4m3 factor)
    bit for bit: ties rows, zero group, infinities, overflowing products, several global
    scales, partial row blocks (M = 13 of 16), 128- and 512-column tiles."""
    _check_nvfp4(rng, rule, m, k, interpret=True)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="interpret mode (see above)")
def test_nvfp4_operand_of_bf16_rows_is_the_rule_bitwise(rng):
    """bf16 activations (the model's dtype): widened in-tile, the same bits."""
    _check_nvfp4(rng, "compressed-tensors", 40, 512, interpret=True, dtype=jnp.bfloat16)


def test_kernels_lower_for_the_gpu(triton_sm90, tiles):
    """The kernels lower to Triton for an sm_90 GPU from this machine (interpret mode never
    runs the Triton lowering rules: session 32 met a rule that fails there only on the H200)."""
    x = jnp.ones((77, 1024), jnp.bfloat16)
    calls = [lambda x: e4m3_codes(x, jnp.ones((77, 8), jnp.float32))]
    calls += [lambda x, r=r: e4m3_group_codes(x, rule=r) for r in act_quant.FP8_GROUP_RULES]
    calls += [lambda x, r=r: nvfp4_operand(x, jnp.float32(1), rule=r) for r in NVFP4_RULES]
    calls += [lambda x, e=e, r=r: mx_operand(x, elem=e, rule=r)
              for e in ("e2m1", "e4m3") for r in act_quant.MX_RULES]
    for f in calls:
        text = jax.jit(f).trace(x).lower(lowering_platforms=("cuda",)).as_text()
        assert "triton" in text.lower()


def test_nvfp4_operand_rejects_bad_arguments():
    x = jnp.ones((4, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="rule must be one of"):
        nvfp4_operand(x, jnp.float32(1), rule="vllm", interpret=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        nvfp4_operand(jnp.ones((4, 200)), jnp.float32(1), rule="modelopt", interpret=True)
    with pytest.raises(ValueError, match="global_scale must be one float32"):
        nvfp4_operand(x, jnp.ones((2,)), rule="modelopt", interpret=True)
    qw, spec = _nvfp4_weight("modelopt", 256)
    with pytest.raises(ValueError, match="operand must be"):
        nvfp4_activation_operand(x, qw, spec.activation, operand="triton")


def test_nvfp4_operand_path_rule(monkeypatch):
    """The operand kernel serves W4A4 on the GPU from NVFP4_OPERAND_KERNEL_MIN_M with K a
    multiple of 128; interpret mode and the CPU keep XLA's rule; describe_config says which."""
    from jqlin.kernels import pallas_fp4
    from jqlin.kernels.pallas_fp4 import (NVFP4_OPERAND_KERNEL_MIN_M, describe_config,
                                          nvfp4_operand_path)
    monkeypatch.setattr(pallas_fp4.jax, "default_backend", lambda: "cpu")
    assert nvfp4_operand_path(4096, 4096) == "xla"
    monkeypatch.setattr(pallas_fp4.jax, "default_backend", lambda: "gpu")
    assert nvfp4_operand_path(NVFP4_OPERAND_KERNEL_MIN_M, 4096) == "pallas"
    if NVFP4_OPERAND_KERNEL_MIN_M > 1:
        assert nvfp4_operand_path(NVFP4_OPERAND_KERNEL_MIN_M - 1, 4096) == "xla"
    assert nvfp4_operand_path(4096, 4000) == "xla"
    assert nvfp4_operand_path(4096, 4096, interpret=True) == "xla"
    qw, spec = _nvfp4_weight("compressed-tensors", 512)
    assert "Pallas" in describe_config("pallas_nvfp4", 4096, qw, spec, jnp.bfloat16,
                                       False)["activation_operand"]
    monkeypatch.setattr(pallas_fp4.jax, "default_backend", lambda: "cpu")
    assert "XLA" in describe_config("pallas_nvfp4", 4096, qw, spec, jnp.bfloat16,
                                    False)["activation_operand"]


@pytest.mark.gpu
@pytest.mark.parametrize("rule", NVFP4_RULES)
def test_gpu_nvfp4_operand_is_the_rule_bitwise(rng, rule, tiles):
    for m, k in [(1, 128), (1, 1024), (16, 4096), (77, 4096), (300, 1536), (1001, 4096)]:
        _check_nvfp4(rng, rule, m, k, interpret=False)
    _check_nvfp4(rng, rule, 33, 2048, interpret=False, dtype=jnp.bfloat16)


MX_CASES = [(fmt, rule) for fmt in ("mxfp4", "mxfp8")
            for rule in ("compressed-tensors", "modelopt")]


def _mx_weight(fmt, rule, k):
    spec = formats.get(fmt)
    spec = dataclasses.replace(spec, activation=dataclasses.replace(
        spec.activation, rule=ScaleRule(rule)))
    w = np.random.default_rng(7).standard_normal((128, k))
    return qweight.quantize(jnp.asarray(w, jnp.float32), fmt), spec


def _mx_activations(rng, fmt, m, k):
    """Rows of many magnitudes (2**-60 .. 2**60); rows of rounding ties at power-of-two scales
    (each group's first element its amax: 6 * 2**j for e2m1 codes, whose ties are exact then;
    448 * 2**j for e4m3, e4m3 midpoints); a zero group, +-inf, a group of 3e38, a group at
    2**-100, a NaN in a group, a group of NaN (M > 2)."""
    x = rng.standard_normal((m, k)) * np.exp2(rng.uniform(-60, 60, (m, 1)))
    t, groups = (m + 1) // 2, k // 32
    j = np.exp2(rng.integers(-20, 20, (t, groups, 1)).astype(np.float64))
    if fmt == "mxfp4":
        ties = np.float64([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
        y = rng.choice(ties, (t, groups, 32)) * j * rng.choice([-1, 1], (t, groups, 32))
        y[:, :, 0] = 6 * j[:, :, 0]
    else:
        y = oracle.e4m3_ties(rng, (t, groups, 32), j)
        y[:, :, 0] = 448 * j[:, :, 0]
    x[:t] = y.reshape(t, k)
    x = _special_groups(x, 32)
    if m > 1:
        x[0, 96:128] = rng.standard_normal(32) * 2.0 ** -100
    return jnp.asarray(x, jnp.float32)


def _check_mx(rng, fmt, rule, m, k, interpret, dtype=jnp.float32):
    x = _mx_activations(rng, fmt, m, k).astype(dtype)
    qw, spec = _mx_weight(fmt, rule, k)
    _same_operands(lambda x, operand: mx_activation_operand(
        x, qw, spec.activation, operand=operand, interpret=interpret), x,
        f"{fmt} {rule} M={m} K={k}", 32)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="interpret mode (see above)")
@pytest.mark.parametrize("fmt,rule", MX_CASES)
@pytest.mark.parametrize("m,k,tiles", [(1, 128, "launch"), (13, 512, "whole")], indirect=["tiles"])
def test_mx_operand_is_the_rule_bitwise(rng, fmt, rule, m, k, tiles):
    """The MX operand kernel is the XLA rule (quantize_activation, then code * 2**(u-127)) bit
    for bit: ties rows, zero group, infinities, huge and tiny groups, partial row blocks."""
    _check_mx(rng, fmt, rule, m, k, interpret=True)


def test_mx_operand_rejects_bad_arguments():
    with pytest.raises(ValueError, match="elem must be one of"):
        mx_operand(jnp.ones((4, 256)), elem="e5m2", rule="modelopt", interpret=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        mx_operand(jnp.ones((4, 200)), elem="e2m1", rule="modelopt", interpret=True)
    qw, spec = _mx_weight("mxfp4", "modelopt", 256)
    with pytest.raises(ValueError, match="operand must be"):
        mx_activation_operand(jnp.ones((4, 256)), qw, spec.activation, operand="triton")


def test_mx_operand_is_routed_on_the_gpu(monkeypatch):
    """From MX_OPERAND_KERNEL_MIN_M (1 since its GPU tests passed, session 35) the GPU takes
    the Pallas pass where K suits it, and explain says so; None routes nothing; interpret mode
    and the CPU keep XLA's rule."""
    from jqlin.kernels import pallas_fp4
    from jqlin.kernels.pallas_fp4 import describe_config, mx_operand_path
    assert mx_operand_path(1, 4096) == ("pallas" if jax.default_backend() == "gpu" else "xla")
    monkeypatch.setattr(pallas_fp4.jax, "default_backend", lambda: "gpu")
    assert pallas_fp4.MX_OPERAND_KERNEL_MIN_M == 1
    assert mx_operand_path(1, 4096) == "pallas"
    qw, spec = _mx_weight("mxfp8", "compressed-tensors", 512)
    assert "act_quant.mx_operand" in describe_config("pallas_mxfp8", 4096, qw, spec,
                                                     jnp.bfloat16, False)["activation_operand"]
    assert mx_operand_path(4096, 4000) == "xla"
    assert mx_operand_path(4096, 4096, interpret=True) == "xla"
    monkeypatch.setattr(pallas_fp4, "MX_OPERAND_KERNEL_MIN_M", None)
    assert mx_operand_path(4096, 4096) == "xla"
    assert "XLA" in describe_config("pallas_mxfp8", 4096, qw, spec, jnp.bfloat16,
                                    False)["activation_operand"]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,rule", MX_CASES)
def test_gpu_mx_operand_is_the_rule_bitwise(rng, fmt, rule, tiles):
    for m, k in [(1, 128), (1, 1024), (16, 4096), (77, 4096), (300, 1536), (1001, 4096)]:
        _check_mx(rng, fmt, rule, m, k, interpret=False)
    _check_mx(rng, fmt, rule, 33, 2048, interpret=False, dtype=jnp.bfloat16)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="interpret mode (see above)")
@pytest.mark.parametrize("fmt", ["mxfp4", "mxfp8", "nvfp4"])
def test_products_with_the_operand_kernels_are_bitwise_the_xla_operands(rng, monkeypatch, fmt):
    """pallas_fp4.apply with the operand kernel (the path forced) gives the product of XLA's
    operand bit for bit: the same operand reaches the same matmul (MXFP8: the bf16 variant's
    matmul, called directly)."""
    from jqlin.kernels import pallas_fp4
    x = jnp.asarray(rng.standard_normal((3, 256)), jnp.float32)
    calib = x if fmt == "nvfp4" else None
    qw = qweight.quantize(jnp.asarray(rng.standard_normal((128, 256)), jnp.float32), fmt,
                          calibration=calib)
    run = lambda: np.asarray(jax.jit(lambda x: pallas_fp4.apply(  # noqa: E731
        x, qw, qw.spec, interpret=True))(x))
    ref = run()
    path = "nvfp4_operand_path" if fmt == "nvfp4" else "mx_operand_path"
    monkeypatch.setattr(pallas_fp4, path, lambda *a, **k: "pallas")
    np.testing.assert_array_equal(run(), ref)
