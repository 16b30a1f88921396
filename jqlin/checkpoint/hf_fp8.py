"""quant_method "fp8": vLLM Fp8Config, HF FineGrainedFP8, AutoFP8 and DeepSeek-V3 (FORMATS.md sec. 3).

Maps config.json's quantization_config to one QuantSpec for every quantized Linear:
- no `weight_block_size`: per-tensor `weight_scale` (scalar); `activation_scheme` "static" adds a
  per-tensor `input_scale`, "dynamic" means per-token activation scales at run time;
- `weight_block_size` [bn, bk]: `weight_scale_inv` grid (ceil(N/bn), ceil(K/bk)) -- a multiplier
  despite its name -- and dynamic 1 x bk activation groups; `scale_fmt: "ue8m0"` (DeepSeek-V3.1
  on) makes their scales powers of two by DeepSeek's own rule (ScaleRule.DEEPSEEK).
Dynamic activation scales are computed by vLLM's CUDA kernels in this ecosystem, so the
activation keys carry ScaleRule.VLLM (per-token scale floored at 1/(448*512)). For dynamic
per-tensor checkpoints vLLM uses per-token scales wherever CUTLASS runs; jqlin records that.
"""

from __future__ import annotations

import math

from ..spec import Granularity, QuantKey, QuantSpec, ScaleRule
from .plan import (LayerPlan, Plan, Source, add_unquantized_siblings, config_error,
                   ignored_entry, kv_cache_warnings, quantized_modules, split_ignored)

E4M3 = "float8_e4m3fn"
_CFG = "config.json quantization_config"


def ue8m0_activation(group: int) -> QuantKey:
    """The activation key of `scale_fmt: "ue8m0"` block checkpoints (DeepSeek-V3.1 on): e4m3
    groups of `group` along K, dynamic, power-of-two e8m0 scales by DeepSeek's rule."""
    return QuantKey(E4M3, Granularity.GROUP, scale_dtype="float8_e8m0fnu", dynamic=True,
                    group_size=group, rule=ScaleRule.DEEPSEEK)


def plan(source: Source) -> Plan:
    qc = source.quantization_config
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("static", "dynamic"):
        raise config_error(_CFG, "activation_scheme", "'static' or 'dynamic'", scheme)
    fmt = qc.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise config_error(_CFG, "fmt", "'e4m3' (jqlin reads e4m3fn fp8 only)", fmt)
    scale_fmt = qc.get("scale_fmt")
    if scale_fmt not in (None, "float", "ue8m0"):
        raise config_error(_CFG, "scale_fmt", "absent, 'float' or 'ue8m0'", scale_fmt)
    ignored = qc.get("ignored_layers", qc.get("modules_to_not_convert")) or []
    if not isinstance(ignored, list) or not all(isinstance(s, str) for s in ignored):
        raise config_error(_CFG, "ignored_layers", "a list of module names", ignored)

    block = qc.get("weight_block_size")
    static = scheme == "static"
    if block is not None:
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(b, int) and b > 0 for b in block)):
            raise config_error(_CFG, "weight_block_size", "two positive ints [bn, bk]", block)
        if static:
            raise config_error(_CFG, "activation_scheme",
                               "'dynamic' with weight_block_size (block FP8 has no static scales)",
                               scheme)
        weight = QuantKey(E4M3, Granularity.BLOCK, block=tuple(block), rule=ScaleRule.VLLM)
        if scale_fmt == "ue8m0":  # DeepSeek-V3.1 on: power-of-two activation scales
            act, name = ue8m0_activation(block[1]), "fp8/block_ue8m0"
        else:
            act, name = QuantKey(E4M3, Granularity.GROUP, dynamic=True, group_size=block[1],
                                 rule=ScaleRule.VLLM), "fp8/block"
        scale_suffix = "weight_scale_inv"
    else:
        if scale_fmt == "ue8m0":
            raise config_error(_CFG, "scale_fmt", "'ue8m0' only with weight_block_size (block "
                               "FP8's dynamic activation groups)", scale_fmt)
        weight = QuantKey(E4M3, Granularity.TENSOR, rule=ScaleRule.VLLM)
        if static:
            act = QuantKey(E4M3, Granularity.TENSOR, rule=ScaleRule.VLLM)
        else:
            act = QuantKey(E4M3, Granularity.TOKEN, dynamic=True, rule=ScaleRule.VLLM)
        scale_suffix = "weight_scale"
        name = "fp8/per_tensor" if static else "fp8/per_tensor_dynamic"
    spec = QuantSpec(weight, act)

    layers = {}
    quantized = quantized_modules(source.store)
    kept, problems = split_ignored(quantized, ignored, "ignored_layers", _CFG)
    for module, tensors in kept.items():
        if block is None and "weight_scale_inv" in tensors and "weight_scale" not in tensors:
            problems[module] = _block_scale_without_block_size(module, tensors)
            continue
        layers[module] = LayerPlan(
            module, spec, data=f"{module}.weight", scale=f"{module}.{scale_suffix}",
            input_scale=f"{module}.input_scale" if static else None)
    add_unquantized_siblings(problems, source.store, quantized,
                             lambda m: ignored_entry(m, ignored) is None,
                             f"{_CFG} 'ignored_layers'")
    return Plan(name, layers, problems, warnings=kv_cache_warnings(
        _CFG, "kv_cache_scheme", qc.get("kv_cache_scheme"), source.store))


def _block_scale_without_block_size(module: str, tensors: dict) -> str:
    """A DeepSeek-style block checkpoint whose config lost `weight_block_size` reads as
    per-tensor FP8, whose `weight_scale` is then missing: say what the tensors point to."""
    msg = (f"module '{module}' stores 'weight_scale_inv' (block FP8, DeepSeek style) but no "
           f"'weight_scale': {_CFG} has no 'weight_block_size', so per-tensor FP8 with a "
           "'weight_scale' is expected; add \"weight_block_size\": [bn, bk] to the config")
    w, s = tensors.get("weight"), tensors["weight_scale_inv"]
    if w is not None and len(w.shape) == 2 and tuple(s.shape) == tuple(
            math.ceil(d / 128) for d in w.shape):
        msg += " ([128, 128] fits its scale grid)"
    return msg
