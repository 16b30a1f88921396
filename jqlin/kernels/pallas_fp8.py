"""Glue: the Pallas FP8 kernels of `pallas_kernels` declared to the dispatcher.

Three kernels, each honouring exactly the specs whose numerics it computes:
  pallas_fp8_w8a16  e4m3 weights (tensor / channel / 128x128 block scales), float activations;
  pallas_fp8_w8a8   e4m3 weights (tensor / channel) x e4m3 activations (static or dynamic
                    per-tensor, dynamic per-token);
  pallas_fp8_block  e4m3 128x128-block weights x e4m3 dynamic 1x128-group activations.

Activations of the W8A8 kernels are quantized here, before the kernel, by the same
`quantize_activation` the XLA reference uses, so the codes are the reference's codes bit for
bit whatever producer rule (CT / ModelOpt / vLLM) the key names -- on the GPU its scales with
the codes from one Pallas pass (pallas_kernels.act_quant, the same bits; codes_path).

In default mode, weights with per-tensor / per-channel scales (and activations with per-tensor /
per-token ones) take pallas_kernels.fp8_dense where it measured faster (fp8_paths): one XLA GEMM
of the stored codes (cuBLASLt e4m3 x e4m3, or activations x exact 16-bit codes), float32
accumulation at HIGHEST precision, the scales on the float32 result -- the same function.
Weight-only at M = 2-8 (XLA converts the codes inside its own GEMM there), at mid M where the
Mosaic launch would leave its last wave part-empty, and from M = 1024; W8A8 from M = 128.
Weight-only with those scales at M = 1 and 9-16 takes pallas_kernels.fp8_a16_decode_mgpu (a
plain-pipeline Mosaic GPU kernel, several CTAs an SM), and so do 128x128 block scales at every
M <= 16 up to K = 14336. `describe_config` reports the path.
Deterministic mode never takes the dense GEMM (its summation order follows M): weight-only with
16-bit x runs the Mosaic GPU kernel's M-free schedule -- up to 16 rows of weights with N or
K <= 4096 on the decode kernel, in that schedule's order (the same bits; fp8_paths.
det_decode_wins) -- the rest the Triton kernels'.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pallas_kernels import (MatmulConfig, w8a16_config, w8a16_matmul, w8a8_config,
                            w8a8_matmul)
from pallas_kernels.act_quant import e4m3_codes, e4m3_group_codes, serves
from pallas_kernels.fp8_a16_decode_mgpu import (decode_params, det_decode_launch, det_order,
                                                finish_note)
from pallas_kernels.fp8_core import mgpu_launch_params
from pallas_kernels.fp8_dense import widens
from pallas_kernels.fp8_paths import DENSE_MIN_M, W8A8_DENSE_MIN_M, fp8_path

from ..dispatch import KeyPattern, Kernel, WEIGHT_ONLY, register_kernel
from ..numerics import quantize_activation
from ..numerics.activations import fp8_division_scale
from ..qweight import QuantizedWeight
from ..spec import Granularity, QuantKey, QuantSpec, ScaleRule
from .pallas_common import HOPPER_PALLAS
from .stacked_parts import describe_parts, on_stacked_parts, part_count
from .xla import pad_k

__all__ = ["W8A16", "W8A8", "BLOCK", "describe_config", "w8a16_apply", "w8a8_apply",
           "quantize_x"]

# Default mode runs an XLA GEMM from this M on (read by jqlin.bench to compile such cases apart;
# W8A8 whole-K scales from the lower one)
XLA_GEMM_MIN_M = min(DENSE_MIN_M, W8A8_DENSE_MIN_M)
# x dtypes the W8A16 kernels take as they are (e4m3 -> either is exact); float32 as bf16 parts
_A16_NATIVE = (jnp.bfloat16, jnp.float16)
_E4M3 = ("float8_e4m3fn",)
_F32 = ("float32",)
_W_KIND = {Granularity.TENSOR: "tensor", Granularity.CHANNEL: "channel",
           Granularity.BLOCK: "block"}
_X_KIND = {Granularity.TENSOR: "tensor", Granularity.TOKEN: "row", Granularity.GROUP: "group"}
# From this M the W8A8 activation codes come from pallas_kernels.act_quant (quantize_x): with
# its launch-sized tiles (session 32) never slower than XLA's codes where measured (M = 1-4096;
# at M = 1-64 0.69-0.98x the time, H200)
CODES_KERNEL_MIN_M = 1
# From this M dynamic 1 x 128 groups take act_quant.e4m3_group_codes (amax and scales in the
# codes pass: one launch, not three, and no XLA reduction over x). Every M: bitwise the rule on
# an H100 (session 46), and the codes took 0.36-0.68x the three launches' time at M = 1-4096,
# K = 7168 / 18432 (the block W8A8 layer 0.95-0.98x)
GROUP_CODES_KERNEL_MIN_M: int | None = 1
_CODES = ("xla", "pallas", "pallas_group")

_W_TC = KeyPattern(dtype=_E4M3, granularity=(Granularity.TENSOR, Granularity.CHANNEL),
                   scale_dtype=_F32, global_scale=(False,))
_W_BLOCK = KeyPattern(dtype=_E4M3, granularity=(Granularity.BLOCK,), block=((128, 128),),
                      scale_dtype=_F32, global_scale=(False,))
_A_TENSOR_TOKEN = KeyPattern(dtype=_E4M3, granularity=(Granularity.TENSOR, Granularity.TOKEN),
                             scale_dtype=_F32, global_scale=(False,))
_A_GROUP128 = KeyPattern(dtype=_E4M3, granularity=(Granularity.GROUP,), group_size=(128,),
                         dynamic=(True,), scale_dtype=_F32, global_scale=(False,))
# DeepSeek-V3.1's `scale_fmt: "ue8m0"`: the same groups with power-of-two scales, which the
# kernel takes as float32 (2**j is exact there) and whose codes are x / 2**j
_A_GROUP128_UE8M0 = KeyPattern(dtype=_E4M3, granularity=(Granularity.GROUP,), group_size=(128,),
                               dynamic=(True,), scale_dtype=("float8_e8m0fnu",),
                               rule=(ScaleRule.DEEPSEEK,), global_scale=(False,))


def _weight_scale(qw: QuantizedWeight, spec: QuantSpec) -> tuple[jax.Array, str]:
    kind = _W_KIND[spec.weight.granularity]
    scale = qw.scale.reshape(1, 1) if kind == "tensor" else qw.scale
    return scale, kind


def w8a16_apply(x2d: jax.Array, qw: QuantizedWeight, spec: QuantSpec, *,
                deterministic: bool = False, interpret: bool = False,
                config: MatmulConfig | None = None,
                config_overrides: dict | None = None, path: str | None = None,
                out_dtype=None) -> jax.Array:
    """The W8A16 kernel on a QuantizedWeight (output in out_dtype, default x's). `config`
    replaces the resolved tile config; `config_overrides` changes fields of the resolved one,
    `path` the path (benchmarks). A float32 x runs as its three exact bf16 parts stacked as
    rows (stacked_parts: the 16-bit paths); config / path then apply to that call."""
    if part_count(x2d.dtype, native=_A16_NATIVE) > 1:
        return on_stacked_parts(
            lambda xs: w8a16_apply(xs, qw, spec, deterministic=deterministic,
                                   interpret=interpret, config=config,
                                   config_overrides=config_overrides, path=path,
                                   out_dtype=jnp.float32),
            x2d, out_dtype or x2d.dtype, deterministic=deterministic)
    scale, kind = _weight_scale(qw, spec)
    x = pad_k(x2d, qw.storage_shape[1])  # block formats store K padded to whole blocks
    if config_overrides:
        base = config or w8a16_config(x.shape[0], qw.storage_shape[0], x.shape[1],
                                      scale_kind=kind, x_dtype=x.dtype,
                                      deterministic=deterministic)
        config = dataclasses.replace(base, **config_overrides)
    y = w8a16_matmul(x, qw.data, scale, scale_kind=kind, deterministic=deterministic,
                     interpret=interpret, config=config, path=path, out_dtype=out_dtype)
    return qw.trim_rows(y)


def w8a16_impl(x2d: jax.Array, qw: QuantizedWeight, *, spec: QuantSpec, deterministic: bool,
               interpret: bool = False, out_dtype=None) -> jax.Array:
    return w8a16_apply(x2d, qw, spec, deterministic=deterministic, interpret=interpret,
                       out_dtype=out_dtype)


def codes_path(m: int, k_storage: int, key: QuantKey, *, interpret: bool = False) -> str:
    """Who computes the W8A8 activation codes (the same bits either way): "pallas"
    (pallas_kernels.act_quant: one pass, the hardware's IEEE division) on the GPU from
    M = CODES_KERNEL_MIN_M (1: every M) for the division-form rules (all but ModelOpt's
    static one, which multiplies) and K a multiple of 128; for dynamic 1 x 128 groups from
    M = GROUP_CODES_KERNEL_MIN_M "pallas_group" instead (the scales in that pass too; not
    where the key bounds the amax); else "xla" (quantize_activation)."""
    division = key.dynamic or key.rule is not ScaleRule.MODELOPT
    if not (division and serves(m, k_storage, CODES_KERNEL_MIN_M, interpret=interpret)):
        return "xla"
    group = (key.granularity is Granularity.GROUP and key.amax_bound is None and serves(
        m, k_storage, GROUP_CODES_KERNEL_MIN_M, interpret=interpret))
    return "pallas_group" if group else "pallas"


def quantize_x(x2d: jax.Array, qw: QuantizedWeight, spec: QuantSpec, *,
               codes: str | None = None, interpret: bool = False):
    """e4m3 codes (M, Ks) and float32 scales of x, exactly as the XLA reference computes them.

    codes: "xla" (quantize_activation, whose exact division corrects XLA's quotient with
    integer arithmetic: ALU-bound at prefill sizes), "pallas" (pallas_kernels.act_quant's
    e4m3_codes, the scales still from quantize_activation's rule; division-form rules only) or
    "pallas_group" (act_quant.e4m3_group_codes: dynamic 1 x 128 groups, amax and scales in the
    codes pass too); None: codes_path. The same bits each way (tests:
    tests/kernels/test_act_quant.py)."""
    k_storage = qw.storage_shape[1]
    key = spec.activation
    codes = codes or codes_path(x2d.shape[0], k_storage, key, interpret=interpret)
    if codes not in _CODES:
        raise ValueError(f"codes must be one of {_CODES}, got {codes!r}")
    if codes == "pallas_group":
        if not (key.granularity is Granularity.GROUP and key.group_size == 128 and key.dynamic
                and key.amax_bound is None):
            raise ValueError(f"codes='pallas_group' computes dynamic 1 x 128 group scales from "
                             f"unbounded amaxes; the activation key is [{key.describe()}]")
        q, s = e4m3_group_codes(pad_k(x2d, k_storage), rule=key.rule.value, interpret=interpret)
        return q, s, _X_KIND[key.granularity]
    xf = pad_k(x2d.astype(jnp.float32), k_storage)
    s = fp8_division_scale(xf, key, qw.input_scale) if codes == "pallas" else None
    if codes == "pallas" and s is None:
        raise ValueError(f"codes='pallas' divides by the scale; the activation rule "
                         f"[{key.describe()}] multiplies (ModelOpt static): use codes='xla'")
    if s is None:
        q, s = quantize_activation(xf, key, qw.input_scale)
    else:  # (x in its own dtype: the kernel widens a tile at a time)
        q = e4m3_codes(pad_k(x2d, k_storage), s, interpret=interpret)
    return q, s.astype(jnp.float32), _X_KIND[key.granularity]


def w8a8_apply(x2d: jax.Array, qw: QuantizedWeight, spec: QuantSpec, *,
               deterministic: bool = False, interpret: bool = False,
               config: MatmulConfig | None = None, path: str | None = None,
               out_dtype=None) -> jax.Array:
    """The W8A8 / block kernel on a QuantizedWeight (output in out_dtype, default x's);
    `config` / `path` override the tile config / the path (benchmarks)."""
    xq, xs, x_kind = quantize_x(x2d, qw, spec, interpret=interpret)
    scale, w_kind = _weight_scale(qw, spec)
    y = w8a8_matmul(xq, xs, qw.data, scale, x_scale_kind=x_kind, w_scale_kind=w_kind,
                    out_dtype=out_dtype or x2d.dtype, deterministic=deterministic,
                    interpret=interpret, config=config, path=path)
    return qw.trim_rows(y)


def w8a8_impl(x2d: jax.Array, qw: QuantizedWeight, *, spec: QuantSpec, deterministic: bool,
              interpret: bool = False, out_dtype=None) -> jax.Array:
    return w8a8_apply(x2d, qw, spec, deterministic=deterministic, interpret=interpret,
                      out_dtype=out_dtype)


def describe_config(kernel: str, m: int, qw: QuantizedWeight, spec: QuantSpec, x_dtype,
                    deterministic: bool) -> dict:
    """The tile config `kernel` runs with for an (m, K) x of x_dtype (for benchmark records)
    and, for the W8A8 kernels, who computes the activation codes (codes_path)."""
    if kernel == W8A16.name and (count := part_count(x_dtype, native=_A16_NATIVE)) > 1:
        return {**describe_parts(count, x_dtype),  # (the parts' products in float32)
                **_describe_path(kernel, count * m, qw, spec, jnp.bfloat16, deterministic,
                                 out_dtype=jnp.float32)}
    out = _describe_path(kernel, m, qw, spec, x_dtype, deterministic)
    if kernel != W8A16.name:
        out["activation_codes"] = {
            "xla": "XLA (quantize_activation, exact division)",
            "pallas": "one Pallas pass (act_quant.e4m3_codes, div.rn.f32), scales by XLA",
            "pallas_group": "one Pallas pass (act_quant.e4m3_group_codes, div.rn.f32), its "
                            "scales too"}[codes_path(m, qw.storage_shape[1], spec.activation)]
    return out


def _describe_path(kernel: str, m: int, qw: QuantizedWeight, spec: QuantSpec, x_dtype,
                   deterministic: bool, out_dtype=None) -> dict:
    n, k = qw.storage_shape
    w_kind = _W_KIND[spec.weight.granularity]  # not _weight_scale: qw may be abstract
    x_kind = "none" if kernel == W8A16.name else _X_KIND[spec.activation.granularity]
    interpret = jax.default_backend() == "cpu"  # the dispatcher interprets there
    path = fp8_path(m, x_scale_kind=x_kind, w_scale_kind=w_kind, deterministic=deterministic,
                    interpret=interpret, n=n, k=k, x_dtype=x_dtype, out_dtype=out_dtype)
    if path == "dense":
        weight = ""  # (fp8 x fp8: the codes as they are)
        if kernel == W8A16.name:
            weight = ("; the e4m3 weight widened to the activations' dtype by one Pallas pass "
                      "first (fp8_widen, exact)" if widens(n, k, x_dtype, m) else
                      "; the e4m3 weight converted by XLA, inside its GEMM at decode sizes")
        return {"path": "dense (one XLA GEMM of the stored codes, scales on the f32 result"
                        f"{weight})"}
    if path == "decode":
        splits, stages = decode_params(n, k)
        order, held, groups, asked = "", 1, 1, None
        out = out_dtype or x_dtype
        if deterministic:  # (the Mosaic kernel's deterministic sums, to the bit)
            groups, splits, held, asked = det_decode_launch(m, n, k, out, interpret=interpret)
            order = (f", deterministic order: K in {det_order(n, k)[0]} parts, each K-block's "
                     f"chain from zero, added in K order by {groups} group(s)")
        blocks = ", each K-block's chain times its 128x128 block scale" if w_kind == "block" else ""
        finished = finish_note("fp8_a16_decode_mgpu", m, n, splits, out,
                               deterministic=deterministic, interpret=interpret,
                               range_parts=held, groups=groups, asked=asked)
        return {"path": f"decode (Mosaic GPU plain-pipeline W8A16 swap-AB kernel, 64-row weight "
                        f"tiles, several CTAs an SM, splits={splits}, stages={stages}"
                        f"{finished}{blocks}{order})"}
    if path == "mgpu":
        weight_only = kernel == W8A16.name
        if deterministic and not weight_only:
            return {"path": _det_w8a8_note(mgpu_launch_params(
                False, m, n, k, interpret, True, out_dtype=out_dtype or x_dtype))}
        what = "W8A16 swap-AB" if weight_only else "block W8A8"
        params = mgpu_launch_params(weight_only, m, n, k, interpret, deterministic)
        launch = ", ".join(f"{key}={v}" for key, v in params.items())
        read = ("; the e4m3 weights widened to bf16 by one Pallas pass first (fp8_widen, "
                "exact), wgmma reading them from shared memory" if params.get("predecode")
                else "")
        return {"path": f"mgpu (Mosaic GPU wgmma {what} kernel, 128-row weight tiles, "
                        f"{launch}{read})"}
    if kernel == W8A16.name:
        cfg = w8a16_config(m, n, k, scale_kind=w_kind, x_dtype=x_dtype,
                           deterministic=deterministic)
    else:
        _, cfg = w8a8_config(m, n, k, x_scale_kind=x_kind, w_scale_kind=w_kind,
                             deterministic=deterministic)
    return {**cfg.to_json(), "path": "pallas"}


def _park_words(cols: int) -> str:
    """explain()'s words for a fold's park of `cols` of its 128 columns."""
    if cols == 128:
        return ", their sum parked in shared memory"
    return f", their sum parked in shared memory ({cols} of 128 columns; the rest in registers)"


def _det_w8a8_note(launch: dict) -> str:
    """explain()'s words for fp8_block_det's launch (its DetLaunch as a dict)."""
    order = (f"deterministic order: K in {launch['parts']} parts, each K-block's chain times its "
             f"x and weight scales, added in K order, the parts added in order")
    if launch["kind"] == "decode":
        how = (f"swap-AB plain-pipeline launch, 64-row weight tiles, one K part a CTA, "
               f"stages={launch['stages']}, the parts added "
               + ("by the CTAs' cluster in the kernel" if launch["in_kernel_finish"] else
                  "by XLA from float32 slabs"))
    else:
        how = (f"128x128 output tiles, blocks_per_step={launch['blocks_per_step']}, the parts "
               + ("as CTAs of their own, added by XLA from float32 slabs"
                  if launch["kind"] == "spread" else "folded in each CTA"
                  + (_park_words(launch["park_cols"]) if launch["park"] else "")))
    return (f"mgpu (Mosaic GPU deterministic block W8A8, fp8_block_det, launch "
            f"'{launch['kind']}': {how}; {order})")


W8A16 = register_kernel(Kernel(
    name="pallas_fp8_w8a16",
    impl=w8a16_impl,
    honours=((_W_TC, WEIGHT_ONLY), (_W_BLOCK, WEIGHT_ONLY)),
    description="Pallas FP8 weight-only: e4m3 tile -> x dtype in registers (float32 x: its "
                "three exact bf16 parts as rows), f32 MMA accumulation. sm_90 with 16-bit "
                "x: Mosaic GPU swap-AB wgmma kernel (K ranges "
                "for decode; deterministic mode too, its K order fixed by K), at M = 1 and 9-16 "
                "(block scales at M <= 16 up to K = 14336; deterministic mode at M <= 16 where "
                "N or K <= 4096, in its order) a plain-pipeline one of several CTAs an SM; "
                "otherwise Triton "
                "(split-K / narrow N tiles, gemv at M=1); default mode at M = 2-8 and M >= 1024 "
                "with tensor/channel scales: one XLA GEMM of the exact codes",
    **HOPPER_PALLAS,
))

W8A8 = register_kernel(Kernel(
    name="pallas_fp8_w8a8",
    impl=w8a8_impl,
    honours=((_W_TC, _A_TENSOR_TOKEN),),
    description="Pallas/Triton FP8 x FP8 MMA, per-tensor/channel weights x per-tensor/token "
                "activations (quantized by the reference rule in a fused XLA pre-pass); default "
                "mode from M = 128: XLA's e4m3 x e4m3 GEMM (cuBLASLt), scales on the f32 result",
    **HOPPER_PALLAS,
))

BLOCK = register_kernel(Kernel(
    name="pallas_fp8_block",
    impl=w8a8_impl,
    honours=((_W_BLOCK, _A_GROUP128), (_W_BLOCK, _A_GROUP128_UE8M0)),
    description="Pallas/Triton block-scaled FP8 x FP8 (128x128 weight blocks, 1x128 dynamic "
                "activation groups, float32 or DeepSeek's ue8m0 scales), per-K-block scaling "
                "of f32 partials; default mode at "
                "M >= 256 on sm_90: the Mosaic GPU wgmma kernel (fp8_block_mgpu), same order; "
                "deterministic mode on sm_90: Mosaic GPU at every M in one K order "
                "(fp8_block_det: swap-AB decode up to 16-64 rows, fp8_block_mgpu with K parts "
                "beyond)",
    **HOPPER_PALLAS,
))
