"""The jqlin checkpoint format written by `convert`: safetensors + one small JSON metadata file.

Layout of a jqlin checkpoint directory:
  config.json         the model's HF config; `quantization_config` = {"quant_method": "jqlin", ...}
  jqlin_quant.json    {"format_version", "source_format", "layers": {module: {"spec", "shape",
                      "segments", "layout", "tensors": {"data", "scale", "global_scale",
                      "input_scale"}}}}
  model.safetensors   (or shards + model.safetensors.index.json) holding every QuantizedWeight
                      array exactly as in memory (padded storage, f32 / e4m3 / e8m0-byte scales)
                      and every other tensor unchanged.

Why safetensors + JSON rather than Orbax: the arrays are the same kind of thing the sources
hold, so one reader (with its header checks and truncation detection) serves both; safetensors
keeps fp8 bytes exact, can be written one tensor at a time (Orbax/tensorstore write a whole
pytree), is opened lazily and is readable by every tool in the HF ecosystem. The only thing
safetensors cannot say -- each layer's QuantSpec, logical shape and row segments -- is a few
hundred bytes of JSON. Reloading needs no source-format logic: specs are stored, not inferred.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import CheckpointError
from ..qweight import QuantizedWeight
from ..spec import QuantKey, QuantSpec
from .plan import LayerPlan, NativeLayout, Plan, Source

__all__ = ["METADATA_FILE", "FORMAT_VERSION", "QUANT_METHOD", "spec_to_dict", "spec_from_dict",
           "layer_entry", "tensor_names", "plan"]

METADATA_FILE = "jqlin_quant.json"
FORMAT_VERSION = 1
QUANT_METHOD = "jqlin"


def key_to_dict(key: QuantKey) -> dict[str, Any]:
    d = {"dtype": key.dtype, "granularity": key.granularity.value,
         "scale_dtype": key.scale_dtype, "dynamic": key.dynamic,
         "block": list(key.block) if key.block else None, "group_size": key.group_size,
         "rule": key.rule.value,
         "global_scale": key.global_scale.value if key.global_scale else None}
    if key.amax_bound is not None:  # (only then: files without one read as before)
        d["amax_bound"] = key.amax_bound
    return d


def key_from_dict(d: Any, where: str) -> QuantKey:
    try:
        d = dict(d)
        if d.get("block") is not None:
            d["block"] = tuple(d["block"])
        return QuantKey(**d)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: invalid QuantKey {d!r}: {e}") from None


def spec_to_dict(spec: QuantSpec) -> dict[str, Any]:
    return {"weight": key_to_dict(spec.weight),
            "activation": key_to_dict(spec.activation) if spec.activation else None}


def spec_from_dict(d: Any, where: str) -> QuantSpec:
    if not isinstance(d, dict) or "weight" not in d:
        raise CheckpointError(f"{where}: expected {{'weight': ..., 'activation': ...}}, got {d!r}")
    act = d.get("activation")
    try:
        return QuantSpec(key_from_dict(d["weight"], f"{where}.weight"),
                         None if act is None else key_from_dict(act, f"{where}.activation"))
    except ValueError as e:
        raise CheckpointError(f"{where}: invalid QuantSpec: {e}") from None


def tensor_names(module: str, qw: QuantizedWeight) -> dict[str, str | None]:
    return {"data": f"{module}.weight", "scale": f"{module}.weight_scale",
            "global_scale": f"{module}.weight_global_scale" if qw.global_scale is not None else None,
            "input_scale": f"{module}.input_scale" if qw.input_scale is not None else None}


def layer_entry(module: str, qw: QuantizedWeight) -> dict[str, Any]:
    return {"spec": spec_to_dict(qw.spec), "shape": list(qw.shape),
            "segments": [list(s) for s in qw.segments], "layout": qw.layout,
            "tensors": tensor_names(module, qw)}


def plan(source: Source) -> Plan:
    path = source.path / METADATA_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{source.path}: config.json says quant_method 'jqlin' but "
                              f"{METADATA_FILE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        got = meta.get("format_version") if isinstance(meta, dict) else meta
        raise CheckpointError(f"{path}: 'format_version' must be {FORMAT_VERSION}, got {got!r}")
    entries = meta.get("layers")
    if not isinstance(entries, dict):
        raise CheckpointError(f"{path}: 'layers' must be an object of module -> layer entry")
    layers: dict[str, LayerPlan] = {}
    for module, e in entries.items():
        where = f"{METADATA_FILE}: layers.{module}"
        try:
            t = e["tensors"]
            shape = tuple(int(v) for v in e["shape"])
            segments = tuple((int(a), int(b)) for a, b in e.get("segments", []))
            layout = str(e.get("layout", "nk"))
            data, scale = str(t["data"]), str(t["scale"])
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{where}: malformed entry ({err!r}): expected spec, shape, "
                                  "segments, layout and tensors.data/scale") from None
        if len(shape) != 2 or layout != "nk":
            raise CheckpointError(f"{where}: expected a 2-D shape and layout 'nk', got "
                                  f"{list(shape)} / {layout!r}")
        layers[module] = LayerPlan(
            module, spec_from_dict(e.get("spec"), f"{where}.spec"), data=data, scale=scale,
            global_scale=t.get("global_scale"), input_scale=t.get("input_scale"),
            native=NativeLayout(shape, segments, layout))
    return Plan("jqlin", layers, source_format=meta.get("source_format"))
