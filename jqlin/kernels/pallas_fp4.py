"""Glue: the Pallas NVFP4 / MXFP4 / MXFP8 kernels of `pallas_kernels` declared to the dispatcher.

Three kernels, each serving its weight format weight-only (float activations) and with the
format's own quantized activations:
  pallas_nvfp4  e2m1 + e4m3 scale per 16 + global  (nvfp4_a16, nvfp4; CT and ModelOpt rules)
  pallas_mxfp4  e2m1 + e8m0 scale per 32           (mxfp4_a16, mxfp4)
  pallas_mxfp8  e4m3 + e8m0 scale per 32           (mxfp8_a16, mxfp8)

Hopper has no FP4 MMA: weights are dequantized in the kernel to bf16 (exact) for bf16 MMAs
with float32 accumulation. A float16 / float32 x runs as its exact bf16 parts stacked as rows
(stacked_parts). On sm_90 with one bf16 activation operand (bf16 x, or a quantized
activation), NVFP4 and MXFP4 in default mode at M <= 16 run the plain-pipeline decode kernel
(pallas_kernels.group_a16_decode_mgpu, session 28: several CTAs an SM) where N, K suit it --
deterministic mode too, in group_a16_mgpu's order (the same bits; session 29); with
N, K the kernel takes, the Mosaic GPU kernel (pallas_kernels.group_a16_mgpu,
session 12: the codes decoded in registers; in deterministic mode from
group_a16_mgpu.det_predecode_min_m rows on (2048; 4096 for e2m1 codes read as words) decoded
to exact bf16 by one pass first, session 17) runs in
default mode up to M = 256 and in deterministic mode at every M; otherwise the Triton kernel
(mx_core). In default mode from
M = 1024 (prefill) the weight is instead dequantized exactly to bf16 in one pass and
multiplied by one XLA dot (pallas_kernels.mx_dense): the same exact operands, float32
accumulation, measured faster there. Both passes are group_dequant's Pallas kernel where its
tiles fit the weight (session 21), else XLA's dequantization: the same bits.
pallas_kernels.fp4_matmul.mgpu_path is the rule. MXFP8 W8A8 with fp8 MMAs (mx_fp8mma) is
available through `apply(..., mxfp8_variant="fp8mma")`; it measured slower, and so did its
Mosaic GPU form ("fp8mma_mgpu" / "fp8mma_mgpu_f4": 0.47-0.66x bf16 at M = 4096 where this
route ran 0.88-1.14x, H100, session 53, benchmarks/results/h100_mxmma_s53.json). Quantized
activations are computed here, before the kernel, by the XLA reference's rule
(`quantize_activation`: two XLA fusions, the amax and one pass, since session 30) -- on the GPU
by one Pallas pass of the same rule instead (pallas_kernels.act_quant.nvfp4_operand, session
32, nvfp4_operand_path; act_quant.mx_operand, session 35, mx_operand_path) -- so the codes are
the reference's codes bit for bit, and are handed over in a form that is exact in bf16:
  * MX: code * 2**k (<= 4 significant bits);
  * NVFP4: code * e4m3 block scale, with the activation's global scale moved to the float32
    accumulator next to the weight's (t = s / g is not a bf16 number, s and 1/g separately are).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.act_quant import mx_operand, nvfp4_operand, serves
from pallas_kernels.common import MatmulConfig, kept
from pallas_kernels.fp4_matmul import (GROUP_FORMAT, MGPU_MAX_M, MXFP4_KERNEL, NVFP4_KERNEL,
                                       fp4_layout_for, mgpu_path, mxfp4_matmul, nvfp4_matmul,
                                       path_for, resolve_dequant_config)
from pallas_kernels.group_dequant import dequant_pass_fits
from pallas_kernels.mx_core import split_activation
from pallas_kernels.mx_dense import DENSE_MIN_M
from pallas_kernels.mx_fp8 import MXFP8_KERNEL, mxfp8_matmul, mxfp8_w8a8_matmul

from ..dispatch import KeyPattern, Kernel, WEIGHT_ONLY, register_kernel
from ..numerics import quantize_activation
from ..numerics.fp8 import round_e4m3
from ..numerics.tiling import expand
from ..qweight import QuantizedWeight
from ..spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule
from .pallas_common import HOPPER_PALLAS
from .stacked_parts import describe_parts, on_stacked_parts, part_count
from .xla import pad_k

__all__ = ["NVFP4", "MXFP4", "MXFP8", "apply", "describe_config", "mx_activation_operand",
           "mx_operand_path", "nvfp4_activation_operand", "nvfp4_operand_path",
           "nvfp4_post_scale"]

F32, BF16 = jnp.float32, jnp.bfloat16
# Default mode may run an XLA dot from this M on (read by jqlin.bench to compile such cases
# apart): past the Mosaic kernel's M where its waves would run part-empty, from DENSE_MIN_M on
XLA_GEMM_MIN_M = min(min(MGPU_MAX_M.values()) + 1, DENSE_MIN_M)
# NVFP4 W4A4 activation operand by one Pallas pass from this M on (GPU): 0.30-0.50x the XLA
# rule's time at M = 1-4096 (H200, session 32)
NVFP4_OPERAND_KERNEL_MIN_M = 1
# MX activation operand by one Pallas pass from this M on (GPU): 0.35-0.49x the XLA rule's time
# at M = 1-4096, K = 4096 / 8192 (H200, session 35; its GPU tests bitwise); None: not routed
MX_OPERAND_KERNEL_MIN_M: int | None = 1
_E2M1, _E4M3, _E8M0 = ("float4_e2m1fn",), ("float8_e4m3fn",), ("float8_e8m0fnu",)
_G = (Granularity.GROUP,)

_W_NVFP4 = KeyPattern(dtype=_E2M1, granularity=_G, scale_dtype=_E4M3, group_size=(16,),
                      global_scale=(True,))
_A_NVFP4 = KeyPattern(dtype=_E2M1, granularity=_G, scale_dtype=_E4M3, group_size=(16,),
                      dynamic=(True,), global_scale=(True,))
_W_MXFP4 = KeyPattern(dtype=_E2M1, granularity=_G, scale_dtype=_E8M0, group_size=(32,),
                      global_scale=(False,))
_A_MXFP4 = KeyPattern(dtype=_E2M1, granularity=_G, scale_dtype=_E8M0, group_size=(32,),
                      dynamic=(True,), global_scale=(False,))
_W_MXFP8 = KeyPattern(dtype=_E4M3, granularity=_G, scale_dtype=_E8M0, group_size=(32,),
                      global_scale=(False,))
# (the MX activation operand computes these two rules: act_quant.mx_operand, numerics._mx)
_A_MXFP8 = KeyPattern(dtype=_E4M3, granularity=_G, scale_dtype=_E8M0, group_size=(32,),
                      dynamic=(True,), global_scale=(False,),
                      rule=(ScaleRule.CT, ScaleRule.MODELOPT))

def _x_parts(x2d: jax.Array, qw: QuantizedWeight) -> list[jax.Array]:
    """Weight-only: the activation as exact bf16 parts (several only on the dense path:
    _parts_listed), K padded to the storage."""
    return split_activation(pad_k(x2d, qw.storage_shape[1]))


def _parts_listed(m: int, deterministic: bool, config, path) -> bool:
    """Whether a wider x's bf16 parts go to the kernel as a list rather than stacked as rows: on
    the dense path (default mode from DENSE_MIN_M: one dequantization, a dot per part), where
    stacking only adds a copy of x and of the outputs. H100, session 38 (bench_out_dtype.py,
    8192x8192, M=4096, float32 x, separate runs): NVFP4 W4A16 listed 2281 us, stacked 2591 us;
    MXFP8 W8A16 2263 / 2323 us."""
    return path_for(m, deterministic, config, path) == "dense"


def nvfp4_operand_path(m: int, k_storage: int, *, interpret: bool = False) -> str:
    """Who computes the NVFP4 W4A4 activation operand (the same bits either way): "pallas"
    (pallas_kernels.act_quant.nvfp4_operand: the whole rule in one pass, the hardware's IEEE
    division) on the GPU from M = NVFP4_OPERAND_KERNEL_MIN_M with K a multiple of 128; else
    "xla" (quantize_activation: an amax fusion and one pass, the exact division corrected by
    integer arithmetic)."""
    return ("pallas" if serves(m, k_storage, NVFP4_OPERAND_KERNEL_MIN_M, interpret=interpret)
            else "xla")


def nvfp4_activation_operand(x2d: jax.Array, qw: QuantizedWeight, act: QuantKey, *,
                             operand: str | None = None, interpret: bool = False) -> jax.Array:
    """bf16 (M, Ks) = e2m1 code * e4m3 block scale of the reference's quantized activation.

    operand: "xla" or "pallas" (see nvfp4_operand_path, which None asks). XLA:
    quantize_activation returns the block step t = s / g (CT) or b * g (ModelOpt) in float32;
    the e4m3 factor is recovered exactly by rounding t * g (or t / g) back to e4m3: the float32
    round trip is off by at most two ulps, far below half an e4m3 step. The global factor goes
    to the accumulator (nvfp4_post_scale). code * e4m3 needs <= 6 significant bits: exact in bf16.
    (round_e4m3, not the barrier-built cast_e4m3: the same values, and no end to the fusion.)
    """
    ks = qw.storage_shape[1]
    operand = operand or nvfp4_operand_path(x2d.shape[0], ks, interpret=interpret)
    if operand not in ("xla", "pallas"):
        raise ValueError(f"operand must be 'xla' or 'pallas', got {operand!r}")
    g = jnp.asarray(qw.input_scale, F32)
    if operand == "pallas":  # (the rule's branch is the global scale's role, as in _nvfp4)
        rule = ("compressed-tensors" if act.global_scale is GlobalScale.DIVISOR
                else "modelopt")
        return nvfp4_operand(pad_k(x2d, ks), g, rule=rule, interpret=interpret)
    xf = pad_k(x2d.astype(F32), ks)
    q, t = quantize_activation(xf, act, qw.input_scale)
    s = round_e4m3(t * g if act.global_scale is GlobalScale.DIVISOR else t / g)
    return (q.astype(F32) * expand(s, *q.shape)).astype(BF16)


def nvfp4_post_scale(qw: QuantizedWeight, spec: QuantSpec) -> tuple[jax.Array, str]:
    """(per stored row float32 factor, "div" | "mul") applied to the float32 accumulator. The
    global scales enter `kept` (data to XLA even when jit closes over the weight), so the
    factor is computed and divided by on the GPU alike whichever way the weight arrives, and an
    in-kernel finish and XLA's give the same bits (common.finish_rows)."""
    rows = qw.storage_shape[0]
    gw = jnp.broadcast_to(kept(qw.global_scale), (rows,))
    w_div = spec.weight.global_scale is GlobalScale.DIVISOR
    if spec.activation is None:
        return gw, "div" if w_div else "mul"
    ga = kept(qw.input_scale)
    a_div = spec.activation.global_scale is GlobalScale.DIVISOR
    if w_div and a_div:
        return gw * ga, "div"
    if not w_div and not a_div:
        return gw * ga, "mul"
    return (ga / gw, "mul") if w_div else (gw / ga, "mul")


