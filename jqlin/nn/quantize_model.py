"""quantize_model: replace the nnx.Linear layers of an NNX model by QuantDense, by path rules.

Rules select layers by the dotted path of the layer in the model (e.g.
`layers.0.self_attn.qkv.parts.q_proj`, `lm_head`): a glob (`fnmatch`, `*` crosses dots) or a
regular expression written `re:<pattern>` (searched). The first matching rule wins; its format
(a name in `jqlin.formats` or a QuantSpec) quantizes the layer, `None` keeps it in floating point.
Layers matching no rule are left alone.
"""

from __future__ import annotations

import fnmatch
import math
import re
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from ..dispatch import Explanation
from ..numerics.tiling import abs_max
from ..spec import QuantSpec
from .dense import QuantDense, _spec
from .fused import FusedLinear

__all__ = ["quantize_model", "quant_layers", "linear_layers", "configure", "explain_model"]

Rule = tuple[str, "QuantSpec | str | None"]


def _path_str(path: Sequence[Any]) -> str:
    return ".".join(str(p) for p in path)


def _normalize_rules(rules: Any) -> list[Rule]:
    if isinstance(rules, (str, QuantSpec)):
        return [("*", rules)]
    if isinstance(rules, Mapping):
        rules = list(rules.items())
    out = []
    for i, rule in enumerate(rules):
        if not (isinstance(rule, (tuple, list)) and len(rule) == 2 and isinstance(rule[0], str)):
            raise TypeError(f"rules[{i}] must be a (pattern, format-or-None) pair, got {rule!r}")
        pattern, fmt = rule
        if fmt is not None:
            _spec(fmt)  # unknown names fail here, before the model is touched
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise ValueError(f"rules[{i}]: {pattern!r} is not a regular expression: {e}") from None
        out.append((pattern, fmt))
    return out


def _matches(pattern: str, path: str) -> bool:
    if pattern.startswith("re:"):
        return re.search(pattern[3:], path) is not None
    return fnmatch.fnmatchcase(path, pattern)


def _modules(model: nnx.Module, kind: type) -> Iterator[tuple[str, tuple, nnx.Module]]:
    for path, node in nnx.iter_graph(model):
        if isinstance(node, kind):
            yield _path_str(path), tuple(path), node


def linear_layers(model: nnx.Module) -> dict[str, nnx.Linear]:
    """Dotted path -> nnx.Linear for every float linear layer in the model."""
    return {p: n for p, _, n in _modules(model, nnx.Linear)}


def quant_layers(model: nnx.Module) -> dict[str, QuantDense]:
    """Dotted path -> QuantDense for every quantized layer in the model."""
    return {p: n for p, _, n in _modules(model, QuantDense)}


def configure(model: nnx.Module, **options: Any) -> nnx.Module:
    """Set QuantDense options (kernel, deterministic, weight_only, dtype, promote) on every
    layer."""
    allowed = {"kernel", "deterministic", "weight_only", "dtype", "promote"}
    if set(options) - allowed:
        raise TypeError(f"configure: unknown options {sorted(set(options) - allowed)}; "
                        f"allowed {sorted(allowed)}")
    for layer in quant_layers(model).values():
        for k, v in options.items():
            setattr(layer, k, v)
    return model


def explain_model(model: nnx.Module, m: int = 1, dtype: Any = jnp.bfloat16
                  ) -> dict[str, Explanation]:
    """Dotted path -> the dispatcher's choice for each QuantDense at M = m rows of `dtype`
    activations (each layer's own cast applied: what it runs)."""
    return {p: layer.explain(jax.ShapeDtypeStruct((m, layer.in_features), dtype))
            for p, layer in quant_layers(model).items()}


def _is_container(node: Any) -> bool:
    return isinstance(node, (nnx.List, nnx.Dict, list, dict))


def _set_child(model: nnx.Module, path: tuple, new: nnx.Module) -> None:
    parent = model
    for key in path[:-1]:
        parent = parent[key] if _is_container(parent) else getattr(parent, key)
    if _is_container(parent):
        parent[path[-1]] = new
    else:
        setattr(parent, path[-1], new)


