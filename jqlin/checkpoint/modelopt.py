"""NVIDIA ModelOpt exports: `hf_quant_config.json` and/or config.json `quant_method: modelopt` (FORMATS.md sec. 5).

The algorithm comes from `quantization.quant_algo` (hf_quant_config.json) or config.json's
`quantization_config.quant_algo`; exports write it in either case ("fp8_pb_wo"), so it is
upper-cased. Excluded modules are `exclude_modules` (or config.json `ignore`) fnmatch patterns;
MIXED_PRECISION names each quantized module in `quantized_layers` with its own algorithm.
Tensor names are ModelOpt's (`weight`, `weight_scale`, `weight_scale_2`, `input_scale`) even when
config.json carries compressed-tensors-like `config_groups`, which are therefore not read.

Every key carries ScaleRule.MODELOPT and NVFP4 globals are multipliers
(`weight_scale_2` = amax/(6*448), `input_scale` likewise). FP8_PB_WO is weight-only as exported
(ModelOpt's own model has no activation quantizers; vLLM's choice to quantize activations
dynamically for its kernel is a serving decision, not the checkpoint's numerics).
"""

from __future__ import annotations

import fnmatch

from ..errors import CheckpointError
from ..spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule
from .plan import (LayerPlan, Plan, Source, config_error, excluded_but_quantized,
                   kv_cache_warnings, module_tensors, quantized_modules, add_unquantized_siblings)

E4M3, E2M1, E8M0 = "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu"
MO = ScaleRule.MODELOPT
_NVFP4 = dict(scale_dtype=E4M3, group_size=16, rule=MO, global_scale=GlobalScale.MULTIPLIER)
_W_NVFP4 = QuantKey(E2M1, Granularity.GROUP, **_NVFP4)
_MX8 = dict(scale_dtype=E8M0, group_size=32, rule=MO)

SPECS: dict[str, QuantSpec] = {
    "FP8": QuantSpec(QuantKey(E4M3, Granularity.TENSOR, rule=MO),
                     QuantKey(E4M3, Granularity.TENSOR, rule=MO)),
    "FP8_PER_CHANNEL_PER_TOKEN": QuantSpec(QuantKey(E4M3, Granularity.CHANNEL, rule=MO),
                                           QuantKey(E4M3, Granularity.TOKEN, dynamic=True, rule=MO)),
    "FP8_PB_WO": QuantSpec(QuantKey(E4M3, Granularity.BLOCK, block=(128, 128), rule=MO)),
    "NVFP4": QuantSpec(_W_NVFP4, QuantKey(E2M1, Granularity.GROUP, dynamic=True, **_NVFP4)),
    "W4A16_NVFP4": QuantSpec(_W_NVFP4),
    "MXFP8": QuantSpec(QuantKey(E4M3, Granularity.GROUP, **_MX8),
                       QuantKey(E4M3, Granularity.GROUP, dynamic=True, **_MX8)),
}
_NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")


def _files(source: Source) -> tuple[dict, dict, str]:
    """(hf_quant_config 'quantization' section, config.json modelopt section, where-string)."""
    hq = source.hf_quant_config
    info = {}
    if hq is not None:
        info = hq.get("quantization")
        if not isinstance(info, dict):
            raise config_error("hf_quant_config.json", "quantization", "an object", info)
        producer = hq.get("producer") or {}
        producer = producer.get("name", "modelopt") if isinstance(producer, dict) else producer
        if str(producer).lower() != "modelopt":
            raise config_error("hf_quant_config.json", "producer.name", "'modelopt'", producer)
    qc = source.quantization_config or {}
    if not str(qc.get("quant_method", "")).lower().startswith("modelopt"):
        qc = {}
    nested = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else {}
    return info, {**nested, **{k: v for k, v in qc.items() if k != "quantization"}}, \
        "hf_quant_config.json" if hq is not None else "config.json quantization_config"


def _pick(info: dict, qc: dict, *keys):
    for src in (info, qc):
        for k in keys:
            if src.get(k) is not None:
                return src[k]
    return None