def _mx_activation(x2d: jax.Array, qw: QuantizedWeight, act: QuantKey):
    xf = pad_k(x2d.astype(F32), qw.storage_shape[1])
    return quantize_activation(xf, act)  # codes, float32 2**(u-127) per 32


def mx_operand_path(m: int, k_storage: int, *, interpret: bool = False) -> str:
    """Who computes the MX activation operand (the same bits either way): "pallas"
    (pallas_kernels.act_quant.mx_operand) on the GPU from M = MX_OPERAND_KERNEL_MIN_M with K a
    multiple of 128 -- never while that is None; else "xla" (quantize_activation)."""
    return ("pallas" if serves(m, k_storage, MX_OPERAND_KERNEL_MIN_M, interpret=interpret)
            else "xla")


def mx_activation_operand(x2d: jax.Array, qw: QuantizedWeight, act: QuantKey, *,
                          operand: str | None = None, interpret: bool = False) -> jax.Array:
    """bf16 (M, Ks) = code * 2**(u - 127) of the reference's MX activation (exact: <= 4
    significant bits). operand: "xla" or "pallas" (see mx_operand_path, which None asks)."""
    ks = qw.storage_shape[1]
    operand = operand or mx_operand_path(x2d.shape[0], ks, interpret=interpret)
    if operand not in ("xla", "pallas"):
        raise ValueError(f"operand must be 'xla' or 'pallas', got {operand!r}")
    if operand == "pallas":  # (the rule's branches as in numerics.activations._mx)
        return mx_operand(pad_k(x2d, ks), elem="e2m1" if act.is_fp4 else "e4m3",
                          rule="modelopt" if act.rule is ScaleRule.MODELOPT
                          else "compressed-tensors", interpret=interpret)
    q, s = _mx_activation(x2d, qw, act)
    return (q.astype(F32) * expand(s, *q.shape)).astype(BF16)


