"""quant_method "fbgemm_fp8": HF transformers' FbgemmFp8Config (FORMATS.md sec. 3c), e.g.
Meta's Llama-3.1-405B-Instruct-FP8.

Every quantized Linear stores `weight` e4m3 (N, K) and `weight_scale` (N, 1), one float scale
per output row. Activations are quantized at run time per token by fbgemm's
`quantize_fp8_per_row` with the config's `activation_scale_ub` as the bound of the row's amax:
s = max(min(amax, ub) / 448, 1 / (448 * 512)), codes e4m3(x / s), saturating (FBGEMM's
quantize.cu). That is the per-token rule jqlin records for vLLM's CUDA kernels (ScaleRule.VLLM:
the same floor, and vLLM passes the same bound as `scale_ub`) with the bound in the key
(QuantKey.amax_bound), so values past it saturate at +-448 as they do there.

`modules_to_not_convert` names the Linears kept in bf16. HF's versions match its entries
differently (substring; then regex prefix or suffix), so a module counts as deliberately
unquantized if any of those would skip it; a module stored quantized must not be named by an
entry exactly (or as a parent).
"""

from __future__ import annotations

import re

from ..spec import Granularity, QuantKey, QuantSpec, ScaleRule
from .hf_fp8 import E4M3
from .plan import (LayerPlan, Plan, Source, add_unquantized_siblings, config_error,
                   kv_cache_warnings, quantized_modules, split_ignored)

_CFG = "config.json quantization_config"
FORMAT = "fbgemm_fp8/ptpc"


def _activation(qc: dict) -> QuantKey:
    """The per-token key with the config's bound (QuantKey checks the value)."""
    ub = qc.get("activation_scale_ub")
    if ub is None:
        raise config_error(_CFG, "activation_scale_ub", "set: the bound of the activations' "
                           "per-token amax (HF writes it, default 1200.0; vLLM requires it)", ub)
    try:
        return QuantKey(E4M3, Granularity.TOKEN, dynamic=True, rule=ScaleRule.VLLM,
                        amax_bound=ub)
    except ValueError:
        raise config_error(_CFG, "activation_scale_ub", "a finite positive number",
                           ub) from None


def _entries(qc: dict) -> list[str]:
    entries = qc.get("modules_to_not_convert") or []
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise config_error(_CFG, "modules_to_not_convert", "a list of module names", entries)
    for e in entries:
        try:
            re.compile(e)
        except re.error as err:  # (HF's matching takes the entries as regexes)
            raise config_error(_CFG, "modules_to_not_convert",
                               f"module names or regexes ({err})", e) from None
    return entries


def _skipped_by_hf(module: str, entries: list[str]) -> bool:
    """Whether some HF version leaves `module` unconverted: an entry that is a substring of its
    name (older transformers), or that matches its start as a regex or ends it (later)."""
    return any(e in module or re.match(e, module) or module.endswith(e) for e in entries)


def plan(source: Source) -> Plan:
    qc = source.quantization_config
    spec = QuantSpec(QuantKey(E4M3, Granularity.CHANNEL, rule=ScaleRule.VLLM), _activation(qc))
    entries = _entries(qc)
    quantized = quantized_modules(source.store)
    kept, problems = split_ignored(quantized, entries, "modules_to_not_convert", _CFG)
    layers = {m: LayerPlan(m, spec, data=f"{m}.weight", scale=f"{m}.weight_scale")
              for m in kept}
    add_unquantized_siblings(problems, source.store, quantized,
                             lambda m: not _skipped_by_hf(m, entries),
                             f"{_CFG} 'modules_to_not_convert'")
    return Plan(FORMAT, layers, problems,
                warnings=kv_cache_warnings(_CFG, "kv_cache_scheme", None, source.store))
