"""Open a checkpoint directory and hand it to the ecosystem module its configs name (FORMATS.md sec. 8)."""

from __future__ import annotations

import json
import os
import pathlib
import warnings

from ..errors import CheckpointError
from . import compressed_tensors, fbgemm_fp8, hf_fp8, modelopt, native
from .plan import Plan, Source, file_problem_key, quantized_modules
from .safetensors_io import TensorStore

__all__ = ["open_source", "plan_for", "SUPPORTED_METHODS"]

SUPPORTED_METHODS = ("fp8", "compressed-tensors", "modelopt", "fbgemm_fp8", native.QUANT_METHOD)
# methods FORMATS.md sec. 8 names that jqlin does not read, and why
_KNOWN_UNSUPPORTED = {
    "mxfp4": "gpt-oss stores MXFP4 mixture-of-experts weights (*_blocks / *_scales, 3-D per "
             "expert); jqlin's layers are dense Linears",
}


def _read_json(path: pathlib.Path, *, required: bool) -> dict | None:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path.parent}: missing {path.name}")
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: invalid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def open_source(path: str | os.PathLike) -> Source:
    p = pathlib.Path(path)
    if not p.is_dir():
        raise CheckpointError(f"{p}: not a checkpoint directory (expected config.json and "
                              "model.safetensors or model.safetensors.index.json)")
    config = _read_json(p / "config.json", required=True)
    hq = _read_json(p / "hf_quant_config.json", required=False)
    return Source(p, config, hq, TensorStore(p))


def plan_for(source: Source) -> Plan:
    """Detect the producer from the configs and let its module plan the layers.

    Problems of the files (source.store.problems) join the plan's; settings the plan does not
    apply (plan.warnings) are warned about here, so that load and convert both say so.
    """
    try:
        plan = _plan_for(source)
    except CheckpointError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        # ecosystem modules validate the config keys they read; this catches the shapes of
        # config they did not anticipate (e.g. a list where an object belongs)
        raise CheckpointError(f"{source.path}: malformed quantization config "
                              f"({type(e).__name__}: {e})") from None
    plan.problems.update({file_problem_key(f): p for f, p in source.store.problems.items()})
    for w in plan.warnings:
        warnings.warn(w, UserWarning, stacklevel=3)  # the caller of load_checkpoint / convert
    return plan


def _declared_but_unquantized(source: Source, plan: Plan) -> str | None:
    """A quantized config over weights with no quantized module: the unquantized model with
    a quantized model's config. Loading it would give a bf16 model labelled e.g. modelopt/NVFP4."""
    if quantized_modules(source.store):
        return None
    where = ("hf_quant_config.json" if plan.format.startswith("modelopt/")
             and source.hf_quant_config is not None else "config.json quantization_config")
    return (f"{where} declares a quantized checkpoint ({plan.format}) but no layer is stored "
            "quantized: no tensor has a quantization suffix (weight_scale, weight_packed, ...) "
            "or an fp8 / packed-fp4 weight dtype; remove the quantization config to load the "
            "weights as unquantized, or use the quantized export's weights")


def _plan_for(source: Source) -> Plan:
    qc = source.quantization_config
    method = str(qc.get("quant_method", "")).lower() if qc is not None else ""
    if method == native.QUANT_METHOD:
        return native.plan(source)
    if qc is None and source.hf_quant_config is None:
        problems = {m: (f"module '{m}' stores quantization tensors "
                        f"({', '.join(sorted(t))}) but config.json has no quantization_config")
                    for m, t in quantized_modules(source.store).items()}
        return Plan("unquantized", {}, problems)
    if method.startswith("modelopt"):
        plan = modelopt.plan(source)
    elif source.hf_quant_config is not None:
        if qc is not None:
            raise CheckpointError(
                f"{source.path}: hf_quant_config.json (ModelOpt) is present but config.json's "
                f"quantization_config has quant_method {qc.get('quant_method')!r}; expected "
                "'modelopt' or no quantization_config")
        plan = modelopt.plan(source)
    elif method == "compressed-tensors":
        plan = compressed_tensors.plan(source)
    elif method == "fp8":
        plan = hf_fp8.plan(source)
    elif method == "fbgemm_fp8":
        plan = fbgemm_fp8.plan(source)
    else:
        why = _KNOWN_UNSUPPORTED.get(method)
        raise CheckpointError(
            f"config.json: quantization_config.quant_method {qc.get('quant_method')!r} is not "
            f"supported{f': {why}' if why else ''} (jqlin reads "
            f"{', '.join(repr(m) for m in SUPPORTED_METHODS)})")
    problem = _declared_but_unquantized(source, plan)
    if problem is not None:
        plan.problems[file_problem_key("quantization config")] = problem
    return plan