def apply(x2d: jax.Array, qw: QuantizedWeight, spec: QuantSpec, *, deterministic: bool = False,
          interpret: bool = False, config: MatmulConfig | None = None,
          fp4_layout: str | None = None, decode: str | None = None, path: str | None = None,
          mxfp8_variant: str | None = None, out_dtype=None) -> jax.Array:
    """The kernel of qw's weight family on a QuantizedWeight, output in out_dtype (default
    x's; benchmarks pass overrides). Weight-only with a float16 / float32 x runs its exact bf16
    parts stacked as rows (stacked_parts: the one-bf16-operand paths; the overrides then apply
    to that call) -- except on the dense path, which takes them as they are (_parts_listed)."""
    wk = spec.weight
    if (spec.activation is None and part_count(x2d.dtype) > 1
            and not _parts_listed(x2d.shape[0], deterministic, config, path)):
        return on_stacked_parts(
            lambda xs: apply(xs, qw, spec, deterministic=deterministic, interpret=interpret,
                             config=config, fp4_layout=fp4_layout, decode=decode, path=path,
                             out_dtype=F32),
            x2d, out_dtype or x2d.dtype, deterministic=deterministic)
    kw = dict(out_dtype=jnp.dtype(out_dtype or x2d.dtype), deterministic=deterministic,
              config=config, path=path, interpret=interpret)
    if wk.scale_dtype == "float8_e4m3fn":  # NVFP4
        if spec.activation is None:
            parts = _x_parts(x2d, qw)
        else:
            parts = [nvfp4_activation_operand(x2d, qw, spec.activation, interpret=interpret)]
        col, post = nvfp4_post_scale(qw, spec)
        y = nvfp4_matmul(parts, qw.data, qw.scale, col, post=post, fp4_layout=fp4_layout,
                         decode=decode, **kw)
    elif wk.is_fp4:  # MXFP4
        if spec.activation is None:
            parts = _x_parts(x2d, qw)
        else:  # code * 2**k is exact in bf16
            parts = [mx_activation_operand(x2d, qw, spec.activation, interpret=interpret)]
        y = mxfp4_matmul(parts, qw.data, qw.scale, fp4_layout=fp4_layout, decode=decode, **kw)
    elif spec.activation is None:  # MXFP8 weight-only
        y = mxfp8_matmul(_x_parts(x2d, qw), qw.data, qw.scale, **kw)
    elif (mxfp8_variant in (None, "bf16") and  # (the bf16 variant's operand, by one pass)
          mx_operand_path(x2d.shape[0], qw.storage_shape[1], interpret=interpret) == "pallas"):
        xb = mx_activation_operand(x2d, qw, spec.activation, operand="pallas",
                                   interpret=interpret)
        y = mxfp8_matmul([xb], qw.data, qw.scale, **kw)
    else:  # MXFP8 x MXFP8
        q, s = _mx_activation(x2d, qw, spec.activation)
        y = mxfp8_w8a8_matmul(q, s, qw.data, qw.scale, variant=mxfp8_variant, **kw)
    return qw.trim_rows(y)


