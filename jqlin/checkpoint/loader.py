"""load_checkpoint: a checkpoint directory -> Checkpoint(format, config, layers, tensors), strictly."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import warnings
from typing import Mapping, Sequence

import jax
import jax.numpy as jnp

from ..errors import CheckpointError
from ..qweight import QuantizedWeight
from .build import build_layer, required_tensors
from .detect import open_source, plan_for
from .fusion import DEFAULT_GROUPS, fuse_layers, fuse_projections
from .plan import QUANT_SUFFIXES, Plan, split_name
from .safetensors_io import TensorStore

__all__ = ["Checkpoint", "load_checkpoint", "unexpected_tensors"]


@dataclasses.dataclass(eq=False)  # arrays inside: identity, not elementwise ==
class Checkpoint:
    """A loaded checkpoint.

    format: detected scheme, e.g. "compressed-tensors/fp8_block", "modelopt/NVFP4",
        "fp8/per_tensor", "unquantized", or "jqlin" for checkpoints written by `convert`
        (then `source_format` says what they were converted from).
    layers: every quantized Linear by module name (no ".weight" suffix), each with its own spec.
    tensors: every other tensor (embeddings, norms, biases, unquantized layers) by full name.
    """

    path: pathlib.Path
    format: str
    config: dict
    layers: dict[str, QuantizedWeight]
    tensors: dict[str, jax.Array]
    source_format: str | None = None

    def fuse(self, names: Sequence[str]) -> QuantizedWeight:
        """One QuantizedWeight of the named layers concatenated along N, losslessly."""
        return fuse_layers(self.layers, names)

    def fused_projections(self, groups: Mapping[str, Sequence[str]] = DEFAULT_GROUPS
                          ) -> dict[str, QuantizedWeight]:
        """Fused q/k/v (`<attn>.qkv_proj`) and gate/up (`<mlp>.gate_up_proj`) of every block."""
        return fuse_projections(self.layers, groups)

    def __repr__(self) -> str:
        src = f", source_format={self.source_format!r}" if self.source_format else ""
        return (f"Checkpoint({str(self.path)!r}, format={self.format!r}{src}, "
                f"{len(self.layers)} quantized layers, {len(self.tensors)} other tensors)")


def unexpected_tensors(store: TensorStore, plan: Plan) -> list[str]:
    """Tensors no layer consumed that only make sense on a quantized layer."""
    consumed = {n for lp in plan.layers.values() for n in lp.tensor_names}
    out = []
    for name in store.names():
        if name in consumed:
            continue
        module, suffix = split_name(name)
        if suffix in QUANT_SUFFIXES or (module in plan.layers and suffix == "weight"):
            out.append(name)
    return out


def raise_problems(plan: Plan) -> None:
    if plan.problems:
        first = plan.problems[sorted(plan.problems)[0]]
        more = len(plan.problems) - 1
        raise CheckpointError(first + (f" (and {more} more problem(s); `jqlin inspect` lists them)"
                                       if more else ""))


def load_checkpoint(path: str | os.PathLike, *, strict: bool = True) -> Checkpoint:
    """Load a checkpoint directory (config.json [+ hf_quant_config.json] + safetensors).

    Every tensor a layer's spec needs must be present with the expected dtype and shape, and
    every scale finite and positive; anything else raises CheckpointError naming the file,
    tensor or config key. strict=False only relaxes unexpected tensors (quantization tensors no
    layer uses): they are kept in `tensors` with a warning instead of raising.
    """
    source = open_source(path)
    plan = plan_for(source)
    raise_problems(plan)
    store = source.store
    for module in sorted(plan.layers):  # names first: a missing tensor outranks a stray one
        for name in required_tensors(plan.layers[module]):
            store.info(name)
    extra = unexpected_tensors(store, plan)
    if extra:
        msg = (f"{store.info(extra[0]).where}: unexpected tensor for a {plan.format} checkpoint "
               f"(no quantized layer uses it){f'; {len(extra) - 1} more' if len(extra) > 1 else ''}")
        if strict:
            raise CheckpointError(msg + "; pass strict=False to keep such tensors")
        warnings.warn(msg, stacklevel=2)
    layers = {m: build_layer(store, plan.layers[m]) for m in sorted(plan.layers)}
    consumed = {n for lp in plan.layers.values() for n in lp.tensor_names}
    tensors = {n: jnp.asarray(store.read(n)) for n in store.names() if n not in consumed}
    return Checkpoint(source.path, plan.format, source.config, layers, tensors, plan.source_format)
