"""quant_method "compressed-tensors" (llm-compressor): config groups -> per-layer QuantSpecs (FORMATS.md sec. 4).

Each `config_groups` entry has `targets`, `weights`, `input_activations` and (newer versions, and
always under the `mixed-precision` format) its own `format`. A module's group is chosen as
compressed-tensors does: exact-name targets first, then `re:` regexes (`re.match`), then class
names, the first group in config order winning at each level. A checkpoint does not record
module classes, so the class target "Linear" is resolved by the tensors: a module that stores
quantization tensors is a Linear. `ignore` entries are names or `re:` regexes.

Supported (float schemes only): fp8 weights per tensor / channel / 2-D block / 1-D group
(`float-quantized`, `naive-quantized`); NVFP4 (`nvfp4-pack-quantized`, weight_global_scale is a
divisor); MXFP8 (`mxfp8-quantized`) and MXFP4 (`mxfp4-pack-quantized`, also the older alias of
MXFP4 under the nvfp4 compressor). Activations: static per-tensor `input_scale`, dynamic
per-tensor / per-token / group, NVFP4 "local" with `input_global_scale`, dynamic MX groups.
Every key carries ScaleRule.CT: compressed-tensors' forward computes the dynamic scales.
"""

from __future__ import annotations

import dataclasses
import re

from .. import formats
from ..errors import CheckpointError
from ..spec import GlobalScale, Granularity, QuantKey, QuantSpec, ScaleRule
from .plan import (LayerPlan, Plan, Source, config_error, excluded_but_quantized,
                   kv_cache_warnings, linear_modules, quantized_modules, add_unquantized_siblings)

E4M3, E2M1, E8M0 = "float8_e4m3fn", "float4_e2m1fn", "float8_e8m0fnu"
T, C, TOK, B, G = (Granularity.TENSOR, Granularity.CHANNEL, Granularity.TOKEN,
                   Granularity.BLOCK, Granularity.GROUP)
CT = ScaleRule.CT
_CFG = "config.json quantization_config"
_FP8_FORMATS = ("float-quantized", "naive-quantized")
_FORMATS = (*_FP8_FORMATS, "nvfp4-pack-quantized", "mxfp8-quantized", "mxfp4-pack-quantized",
            "mixed-precision")
# class-name targets that can be resolved from tensors alone
_CLASS_TARGETS = ("Linear",)


@dataclasses.dataclass(frozen=True)
class _Group:
    name: str
    targets: tuple[str, ...]
    weights: dict | None
    inputs: dict | None
    format: str | None


class _Unsupported(CheckpointError):
    pass


def plan(source: Source) -> Plan:
    qc = source.quantization_config
    status = qc.get("quantization_status")
    if status not in (None, "compressed"):
        raise config_error(_CFG, "quantization_status",
                           "'compressed' (jqlin reads compressed checkpoints)", status)
    if qc.get("transform_config"):
        raise config_error(_CFG, "transform_config",
                           "empty (online rotations/transforms are not supported)",
                           qc["transform_config"])
    sparsity = qc.get("sparsity_config") or {}
    if sparsity and sparsity.get("format") not in (None, "dense"):
        raise config_error(_CFG, "sparsity_config.format", "absent or 'dense'",
                           sparsity.get("format"))
    groups = _parse_groups(qc)
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(s, str) for s in ignore):
        raise config_error(_CFG, "ignore", "a list of module names / 're:' patterns", ignore)

    store = source.store
    quantized = quantized_modules(store)
    modules = set(linear_modules(store)) | set(quantized)
    layers: dict[str, LayerPlan] = {}
    problems: dict[str, str] = {}
    for module, tensors in quantized.items():
        hit = _match_any(module, ignore)
        if hit is not None:
            problems[module] = excluded_but_quantized(module, tensors,
                                                      f"ignore entry {hit!r}", _CFG)
            continue
        group = _group_for(module, groups, modules, quantized=True)
        if group is None:
            targets = sorted({t for g in groups for t in g.targets})
            problems[module] = (f"module '{module}' stores quantization tensors but no config "
                                f"group in {_CFG} targets it (targets: {targets})")
            continue
        try:
            layers[module] = _layer_plan(module, group, tensors)
        except CheckpointError as e:
            problems[module] = str(e)

    # A module named exactly by a target must be quantized (regex/class targets may match
    # modules, such as embeddings, that compressed-tensors never quantizes).
    for module in sorted(modules - set(quantized)):
        if _match_any(module, ignore) is not None:
            continue
        for g in groups:
            if module in g.targets:
                problems[module] = (f"config group '{g.name}' in {_CFG} targets module "
                                    f"'{module}' by name but its weight is stored unquantized")
                break
    # Class targets ("Linear") cover every Linear, but a checkpoint cannot say which 2-D weights
    # are Linears: a quantized sibling in another layer says so.
    def expected(module: str) -> bool:
        return (_match_any(module, ignore) is None
                and _group_for(module, groups, modules, quantized=True) is not None)
    add_unquantized_siblings(problems, store, quantized, expected, f"{_CFG} 'ignore'")
    return Plan(_format_name(qc, layers), layers, problems, warnings=kv_cache_warnings(
        _CFG, "kv_cache_scheme", qc.get("kv_cache_scheme"), store))