def _impl(x2d: jax.Array, qw: QuantizedWeight, *, spec: QuantSpec, deterministic: bool,
          interpret: bool = False, out_dtype=None) -> jax.Array:
    return apply(x2d, qw, spec, deterministic=deterministic, interpret=interpret,
                 out_dtype=out_dtype)


def describe_config(kernel: str, m: int, qw: QuantizedWeight, spec: QuantSpec, x_dtype,
                    deterministic: bool) -> dict:
    """The tile config (and decode variant) `kernel` runs with, for benchmark records."""
    del kernel
    n, k = qw.storage_shape
    wk = spec.weight
    count = 1 if spec.activation is not None else part_count(x_dtype)
    listed = count > 1 and _parts_listed(m, deterministic, None, None)
    if not listed:
        m *= count  # (a wider x: its bf16 parts as rows)
    fmt = GROUP_FORMAT["e2m1" if wk.is_fp4 else "e4m3",
                       "e4m3" if wk.scale_dtype == "float8_e4m3fn" else "e8m0"]
    path = mgpu_path(fmt, m, n, k, 1, BF16, deterministic=deterministic, config=None,
                     path=None, interpret=False)
    # one predicate for the pass and its explanation (mx_dense.dequantized)
    dequant = ("one Pallas pass (group_dequant)"
               if dequant_pass_fits(n, k, elem="e2m1" if wk.is_fp4 else "e4m3",
                                    group=wk.group_size) else "one XLA pass")
    out = {**describe_parts(count, x_dtype, stacked=not listed),
           **_describe_path(path, m, n, k, qw, spec, fmt, dequant, deterministic,
                            out_dtype=F32 if count > 1 else BF16)}  # (parts: float32)
    if spec.activation is not None and wk.scale_dtype == "float8_e4m3fn":
        out["activation_operand"] = (
            "one Pallas pass (act_quant.nvfp4_operand, div.rn.f32)"
            if nvfp4_operand_path(m, k) == "pallas"
            else "XLA (quantize_activation, exact division)")
    elif spec.activation is not None:
        out["activation_operand"] = (
            "one Pallas pass (act_quant.mx_operand)" if mx_operand_path(m, k) == "pallas"
            else "XLA (quantize_activation)")
    return out