def plan(source: Source) -> Plan:
    info, qc, where = _files(source)
    a_h, a_c = info.get("quant_algo"), qc.get("quant_algo")
    if a_h is not None and a_c is not None and str(a_h).upper() != str(a_c).upper():
        raise CheckpointError(
            f"hf_quant_config.json quant_algo {a_h!r} disagrees with config.json "
            f"quantization_config.quant_algo {a_c!r}")
    algo = a_h if a_h is not None else a_c
    if not isinstance(algo, str):
        raise config_error(where, "quant_algo", "a string", algo)
    algo = algo.upper()
    exclude = _pick(info, qc, "exclude_modules", "ignore") or []
    if not isinstance(exclude, list) or not all(isinstance(s, str) for s in exclude):
        raise config_error(where, "exclude_modules", "a list of fnmatch patterns", exclude)
    group_size = _pick(info, qc, "group_size")

    quantized_layers = None
    if algo == "MIXED_PRECISION":
        quantized_layers = _pick(info, qc, "quantized_layers")
        if not isinstance(quantized_layers, dict):
            raise config_error(where, "quantized_layers",
                               "an object of module -> {quant_algo, ...} for MIXED_PRECISION",
                               quantized_layers)
    elif algo not in SPECS:
        raise CheckpointError(f"{where}: quant_algo {algo!r} is not supported (jqlin reads "
                              f"{', '.join([*SPECS, 'MIXED_PRECISION'])})")

    store = source.store
    quantized = quantized_modules(store)
    layers: dict[str, LayerPlan] = {}
    problems: dict[str, str] = {}
    for module, tensors in quantized.items():
        hit = next((p for p in exclude if fnmatch.fnmatchcase(module, p)), None)
        if hit is not None:
            problems[module] = excluded_but_quantized(
                module, tensors, f"exclude_modules pattern {hit!r}", where)
            continue
        a, gs = algo, group_size
        if quantized_layers is not None:
            entry = quantized_layers.get(module)
            if not isinstance(entry, dict) or not isinstance(entry.get("quant_algo"), str):
                problems[module] = (f"module '{module}' stores quantization tensors but "
                                    f"quantized_layers in {where} has no quant_algo for it")
                continue
            a, gs = entry["quant_algo"].upper(), entry.get("group_size", group_size)
        try:
            layers[module] = _layer_plan(module, a, gs, tensors, where)
        except CheckpointError as e:
            problems[module] = str(e)

    if quantized_layers is not None:
        present = set(module_tensors(store))
        for module in sorted(set(quantized_layers) - set(quantized)):
            state = ("stores its weight unquantized" if module in present
                     else "has no tensors in the checkpoint")
            problems[module] = (f"quantized_layers in {where} lists module '{module}', which "
                                f"{state}")
    else:  # MIXED_PRECISION names its quantized layers: a module it omits is unquantized by design
        def expected(module: str) -> bool:
            # as leniently as vLLM (a pattern also covers its children, and old exports were
            # matched by substring): a layer the export meant to exclude must not be flagged
            return not any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*")
                           or p in module for p in exclude)
        add_unquantized_siblings(problems, store, quantized, expected,
                                 f"exclude_modules in {where}")
    return Plan(f"modelopt/{algo}", layers, problems,
                warnings=_kv_cache_warnings(info, qc, where, store))


def _kv_cache_warnings(info: dict, qc: dict, where: str, store) -> list[str]:
    # hf_quant_config.json says kv_cache_quant_algo; newer config.json exports kv_cache_scheme
    key = next((k for k in ("kv_cache_quant_algo", "kv_cache_scheme") if _pick(info, qc, k)),
               "kv_cache_quant_algo")
    return kv_cache_warnings(where, key, _pick(info, qc, key), store)


def _layer_plan(module: str, algo: str, group_size, tensors: dict, where: str) -> LayerPlan:
    if algo not in SPECS:
        raise CheckpointError(f"{where}: quant_algo {algo!r} of layer '{module}' is not supported "
                              f"(jqlin reads {', '.join(SPECS)})")
    if algo in _NVFP4_ALGOS and group_size not in (None, 16):
        raise config_error(where, "group_size", f"16 for {algo} (layer '{module}')", group_size)
    spec = SPECS[algo]
    m = module
    kw: dict = {}
    if algo in _NVFP4_ALGOS:
        kw["global_scale"] = f"{m}.weight_scale_2"
    if algo in ("FP8", "NVFP4"):
        kw["input_scale"] = f"{m}.input_scale"
    if algo == "W4A16_NVFP4" and "input_scale" in tensors:
        # exported by some versions; vLLM ignores it, and so does jqlin, after checking it
        kw["ignorable"] = (f"{m}.input_scale",)
    if algo == "FP8_PB_WO":
        kw["block_scale_4d"] = True
    return LayerPlan(m, spec, data=f"{m}.weight", scale=f"{m}.weight_scale", **kw)