def _parse_groups(qc: dict) -> list[_Group]:
    cg = qc.get("config_groups")
    if not isinstance(cg, dict) or not cg:
        raise config_error(_CFG, "config_groups", "a non-empty object of scheme groups", cg)
    top = qc.get("format")
    if top is not None and top not in _FORMATS:
        raise _Unsupported(f"{_CFG}: 'format' {top!r} is not supported (jqlin reads "
                           f"{', '.join(_FORMATS)})")
    groups = []
    for name, g in cg.items():
        key = f"config_groups.{name}"
        if not isinstance(g, dict):
            raise config_error(_CFG, key, "an object", g)
        targets = g.get("targets")
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            raise config_error(_CFG, f"{key}.targets", "a non-empty list of strings", targets)
        for field in ("weights", "input_activations"):
            if g.get(field) is not None and not isinstance(g[field], dict):
                raise config_error(_CFG, f"{key}.{field}", "an object or null", g[field])
        if g.get("output_activations") is not None:
            raise _Unsupported(f"{_CFG}: '{key}.output_activations' is set; output activation "
                               "quantization is not supported")
        fmt = g.get("format") or top
        if fmt == "mixed-precision" or fmt is None:
            raise config_error(_CFG, f"{key}.format",
                               "a concrete compressor format under 'mixed-precision'", fmt)
        if fmt not in _FORMATS:
            raise _Unsupported(f"{_CFG}: '{key}.format' {fmt!r} is not supported (jqlin reads "
                               f"{', '.join(_FORMATS[:-1])})")
        groups.append(_Group(name, tuple(targets), _resolved_args(g.get("weights"), f"{key}.weights"),
                             _resolved_args(g.get("input_activations"),
                                            f"{key}.input_activations"), fmt))
    return groups


def _resolved_args(args: dict | None, key: str) -> dict | None:
    """Quantization args as compressed-tensors reads them (QuantizationArgs' validators):
    `strategy` / `dynamic` strings in any case, and a missing strategy inferred from group_size
    (none -> tensor, > 0 -> group, -1 -> channel)."""
    if args is None:
        return None
    args = dict(args)
    for field in ("strategy", "dynamic"):
        if isinstance(args.get(field), str):
            args[field] = args[field].lower()
    if args.get("strategy") is None:
        gs = args.get("group_size")
        if gs is None:
            args["strategy"] = "tensor"
        elif isinstance(gs, int) and gs > 0:
            args["strategy"] = "group"
        elif gs == -1:
            args["strategy"] = "channel"
        else:
            raise config_error(_CFG, f"{key}.group_size",
                               "a positive int (group) or -1 (channel) where strategy is absent",
                               gs)
    return args