def _describe_path(path, m, n, k, qw, spec, fmt, dequant, deterministic, out_dtype) -> dict:
    wk = spec.weight
    if path == "decode":
        from pallas_kernels.fp8_a16_decode_mgpu import finish_note
        from pallas_kernels.group_a16_decode_mgpu import group_decode_params
        splits, stages, load = group_decode_params(fmt, n, k)
        order = ""
        if deterministic:  # (group_a16_mgpu's deterministic sums, to the bit)
            from pallas_kernels.group_a16_decode_mgpu import det_launch_of, det_order
            groups, splits, held = det_launch_of(fmt, n, k)
            order = (f", deterministic order: K in {det_order(n, k)[0]} parts"
                     f"{f' ({held} a range)' if held > 1 else ''}, each K-block's chain from "
                     f"zero, added in K order by {groups} group(s)")
        finished = finish_note("group_a16_decode_mgpu", m, n, splits, out_dtype,
                               deterministic=deterministic,
                               interpret=jax.default_backend() == "cpu",
                               **(dict(range_parts=held, groups=groups) if deterministic else {}))
        return {"path": f"decode (Mosaic GPU plain-pipeline swap-AB kernel, 64-row weight tiles,"
                        f" several CTAs an SM, codes decoded in registers ({load}), "
                        f"splits={splits}, stages={stages}"
                        f"{finished}{order})",
                "splits": splits, "stages": stages, "load": load}
    if path == "mgpu":
        from pallas_kernels.group_a16_mgpu import group_launch_params
        params = group_launch_params(m, n, k, False, deterministic=deterministic, fmt=fmt)
        how = (f"codes decoded to exact bf16 by {dequant}, wgmma reading them from shared "
               "memory" if params.get("predecode") else "codes decoded in registers")
        return {"path": f"mgpu (Mosaic GPU, {how})", **params}
    if path == "dense":
        return {"path": f"dense (exact bf16 dequantization by {dequant} + XLA dot)"}
    name = (NVFP4_KERNEL if wk.scale_dtype == "float8_e4m3fn" else
            MXFP4_KERNEL if wk.is_fp4 else MXFP8_KERNEL)
    cfg = resolve_dequant_config(name, m=m, n=n, k=k, elem_bits=4 if wk.is_fp4 else 8,
                                 group=wk.group_size, deterministic=deterministic, config=None,
                                 extra="1")
    out = {**cfg.to_json(), "path": "pallas"}
    if wk.is_fp4:
        out["fp4_layout"] = fp4_layout_for(cfg, None)
        out["decode"] = "asm" if out["fp4_layout"] == "split" else "jnp"
    return out


NVFP4 = register_kernel(Kernel(
    name="pallas_nvfp4",
    impl=_impl,
    honours=((_W_NVFP4, WEIGHT_ONLY), (_W_NVFP4, _A_NVFP4)),
    description="Pallas (Mosaic GPU: plain-pipeline decode at M <= 16, warp-specialized "
                "at M <= 256 and deterministic; else Triton) NVFP4: "
                "e2m1 x e4m3/16 decoded in-kernel to exact bf16, bf16 MMA, "
                "f32 accumulation, global scale on the accumulator; W4A4 activations quantized "
                "by the reference rule in one Pallas pass on the GPU (act_quant), else an XLA "
                "pre-pass",
    **HOPPER_PALLAS,
))

MXFP4 = register_kernel(Kernel(
    name="pallas_mxfp4",
    impl=_impl,
    honours=((_W_MXFP4, WEIGHT_ONLY), (_W_MXFP4, _A_MXFP4)),
    description="Pallas (Mosaic GPU: plain-pipeline decode at M <= 16, warp-specialized "
                "at M <= 256 and deterministic; else Triton) MXFP4: "
                "e2m1 x 2^k/32 decoded in-kernel to exact bf16, bf16 MMA, "
                "f32 accumulation; MX activations quantized by the reference rule (XLA pre-pass)",
    **HOPPER_PALLAS,
))

MXFP8 = register_kernel(Kernel(
    name="pallas_mxfp8",
    impl=_impl,
    honours=((_W_MXFP8, WEIGHT_ONLY), (_W_MXFP8, _A_MXFP8)),
    description="Pallas (Mosaic GPU at M <= 256 and deterministic, else Triton) "
                "MXFP8: e4m3 x 2^k/32 decoded in-kernel to exact bf16, bf16 MMA, "
                "f32 accumulation; MX activations quantized by the reference rule (XLA pre-pass)",
    **HOPPER_PALLAS,
))