class _InputRecorder(nnx.Module):
    """Stands in for an nnx.Linear during calibration and records max |input|."""

    def __init__(self, linear: nnx.Linear, path: str):
        self.linear = linear
        self.path = path
        self.amax = None
        self.out_features = linear.out_features
        self.in_features = linear.in_features

    def __call__(self, x, **_unused):
        if isinstance(x, jax.core.Tracer):
            raise ValueError(f"calibration of {self.path}: run the calibrate function eagerly "
                             "(not under jit), so inputs can be recorded")
        a = float(abs_max(jnp.asarray(x, jnp.float32)))
        if not math.isfinite(a):
            raise ValueError(f"calibration of {self.path}: its inputs hold NaN or inf; a "
                             "static activation scale needs finite calibration data")
        self.amax = a if self.amax is None else max(self.amax, a)
        return self.linear(x)


def quantize_model(model: nnx.Module, rules: Any, *,
                   calibrate: Callable[[nnx.Module], Any] | None = None,
                   input_scales: Mapping[str, Any] | None = None, fuse: bool = True,
                   **options: Any) -> nnx.Module:
    """Replace the model's nnx.Linear layers selected by `rules` by QuantDense (in place;
    the model is returned too).

    rules: a format (applies to every Linear), or (pattern, format-or-None) pairs / a mapping.
    Formats with a static activation scale (fp8_per_tensor, nvfp4) need the scale per layer:
    `input_scales={path: scale}` in the spec's convention, or `calibrate(model)`, a function
    that runs the model eagerly on sample inputs while each selected layer records its max |x|.
    fuse: afterwards merge FusedLinear parts that became QuantDense of one spec.
    options: QuantDense options (kernel, deterministic, weight_only, dtype, promote); each
    layer keeps its Linear's output dtype unless `dtype` says otherwise (QuantDense.from_linear).
    Every layer is quantized before any is swapped: an error names the layer and leaves the
    model as it was.
    """
    rules = _normalize_rules(rules)
    chosen: dict[str, tuple[tuple, nnx.Linear, QuantSpec]] = {}
    for path, pth, node in _modules(model, nnx.Linear):
        for pattern, fmt in rules:
            if _matches(pattern, path):
                if fmt is not None:
                    chosen[path] = (pth, node, _spec(fmt))
                break
    scales = dict(input_scales or {})
    unknown = set(scales) - set(chosen)
    if unknown:
        raise ValueError(f"input_scales names layers that no rule quantizes: {sorted(unknown)}")
    unused = sorted(p for p in scales if not chosen[p][2].static_input_scale)
    if unused:  # (jqlin.quantize refuses it too: the scale would be dropped silently)
        raise ValueError(f"input_scales names layers whose format needs no static activation "
                         f"scale: {unused}")
    need = [p for p, (_, _, s) in chosen.items() if s.static_input_scale and p not in scales]
    if need and calibrate is not None:
        recorders = {}
        for p in need:
            pth, node, _ = chosen[p]
            recorders[p] = _InputRecorder(node, p)
            _set_child(model, pth, recorders[p])
        try:
            calibrate(model)
        finally:
            for p in need:
                _set_child(model, chosen[p][0], chosen[p][1])
        for p, rec in recorders.items():
            if rec.amax is None:
                raise ValueError(f"calibrate() never called layer {p}")
            scales[p] = _scale_from_amax(chosen[p][2], rec.amax)
    elif need:
        raise ValueError(f"formats with a static activation scale need input_scales= or "
                         f"calibrate= for: {need}")
    built = {}  # every layer quantized before any is swapped: an error leaves the model as it was
    for path, (pth, node, spec) in chosen.items():
        try:
            built[path] = QuantDense.from_linear(node, spec, input_scale=scales.get(path),
                                                 **options)
        except ValueError as e:
            raise ValueError(f"quantize_model: layer {path}: {e}") from None
    for path, (pth, _, _) in chosen.items():
        _set_child(model, pth, built[path])
    if fuse:
        for _, _, node in list(_modules(model, FusedLinear)):
            node.fuse()
    return model


def _scale_from_amax(spec: QuantSpec, amax: jax.Array) -> jax.Array:
    from ..qweight import calibrate_input_scale
    return calibrate_input_scale(spec.activation, jnp.asarray([amax], jnp.float32))