def _match(module: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    return module == pattern


def _match_any(module: str, patterns: list[str]) -> str | None:
    return next((p for p in patterns if _match(module, p)), None)


def _group_for(module: str, groups: list[_Group], modules: set[str], *, quantized: bool):
    for level in ("name", "regex", "class"):
        for g in groups:
            for t in g.targets:
                if level == "name" and t == module:
                    return g
                if level == "regex" and t.startswith("re:") and _match(module, t):
                    return g
                if (level == "class" and quantized and t in _CLASS_TARGETS):
                    return g
    return None


def _norm_dtype(s) -> str | None:
    return None if s is None else str(s).removeprefix("torch.")


def _layer_plan(module: str, group: _Group, tensors: dict) -> LayerPlan:
    where = f"compressed-tensors config group '{group.name}' (format {group.format}) for layer '{module}'"
    if group.weights is None:
        raise _Unsupported(f"{where}: the group quantizes no weights (activation-only schemes "
                           "are not supported)")
    scale = tensors.get("weight_scale")
    e8m0_on_disk = scale is not None and scale.dtype in ("U8", "F8_E8M0")
    wkey, data_suffix, global_suffix = _weight_key(group.weights, group.format, where, e8m0_on_disk)
    akey, input_suffix = _activation_key(group.inputs, wkey, where)
    try:
        spec = QuantSpec(wkey, akey)
    except ValueError as e:
        raise _Unsupported(f"{where}: {e}") from None
    zps = tuple(f"{module}.{s}" for s in ("weight_zero_point", "input_zero_point") if s in tensors)
    return LayerPlan(
        module, spec, data=f"{module}.{data_suffix}", scale=f"{module}.weight_scale",
        global_scale=f"{module}.{global_suffix}" if global_suffix else None,
        input_scale=f"{module}.{input_suffix}" if input_suffix else None,
        zero_points=zps,
        shape_tensor=f"{module}.weight_shape" if "weight_shape" in tensors else None)


def _describe(args: dict) -> str:
    parts = [f"{args.get('type', 'int')} {args.get('num_bits')}-bit", str(args.get("strategy"))]
    if args.get("group_size"):
        parts.append(f"group_size={args['group_size']}")
    if args.get("block_structure"):
        parts.append(f"block={args['block_structure']}")
    return " ".join(parts)


def _check_common(args: dict, what: str, where: str) -> None:
    if args.get("type", "int") != "float":
        raise _Unsupported(
            f"{where}: unsupported {what} scheme ({_describe(args)}): jqlin reads float "
            "(fp8 / fp4) schemes only, not int-quantized ones")
    if args.get("symmetric", True) is not True:
        raise _Unsupported(f"{where}: asymmetric {what} quantization ({_describe(args)}) is not supported")
    if args.get("actorder"):
        raise _Unsupported(f"{where}: {what} actorder={args['actorder']!r} is not supported")


def _weight_key(w: dict, fmt: str, where: str,
                e8m0_on_disk: bool = False) -> tuple[QuantKey, str, str | None]:
    _check_common(w, "weights", where)
    if w.get("dynamic", False) is not False:
        raise _Unsupported(f"{where}: dynamic weight quantization is not a stored format")
    bits, strategy, gs = w.get("num_bits"), w.get("strategy"), w.get("group_size")
    mx = fmt in ("mxfp8-quantized", "mxfp4-pack-quantized") or _norm_dtype(w.get("scale_dtype")) == "uint8"
    bad = _Unsupported(f"{where}: unsupported weights scheme {_describe(w)} with format {fmt}")
    if bits == 8:
        if fmt not in (*_FP8_FORMATS, "mxfp8-quantized"):
            raise bad
        if mx:
            if strategy != "group" or gs != 32:
                raise bad
            return QuantKey(E4M3, G, scale_dtype=E8M0, group_size=32, rule=CT), "weight", None
        if strategy == "tensor":
            return QuantKey(E4M3, T, rule=CT), "weight", None
        if strategy == "channel":
            return QuantKey(E4M3, C, rule=CT), "weight", None
        if strategy == "block":
            blk = w.get("block_structure")
            if (not isinstance(blk, list) or len(blk) != 2
                    or not all(isinstance(b, int) and b > 0 for b in blk)):
                raise config_error(where, "weights.block_structure", "two positive ints", blk)
            return QuantKey(E4M3, B, block=tuple(blk), rule=CT), "weight", None
        if strategy == "group" and isinstance(gs, int) and gs > 0:
            return QuantKey(E4M3, G, group_size=gs, rule=CT), "weight", None
        raise bad
    if bits == 4:
        if strategy == "tensor_group" and gs == 16 and not mx and fmt == "nvfp4-pack-quantized":
            key = QuantKey(E2M1, G, scale_dtype=E4M3, group_size=16, rule=CT,
                           global_scale=GlobalScale.DIVISOR)
            return key, "weight_packed", "weight_global_scale"
        # MXFP4; compressed-tensors <= 0.12 wrote it through the nvfp4 compressor, with configs
        # that may predate `scale_dtype`: then the exponent-byte scales in the header say MX
        if (strategy == "group" and gs == 32 and (mx or e8m0_on_disk)
                and fmt in ("mxfp4-pack-quantized", "nvfp4-pack-quantized")):
            return QuantKey(E2M1, G, scale_dtype=E8M0, group_size=32, rule=CT), "weight_packed", None
        raise bad
    raise bad


def _activation_key(a: dict | None, wkey: QuantKey, where: str) -> tuple[QuantKey | None, str | None]:
    if a is None:
        return None, None
    _check_common(a, "input_activations", where)
    bits, strategy, gs, dyn = a.get("num_bits"), a.get("strategy"), a.get("group_size"), a.get("dynamic")
    bad = _Unsupported(f"{where}: unsupported input_activations scheme {_describe(a)} "
                       f"dynamic={dyn!r} with weights [{wkey.describe()}]")
    if bits == 8:
        if wkey.scale_dtype == E8M0:  # MXFP8 activations
            if strategy == "group" and gs == 32 and dyn is True:
                return QuantKey(E4M3, G, scale_dtype=E8M0, dynamic=True, group_size=32, rule=CT), None
            raise bad
        if strategy == "tensor" and dyn is False:
            return QuantKey(E4M3, T, rule=CT), "input_scale"
        if strategy == "tensor" and dyn is True:
            return QuantKey(E4M3, T, dynamic=True, rule=CT), None
        if strategy == "token" and dyn is True:
            return QuantKey(E4M3, TOK, dynamic=True, rule=CT), None
        if strategy == "group" and dyn is True and isinstance(gs, int) and gs > 0:
            return QuantKey(E4M3, G, dynamic=True, group_size=gs, rule=CT), None
        raise bad
    if bits == 4:
        if (strategy == "tensor_group" and gs == 16 and dyn == "local"
                and wkey.global_scale is GlobalScale.DIVISOR):
            key = QuantKey(E2M1, G, scale_dtype=E4M3, dynamic=True, group_size=16, rule=CT,
                           global_scale=GlobalScale.DIVISOR)
            return key, "input_global_scale"
        if strategy == "group" and gs == 32 and dyn is True and wkey.scale_dtype == E8M0:
            return QuantKey(E2M1, G, scale_dtype=E8M0, dynamic=True, group_size=32, rule=CT), None
        raise bad
    raise bad


def _format_name(qc: dict, layers: dict[str, LayerPlan]) -> str:
    specs = {lp.spec for lp in layers.values()}
    if len(specs) == 1:
        return f"compressed-tensors/{formats.name_of(next(iter(specs))) or 'custom'}"
    if qc.get("format") == "mixed-precision" or len(specs) > 1:
        return "compressed-tensors/mixed-precision"
    return "compressed-tensors/none"
